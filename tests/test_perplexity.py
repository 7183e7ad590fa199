"""`dsv4 perplexity` and dsv4.perplexity: a text's tokens scored by the prefill (Model.prefill_scored) in windows,
against HF transformers' DeepseekV4ForCausalLM on the same checkpoint (each window's logits, log_softmax, the mean
negative log-likelihood; tolerance 1e-5, fp32 tiny), and the command's line and errors."""

from __future__ import annotations

import json
import math

import pytest
import torch

import dsv4
from dsv4 import cli
from dsv4.checkpoint.synth import synth
from dsv4.config import preset
from dsv4.perplexity import perplexity


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return synth(preset("tiny"), tmp_path_factory.mktemp("ppl") / "tiny", seed=3, quant="none")


def test_perplexity_is_hfs(checkpoint):
    transformers = pytest.importorskip("transformers")
    model = dsv4.load(checkpoint, device="cpu", dtype=torch.float32)
    hf = transformers.DeepseekV4ForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).float().eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, model.cfg.vocab_size, (45,), generator=g).tolist()
    got = perplexity(model, ids, ctx=20, chunk=8)
    nll, n = 0.0, 0
    for start in range(0, len(ids) - 1, 20):  # windows of 20: 20 + 20 + 5 tokens, 19 + 19 + 4 scored
        window = ids[start:start + 20]
        with torch.no_grad():
            lp = torch.log_softmax(hf(torch.tensor([window])).logits[0].float(), dim=-1)
        nll -= float(lp[:-1].gather(-1, torch.tensor(window[1:]).view(-1, 1)).sum())
        n += len(window) - 1
    assert (got.tokens, got.windows, got.ctx) == (n, 3, 20) == (42, 3, 20)
    assert abs(got.nll - nll / n) <= 1e-5 and got.ppl == pytest.approx(math.exp(nll / n), rel=1e-5)


def test_bad_windows_are_refused(checkpoint):
    model = dsv4.load(checkpoint, device="cpu", dtype=torch.float32)
    with pytest.raises(ValueError, match="ctx 1: at least 2"):
        perplexity(model, [5, 6, 7], ctx=1)
    with pytest.raises(ValueError, match="1 token"):
        perplexity(model, [5], ctx=8)


def test_the_command_prints_one_json_line(capsys, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 4, encoding="utf-8")
    assert cli.main(["perplexity", "--preset", "tiny", "--device", "cpu", "--text-file", str(text), "--ctx", "32"]) == 0
    out = json.loads(capsys.readouterr().out)
    model = dsv4.load("tiny", device="cpu")
    n = len(model.tokenizer.encode(text.read_text()))
    assert out["tokens"] == n - 1 - (out["windows"] - 1) and out["windows"] == math.ceil((n - 1) / 32)
    assert out["ppl"] == pytest.approx(math.exp(out["nll"])) and out["ctx"] == 32


@pytest.mark.parametrize("argv,words", [
    (["--text-file", "/no/such/file"], "--text-file /no/such/file: No such file"),
    ([], "one of --text or --text-file"),
    (["--text", "hello there", "--ctx", "1"], "ctx 1: at least 2"),
])
def test_the_command_names_what_is_wrong(capsys, argv, words):
    assert cli.main(["perplexity", "--preset", "tiny", "--device", "cpu", *argv]) == 2
    assert words in capsys.readouterr().err
