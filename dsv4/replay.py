"""Full-token replay: the whole step of one state captured once into one CUDA graph.

The graph holds forward, verdict, commit, head and sampling. A replay reads the
input token from the state's static `input` buffer and leaves [token, verdict]
in a static output buffer: the only readback. Counters:

* captures: graphs captured for this state (must stay 1: nothing recaptures silently);
* replays [forward, commit]: the state's device counters, advanced inside the graph;
* census: what the captured graph holds: collectives, embedding lookups and mHC posts
  counted while it was captured, and its kernel / memcpy / memset nodes read from the graph
  before it is instantiated (dsv4.graph_nodes; until session 40 the profiler's activities of the
  first replay, which left CUPTI slowing every later launch of the process).
  "unsupported" counts what would break replay (a capture that failed), and must be 0.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import os

import torch

from . import graph_nodes, profile
from .kernels import commit_step, lanes, undo
from .layout import CONFIG as LAYOUT
from .sampler import SamplingParams, SamplingRows, restricts


# mapped_io (DSV4_MAPPED_IO=0 turns it off; on since session 42): a full-token graph takes its input token from a
# pinned host buffer of its own and leaves its readback in another, both read and written by the graph's kernels in
# place (bookkeeping.fetch, the readback's host store), so that Model.step's graph arm costs the host one graph launch
# and one stream synchronize a token: no copy's launch before the replay (6-9 us of host time a step) nor after it
# (6-11 us), and no copy on the GPU between two graphs (session 42 call 2, benchmarks/launch_probe.py: the graph arm's
# host parts ~31 us of a 1,015 us step). Call 3 (decode_ab on mini, one process, 6 rounds ABBA): graph 976.3 ->
# 994.3 tok/s (+1.8 %, ahead in every round), the same stream; one kernel node more (the fetch).
# fetch (DSV4_FETCH=copy; "kernel" by default): how mapped I/O's token reaches the state's input inside the graph:
# bookkeeping.fetch, a kernel reading the pinned host buffer (session 42 call 9's kernel table: 4.5 us of the step,
# the graph's first node), or "copy", a memcpy node from it (the copy engine's DMA; the first kernel then starts after
# it without PDL). Untimed: an arm for the next GPU session (decode_ab --arm copy=replay.fetch=copy).
# gc_hold (DSV4_CAPTURE_GC_HOLD; on by default since session 49, "0" turns it off; see capturing): every capture with
# the cycle collector run before it and held off during it.
CONFIG = {"mapped_io": os.environ.get("DSV4_MAPPED_IO", "1") == "1",
          "fetch": os.environ.get("DSV4_FETCH", "kernel"),
          "gc_hold": os.environ.get("DSV4_CAPTURE_GC_HOLD", "1") == "1"}
if CONFIG["fetch"] not in ("kernel", "copy"):
    raise ValueError(f"DSV4_FETCH={CONFIG['fetch']!r}: expected 'kernel' or 'copy'")


def capturing(graph: torch.cuda.CUDAGraph, pool=None):
    """torch.cuda.graph(graph, pool), with CONFIG gc_hold Python's cycle collector run before it and held off during
    it. torch no longer collects at a capture's start (torch.compiler.config.force_cudagraph_gc, off), so a dead cycle
    holding an older graph (a finished batch's, a dropped state's) could be collected by an allocation inside the
    capture: the old graph's destructor (CUDAGraph::reset) is not permitted while a stream captures and invalidates
    the new capture ("operation not permitted when stream is capturing (function reset)": session 48 call 4, the
    one-row graph of a generation after generate_many in one process; that cycle is gone at its root, see
    Scheduler.driven_inline, yet session 49 call C met the same fault in the same benchmark with it gone: cycles other
    code makes are not ours to find one by one). On by default since session 49 (its test and the gate with it on the
    H200, call A); with gc_hold off it is torch.cuda.graph itself."""
    if not CONFIG["gc_hold"]:
        return torch.cuda.graph(graph, pool=pool)
    return _gc_held(graph, pool)


@contextlib.contextmanager
def _gc_held(graph: torch.cuda.CUDAGraph, pool):
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, pool=pool):
            yield
    finally:
        if was:
            gc.enable()


class ReplayError(RuntimeError):
    pass


class FullTokenReplay:
    def __init__(self, model, state, sampling, warmup: int = 2):
        if state.device.type != "cuda":
            raise ReplayError("full-token replay needs a CUDA state (the graph arm does not exist on CPU)")
        self.model, self.sampling, self.warmup = model, sampling, warmup
        # The sampling's device rows, filled once here: built inside the capture, their four fills would be graph
        # nodes run again at every replay (~3.6 us a token on mini, session 19's kernel table) for the same values.
        params = sampling or SamplingParams()
        self.rows = SamplingRows(1, state.device, params, restricted=restricts(params))
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: torch.Tensor | None = None
        self.captures = 0
        self.census: dict[str, int] = {}
        # mapped I/O (CONFIG): the graph's own pinned token and readback, never freed while the graph lives (their
        # addresses are in it), with numpy views the host writes and reads without a torch dispatch
        self.host = None
        if CONFIG["mapped_io"]:
            self.host = (torch.zeros(1, dtype=torch.int64, pin_memory=True),
                         torch.zeros(2, dtype=torch.float64, pin_memory=True))
            self._token, self._readback = self.host[0].numpy(), self.host[1].numpy()

    def step_mapped(self, state, token: int, sampling) -> list:
        """A step of the graph with mapped I/O: the token written into its host buffer, the replay (the capture at
        the first: its warm-up reads the same token), the stream's synchronize, the readback [token, verdict] read
        from its host buffer. The previous step's synchronize left no replay of this graph running, so the buffers
        are free."""
        self._token[0] = token
        self.replay(state, sampling)
        torch.cuda.current_stream(state.device).synchronize()
        return self._readback.tolist()

    def _capture(self, state):
        model = self.model
        # Warm up on a scratch copy: warm-up executes, and the real state must not advance.
        census_before = model.comm.census.clone()
        scratch = model.new_state(state.capacity)
        scratch.restore(state)
        scratch.input.copy_(state.input)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.inference_mode():
            for _ in range(self.warmup):
                model.step_device(scratch, self.sampling, self.rows, self.host)
        torch.cuda.current_stream().wait_stream(side)
        # The warm-up's reductions are not the state's: take them back out of the census.
        model.comm.census.copy_(census_before)
        del scratch
        graph = torch.cuda.CUDAGraph(keep_graph=True)  # its nodes read before it is instantiated (_instantiate)
        trace = collections.Counter()
        model.transformer.trace = trace
        try:
            with torch.inference_mode(), self._marking(state), capturing(graph):
                self.out = model.step_device(state, self.sampling, self.rows, self.host)
            commit_step.captured()  # the graph's commit table, before its first replay
        except Exception as e:  # a capture that breaks is the one unsupported thing
            self.census = {"unsupported": 1}
            raise ReplayError(f"capture failed: {e}") from e
        finally:
            model.transformer.trace = None
        self.graph = graph
        self.captures += 1
        self.census = {"collectives": trace["collective"], "embedding": trace["embedding"],
                       "hc_posts": trace["hc_post"], "unsupported": 0, **_instantiate(graph)}

    def _marking(self, state):
        return contextlib.nullcontext()

    def replay(self, state, sampling) -> torch.Tensor:
        if sampling != self.sampling:
            raise ReplayError(f"this state's graph was captured for {self.sampling}; got {sampling} "
                              "(a new graph would be a silent recapture)")
        if self.graph is None:
            self._capture(state)
        self.graph.replay()
        return self.out


class TimedReplay(FullTokenReplay):
    """A FullTokenReplay for a profile (dsv4.measure.graph_phases), never a state's production graph: every
    replay is bracketed by two timing events on the stream, outside the graph (`spans`: its span on the GPU),
    and, `marked`, the graph is captured under dsv4.profile.timing, so it holds an event-record node at each
    phase's enter and exit (`marks`: that capture's log, which also keeps its events alive). With layout CONFIG
    profile_lane off both arms are captured on one stream (lanes.one_stream), each phase timed whole."""

    def __init__(self, model, state, sampling, marked: bool):
        super().__init__(model, state, sampling)
        self.marked = marked
        self.marks: list = []
        self.spans: list = []
        self._clock = profile.clock(state.device)

    @contextlib.contextmanager
    def _marking(self, state):
        # one stream, marked or not (layout CONFIG profile_lane off): a phase's stamps are events on the current
        # stream, so a chain on the lane (dsv4.kernels.lanes) is timed as its fork; the plain arm is the same graph
        # without the stamps
        with contextlib.nullcontext() if LAYOUT["profile_lane"] else lanes.one_stream():
            if not self.marked:
                yield
                return
            with profile.timing(state.device) as log:
                yield
            self.marks = log

    def replay(self, state, sampling) -> torch.Tensor:
        begin = self._clock()
        out = super().replay(state, sampling)
        self.spans.append((begin, self._clock()))
        return out


class BatchReplay:
    """The batched step of fixed states (`engine.Batch`) captured once into one CUDA graph.

    Its warm-up runs with every row inactive, so it commits nothing (no scratch states needed);
    the caller's active rows are put back before the capture. Census as FullTokenReplay's.
    """

    def __init__(self, model, batch, warmup: int = 2):
        self.model, self.batch, self.warmup = model, batch, warmup
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: torch.Tensor | None = None
        self.captures = 0
        self.census: dict[str, int] = {}

    def run(self) -> torch.Tensor:
        if self.graph is None:
            self._capture()
        self.graph.replay()
        return self.out

    def _capture(self):
        model, batch = self.model, self.batch
        census_before = model.comm.census.clone()
        active = batch.active.clone()
        batch.active.zero_()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.inference_mode():
            for _ in range(self.warmup):
                model.step_batch_device(batch)
        torch.cuda.current_stream().wait_stream(side)
        model.comm.census.copy_(census_before)
        batch.active.copy_(active)
        graph = torch.cuda.CUDAGraph(keep_graph=True)
        trace = collections.Counter()
        model.transformer.trace = trace
        try:
            with torch.inference_mode(), capturing(graph):
                self.out = model.step_batch_device(batch)
            commit_step.captured()
        except Exception as e:
            self.census = {"unsupported": 1}
            raise ReplayError(f"capture of a {len(batch.states)}-row batch failed: {e}") from e
        finally:
            model.transformer.trace = None
        self.graph = graph
        self.captures += 1
        self.census = {"rows": len(batch.states), "collectives": trace["collective"], "unsupported": 0,
                       **_instantiate(graph)}


class PrefillReplay:
    """One state's prefill chunk of T tokens captured once into a CUDA graph (DSV4_PREFILL_GRAPHS: see
    engine.Model.prefill_graphs), replayed for every later chunk of T tokens on that state's buffers.

    Why: a short chunk's eager forward is bound by its host side (benchmarks/RESULTS.md, session 29 call 3: mini,
    63 tokens, 19.9 ms of wall for 13.95 ms of kernels; a Flash rank launches the same ~25 kernels a layer for 43
    layers); its replay costs the kernels alone (session 30 call 1: 16 tokens, eager 16.9 ms, replay 5.7 ms, the
    logits and the committed state the same bits). Its shapes must not follow the position: the chunk's Step
    takes no host position (transaction by_position=False; a whole compressed store scored, its uncommitted rows
    masked: the same bits, dsv4.model.step.store_limit), in its eager runs too, so that one graph serves the
    chunk at every position. The forward reads nothing from the host, so a replay is the eager chunk's
    kernels with the same arguments.

    No warm-up of its own: the engine captures a length only after an eager chunk of that length on the same
    state compiled its kernels (and made the split tickets). The capture runs nothing, so the state is unchanged
    until the replay; the graphs of a model share one memory pool (their replays never overlap and each one's
    verdict is read right after it)."""

    def __init__(self, model, state, T: int, pool):
        self.tokens = torch.zeros(T, dtype=torch.int64, device=state.device)  # the chunk's ids, static
        self.graph = torch.cuda.CUDAGraph()
        self.replays = 0
        try:
            with torch.inference_mode(), capturing(self.graph, pool):
                self.verdict = model.transformer.transaction([state], self.tokens, by_position=False)
            commit_step.captured()
        except Exception as e:
            raise ReplayError(f"capture of a {T}-token prefill chunk failed: {e}") from e

    def run(self, tokens: torch.Tensor) -> torch.Tensor:
        """The chunk `tokens` [T] (on the device) through the graph -> its device verdict (0 = committed)."""
        self.tokens.copy_(tokens)
        self.graph.replay()
        self.replays += 1
        return self.verdict


def _instantiate(graph: torch.cuda.CUDAGraph) -> dict:
    """Instantiate a graph captured with keep_graph=True, its nodes counted first (dsv4.graph_nodes: from the graph
    itself, not a profiled replay, which would leave every later launch of the process slower): the census' kernel /
    memcpy / memset / other nodes, or "nodes_uncounted" with why; counting never costs the capture."""
    try:
        nodes = graph_nodes.census(graph.raw_cuda_graph())
    except Exception as e:  # noqa: BLE001 - a census, not the step
        nodes = {"nodes_uncounted": f"{type(e).__name__}: {e}"[:200]}
    graph.instantiate()
    return nodes


def enable(model, state, sampling):
    """Arm full-token replay for `state`: its next step captures once, every later step replays."""
    state.check_open()
    state.replay = FullTokenReplay(model, state, sampling)
    return state.replay


class VerifyReplay:
    """A verify step of one state (engine.Model.verify_device: dsv4.speculative) captured once for its row count R,
    its MTP drafts k, its sampling and its stop tokens; a replay reads the R tokens from a static buffer (copied in
    before it) and leaves [draws, accepted, verdict, drafts] in a static output, read back after it. The warm-up runs
    on a scratch copy of the state (its MTP window zeros: a warm-up's drafts are never used), so the state advances
    only by the replays. Model.verify takes it with graph=True; tests/test_speculative_gpu.py checks it against the
    eager verify and `dsv4 gate --speculative` against the plain steps (first on an H200 in session 48)."""

    def __init__(self, model, state, R: int, k: int, sampling, stop: torch.Tensor | None, warmup: int = 2):
        if state.device.type != "cuda":
            raise ReplayError("a verify graph needs a CUDA state")
        self.model, self.R, self.k, self.sampling, self.stop, self.warmup = model, R, k, sampling, stop, warmup
        self.tokens = torch.zeros(R, dtype=torch.int64, device=state.device)
        # the sampling as device rows (R draws, 1 draft), loaded before each replay: one graph serves every seed and
        # temperature of its kind (restricted or not), as a batched step's graph does
        self.rows = (SamplingRows(R, state.device, sampling, restricted=restricts(sampling)),
                     SamplingRows(1, state.device, sampling, restricted=restricts(sampling)))
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: torch.Tensor | None = None
        self.captures = 0
        self.census: dict = {}  # the captured graph's nodes by kind (dsv4.graph_nodes)
        self.undo_tables: list[torch.Tensor] = []

    def _capture(self, state):
        model = self.model
        census_before = model.comm.census.clone()
        scratch = model.new_state(state.capacity)
        scratch.restore(state)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        tables = [0]
        with torch.cuda.stream(side), torch.inference_mode():
            for _ in range(self.warmup):
                scratch.restore(state)  # a warm-up commits: each starts where the state is
                with undo.counting() as tables:  # the fused Undo's tables: their room reserved before the capture
                    model.verify_device(scratch, self.tokens, self.sampling, self.stop, self.k, self.rows)
        torch.cuda.current_stream().wait_stream(side)
        undo.reserve(state.device, tables[0])
        model.comm.census.copy_(census_before)  # the warm-up's reductions are not the state's
        del scratch
        graph = torch.cuda.CUDAGraph(keep_graph=True)  # its nodes counted before it is instantiated (_instantiate)
        try:
            with torch.inference_mode(), capturing(graph):
                self.out = model.verify_device(state, self.tokens, self.sampling, self.stop, self.k, self.rows)
            self.undo_tables = undo.captured()  # the fused Undo's tables (kernels/undo.py): filled, kept with the graph
        except Exception as e:
            undo.capture_failed()
            raise ReplayError(f"verify capture failed: {e}") from e
        self.census = _instantiate(graph)
        self.graph = graph
        self.captures += 1

    def run(self, state, tokens: torch.Tensor, sampling) -> list:
        """One verify step of `state` on `tokens` [R] (device) drawing with `sampling`: the capture at the first;
        -> the readback."""
        self.tokens.copy_(tokens)
        self.rows[0].load([sampling] * self.R)
        self.rows[1].load([sampling])
        if self.graph is None:
            self._capture(state)
        self.graph.replay()
        return self.out.tolist()
