"""Receipts: one emitter of tagged JSON records (dsv4.receipts), used by the gate, `dsv4 bench` and
every benchmark script."""

from __future__ import annotations

import json
from pathlib import Path

from dsv4.receipts import Receipts, emit, provenance

ROOT = Path(__file__).resolve().parents[1]


def test_a_record_is_its_kind_and_one_json_object(tmp_path, capsys):
    out = tmp_path / "r.txt"
    r = Receipts(out)
    r.emit("KIND", {"a": 1}, b=[2, 3])
    r.note("PASS something")
    r.close()
    emit("OTHER", c=None)
    lines = capsys.readouterr().out.splitlines()
    assert lines == ['KIND {"a":1,"b":[2,3]}', "PASS something", 'OTHER {"c":null}']
    assert out.read_text().splitlines() == lines[:2]


def test_provenance_names_the_conditions():
    p = provenance("cpu", "tiny")
    assert set(p) == {"commit", "torch", "device", "device_name", "kernels", "gemv", "prefill_gemv", "fuse_qkv",
                      "fuse_xproj", "pdl", "sampler", "preset"}
    assert p["device"] == "cpu" and p["preset"] == "tiny" and p["kernels"] in ("auto", "torch", "triton")
    assert p["sampler"] in ("inverse", "gumbel")
    json.dumps(p)


def test_every_benchmark_script_writes_through_receipts():
    scripts = sorted((ROOT / "benchmarks").glob("*.py"))
    assert scripts
    for script in scripts:
        text = script.read_text()
        assert "from dsv4.receipts import" in text, script.name
        assert "json.dumps" not in text and "print(" not in text, f"{script.name} prints its own records"
