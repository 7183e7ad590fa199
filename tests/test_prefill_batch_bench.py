"""benchmarks/prefill_batch_bench.py's --arm (in-process A/B of CONFIG settings) on `tiny`, CPU: each arm's wave is
timed interleaved with the defaults, its digest compared with theirs, and every setting put back afterwards."""

from __future__ import annotations

import json
import sys

import pytest

import benchmarks.prefill_batch_bench as bench
from dsv4.kernels import geometry, moe, moe_tc


def records(lines, kind):
    return [json.loads(line.split(" ", 1)[1]) for line in lines if line.startswith(kind + " ")]


def test_arms_run_interleaved_and_put_the_settings_back(monkeypatch, capsys):
    before = (geometry.CONFIG["chunks"], moe.CONFIG["shared_prefill_tiles"], moe_tc.CONFIG["wave_tiles"])
    monkeypatch.setattr(sys, "argv", ["prefill_batch_bench", "tiny", "--device", "cpu", "--states", "2", "--tokens",
                                      "8", "--runs", "2", "--arm", "geom0=geometry.chunks=0",
                                      "--arm", "both=moe.shared_prefill_tiles=1,moe_tc.wave_tiles=1"])
    assert bench.main() == 0
    ab = records(capsys.readouterr().out.splitlines(), "PREFILL_BATCH_AB")
    assert [r["arm"] for r in ab] == ["defaults", "geom0", "both"]
    assert ab[1]["settings"] == {"chunks": False}
    assert ab[2]["settings"] == {"shared_prefill_tiles": True, "wave_tiles": True}
    # on the CPU's torch path none of these switches changes a bit; each arm ran --runs timed rounds
    assert all(r["digest_as_defaults"] and r["runs"] == 2 and r["min_s"] <= r["grouped_s"] <= r["max_s"] for r in ab)
    assert (geometry.CONFIG["chunks"], moe.CONFIG["shared_prefill_tiles"], moe_tc.CONFIG["wave_tiles"]) == before


@pytest.mark.parametrize("spec,message", [("nokey=moe.nokey=1", "has no key 'nokey'"),
                                          ("noequals", "expected NAME=module.key=value")])
def test_a_bad_arm_is_refused_before_the_model_is_built(monkeypatch, spec, message):
    monkeypatch.setattr(sys, "argv", ["prefill_batch_bench", "tiny", "--device", "cpu", "--arm", spec])
    monkeypatch.setattr(bench.dsv4, "load", lambda *a, **k: pytest.fail("built a model for a bad --arm"))
    with pytest.raises(SystemExit, match=message):
        bench.main()
