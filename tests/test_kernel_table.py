"""benchmarks/kernel_table.py: the per-kernel table of a step (a CPU smoke run: torch ops, host time)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from dsv4.measure import advances, short_kernel_name


def _script():
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "kernel_table.py"
    spec = importlib.util.spec_from_file_location("kernel_table", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_short_kernel_name_drops_void_and_parameters():
    kernel = "at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>, std::array<char*, 3> >"
    assert short_kernel_name(f"void {kernel}(int, at::native::AddFunctor<float>, std::array<char*, 3>)") == kernel
    assert short_kernel_name("_commit_step_kernel") == "_commit_step_kernel"
    assert short_kernel_name("Memcpy HtoD (Pageable -> Device)") == "Memcpy HtoD"
    assert len(short_kernel_name("k<" + "x" * 300 + ">", width=50)) == 50


def test_kernel_table_smoke_on_cpu(tmp_path):
    out = tmp_path / "table.txt"
    assert _script().main(["--preset", "tiny", "--device", "cpu", "--steps", "2", "--top", "3", "--out", str(out)]) == 0
    records = [line.split(" ", 1) for line in out.read_text().splitlines()]
    rows = [json.loads(r) for tag, r in records if tag == "KERNEL_ROW"]
    totals = [json.loads(r) for tag, r in records if tag == "KERNEL_TOTAL"]
    assert len(rows) == 3 and [r["arm"] for r in rows] == ["eager"] * 3  # no graph arm on CPU
    assert rows == sorted(rows, key=lambda r: -r["us_per_token"]) and all(r["calls_per_token"] > 0 for r in rows)
    (total,) = totals
    assert total["arm"] == "eager" and total["rank"] == 0 and total["preset"] == "tiny" and total["steps"] == 2
    assert total["kernels_per_token"] >= sum(r["calls_per_token"] for r in rows)
    assert total["kernel_us_per_token"] >= sum(r["us_per_token"] for r in rows) - 1
    assert total["wall_ms_per_token"] > 0 and total["distinct"] >= 3


def test_advances_charge_each_activity_what_it_moved_the_frontier():
    """Overlapping activities (PDL: a kernel starts before its predecessor ends) are charged only their advance of
    the latest end; a start past it is idle; advances + idle = the span; the last token's sequence in order."""
    # token 0: a [0, 10], b [4, 12] (overlaps a: +2), c [12, 13] (+1); idle 5; token 1: a [18, 30], b [20, 25]
    # (inside a: +0), c [31, 35] (1 idle, +4)
    spans = [(18.0, 30.0, "a"), (0.0, 10.0, "a"), (4.0, 12.0, "b"), (12.0, 13.0, "c"), (20.0, 25.0, "b"),
             (31.0, 35.0, "c")]
    got = advances(spans, 2)
    assert got["advance_us_per_token"] == {"a": 11.0, "b": 1.0, "c": 2.5}
    assert got["idle_us_per_token"] == 3.0 and got["span_us_per_token"] == 17.5
    assert sum(got["advance_us_per_token"].values()) + got["idle_us_per_token"] == got["span_us_per_token"]
    assert [(r["name"], r["start_us"], r["us"], r["advance_us"]) for r in got["sequence"]] == [
        ("a", 0.0, 12.0, 12.0), ("b", 2.0, 5.0, 0.0), ("c", 13.0, 4.0, 4.0)]
    assert advances([], 1)["span_us_per_token"] == 0.0
