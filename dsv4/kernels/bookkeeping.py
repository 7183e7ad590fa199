"""A step's bookkeeping in one launch each (references: dsv4.parallel.Comm.begin_step / end_step and the
transaction's settle of one state, dsv4.model.forward._Rows.settle; their torch ops are the reference).

Integer and select operations only, so the results are the reference's bits:
- begin: verdict = 0, refusing = (armed != 0) (3 launches in torch);
- end: the last door's unseen flag added into the verdict, then the last armed door that fires (in door order)
  recorded as the rank's word and [code, layer, site], and armed cleared (14 launches in torch);
- settle: where keep holds, hidden = last, logits = the step's logits, pos += T, commits += 1 (8 launches);
- readback: a solo step's drawn token into the state and its [token, verdict] readback (4 launches).
"""

import os

import torch

from . import launcher, next_pow2, pdl_wait

try:
    import triton.language as tl
    from triton.language import constexpr
except ImportError:  # the torch reference runs without triton; the kernel is never built then
    tl, constexpr = None, int

# Through the GPU checks in session 17 call 4 (under DSV4_STEP_BOOKKEEPING=1: its CUDA tests, the reference's bits;
# graph == eager, pooled == solo, no host sync; the gate's refusal cells in the replayed graph): "auto" runs it on
# CUDA; DSV4_STEP_BOOKKEEPING=0 keeps torch's ops.
GPU_CHECKED = os.environ.get("DSV4_STEP_BOOKKEEPING", "1") == "1"
# lean_prologue (DSV4_LEAN_PROLOGUE=0 turns it off): a decode step opens with fewer launches, the same values: its one
# position is a view of the state's pos (model.step.Step), and the first mHC boundary reads the embedded rows from
# the embedding table itself (model.forward._first_boundary: no gather launch before it).
CONFIG = {"lean_prologue": os.environ.get("DSV4_LEAN_PROLOGUE", "1") == "1"}
SETTLE_BLOCK = 4096


def _begin_kernel(armed_ptr, refusing_ptr, verdict_ptr, N, BLOCK: constexpr):
    pdl_wait()
    i = tl.arange(0, BLOCK)
    ok = i < N
    armed = tl.load(armed_ptr + i, mask=ok, other=0)
    tl.store(refusing_ptr + i, (armed != 0).to(refusing_ptr.dtype.element_ty), mask=ok)
    tl.store(verdict_ptr, 0.0)


def _end_kernel(armed_ptr, word_ptr, fired_ptr, verdict_ptr, unseen_ptr, N, SITES: constexpr, UNSEEN: constexpr,
                BLOCK: constexpr):
    pdl_wait()
    if UNSEEN:
        tl.store(verdict_ptr, tl.load(verdict_ptr) + tl.load(unseen_ptr).to(tl.float32))
    i = tl.arange(0, BLOCK)
    ok = i < N
    armed = tl.load(armed_ptr + i, mask=ok, other=0)
    firing = armed != 0
    last = tl.max(tl.where(firing, i, 0), axis=0)  # the last firing door (0 when none fires), as argmax's
    code = tl.sum(tl.where(i == last, armed, 0), axis=0)
    anyone = tl.max(firing.to(tl.int32), axis=0) > 0
    tl.store(word_ptr, tl.where(anyone, code, tl.load(word_ptr)))
    tl.store(fired_ptr, tl.where(anyone, code, tl.load(fired_ptr)))
    tl.store(fired_ptr + 1, tl.where(anyone, last // SITES, tl.load(fired_ptr + 1)).to(tl.int64))
    tl.store(fired_ptr + 2, tl.where(anyone, last % SITES, tl.load(fired_ptr + 2)).to(tl.int64))
    tl.store(armed_ptr + i, tl.zeros_like(armed), mask=ok)


def _settle_kernel(keep_ptr, last_ptr, hidden_ptr, logits_ptr, state_logits_ptr, pos_ptr, commits_ptr, H, V, T,
                   BLOCK: constexpr):
    pdl_wait()
    keep = tl.load(keep_ptr) != 0
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    h = i < H
    tl.store(hidden_ptr + i, tl.load(last_ptr + i, mask=h), mask=h & keep)
    v = i < V
    tl.store(state_logits_ptr + i, tl.load(logits_ptr + i, mask=v), mask=v & keep)
    if tl.program_id(0) == 0:
        k = keep.to(tl.int64)
        tl.store(pos_ptr, tl.load(pos_ptr) + k * T)
        tl.store(commits_ptr, tl.load(commits_ptr) + k)


def _readback_kernel(drawn_ptr, token_ptr, verdict_ptr, out_ptr):
    pdl_wait()
    t = tl.load(drawn_ptr)
    tl.store(token_ptr, t)
    tl.store(out_ptr, t.to(tl.float64))
    tl.store(out_ptr + 1, tl.load(verdict_ptr).to(tl.float64))


def readback(drawn: torch.Tensor, token: torch.Tensor, verdict: torch.Tensor) -> torch.Tensor:
    """A solo step's end (engine.Model.step_device): token = drawn, and the readback [token, verdict] fp64 (torch's
    copy, two conversions and a stack: four launches)."""
    out = torch.empty(2, dtype=torch.float64, device=token.device)
    launcher(_readback_kernel, token)[(1,)](drawn, token, verdict, out)
    return out


def readback_supported(drawn: torch.Tensor, token: torch.Tensor, verdict: torch.Tensor) -> bool:
    return (drawn.numel() == token.numel() == verdict.numel() == 1 and drawn.dtype == token.dtype == torch.int64
            and verdict.dtype == torch.float32)


def begin(armed: torch.Tensor, refusing: torch.Tensor, verdict: torch.Tensor):
    n = armed.numel()
    launcher(_begin_kernel, armed)[(1,)](armed, refusing, verdict, n, BLOCK=next_pow2(n))


def end(armed: torch.Tensor, word: torch.Tensor, fired: torch.Tensor, verdict: torch.Tensor,
        unseen: torch.Tensor | None):
    n, sites = armed.numel(), armed.shape[-1]
    launcher(_end_kernel, armed)[(1,)](armed, word, fired, verdict, unseen if unseen is not None else verdict, n,
                                       SITES=sites, UNSEEN=unseen is not None, BLOCK=next_pow2(n))


def settle_supported(keep: torch.Tensor, last: torch.Tensor, hidden: torch.Tensor, logits: torch.Tensor,
                     state_logits: torch.Tensor) -> bool:
    """One state's settle in one launch: keep 0-dim, the new hidden in its state tensor's dtype and shape, the logits
    in the state's dtype or a narrower float one that it holds exactly (the head's bf16 into the state's fp32: the
    store widens them, the bits of a separate conversion), all contiguous (else torch's where and copy)."""
    return (keep.dim() == 0 and last.dtype == hidden.dtype and last.shape == hidden.shape
            and (logits.dtype == state_logits.dtype
                 or (state_logits.dtype == torch.float32 and logits.dtype in (torch.bfloat16, torch.float16)))
            and logits.shape == state_logits.shape
            and all(t.is_contiguous() for t in (last, hidden, logits, state_logits)))


def settle(keep: torch.Tensor, last: torch.Tensor, hidden: torch.Tensor, logits: torch.Tensor,
           state_logits: torch.Tensor, pos: torch.Tensor, commits: torch.Tensor, T: int):
    H, V = hidden.numel(), state_logits.numel()
    launcher(_settle_kernel, hidden)[(-(-max(H, V) // SETTLE_BLOCK),)](
        keep, last, hidden, logits, state_logits, pos, commits, H, V, T, BLOCK=SETTLE_BLOCK)
