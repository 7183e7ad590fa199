"""`dsv4 gate` on CPU: the protocol's records and exit status, and that it catches a wrong fast path."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

import dsv4
from dsv4.gate import Gate, GateFailure, Receipts, looped


def records(text: str) -> list[tuple[str, dict]]:
    out = []
    for line in text.splitlines():
        tag, _, rest = line.partition(" ")
        if rest.startswith("{"):
            out.append((tag, json.loads(rest)))
    return out


def test_cpu_gate_two_ranks(tmp_path):
    """The protocol on two ranks (with the batch, speculative and prefix-cache checks). Its 24 sampled tokens (positions 33..56) cross tiny's window of 8 and its CSA (4)
    and HCA (16, at 48) closes; the refusal cells (prime + 3, the middle, the end) lie on three layers."""
    out = tmp_path / "receipts.txt"
    proc = subprocess.run([sys.executable, "-m", "dsv4.cli", "gate", "--preset", "tiny", "--device", "cpu",
                           "--ranks", "2", "--prime", "32", "--output", "24", "--batch", "3", "--speculative", "3",
                           "--prefix-cache", "--out", str(out)],
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    recs = records(out.read_text())
    tags = [t for t, _ in recs]
    protocol = recs[0][1]
    assert tags[0] == "REPLAY_PROTOCOL" and protocol["ranks"] == 2 and protocol["graph_arm"] is False
    assert protocol["prime_tokens"] == 32 and protocol["sampled_output_tokens"] == 24
    assert any("graph arm absent" in d for d in protocol["differences"])
    batch = [r for t, r in recs if t == "BATCH_IDENTITY"]
    assert len(batch) == 1 and batch[0]["rows"] == 3 and batch[0]["tokens"] == 3 * 27 - 3
    assert [r["rows_quarantined"] for t, r in recs if t == "BATCH_REFUSAL"] == [True]
    pipelined = [r for t, r in recs if t == "BATCH_PIPELINED"]  # the server's pipelined steps, against solo
    assert len(pipelined) == 1 and pipelined[0]["tokens"] == 3 * 27 - 3 and pipelined[0]["all_rank_final_state_equal"]
    assert [(r["rows_unchanged"], r["next_step_held"]) for t, r in recs if t == "BATCH_PIPELINED_REFUSAL"] == [(True, True)]
    spec = [r for t, r in recs if t == "SPECULATIVE_IDENTITY"]  # verify steps against plain ones, on two ranks
    assert len(spec) == 1 and spec[0]["tokens"] == 24 and 0 < spec[0]["accepted"] < spec[0]["drafted"]
    assert spec[0]["verify_steps"] < 24 and spec[0]["all_rank_cache_hidden_logits"]
    assert [(r["state_unchanged"], r["quarantined"]) for t, r in recs if t == "SPECULATIVE_REFUSAL"] == [(True, True)]
    prefix = [r for t, r in recs if t == "PREFIX_IDENTITY"]  # prefills through the prefix cache against plain ones
    assert len(prefix) == 1 and prefix[0]["restored"] == [0, 16, 0, 8] and prefix[0]["all_rank_cache_hidden_logits"]
    assert [(r["quarantined"], r["cache_unchanged"]) for t, r in recs if t == "PREFIX_REFUSAL"] == [(True, True)]
    exact = [r for t, r in recs if t == "REPLAY_EXACT"]
    assert len(exact) >= 24 // 4 and all(r["all_rank_cache_hidden_logits"] for r in exact)
    refusals = [r for t, r in recs if t == "REPLAY_REFUSAL"]
    assert [(r["rank"], r["position"], r["layer"]) for r in refusals] == [
        (rank, pos, layer) for rank in (0, 1) for pos, layer in ((35, 0), (43, 2), (55, 4))]
    assert all(r["cache_unchanged"] and r["retry_quarantined"] for r in refusals)
    assert refusals[3]["words"] == [0, 40044]
    measures = [r for t, r in recs if t == "MEASURE"]
    assert len(measures) == 20
    assert sum(r.get("skipped", False) for r in measures) == 10  # graph rows: no graph arm on CPU
    assert len({r["generated_sha256"] for r in measures if not r.get("skipped")}) == 1
    summary = recs[-1]
    assert summary[0] == "REPLAY_SUMMARY" and summary[1]["rows_per_arm"] == {"eager": 10, "graph": 0}


def test_gate_catches_a_wrong_fast_path(capsys):
    """A candidate that samples one wrong token must fail the gate at that position."""
    model = dsv4.load("tiny", device="cpu", seed=2)
    args = SimpleNamespace(prime=16, output=24, seed=20260907, reverse=False, profile=False, preset="tiny",
                           model=None)
    gate = Gate(model, args, Receipts(None))
    real_step = model.step
    calls = {"n": 0}

    def sabotaged(state, token, sampling=None):
        out = real_step(state, token, sampling)
        calls["n"] += 1
        return (out + 1) % model.cfg.vocab_size if calls["n"] == 12 else out  # the candidate's 6th step

    model.step = sabotaged
    with pytest.raises(GateFailure) as e:
        gate.run()
    assert e.value.check == "sampled token" and e.value.detail["position"] == 16 + 6


def test_gate_rejects_tiny_sizes():
    proc = subprocess.run([sys.executable, "-m", "dsv4.cli", "gate", "--preset", "tiny", "--device", "cpu",
                           "--prime", "4"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "at least 8" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "dsv4.cli", "gate", "--preset", "tiny", "--device", "cpu",
                           "--speculative", "9"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--speculative 9" in proc.stderr


def test_looped():
    assert looped([1, 2] * 40)
    assert looped(list(range(40)) + [7] * 64)
    assert not looped(list(range(200)))
