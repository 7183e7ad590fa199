"""benchmarks/pick_arm.py: which v3 arm of a qgemv_bench --rows run is taken further (session 25's calls)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from pick_arm import pick  # noqa: E402


ARMS = "^v3_(whole|fast)"


def rows(variant, us1, us16):
    return [f'QGEMV_ROWS {json.dumps({"rows": 1, "variant": variant, "us": us1})}',
            f'QGEMV_ROWS {json.dumps({"rows": 16, "variant": variant, "us": us16})}']


def shape(variant, bits=True, exact=True):
    return f'QGEMV {json.dumps({"variant": variant, "bits_as_v3_default": bits, "rows_exact": exact})}'


def test_the_fastest_arm_that_keeps_the_bits_and_beats_the_default_by_5_percent_everywhere():
    base = rows("v3_default", 56.0, 60.0)
    assert pick(ARMS, base + rows("v3_whole", 50.0, 55.0) + [shape("v3_whole")]) == "v3_whole"
    # faster still, but other bits in one shape / a row not its own: not taken
    assert pick(ARMS, base + rows("v3_fast", 40.0, 45.0) + [shape("v3_fast"), shape("v3_fast", bits=False)]) is None
    assert pick(ARMS, base + rows("v3_fast", 40.0, 45.0) + [shape("v3_fast", exact=False)]) is None
    # 5 % at one row count only: not taken
    assert pick(ARMS, base + rows("v3_whole_w8", 50.0, 58.0) + [shape("v3_whole_w8")]) is None
    both = base + rows("v3_whole", 50.0, 55.0) + rows("v3_whole_w8", 45.0, 52.0) + [shape("v3_whole"),
                                                                                      shape("v3_whole_w8")]
    assert pick(ARMS, both) == "v3_whole_w8"
    assert pick("^v3_whole$", both) == "v3_whole" and pick("^v3_fast", both) is None  # only arms the regex names
    assert pick(ARMS, rows("v3_whole", 50.0, 55.0) + [shape("v3_whole")]) is None  # no default to beat
