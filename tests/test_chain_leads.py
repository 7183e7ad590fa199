"""benchmarks/chain_leads.py: the leads and the added time of each (predecessor, successor) pair of a kernel_table
--sequence record, on a hand-made sequence (CPU)."""

from __future__ import annotations

import json

import pytest

import benchmarks.chain_leads as chain


def seq(arm, i, name, start, us, advance):
    return "KERNEL_SEQ " + json.dumps({"arm": arm, "rank": 0, "i": i, "name": name, "start_us": start, "us": us,
                                       "advance_us": advance})


def test_leads_medians_and_order(tmp_path, capsys):
    # A ends at 10, B starts at 8 (lead 2) and ends at 15 (adds 5); B ends 15, C starts 15 (lead 0), adds 1 ... twice
    lines = [seq("graph", 0, "A", 0, 10, 10), seq("graph", 1, "B", 8, 7, 5), seq("graph", 2, "C", 15, 1, 1),
             seq("graph", 3, "A", 16, 10, 10), seq("graph", 4, "B", 22, 7, 3), seq("graph", 5, "C", 29, 1, 1),
             seq("eager", 0, "A", 0, 1, 1)]
    record = tmp_path / "seq.txt"
    record.write_text("\n".join(lines) + "\n")
    chain.main([str(record)])
    rows = [json.loads(line.split(" ", 1)[1]) for line in capsys.readouterr().out.splitlines()
            if line.startswith("CHAIN_LEAD ")]
    by = {(r["pred"], r["succ"]): r for r in rows}
    assert set(by) == {("A", "B"), ("B", "C"), ("C", "A")}
    ab = by[("A", "B")]
    assert ab["n"] == 2 and ab["lead_us"] == 3.0 and ab["past_us"] == 4.0 and ab["advance_sum_us"] == 8.0  # leads 2, 4
    assert by[("B", "C")]["lead_us"] == 0.0 and by[("C", "A")]["lead_us"] == 0.0
    # ordered by the pairs' summed advance: C -> A (A's 10, once), A -> B (5 + 3), B -> C (1 + 1)
    assert [(r["pred"], r["succ"], r["advance_sum_us"]) for r in rows] == [("C", "A", 10.0), ("A", "B", 8.0),
                                                                           ("B", "C", 2.0)]


def test_a_record_without_a_sequence_is_refused(tmp_path):
    record = tmp_path / "table.txt"
    record.write_text('KERNEL_ROW {"arm": "graph"}\n')
    with pytest.raises(SystemExit, match="no KERNEL_SEQ rows"):
        chain.main([str(record)])
