"""benchmarks/decode_ab_bench.py (in-process A/B of kernel CONFIG settings on solo decode) on `tiny`, CPU: every arm
timed in each round, its stream compared with the defaults', and every setting put back afterwards."""

from __future__ import annotations

import json
import sys

import benchmarks.decode_ab_bench as bench
from dsv4.kernels import attention, hc_boundary


def records(lines, kind):
    return [json.loads(line.split(" ", 1)[1]) for line in lines if line.startswith(kind + " ")]


def test_arms_run_interleaved_and_put_the_settings_back(monkeypatch, capsys):
    before = (attention.CONFIG["fused_combine"], hc_boundary.CONFIG["block_d"])
    monkeypatch.setattr(sys, "argv", ["decode_ab_bench", "--preset", "tiny", "--device", "cpu", "--prime", "6",
                                      "--steps", "3", "--rounds", "2", "--arm", "fused=attention.fused_combine=1",
                                      "--arm", "d64=hc_boundary.block_d=64,attention.fused_combine=0"])
    assert bench.main() == 0
    out = capsys.readouterr().out.splitlines()
    ab = records(out, "DECODE_AB")
    assert [r["arm"] for r in ab] == ["defaults", "fused", "d64"]
    assert ab[1]["settings"] == {"fused_combine": True}
    assert ab[2]["settings"] == {"block_d": 64, "fused_combine": False}
    # on the CPU's torch path these settings change no bit; one stream an arm; the defaults' ratio is 1
    assert all(r["same_stream_as_defaults"] and r["streams"] == 1 and r["eager_tok_s"] > 0 for r in ab)
    assert ab[0]["eager_over_defaults"] == 1.0
    assert [r["arm"] for r in records(out, "DECODE_AB_ROW")] == ["defaults", "fused", "d64", "d64", "fused",
                                                                  "defaults"]
    assert (attention.CONFIG["fused_combine"], hc_boundary.CONFIG["block_d"]) == before
