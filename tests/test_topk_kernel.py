"""The indexer's one-launch top-k (dsv4.kernels.topk) against torch.topk, its reference in
dsv4.kernels.compressor.topk. Exact: indices and valid flags equal bit for bit (integers, distinct keys).

Keys are drawn as index_keys writes them: a 32-bit score code above the key's own column. Codes come from a
small set (many equal scores: the column breaks the tie) that includes invisible entries (-inf's code and
above), so the valid flag is both true and false in a row. On CPU the kernel runs through Triton's interpreter.
"""

from __future__ import annotations

import pytest
import torch

from dsv4 import kernels
from dsv4.kernels import compressor
from dsv4.kernels import topk as topk_kernel
from dsv4.syncguard import NoHostSync

pytest.importorskip("triton")

DEVICES = (["cpu"] if kernels.interpreting() else []) + (["cuda"] if torch.cuda.is_available() else [])
INVISIBLE = 0x7F800000  # a score code at or above it: key >= compressor._VISIBLE_BELOW


def sort_keys(T: int, N: int, seed: int, device) -> torch.Tensor:
    """Distinct keys [T, N] as index_keys makes them: code << 32 | column, codes drawn with many repeats."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.cat([torch.randint(-2 ** 31, 2 ** 31, (5,), generator=g),
                       torch.tensor([INVISIBLE, INVISIBLE + 1, -2 ** 31, 2 ** 31 - 1])])
    code = codes[torch.randint(0, codes.numel(), (T, N), generator=g)]
    return ((code << 32) | torch.arange(N)).to(device)


def reference(keys: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    top = torch.topk(keys, k, dim=-1, largest=False, sorted=True)
    return top.indices, top.values < compressor._VISIBLE_BELOW


# (T, N, k): k == N (a full sort), N not a power of two, k not one, one key, Flash's k over a small store.
CASES = [(1, 1, 1), (3, 7, 7), (2, 100, 13), (4, 33, 32), (2, 300, 64), (1, 512, 512), (1, 1027, 512)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T,N,k", CASES)
def test_equals_torch_topk(monkeypatch, device, T, N, k):
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    keys = sort_keys(T, N, seed=T * 1000 + N + k, device=device)
    ref_sel, ref_valid = reference(keys, k)
    assert topk_kernel.supported(keys, k)
    sel, valid = compressor.topk(keys, k)
    assert sel.dtype == torch.int64 and valid.dtype == torch.bool
    assert torch.equal(sel, ref_sel) and torch.equal(valid, ref_valid)


@pytest.mark.parametrize("device", DEVICES)
def test_valid_flag_at_the_visibility_edge(monkeypatch, device):
    """The last finite score's code (just below -inf's) is valid, -inf's is not, whatever their columns."""
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    code = torch.tensor([[INVISIBLE, INVISIBLE - 1, INVISIBLE, INVISIBLE - 1, 0, -1]])
    keys = ((code << 32) | torch.arange(6)).to(device)
    sel, valid = compressor.topk(keys, 6)
    assert sel.tolist() == [[5, 4, 1, 3, 0, 2]]
    assert valid.tolist() == [[True, True, True, True, False, False]]


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_and_no_host_sync(monkeypatch, device):
    """The same bytes twice, and no host sync (the step holding it is captured in a CUDA graph)."""
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    keys = sort_keys(3, 200, seed=1, device=device)
    first = compressor.topk(keys, 16)
    with NoHostSync():
        second = compressor.topk(keys, 16)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_long_rows_keep_torch_topk():
    """Above MAX_N keys a row, or keys not laid out as one row each, the wrapper takes torch.topk (the shape
    decides, not the data)."""
    keys = torch.zeros(1, topk_kernel.MAX_N + 1, dtype=torch.int64)
    assert not topk_kernel.supported(keys, 512)
    assert topk_kernel.supported(keys[:, :topk_kernel.MAX_N], 512)
    assert not topk_kernel.supported(torch.zeros(4, 2, dtype=torch.int64).t(), 1)
    assert not topk_kernel.supported(torch.zeros(1, 8, dtype=torch.int64), 0)


def test_long_rows_equal_torch_topk_through_the_wrapper(monkeypatch):
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    keys = sort_keys(1, topk_kernel.MAX_N + 3, seed=2, device="cpu")
    sel, valid = compressor.topk(keys, 512)
    ref_sel, ref_valid = reference(keys, 512)
    assert torch.equal(sel, ref_sel) and torch.equal(valid, ref_valid)
