"""The Gumbel-max draw in two launches (reference: dsv4.sampler._token_gumbel; DSV4_SAMPLER=gumbel).

1. `_chunk_kernel`, a program per (row, chunk): each token's G index (SplitMix64 output i + 1 of the row's draw
   state, its top 24 bits: dsv4.sampler._gumbel_index), z = logits / temperature + table[index] over the kept tokens
   (a greedy row: its logits, every token), and the chunk's largest z with its lowest id.
2. `_pick_kernel`, a program per row: the largest of the chunks' values, its lowest id.
The arithmetic is the reference's op for op (one fp32 division, one fp32 add of a value read from the shared
table, comparisons), so the token is the reference's bit for bit, not only within rounding as the inverse draw's
kernel (dsv4.kernels.sample, whose exp and sums round their own way); a row's token is its own in any batch.
"""

import torch

from . import cdiv, device_function, interpreting, launcher, next_pow2, pdl_wait

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = False  # not yet through a GPU run: benchmarks/gpu_gumbel_call.sh

CHUNK = 4096  # tokens a program of kernel 1 reads (Flash's 129,280: 32 chunks); a power of two
_NUM_WARPS = 8

_G = constexpr(0x9E3779B97F4A7C15)
_M1 = constexpr(0xBF58476D1CE4E5B9)
_M2 = constexpr(0x94D049BB133111EB)


def _mix(z):
    z = (z ^ (z >> 30)) * _M1
    z = (z ^ (z >> 27)) * _M2
    return z ^ (z >> 31)


_mix = device_function(_mix)


def _chunk_kernel(logits_ptr, kept_ptr, temperature_ptr, key_ptr, pos_ptr, table_ptr, best_ptr, best_id_ptr, V, C,
                  BLOCK: constexpr, HAS_KEPT: constexpr):
    pdl_wait()
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    i = c * BLOCK + tl.arange(0, BLOCK)
    ok = i < V
    x = tl.load(logits_ptr + row * V + i, mask=ok, other=float("-inf")).to(tl.float32)
    t = tl.load(temperature_ptr + row)
    greedy = t == 0
    t = tl.where(greedy, 1.0, t)
    state = _mix((tl.load(pos_ptr + row).to(tl.uint64, bitcast=True) + 1) * _G
                 + tl.load(key_ptr + row).to(tl.uint64, bitcast=True))
    index = _mix(state + (i.to(tl.uint64) + 1) * _G) >> 40
    z = x / t + tl.load(table_ptr + index.to(tl.int64), mask=ok, other=0.0)
    kept = tl.load(kept_ptr + row * V + i, mask=ok, other=0) != 0 if HAS_KEPT else ok
    z = tl.where(kept & ok, z, float("-inf"))
    value = tl.where(greedy, x, z)
    best = tl.max(value, 0)
    tl.store(best_ptr + row * C + c, best)
    tl.store(best_id_ptr + row * C + c, tl.min(tl.where(ok & (value == best), i, V), 0))


def _pick_kernel(best_ptr, best_id_ptr, token_ptr, V, C, C_PAD: constexpr):
    pdl_wait()
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, C_PAD)
    live = c < C
    best = tl.load(best_ptr + row * C + c, mask=live, other=float("-inf"))
    top = tl.max(best, 0)
    ids = tl.load(best_id_ptr + row * C + c, mask=live, other=V)
    token = tl.min(tl.where(best == top, ids, V), 0)  # the chunks' lowest id among the largest
    tl.store(token_ptr + row, tl.where(token < V, token, 0).to(tl.int64))  # NaN logits: an id the embedding holds


def supported(logits: torch.Tensor, kept: torch.Tensor | None) -> bool:
    """By dtype and shape alone, as dsv4.kernels.sample's."""
    return (logits.dim() == 2 and logits.dtype in (torch.float32, torch.bfloat16)
            and (kept is None or (kept.shape == logits.shape and kept.dtype == torch.bool)))


def token(logits: torch.Tensor, temperature: torch.Tensor, key: torch.Tensor, pos: torch.Tensor,
          kept: torch.Tensor | None, table: torch.Tensor) -> torch.Tensor:
    """logits [B, V] (fp32 or bf16), temperature [B] fp32, key [B] / pos [B] int64, kept [B, V] bool or None (all),
    table the G table on the logits' device (dsv4.sampler.gumbel_table) -> int64 [B]."""
    logits = logits.contiguous()
    B, V = logits.shape
    block = next_pow2(min(CHUNK, V))
    C = cdiv(V, block)
    # int32 flags, as the inverse draw's kernel reads them (dsv4.kernels.sample._kept_arg: a layout that does not
    # depend on whether a row has a kept set); without a set, the logits (never read)
    kept_arg = logits if kept is None else kept.contiguous().to(torch.int32)
    best = torch.empty(B, C, dtype=torch.float32, device=logits.device)
    best_id = torch.empty(B, C, dtype=torch.int32, device=logits.device)
    extra = {} if interpreting() else {"num_warps": _NUM_WARPS}
    launcher(_chunk_kernel, logits)[(B, C)](logits, kept_arg, temperature.contiguous(), key.contiguous(),
                                             pos.to(torch.int64).contiguous(), table, best, best_id, V, C,
                                             BLOCK=block, HAS_KEPT=kept is not None, **extra)
    out = torch.empty(B, dtype=torch.int64, device=logits.device)
    launcher(_pick_kernel, logits)[(B,)](best, best_id, out, V, C, C_PAD=next_pow2(C), **extra)
    return out
