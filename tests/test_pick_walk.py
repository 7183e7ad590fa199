"""benchmarks/pick_walk.py: which v3_walkP arm of a qgemv_bench --rows run is taken further (session 25 call 3)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from pick_walk import pick  # noqa: E402


def rows(variant, us1, us16):
    return [f'QGEMV_ROWS {json.dumps({"rows": 1, "variant": variant, "us": us1})}',
            f'QGEMV_ROWS {json.dumps({"rows": 16, "variant": variant, "us": us16})}']


def shape(variant, bits=True, exact=True):
    return f'QGEMV {json.dumps({"variant": variant, "bits_as_v3_default": bits, "rows_exact": exact})}'


def test_the_fastest_arm_that_keeps_the_bits_and_beats_the_default_by_5_percent_everywhere():
    base = rows("v3_default", 56.0, 60.0)
    assert pick(base + rows("v3_walk128", 50.0, 55.0) + [shape("v3_walk128")]) == 128
    # faster still, but other bits in one shape / a row not its own: not taken
    assert pick(base + rows("v3_walk64", 40.0, 45.0) + [shape("v3_walk64"), shape("v3_walk64", bits=False)]) is None
    assert pick(base + rows("v3_walk64", 40.0, 45.0) + [shape("v3_walk64", exact=False)]) is None
    # 5 % at one row count only: not taken
    assert pick(base + rows("v3_walk256", 50.0, 58.0) + [shape("v3_walk256")]) is None
    both = base + rows("v3_walk128", 50.0, 55.0) + rows("v3_walk256", 45.0, 52.0) + [shape("v3_walk128"),
                                                                                      shape("v3_walk256")]
    assert pick(both) == 256
    assert pick(rows("v3_walk128", 50.0, 55.0) + [shape("v3_walk128")]) is None  # no default to beat
