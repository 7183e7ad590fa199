"""A step's bookkeeping in one launch each (references: dsv4.parallel.Comm.begin_step / end_step and the
transaction's settle of one state, dsv4.model.forward._Rows.settle; their torch ops are the reference).

Integer and select operations only, so the results are the reference's bits:
- begin: verdict = 0, refusing = (armed != 0) (3 launches in torch);
- end: the last door's unseen flag added into the verdict, then the last armed door that fires (in door order)
  recorded as the rank's word and [code, layer, site], and armed cleared (14 launches in torch);
- settle: where keep holds, hidden = last, logits = the step's logits, pos += T, commits += 1 (8 launches);
- readback: a solo step's drawn token into the state and its [token, verdict] readback (4 launches), with mapped
  host I/O (dsv4.replay CONFIG mapped_io) also stored straight into the replay's pinned host buffer;
- fetch: a full-token graph's input token read from the replay's pinned host buffer (mapped I/O);
- batch_begin / batch_end: a batched step's held flag, active rows and input tokens (5 launches), then its hold, the
  active rows' state tokens and its readback (2 B + 9 launches).
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
# batch_ends (DSV4_BATCH_ENDS=0 turns it off): a batched step's start and end in one launch each (batch_begin,
# batch_end; engine.Model.step_batch_device), the pipelined solo step's and the server's: integer and select operations
# and exact conversions, the torch ops' bits. On since session 34.
# fold_settle (DSV4_FOLD_SETTLE=0 turns it off; on by default since session 41): a step whose states are not a pool's
# rows settles each state from the verdict itself (keep = verdict == 0, and the row's active flag in a batched step)
# and counts its forward there (counts[0] += 1, or += active), so that the transaction launches neither the verdict's
# comparison (nor, batched, its and with the active rows) nor the forward count's add: two torch launches fewer a solo
# step, three a one-row batch's, each of which also broke the PDL chain. Integer and select operations: the same
# values. The forward count then moves from the step's start to its end (every step that runs settles). Session 41
# call 4 (decode_ab on mini, one process, the same stream): pipelined 986.6 -> 993.8 tok/s, graph 962.9 -> 973.8,
# ahead in every round.
CONFIG = {"lean_prologue": os.environ.get("DSV4_LEAN_PROLOGUE", "1") == "1",
          "batch_ends": os.environ.get("DSV4_BATCH_ENDS", "1") == "1",
          "fold_settle": os.environ.get("DSV4_FOLD_SETTLE", "1") == "1"}
# Elements a settle program copies: 1,024 (127 programs for Flash's 129,280 logits). At 4,096 (32 programs) the
# settle of the head's bf16 logits into the state's fp32 ones advanced a token by 6.8 us (session 34 call 1), the
# conversion launch it replaced and the settle before it 3.9 + 2.7: too few programs for 0.8 MB.
SETTLE_BLOCK = 1024
BATCH_ROWS = 1024  # rows of a batched step whose start and end take one program each


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


def _settle_kernel(keep_ptr, last_ptr, hidden_ptr, logits_ptr, state_logits_ptr, pos_ptr, commits_ptr, active_ptr,
                   forwards_ptr, H, V, T, BLOCK: constexpr, VERDICT: constexpr = False, ACTIVE: constexpr = False):
    """VERDICT (CONFIG fold_settle): keep_ptr is the step's verdict, kept where it is 0 (and, ACTIVE, where the row's
    active flag at active_ptr holds), and the state's forward count at forwards_ptr adds 1 (ACTIVE: the flag)."""
    pdl_wait()
    if VERDICT:
        # through where: Triton 3.6's interpreter makes a 0-dim float comparison a scalar that & refuses
        keep = tl.where(tl.load(keep_ptr) == 0.0, 1, 0) != 0
        ran = tl.full([], 1, tl.int64)
        if ACTIVE:
            live = tl.load(active_ptr) != 0
            keep = keep & live
            ran = live.to(tl.int64)
    else:
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
        if VERDICT:
            tl.store(forwards_ptr, tl.load(forwards_ptr) + ran)


def _readback_kernel(drawn_ptr, token_ptr, verdict_ptr, out_ptr, host_ptr, HOST: constexpr):
    """HOST: [token, verdict] also stored at host_ptr, pinned host memory the GPU writes in place (UVA); the host
    reads it after its stream's synchronize (the kernel complete, its stores visible)."""
    pdl_wait()
    t = tl.load(drawn_ptr)
    tl.store(token_ptr, t)
    v = tl.load(verdict_ptr).to(tl.float64)
    tl.store(out_ptr, t.to(tl.float64))
    tl.store(out_ptr + 1, v)
    if HOST:
        tl.store(host_ptr, t.to(tl.float64))
        tl.store(host_ptr + 1, v)


def readback(drawn: torch.Tensor, token: torch.Tensor, verdict: torch.Tensor, host: torch.Tensor | None = None
             ) -> torch.Tensor:
    """A solo step's end (engine.Model.step_device): token = drawn, and the readback [token, verdict] fp64 (torch's
    copy, two conversions and a stack: four launches). host (pinned fp64 [2], CUDA only): the readback stored there
    too, by the same launch (no copy after the step)."""
    out = torch.empty(2, dtype=torch.float64, device=token.device)
    launcher(_readback_kernel, token)[(1,)](drawn, token, verdict, out, out if host is None else host,
                                            HOST=host is not None)
    return out


def _fetch_kernel(src_ptr, dst_ptr):
    pdl_wait()
    tl.store(dst_ptr, tl.load(src_ptr, volatile=True))  # volatile: the host wrote it since the last replay


def fetch(src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst (one int64 on the device) = src (one int64 in pinned host memory, read by the GPU in place, UVA): a full-
    token graph's first node takes its input token from the host buffer the host wrote before the replay, where
    a copy's launch of its own cost the host ~6-9 us a step (session 42 call 2, benchmarks/launch_probe.py)."""
    launcher(_fetch_kernel, dst)[(1,)](src, dst)


def readback_supported(drawn: torch.Tensor, token: torch.Tensor, verdict: torch.Tensor) -> bool:
    return (drawn.numel() == token.numel() == verdict.numel() == 1 and drawn.dtype == token.dtype == torch.int64
            and verdict.dtype == torch.float32)


def _batch_begin_kernel(hold_ptr, active_ptr, feed_ptr, input_ptr, token_addr_ptr, held_ptr, act_ptr, tokens_ptr, B,
                        BLOCK: constexpr):
    pdl_wait()
    b = tl.arange(0, BLOCK)
    ok = b < B
    held = tl.load(hold_ptr) != 0
    tl.store(held_ptr, held)
    tl.store(act_ptr + b, (tl.load(active_ptr + b, mask=ok, other=0) != 0) & ~held, mask=ok)
    state_token = tl.load(token_addr_ptr + b, mask=ok, other=0).to(tl.pointer_type(tl.int64), bitcast=True)
    last = tl.load(state_token, mask=ok, other=0)
    feed = tl.load(feed_ptr + b, mask=ok, other=0) != 0
    tl.store(tokens_ptr + b, tl.where(feed, last, tl.load(input_ptr + b, mask=ok, other=0)), mask=ok)


def _batch_end_kernel(hold_ptr, held_ptr, verdict_ptr, drawn_ptr, act_ptr, token_addr_ptr, out_ptr, B,
                      BLOCK: constexpr):
    pdl_wait()
    v = tl.load(verdict_ptr)
    refused = v != 0
    tl.store(hold_ptr, (tl.load(hold_ptr) != 0) | refused)
    held = (tl.load(held_ptr) != 0).to(tl.float64)
    b = tl.arange(0, BLOCK)
    ok = b < B
    drawn = tl.load(drawn_ptr + b, mask=ok, other=0)
    tl.store(out_ptr + b, drawn.to(tl.float64), mask=ok)
    # held * -1.0, not -held: Triton's negation is 0 - x, +0.0 where torch's -held.double() is -0.0
    tl.store(out_ptr + B, tl.where(refused, v.to(tl.float64), held * -1.0))
    state_token = tl.load(token_addr_ptr + b, mask=ok, other=0).to(tl.pointer_type(tl.int64), bitcast=True)
    tl.store(state_token, drawn, mask=ok & (tl.load(act_ptr + b, mask=ok, other=0) != 0))


def batch_begin(hold: torch.Tensor, active: torch.Tensor, feed: torch.Tensor, input: torch.Tensor,
                token_addr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batched step's start (engine.Model.step_batch_device): (held, active rows, tokens) = (a copy of hold,
    active & ~held, feed ? the row's state's last token : input), the state tokens read at token_addr [B] (their
    addresses, dsv4.engine.Batch's). torch's clone, not, and, stack and where: 5 launches."""
    B = input.shape[0]
    held = torch.empty((), dtype=torch.bool, device=input.device)
    act = torch.empty(B, dtype=torch.bool, device=input.device)
    tokens = torch.empty(B, dtype=torch.int64, device=input.device)
    launcher(_batch_begin_kernel, input)[(1,)](hold, active, feed, input, token_addr, held, act, tokens, B,
                                               BLOCK=next_pow2(B))
    return held, act, tokens


def batch_end(hold: torch.Tensor, held: torch.Tensor, verdict: torch.Tensor, drawn: torch.Tensor,
              active: torch.Tensor, token_addr: torch.Tensor) -> torch.Tensor:
    """A batched step's end: hold |= verdict != 0, each active row's state token = its drawn one, and the readback
    [drawn..., status] fp64, status the verdict where it refused, else -held (-1: a held step; -0.0 otherwise, as
    torch's where of -held.double()). torch's 2 + 5 + 2 B + 2 launches."""
    B = drawn.shape[0]
    out = torch.empty(B + 1, dtype=torch.float64, device=drawn.device)
    launcher(_batch_end_kernel, drawn)[(1,)](hold, held, verdict, drawn, active, token_addr, out, B,
                                             BLOCK=next_pow2(B))
    return out


def batch_supported(hold: torch.Tensor, input: torch.Tensor, token_addr: torch.Tensor | None) -> bool:
    return (CONFIG["batch_ends"] and token_addr is not None and hold.dim() == 0 and hold.dtype == torch.bool
            and input.dtype == torch.int64 and token_addr.shape == input.shape and input.shape[0] <= BATCH_ROWS)


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
    return (keep.dim() == 0 and keep.dtype in (torch.bool, torch.float32) and last.dtype == hidden.dtype
            and last.shape == hidden.shape
            and (logits.dtype == state_logits.dtype
                 or (state_logits.dtype == torch.float32 and logits.dtype in (torch.bfloat16, torch.float16)))
            and logits.shape == state_logits.shape
            and all(t.is_contiguous() for t in (last, hidden, logits, state_logits)))


def settle(keep: torch.Tensor, last: torch.Tensor, hidden: torch.Tensor, logits: torch.Tensor,
           state_logits: torch.Tensor, pos: torch.Tensor, commits: torch.Tensor, T: int,
           forwards: torch.Tensor | None = None, active: torch.Tensor | None = None):
    """Where keep holds: hidden = last, logits, pos += T, commits += 1. forwards (the state's forward count): keep is
    the step's verdict (0-dim fp32), kept where 0 and, with active (0-dim bool, the row's flag), where active holds;
    forwards += 1 (or += active): the transaction's comparison, and, count in one launch (CONFIG fold_settle)."""
    H, V = hidden.numel(), state_logits.numel()
    verdict = forwards is not None
    launcher(_settle_kernel, hidden)[(-(-max(H, V) // SETTLE_BLOCK),)](
        keep, last, hidden, logits, state_logits, pos, commits, active if active is not None else keep,
        forwards if verdict else pos, H, V, T, BLOCK=SETTLE_BLOCK, VERDICT=verdict, ACTIVE=active is not None)
