"""A batched step's (token, expert) pairs grouped by expert (dsv4.kernels.expert_groups): the table the kernel
writes says what the ids say (expert_groups.reference), for steps with every pair its own expert, with every pair
one expert (groups of 8 and a partial one), with a few experts for 240 pairs (a group's pairs written by several
programs), and with random ids; on the interpreter or the GPU."""

from __future__ import annotations

import pytest
import torch

from dsv4.kernels import expert_groups

pytest.importorskip("triton")

from quantised_cases import DEVICES  # noqa: E402


def _groups(table: torch.Tensor) -> list[tuple[int, int, list[int]]]:
    """(leading pair, expert, pairs) of each row with a count, rows ascending."""
    out = []
    for p, row in enumerate(table.tolist()):
        count = row[1]
        assert 0 <= count <= expert_groups.GROUP, (p, row)
        if count:
            out.append((p, row[0], row[2:2 + count]))
    return out


@pytest.mark.skipif(not DEVICES, reason="needs triton's interpreter or a GPU")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["distinct", "one_expert", "random_16x6", "random_32x6", "crowded", "one_token"])
@pytest.mark.parametrize("blocks", [False, True], ids=["one_program", "blocks"])
def test_the_table_is_the_ids_grouped(monkeypatch, device, case, blocks):
    """Both forms of the kernel (CONFIG blocks): one program, or programs of BLOCK pairs."""
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    monkeypatch.setitem(expert_groups.CONFIG, "blocks", blocks)
    g = torch.Generator().manual_seed(5)
    ids = {"distinct": torch.randperm(60, generator=g)[:48].view(8, 6),
           "one_expert": torch.full((13, 6), 77),  # 78 pairs: 9 groups of 8, one of 6
           "random_16x6": torch.randint(0, 256, (16, 6), generator=g),
           "random_32x6": torch.randint(0, 24, (32, 6), generator=g),  # ~8 pairs an expert: full and split groups
           "crowded": torch.randint(0, 5, (40, 6), generator=g),  # ~48 pairs an expert, leaders in every program
           "one_token": torch.tensor([[5, 9, 200, 3, 17, 44]])}[case].to(device)
    table = expert_groups.groups(ids)
    assert table.shape == (ids.numel(), expert_groups.GROUP_ROW) and table.dtype == torch.int32
    groups = _groups(table.cpu())
    assert groups == expert_groups.reference(ids.cpu())
    pairs = sorted(p for _, _, members in groups for p in members)
    assert pairs == list(range(ids.numel()))  # every pair in exactly one group
    flat = ids.flatten().tolist()
    assert all(flat[p] == e for _, e, members in groups for p in members)
    if case == "one_expert":
        assert [len(m) for _, _, m in groups] == [8] * 9 + [6]
    if case == "distinct":
        assert [len(m) for _, _, m in groups] == [1] * 48


def test_reference_groups_in_pair_order():
    """The reference itself, on a hand case: an expert's 9th pair leads a second group; other experts' pairs in
    between do not break a group."""
    ids = torch.tensor([[4] * 5 + [2], [4] * 4 + [2, 2]])
    assert expert_groups.reference(ids) == [(0, 4, [0, 1, 2, 3, 4, 6, 7, 8]), (5, 2, [5, 10, 11]), (9, 4, [9])]
