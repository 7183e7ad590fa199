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
@pytest.mark.parametrize("case", ["distinct", "one_expert", "random_16x6", "random_32x6", "crowded", "one_token",
                                  "prefill_200x6"])
@pytest.mark.parametrize("blocks", [False, True], ids=["one_program", "blocks"])
def test_the_table_is_the_ids_grouped(monkeypatch, device, case, blocks):
    """Both forms of the kernel (CONFIG blocks): one program, or programs of BLOCK pairs. prefill_200x6 (1,200 pairs,
    a short prefill chunk's size, past MAX_PAIRS): the blocks form only (supported() refuses it to the one program)."""
    if case == "prefill_200x6" and not blocks:
        pytest.skip("past MAX_PAIRS: the one-program form is never asked (test_supported_by_form)")
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    monkeypatch.setitem(expert_groups.CONFIG, "blocks", blocks)
    g = torch.Generator().manual_seed(5)
    ids = {"distinct": torch.randperm(60, generator=g)[:48].view(8, 6),
           "one_expert": torch.full((13, 6), 77),  # 78 pairs: 9 groups of 8, one of 6
           "random_16x6": torch.randint(0, 256, (16, 6), generator=g),
           "random_32x6": torch.randint(0, 24, (32, 6), generator=g),  # ~8 pairs an expert: full and split groups
           "crowded": torch.randint(0, 5, (40, 6), generator=g),  # ~48 pairs an expert, leaders in every program
           "one_token": torch.tensor([[5, 9, 200, 3, 17, 44]]),
           "prefill_200x6": torch.randint(0, 256, (200, 6), generator=g)}[case].to(device)
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


@pytest.mark.skipif(not DEVICES, reason="needs triton's interpreter or a GPU")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["prefill_63x6", "crowded", "few_pairs"])
@pytest.mark.parametrize("blocks", [False, True], ids=["one_program", "blocks"])
def test_the_dense_table_holds_the_same_groups(monkeypatch, device, case, blocks):
    """groups(ids, experts): where the pairs outnumber the groups they can make (bound()), the table is dense: the
    leading rows in pair order, then rows of count 0, bound() rows in all; the groups those of the sparse table. Few
    pairs (fewer than bound's) keep the sparse table."""
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    monkeypatch.setitem(expert_groups.CONFIG, "blocks", blocks)
    g = torch.Generator().manual_seed(7)
    experts = {"prefill_63x6": 256, "crowded": 5, "few_pairs": 256}[case]
    T = {"prefill_63x6": 63, "crowded": 40, "few_pairs": 4}[case]
    ids = torch.stack([torch.randperm(experts, generator=g)[:6] if experts >= 6 else
                       torch.randint(0, experts, (6,), generator=g) for _ in range(T)]).to(device)
    P = ids.numel()
    rows = expert_groups.bound(P, experts)
    table = expert_groups.groups(ids, experts)
    assert table.shape == (rows, expert_groups.GROUP_ROW)
    want = expert_groups.reference(ids.cpu())
    if case == "few_pairs":
        assert rows == P and _groups(table.cpu()) == want
        return
    assert rows < P
    dense = table.cpu().tolist()
    assert [(row[0], row[2:2 + row[1]]) for row in dense[:len(want)]] == [(e, m) for _, e, m in want]
    assert all(row[1] == 0 for row in dense[len(want):])


def test_the_bound():
    """bound(pairs, experts): at most pairs / GROUP + the experts picked groups, never more rows than pairs."""
    assert expert_groups.bound(378, 256) == 48 + 256
    assert expert_groups.bound(6048, 256) == 756 + 256
    assert expert_groups.bound(192, 256) == 192 and expert_groups.bound(12, None) == 12
    g = torch.Generator().manual_seed(3)
    for experts, T in ((256, 63), (8, 40), (48, 200), (300, 20)):
        ids = torch.stack([torch.randperm(experts, generator=g)[:6] for _ in range(T)])
        assert len(expert_groups.reference(ids)) <= expert_groups.bound(ids.numel(), experts)


def test_supported_by_form(monkeypatch):
    """The one-program form counts at most MAX_PAIRS pairs; the blocks form up to MAX_BLOCK_PAIRS (a consumer's grid
    axis); neither takes float ids or an empty step."""
    ids = torch.zeros(expert_groups.MAX_PAIRS // 6 + 1, 6, dtype=torch.int64)  # just past MAX_PAIRS
    monkeypatch.setitem(expert_groups.CONFIG, "blocks", False)
    assert not expert_groups.supported(ids) and expert_groups.supported(ids[:-1])
    monkeypatch.setitem(expert_groups.CONFIG, "blocks", True)
    assert expert_groups.supported(ids)
    assert not expert_groups.supported(torch.zeros(expert_groups.MAX_BLOCK_PAIRS // 6 + 1, 6, dtype=torch.int64))
    assert not expert_groups.supported(ids.float()) and not expert_groups.supported(ids[:0])


def test_reference_groups_in_pair_order():
    """The reference itself, on a hand case: an expert's 9th pair leads a second group; other experts' pairs in
    between do not break a group."""
    ids = torch.tensor([[4] * 5 + [2], [4] * 4 + [2, 2]])
    assert expert_groups.reference(ids) == [(0, 4, [0, 1, 2, 3, 4, 6, 7, 8]), (5, 2, [5, 10, 11]), (9, 4, [9])]
