"""The sampler's token in two launches (reference: dsv4.sampler._token_reference).

The draw inverts the kept tokens' CDF in vocabulary order, a chunk of CHUNK tokens at a time, so it needs no sort:
1. `_chunk_kernel`, a program per (row, chunk): z = logits / temperature; the chunk's max m_c, its weights
   w = exp(z - m_c) (0 for a token not kept, or whose logit is -inf) and their sum s_c; and the chunk's largest
   logit with its lowest id (a greedy row's argmax).
2. `_pick_kernel`, a program per row: the row's max m over the chunks, each chunk's weight s_c exp(m_c - m), their
   running sum P, the draw u(key, pos) and target = u x total; the chunk where P passes the target, then in it the
   first token whose running weight passes the target's share of that chunk (recomputing its w as kernel 1 did).
   Rounding can leave the target at or past a running sum's last value: the pick then falls back to the last token
   of positive weight (of the row's chunks, then of the chosen chunk), so a token of zero weight is never drawn.
   A row of NaN logits (a padding row's garbage) draws an id inside the vocabulary all the same (0 at worst).
Each row is one program's work in kernel 2 and CHUNK-wide programs in kernel 1 whatever the batch: a row's token is
the same alone or among any rows, in eager and in a replay.
"""

import torch

from . import cdiv, device_function, interpreting, launcher, next_pow2, pdl_wait
from .draw import u_of

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

GPU_CHECKED = True  # session 11 call 1 (benchmarks/RESULTS.md): the CUDA tests, the replay and pool tests under the defaults

CHUNK = 4096  # tokens a program of kernel 1 weighs (Flash's 129,280: 32 chunks); a power of two
_NUM_WARPS = 8


def chunk(vocab: int) -> int:
    """The chunk of a vocabulary of `vocab` tokens (the whole of a small one)."""
    return min(CHUNK, vocab)


def _weights(x, t, m_c, kept, HAS_KEPT: constexpr):
    z = x.to(tl.float32) / t
    w = tl.where(z == float("-inf"), 0.0, tl.exp(z - m_c))
    if HAS_KEPT:
        w = tl.where(kept, w, 0.0)
    return w


_weights = device_function(_weights)


def _chunk_kernel(logits_ptr, kept_ptr, temperature_ptr, m_ptr, s_ptr, top_ptr, top_id_ptr, V, C,
                  BLOCK: constexpr, HAS_KEPT: constexpr):
    pdl_wait()
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    i = c * BLOCK + tl.arange(0, BLOCK)
    ok = i < V
    x = tl.load(logits_ptr + row * V + i, mask=ok, other=float("-inf"))
    kept = tl.load(kept_ptr + row * V + i, mask=ok, other=0) != 0 if HAS_KEPT else ok
    t = tl.load(temperature_ptr + row)
    t = tl.where(t == 0, 1.0, t)
    m_c = tl.max(x.to(tl.float32) / t, 0)
    w = _weights(x, t, m_c, kept, HAS_KEPT)
    top = tl.max(x, 0)
    top_id = tl.min(tl.where(ok & (x == top), i, V), 0)
    tl.store(m_ptr + row * C + c, m_c)
    tl.store(s_ptr + row * C + c, tl.sum(w, 0))
    tl.store(top_ptr + row * C + c, top.to(tl.float32))
    tl.store(top_id_ptr + row * C + c, top_id)




def _pick_kernel(logits_ptr, kept_ptr, temperature_ptr, key_ptr, pos_ptr, m_ptr, s_ptr, top_ptr, top_id_ptr,
                 token_ptr, V, C, BLOCK: constexpr, C_PAD: constexpr, HAS_KEPT: constexpr):
    pdl_wait()
    row = tl.program_id(0).to(tl.int64)
    t = tl.load(temperature_ptr + row)
    greedy = t == 0
    t = tl.where(greedy, 1.0, t)
    c = tl.arange(0, C_PAD)
    live = c < C
    m_c = tl.load(m_ptr + row * C + c, mask=live, other=float("-inf"))
    s_c = tl.load(s_ptr + row * C + c, mask=live, other=0.0)
    m = tl.max(m_c, 0)
    scale = tl.where(m_c == float("-inf"), 0.0, tl.exp(m_c - m))
    weight = s_c * scale
    through = tl.cumsum(weight, 0)  # P after chunk c
    total = tl.sum(tl.where(c == C - 1, through, 0.0), 0)
    target = u_of(tl.load(key_ptr + row), tl.load(pos_ptr + row)) * total
    last_chunk = tl.max(tl.where(weight > 0, c, 0), 0)
    pick = tl.minimum(tl.sum((through <= target).to(tl.int32), 0), last_chunk)
    before = tl.sum(tl.where(c == pick, through - weight, 0.0), 0)
    share = (target - before) / tl.sum(tl.where(c == pick, scale, 0.0), 0)
    m_pick = tl.sum(tl.where(c == pick, m_c, 0.0), 0)

    i = pick * BLOCK + tl.arange(0, BLOCK)
    ok = i < V
    x = tl.load(logits_ptr + row * V + i, mask=ok, other=float("-inf"))
    kept = tl.load(kept_ptr + row * V + i, mask=ok, other=0) != 0 if HAS_KEPT else ok
    w = _weights(x, t, m_pick, kept, HAS_KEPT)
    run = tl.cumsum(w, 0)
    first = tl.min(tl.where(run > share, i, V), 0)
    last = tl.max(tl.where(w > 0, i, 0), 0)
    drawn = tl.minimum(first, last)

    top = tl.load(top_ptr + row * C + c, mask=live, other=float("-inf"))
    best = tl.max(top, 0)
    top_id = tl.load(top_id_ptr + row * C + c, mask=live, other=V)
    argmax = tl.min(tl.where(top == best, top_id, V), 0)  # the chunks' lowest id among the largest
    argmax = tl.where(argmax < V, argmax, 0)  # logits all NaN (a padding row's): an id the embedding holds
    tl.store(token_ptr + row, tl.where(greedy, argmax, drawn).to(tl.int64))


def supported(logits: torch.Tensor, kept: torch.Tensor | None) -> bool:
    """By dtype and shape alone (never by layout: token() makes its inputs contiguous), so a row's path does not
    depend on how its logits were laid out."""
    return (logits.dim() == 2 and logits.dtype in (torch.float32, torch.bfloat16)
            and (kept is None or (kept.shape == logits.shape and kept.dtype == torch.bool)))


def _kept_arg(logits: torch.Tensor, kept: torch.Tensor | None) -> torch.Tensor:
    """The kept set as the kernels read it: int32, 4 bytes like an fp32 logit. Triton lays a kernel's tensors out
    by its loads' widths (16 bytes a thread: 4 fp32 logits, 16 one-byte flags), and the layout sets the order of
    the chunk's sum and running sums: with one-byte flags a row's sums, so its token, depended on whether another
    row of its step kept a subset (session 14 call 4: a batched row drew one token past its solo draw). int32 flags
    keep the layout of a step without a kept set (sm_90 TTGIR: sizePerThread 4 for fp32 logits, 8 for bf16, either
    way), so the sums are the same. Without a set: the logits (never read)."""
    return logits if kept is None else kept.contiguous().to(torch.int32)


def chunk_sums(logits: torch.Tensor, temperature: torch.Tensor, kept: torch.Tensor | None):
    """Kernel 1: (ws [3, B, C]: each chunk's max m_c, weight sum s_c and largest logit; top_id [B, C]: that
    logit's lowest id) for logits [B, V] contiguous."""
    return _chunk_sums(logits, temperature.contiguous(), _kept_arg(logits, kept), kept is not None)


def _chunk_sums(logits, temperature, kept_arg, has_kept: bool):
    B, V = logits.shape
    block = next_pow2(chunk(V))
    C = cdiv(V, block)
    ws = torch.empty(3, B, C, dtype=torch.float32, device=logits.device)
    top_id = torch.empty(B, C, dtype=torch.int32, device=logits.device)
    extra = {} if interpreting() else {"num_warps": _NUM_WARPS}
    launcher(_chunk_kernel, logits)[(B, C)](logits, kept_arg, temperature, ws[0], ws[1], ws[2], top_id, V, C,
                                             BLOCK=block, HAS_KEPT=has_kept, **extra)
    return ws, top_id


def token(logits: torch.Tensor, temperature: torch.Tensor, key: torch.Tensor, pos: torch.Tensor,
          kept: torch.Tensor | None) -> torch.Tensor:
    """logits [B, V] (fp32 or bf16), temperature [B] fp32, key [B] / pos [B] int64 (the draw's), kept [B, V] bool
    or None (all) -> int64 [B]."""
    logits = logits.contiguous()
    B, V = logits.shape
    block = next_pow2(chunk(V))
    C = cdiv(V, block)
    kept_arg = _kept_arg(logits, kept)
    temperature = temperature.contiguous()
    ws, top_id = _chunk_sums(logits, temperature, kept_arg, kept is not None)
    out = torch.empty(B, dtype=torch.int64, device=logits.device)
    extra = {} if interpreting() else {"num_warps": _NUM_WARPS}
    launcher(_pick_kernel, logits)[(B,)](logits, kept_arg, temperature, key.contiguous(), pos.contiguous(), ws[0],
                                         ws[1], ws[2], top_id, out, V, C, BLOCK=block, C_PAD=next_pow2(C),
                                         HAS_KEPT=kept is not None, **extra)
    return out
