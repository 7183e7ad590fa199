"""`dsv4 plan` (dsv4.plan): a rank's memory from the config alone. Its figures are the load's own (the weights a
load checks before reading a byte) and the server's (its states), on the world sizes that split the model; a
checkpoint directory reads config.json alone; a world that does not split the model, a length past the model's and
a repo id that cannot be reached are refused by name."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import dsv4
from dsv4.checkpoint.memory import weight_bytes
from dsv4.checkpoint.synth import synth
from dsv4.config import preset
from dsv4.plan import PEAK_MARGIN, config_of, plan, worlds
from dsv4.state import state_bytes

sys.path.insert(0, str(Path(__file__).parent))
from test_cli import dsv4_main  # noqa: E402


def test_flash_figures_are_the_load_s_and_the_server_s():
    cfg = preset("flash")
    assert worlds(cfg) == [1, 2, 4, 8]
    for ranks in (1, 2, 4, 8):
        p = plan(cfg, ranks, 8192, 16, 4)
        assert p.weights == max(weight_bytes(cfg, r, ranks, torch.bfloat16) for r in range(ranks))
        assert p.state == state_bytes(cfg, 8192, torch.bfloat16) and p.states == 20
        assert p.total == p.weights + 20 * p.state
    h200 = int(140.4 * 2**30)
    # one H200 cannot hold Flash's weights (145 GiB); two can, as sessions 5-45 ran it (73.8 GiB a rank measured)
    assert not plan(cfg, 1, 8192, 16, 4).fits(h200) and plan(cfg, 2, 8192, 16, 4).fits(h200)
    assert abs(plan(cfg, 2, 8192, 16, 4).weights / 2**30 - 73.8) < 0.1
    # states of 128k tokens, 0.85 GiB each (session 5 measured 0.85 a rank): 44 fit beside the weights, 74 do not
    assert plan(cfg, 2, 131072, 40, 4).fits(h200)
    big = plan(cfg, 2, 131072, 70, 4)
    assert not big.fits(h200) and big.total + PEAK_MARGIN > h200 > big.total


def test_the_server_s_states_match_what_it_allocates():
    model = dsv4.load("tiny", device="cpu", dtype=torch.float32)
    p = plan(model.cfg, 1, 256, 1, 0, torch.float32)
    state = model.new_state(256)
    assert p.state == sum(t.numel() * t.element_size() for _, t in state.committed())


def test_a_directory_reads_its_config_alone(tmp_path):
    ckpt = synth(preset("tiny"), tmp_path / "tiny", seed=1, quant="none")
    for f in Path(ckpt).glob("*.safetensors"):
        f.unlink()  # no weights: a plan reads config.json only
    read, tiny = config_of(Path(ckpt)), preset("tiny")
    assert (read.hidden_size, read.num_hidden_layers, read.vocab_size) == \
        (tiny.hidden_size, tiny.num_hidden_layers, tiny.vocab_size)
    r = dsv4_main("plan", "--model", str(ckpt), "--gpu-memory", "80")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"[dsv4] {ckpt}: 16 slots + 4 prefix states of 4,096 tokens")
    assert lines[1].split()[:5] == ["ranks", "weights", "states", "total", "left"]
    assert [line.split()[0] for line in lines[2:]] == ["1", "2"]  # tiny: 4 heads, 2 output groups
    assert all(line.split()[-1] == "yes" for line in lines[2:])


@pytest.mark.parametrize("args,words", [
    (["--preset", "tiny", "--ranks", "4"], "o_groups=2 is not divisible by ranks=4"),
    (["--preset", "tiny", "--max-model-len", "5000"], "max_model_len 5000: in [1, 4096]"),
    (["--preset", "tiny", "--max-num-seqs", "-1"], "max_num_seqs -1"),
    (["--preset", "huge"], "--preset 'huge': allowed ['flash', 'mini', 'tiny']"),
    (["--model", "no/such/place"], "--model 'no/such/place': no such directory, and not a Hugging Face repo id"),
])
def test_bad_plans_are_refused_by_name(args, words):
    r = dsv4_main("plan", *args)
    assert r.returncode == 2 and words in r.stderr, r.stderr


def test_an_unreachable_repo_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="'nobody/nothing': its config.json is neither in the Hugging Face"):
        config_of("nobody/nothing")
