"""dsv4 bench --profile's pieces: the phases of a step from their marks, and bytes read per token.

On CPU the breakdown is of eager steps (perf_counter marks); on CUDA (the GPU test) of a replayed
timed graph. The attribution itself is checked on synthetic marks.
"""

from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4 import profile
from dsv4.config import CSA
from dsv4.measure import attribute
from dsv4.profile import ENTER, EXIT, PHASES, phase

SAMPLING = dsv4.SamplingParams(temperature=1.0, seed=3)


def test_attribute_nesting_and_other():
    marks = [(1.0, "moe", ENTER), (3.0, "collective", ENTER), (6.0, "collective", EXIT), (7.0, "moe", EXIT),
             (7.0, "head", ENTER), (10.0, "head", EXIT)]
    out = attribute(marks, 0.0, 12.0)
    assert out == {"other": {"us": 3.0, "intervals": 3}, "moe": {"us": 3.0, "intervals": 1},
                   "collective": {"us": 3.0, "intervals": 1}, "head": {"us": 3.0, "intervals": 1}}
    assert attribute([], 2.0, 5.0) == {"other": {"us": 3.0, "intervals": 1}}


def test_attribute_refuses_a_broken_log():
    with pytest.raises(ValueError, match="exits while 'collective'"):
        attribute([(1.0, "moe", ENTER), (2.0, "collective", ENTER), (3.0, "moe", EXIT)], 0.0, 4.0)
    with pytest.raises(ValueError, match="never exit"):
        attribute([(1.0, "moe", ENTER)], 0.0, 4.0)


def test_phase_is_free_outside_the_modes():
    free = phase("moe")
    assert phase("attention") is free  # one shared no-op: nothing made per call
    with profile.timing("cpu") as log:
        with phase("moe"), phase("collective"):
            pass
        with pytest.raises(RuntimeError, match="does not nest"):
            with profile.timing("cpu"):
                pass
    assert [(name, kind) for _, name, kind in log] == [("moe", ENTER), ("collective", ENTER), ("collective", EXIT),
                                                        ("moe", EXIT)]
    with phase("moe"):
        pass
    assert len(log) == 4 and phase("moe") is free


def _expected_intervals(cfg) -> dict:
    from dsv4.layout import CONFIG as LAYOUT

    n = cfg.num_hidden_layers
    compressed = sum(1 for i in range(n) if cfg.compress_rate(i))
    # the stacked x linear launched first (layout xproj_first) is a compressor interval of its own before the query's
    first = 2 if LAYOUT["xproj_first"] and LAYOUT["fuse_xproj"] else 1
    return {"attention": n, "moe": n, "mhc": 2 * n + 1, "collective": 2 * n + 1, "compressor": first * compressed,
            "indexer": sum(1 for t in cfg.layer_types if t == CSA), "head": 1, "sampler": 1, "commit": 1}


def _check_breakdown(model, rec, idle=()):
    """idle: phases that may take no time (on one GPU a collective has no device work between its events)."""
    phases = rec["phases_us_per_token"]
    assert list(phases) == list(PHASES) + ["other"]
    expected = _expected_intervals(model.cfg)
    assert {p: phases[p]["intervals"] for p in expected} == expected
    for p in PHASES:
        assert phases[p]["us"] >= 0 if p in idle else phases[p]["us"] > 0, p
    # per step the phases sum to the step exactly; the means keep that (0.1 us: the records' rounding)
    assert sum(v["us_mean"] for v in phases.values()) == pytest.approx(rec["instrumented_us_mean"], abs=0.1)
    # (medians of parts need not add up to the median step: on a loaded CPU they drift apart, so no bound here)
    assert rec["overhead_us_per_token"] == pytest.approx(rec["instrumented_us_per_token"] - rec["plain_us_per_token"],
                                                         abs=0.11)
    assert rec["marks_per_token"] == 2 * sum(v["intervals"] for p, v in phases.items() if p != "other")


def _profiled(device, dtype):
    model = dsv4.load("tiny", device=device, dtype=dtype, seed=2)
    state = model.new_state(64)
    model.prefill(state, list(range(1, 30)))
    before = model.digests(state)
    rec = model.profile_steps(state, 5, SAMPLING, steps=3, replays=4)
    assert model.digests(state) == before and state.host_pos == 29  # the profile leaves the state as it was
    return model, state, rec


def test_profile_steps_phases_and_bytes():
    model, state, rec = _profiled("cpu", torch.float32)
    cfg = model.cfg
    _check_breakdown(model, rec)
    assert rec["timed_tokens"] == 4
    b = rec["bytes_per_token"]
    # one rank owns every expert: each layer runs its k routed experts per token
    assert b["local_expert_runs_per_token"] == cfg.num_experts_per_tok * cfg.num_hidden_layers
    experts = model.transformer.layers[-1]["ffn"]["experts"]
    one = sum(w.data.numel() * w.data.element_size() for w in experts.values()) // experts["w1"].data.shape[0]
    assert b["routed_experts"] == b["local_expert_runs_per_token"] * one
    head = model.transformer.head_w.data
    assert b["head"] >= head.numel() * head.element_size()
    assert b["total"] == b["dense"] + b["routed_experts"] + b["head"] + b["embedding_row"] + b["cache"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graph_phases_on_cuda():
    """The timed graph's breakdown: every phase's event nodes, summing to the replay; the state untouched, so
    the next step is the one an unprofiled copy takes."""
    model, state, rec = _profiled("cuda", None)
    _check_breakdown(model, rec, idle=("collective",))
    copy = model.new_state(state.capacity)
    copy.restore(state)
    assert model.step(state, 5, SAMPLING) == model.step(copy, 5, SAMPLING)
    assert model.digests(state) == model.digests(copy)


def test_bench_profile_record_on_cpu(capsys):
    """dsv4 bench --profile on CPU: one BENCH_PROFILE, labelled as the eager perf_counter breakdown."""
    import json

    from dsv4.bench import PROFILE_SCOPE, run_bench

    model = dsv4.load("tiny", device="cpu", dtype=torch.float32, seed=2)
    assert run_bench(model, prime=12, steps=2, rows=1, build_s=0.0, preset="tiny", profile=True) == 0
    records = [line.split(" ", 1) for line in capsys.readouterr().out.splitlines()]
    (rec,) = [json.loads(r) for tag, r in records if tag == "BENCH_PROFILE"]
    assert rec["scope"] == PROFILE_SCOPE[False] and rec["timed_tokens"] == 2 and rec["rank"] == 0
    _check_breakdown(model, rec)


def test_profile_steps_on_two_ranks():
    """Every rank times its own marks (each rank's collectives in lockstep with the other's)."""
    with dsv4.load("tiny", device="cpu", dtype=torch.float32, seed=2, ranks=2) as model:
        state = model.new_state(32)
        model.prefill(state, list(range(1, 12)))
        recs = model.each("profile_steps", state, 5, SAMPLING, 2, 2)
        assert len(recs) == 2 and state.host_pos == 11
        for rec in recs:
            _check_breakdown(model, rec)
