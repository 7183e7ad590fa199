"""QWeight dequantisation: the whole-block fast path equals the general (sliced) path bit for bit."""

import pytest
import torch

from dsv4.formats import QWeight, quantize_fp4, quantize_fp8


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt", ["fp8", "fp4"])
def test_block_path_equals_general_path(fmt, dtype):
    quant = quantize_fp8 if fmt == "fp8" else quantize_fp4
    w = torch.randn(3, 256, 384, generator=torch.Generator().manual_seed(0))
    parts = [quant(w[i]) for i in range(3)]
    q = QWeight(torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]), fmt)
    fast = q.dequant(dtype)
    assert torch.equal(fast, q._dequant_any(dtype))
    # a slice that starts inside a block takes the general path and still agrees with the whole
    if fmt == "fp8":
        part = QWeight(q.data[:, 64:192], q.scale[:, 0:2], fmt, row0=64)
        assert torch.equal(part.dequant(dtype), fast[:, 64:192])
    assert (fast.float() - w).abs().max() < 0.6 * w.abs().max()
