"""benchmarks/hf_generate_bench.py on tiny (CPU, fp32): both arms decode the same greedy tokens, every record is
printed with positive timings, and bad sizes are refused by name."""

import json

import pytest

from benchmarks import hf_generate_bench as bench


def _records(out: str, kind: str) -> list[dict]:
    return [json.loads(line.split(" ", 1)[1]) for line in out.splitlines() if line.startswith(kind + " ")]


def test_dsv4_and_hf_decode_the_same_greedy_tokens(capsys):
    assert bench.main(["--preset", "tiny", "--device", "cpu", "--dtype", "float32", "--prompt-tokens", "12",
                       "--new-tokens", "6", "--rows", "1"]) == 0
    out = capsys.readouterr().out
    rows = _records(out, "HF_GENERATE_ROW")
    assert sorted(r["arm"] for r in rows) == ["eager", "hf"] and all(r["ms_per_token"] > 0 for r in rows)
    (summary,) = _records(out, "HF_GENERATE")
    assert summary["same_prefix"] == 6  # fp32: HF's greedy tokens are dsv4's, all of them
    assert summary["dsv4_arm"] == "eager" and summary["device"] == "cpu"
    assert summary["dsv4_over_hf"] == round(summary["hf_ms_per_token"] / summary["eager_ms_per_token"], 2)


def test_same_prefix_counts_the_agreeing_start():
    assert bench.same_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert bench.same_prefix([1, 2], [1, 2, 3]) == 2
    assert bench.same_prefix([], [1]) == 0


def test_sizes_are_checked(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--preset", "tiny", "--device", "cpu", "--new-tokens", "1"])
    assert "--new-tokens >= 2" in capsys.readouterr().err
