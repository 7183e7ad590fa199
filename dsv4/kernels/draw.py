"""The sampler's counter-based draw in one launch (reference: dsv4.sampler._uniform_keyed, ~18 int64 ops):
u = (mix(key + (pos + 1) * G) >> 40) * 2**-24 per row, in uint64 arithmetic (wrapping products, logical
shifts), so every bit is the reference's."""

import torch

from . import cdiv, device_function, launcher, pdl_wait

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = True  # session 7 call 1: replay + pool tests with it in the graphs (DSV4_KERNELS=triton)

# dsv4.sampler's SplitMix64 constants (uint64 in the kernel: Triton types ints of [2**63, 2**64) so).
_G = constexpr(0x9E3779B97F4A7C15)
_M1 = constexpr(0xBF58476D1CE4E5B9)
_M2 = constexpr(0x94D049BB133111EB)
_BLOCK = 128


def _u(key, pos):
    """u(seed, pos) from the seed's key and the position (int64 bits), in uint64 arithmetic; also the sampler's
    token kernel's (dsv4.kernels.sample)."""
    z = (pos.to(tl.uint64, bitcast=True) + 1) * _G + key.to(tl.uint64, bitcast=True)
    z = (z ^ (z >> 30)) * _M1
    z = (z ^ (z >> 27)) * _M2
    z = z ^ (z >> 31)
    return (z >> 40).to(tl.float32) * 5.9604644775390625e-08  # 2**-24: exact


u_of = device_function(_u)


def _draw_kernel(key_ptr, pos_ptr, u_ptr, n, BLOCK: constexpr):
    pdl_wait()
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    tl.store(u_ptr + i, u_of(tl.load(key_ptr + i, mask=ok, other=0), tl.load(pos_ptr + i, mask=ok, other=0)),
             mask=ok)


def supported(key: torch.Tensor, pos: torch.Tensor) -> bool:
    return key.dtype == pos.dtype == torch.int64 and key.dim() == pos.dim() == 1 and key.shape == pos.shape


def uniform(key: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """key [B] (a seed's key, int64 bits), pos [B] int64 -> u [B] float32 in [0, 1)."""
    u = torch.empty(key.shape, dtype=torch.float32, device=key.device)
    n = key.numel()
    launcher(_draw_kernel, key)[(cdiv(n, _BLOCK),)](key.contiguous(), pos.contiguous(), u, n, BLOCK=_BLOCK)
    return u
