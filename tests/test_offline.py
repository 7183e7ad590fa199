"""Offline batch generation (dsv4.generate_many, `dsv4 generate --prompts-file`), on the tiny preset (CPU).

Checked: every prompt's tokens are those it draws alone (model.sample_tokens), with more prompts than slots, mixed
lengths, per-prompt sampling and max_tokens, text and token-id prompts, on one rank and two; its text is the
tokens' text (EOS left out), cut at a stop string; the prefix cache's results are the same; bad input names the
prompt and the field; a failed forward raises with the other prompts' results kept; the CLI writes one JSON line a
prompt, atomically.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import dsv4
from dsv4.serve.offline import GenerationError, generate_many
from test_serve_scheduler import solo


@pytest.fixture(scope="module")
def model():
    return dsv4.load("tiny", device="cpu", dtype=torch.float32)


def prompts(model):
    tok = model.tokenizer
    return ["a small river", "hello there, how are you today", [5, 9, 3, 7] * 9, "x", tok.decode(list(range(40, 90)))]


def test_each_prompt_is_its_stream_alone(model):
    ps = prompts(model)
    samplings = [dsv4.SamplingParams(temperature=t, seed=s) for t, s in ((1.0, 1), (0.8, 2), (0.0, 0), (1.0, 4),
                                                                          (1.2, 5))]
    max_tokens = [6, 9, 5, 12, 7]
    out = generate_many(model, ps, max_tokens, samplings, max_num_seqs=2)
    tok = model.tokenizer
    for p, n, s, c in zip(ps, max_tokens, samplings, out):
        ids = tok.encode(p) if isinstance(p, str) else p
        want = solo(model, ids, n, s)
        assert c.prompt_token_ids == ids and c.token_ids == want
        assert c.text == tok.decode([t for t in want if t != model.cfg.eos_token_id])
        assert c.finish_reason == ("stop" if want[-1] == model.cfg.eos_token_id else "length")
        assert c.cached_tokens == 0
    # the prefix cache changes no result (the same prompt twice: one prefill, the other a copy)
    again = generate_many(model, ps + [ps[4]], max_tokens + [7], samplings + [samplings[4]], max_num_seqs=3,
                          prefill_chunk=8, prefix_cache=2)
    assert [c.token_ids for c in again[:5]] == [c.token_ids for c in out] and again[5].token_ids == out[4].token_ids
    assert again[5].cached_tokens == len(again[5].prompt_token_ids) - 1


def test_a_stop_string_cuts_the_text(model):
    plain = generate_many(model, ["hello there"], 12, dsv4.SamplingParams(seed=3))[0]
    assert len(plain.text) > 4
    stop = plain.text[2:4]
    cut = generate_many(model, ["hello there"], 12, dsv4.SamplingParams(seed=3), stop=[stop])[0]
    assert cut.finish_reason == "stop" and cut.text == plain.text[:plain.text.index(stop)]
    assert cut.token_ids == plain.token_ids[:len(cut.token_ids)] and len(cut.token_ids) < len(plain.token_ids)


def test_two_ranks_each_prompt_is_its_stream_alone(model):
    ps = prompts(model)[:3]
    sp = dsv4.SamplingParams(temperature=1.0, seed=9)
    two = dsv4.load("tiny", device="cpu", dtype=torch.float32, ranks=2)
    try:
        got = generate_many(two, ps, 6, sp, max_num_seqs=2)
        assert [c.token_ids for c in got] == [solo(two, c.prompt_token_ids, 6, sp) for c in got]
    finally:
        two.close()


@pytest.mark.parametrize("args,kwargs,words", [
    ([[]], {}, "non-empty list"),
    (["hello"], {}, "non-empty list"),
    ([[["a"]]], {}, "prompt 0 is neither"),
    ([["hi", []]], {}, "prompt 1 is empty"),
    ([["hi", [1, 10 ** 9]]], {}, "prompt 1 holds token id 1000000000"),
    ([["hi", "there"], [3]], {}, "1 values of max_tokens for 2 prompts"),
    ([["hi"], 0], {}, "max_tokens 0 of prompt 0"),
    ([["hi"], 4, [dsv4.SamplingParams(), dsv4.SamplingParams()]], {}, "2 values of sampling for 1 prompts"),
    ([["hi"], 4, {"temperature": 1}], {}, "sampling of prompt 0 is a dict"),
    ([["hi", "a much longer prompt than that"], 4], {"max_model_len": 8}, "prompt 1 .* exceeds max_model_len 8"),
    ([["hi"], 4], {"max_model_len": 10 ** 9}, "max_position_embeddings"),
    ([["hi"], 4], {"prefix_cache": -1}, "prefix_cache -1"),
])
def test_bad_input_is_named(model, args, kwargs, words):
    with pytest.raises(ValueError, match=words):
        generate_many(model, *args, **kwargs)


def test_a_failed_forward_keeps_the_other_results(model, monkeypatch):
    real = model.prefill_batch

    def refuse_long(states, chunks):
        if len(chunks[0]) > 20:  # only the long prompt's chunk
            raise RuntimeError("refused for the test")
        return real(states, chunks)

    monkeypatch.setattr(model, "prefill_batch", refuse_long)
    ps = ["hi there", [5, 9, 3, 7] * 9]
    with pytest.raises(GenerationError, match="1 of 2 prompts failed .prompt 1: .*refused for the test") as e:
        generate_many(model, ps, 5, dsv4.SamplingParams(seed=1), max_num_seqs=1)
    assert e.value.completions[1] is None and sorted(e.value.failed) == [1]
    assert e.value.completions[0].token_ids == solo(model, model.tokenizer.encode("hi there"), 5,
                                                    dsv4.SamplingParams(seed=1))


def test_cli_prompts_file_writes_a_json_line_a_prompt(model, tmp_path):
    src = tmp_path / "prompts.jsonl"
    src.write_text('"a small river"\n{"prompt": [5, 9, 3, 7], "max_tokens": 4, "seed": 2}\n\n'
                   '{"prompt": "hello", "temperature": 0}\n')
    out = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "dsv4.cli", "generate", "--preset", "tiny", "--device", "cpu", "--prompts-file",
           str(src), "--out", str(out), "--max-tokens", "6", "--seed", "5", "--max-num-seqs", "2"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in rows] == [0, 1, 2]
    want = [solo(model, model.tokenizer.encode("a small river"), 6, dsv4.SamplingParams(seed=5)),
            solo(model, [5, 9, 3, 7], 4, dsv4.SamplingParams(seed=2)),
            solo(model, model.tokenizer.encode("hello"), 6, dsv4.SamplingParams(temperature=0, seed=5))]
    assert [r["token_ids"] for r in rows] == want
    assert {"text", "finish_reason", "prompt_tokens", "cached_tokens"} <= set(rows[0])
    # a bad line is named, and nothing is written
    bad = tmp_path / "bad.jsonl"
    bad.write_text('"fine"\n{"prompt": "x", "temprature": 1}\n')
    out2 = tmp_path / "out2.jsonl"
    r = subprocess.run(cmd[:9] + [str(bad), "--out", str(out2)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "line 2" in r.stderr and "temprature" in r.stderr, r.stderr
    assert not out2.exists()


def test_cli_batch_flags_need_a_prompts_file(capsys):
    from dsv4.cli import main

    assert main(["generate", "--preset", "tiny", "--device", "cpu", "--prefix-cache", "2"]) == 2
    assert "--prefix-cache goes with --prompts-file" in capsys.readouterr().err
    assert main(["generate", "--preset", "tiny", "--device", "cpu", "--prompts-file", "/nonexistent.jsonl"]) == 2
    assert "/nonexistent.jsonl" in capsys.readouterr().err


def test_the_package_face_offers_it_lazily():
    """dsv4.generate_many is this function; `import dsv4` alone does not load the HTTP stack."""
    assert dsv4.generate_many is generate_many
    code = "import sys, dsv4; assert 'fastapi' not in sys.modules; dsv4.generate_many; assert 'fastapi' in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120).returncode == 0


def test_a_finished_batch_leaves_nothing_to_the_cycle_collector(model):
    """generate_many's scheduler, its sequences and their states go when it returns, by reference counting: left in
    a cycle (the unstarted scheduler thread's target, the emitters' list of sequences), they were freed by the cycle
    collector whenever it ran, on CUDA possibly inside a later graph capture, whose destroyed graphs invalidated it
    (session 48: model.sample_tokens after generate_many in one process)."""
    import gc

    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        out = generate_many(model, [[5, 7, 9, 11], [3, 4, 8]], 3, [dsv4.SamplingParams(temperature=1.0, seed=1)] * 2)
        assert len(out) == 2
        del out
        gc.collect()
        left = sorted({type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith("dsv4")})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert left == [], left
