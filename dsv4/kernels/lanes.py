"""A second stream on the device (a lane) for a chain of kernels that does not depend on the main chain's next ones.

A decode step is a chain of latency-bound kernels, most of which leave most of the GPU idle. In a compressed layer the
compressor's pools and, on CSA layers, the indexer (its query projection, the index keys, the top-k) need only x, q's
latent and the caches, and the queries (wq_b's GEMV, their norm and RoPE) need only q's latent: the two chains can run
at once and meet at the attention kernel. `beside` forks the lane off the current stream (the lane waits for all that
stream has enqueued), runs its body on the lane, and `join` makes the current stream wait for the lane. Both are
stream-ordered: no host sync, and a CUDA graph captures them as a fork and a join of its nodes.

The same kernels read the same inputs: the values, hence the bits, are those of the one-stream order. What two
concurrent chains must not share is scratch: the split-K tickets (dsv4.kernels.qgemv.tickets_for) are per lane, so a
kernel on the lane counts its splits in a buffer of its own. Inputs of the lane's kernels made on the current stream
stay referenced until the join (the caller's frame holds them), and what the lane makes is consumed after the join;
so the caching allocator, which reuses a block in the order of the stream that freed it, never hands out a block a
running kernel of the other stream still reads.

The lane runs in a captured graph only (`use`): an eager step is bound by the host, which launches its kernels one by
one, so a second stream cannot shorten it and its switches would cost the host every step; a graph pays them once, at
its capture. The bits are the same either way (tests/test_lanes.py runs both). (Session 39's call 3 read its gate's
eager 45 tok/s as the lane's cost; call 5 showed a fresh machine's first minute instead: one package 51.2, then 89.5
and 93.5 tok/s in the same call.)

Under PDL each kernel's wait also covers a dependency across the fork or the join: a kernel waits for every kernel it
depends on, and every kernel releases its successors only after its own wait, so the contract of dsv4.kernels (when a
kernel starts, every kernel but those right before it is complete) holds on both chains."""

from __future__ import annotations

import contextlib

import torch

GPU_CHECKED = True  # session 39, calls 3-4: tests/test_lanes.py, the replay test and the gate on mini with the lane
current = 0  # the lane the launches of this moment run on: 0 the caller's stream, 1 the lane (tickets_for reads it)
_streams: dict[torch.device, torch.cuda.Stream] = {}
_one_stream = 0  # inside one_stream(): no caller takes the lane


@contextlib.contextmanager
def one_stream():
    """Captures within keep one stream whatever the callers' switches: a profile's graphs (dsv4.replay.TimedReplay),
    whose phase stamps are events on the current stream and would time a chain on the lane as its fork alone."""
    global _one_stream
    _one_stream += 1
    try:
        yield
    finally:
        _one_stream -= 1


def stream(device: torch.device) -> torch.cuda.Stream:
    """The device's lane, made once (a graph keeps the streams it captured)."""
    lane = _streams.get(device)
    if lane is None:
        lane = _streams[device] = torch.cuda.Stream(device)
    return lane


def use(device: torch.device, on: bool) -> bool:
    """Whether a caller whose switch is `on` runs its side chain on the lane now: on a CUDA device, while a graph is
    being captured. The lane's stream is made at the first call (an eager warm-up before a capture), never during one."""
    if not on or device.type != "cuda" or _one_stream:
        return False
    stream(device)
    return torch.cuda.is_current_stream_capturing()


@contextlib.contextmanager
def beside(device: torch.device, on: bool = True):
    """The body's launches on the device's lane, after everything enqueued so far on the current stream (on False, or a
    device that is not CUDA: the body on the current stream, as without lanes)."""
    global current
    if not on or device.type != "cuda":
        yield
        return
    lane = stream(device)
    lane.wait_stream(torch.cuda.current_stream(device))
    current = 1
    try:
        with torch.cuda.stream(lane):
            yield
    finally:
        current = 0


def join(device: torch.device, on: bool = True) -> None:
    """The current stream's later launches after everything enqueued so far on the lane."""
    if on and device.type == "cuda":
        torch.cuda.current_stream(device).wait_stream(stream(device))
