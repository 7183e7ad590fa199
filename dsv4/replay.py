"""Full-token replay: the whole step of one state captured once into one CUDA graph.

The graph holds forward, verdict, commit, head and sampling. A replay reads the
input token from the state's static `input` buffer and leaves [token, verdict]
in a static output buffer: the only readback. Counters:

* captures: graphs captured for this state (must stay 1: nothing recaptures silently);
* replays [forward, commit]: the state's device counters, advanced inside the graph;
* census: what the captured graph holds, counted while it was captured
  (collectives, embedding lookups, mHC posts) and, where torch can dump the graph,
  its kernel / memcpy / memset nodes. "unsupported" counts what would break replay
  (a capture that failed), and must be 0.
"""

from __future__ import annotations

import collections
import os
import re
import tempfile

import torch


class ReplayError(RuntimeError):
    pass


class FullTokenReplay:
    def __init__(self, model, state, sampling, warmup: int = 2):
        if state.device.type != "cuda":
            raise ReplayError("full-token replay needs a CUDA state (the graph arm does not exist on CPU)")
        self.model, self.sampling, self.warmup = model, sampling, warmup
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: torch.Tensor | None = None
        self.captures = 0
        self.census: dict[str, int] = {}

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
                model.step_device(scratch, self.sampling)
        torch.cuda.current_stream().wait_stream(side)
        # The warm-up's reductions are not the state's: take them back out of the census.
        model.comm.census.copy_(census_before)
        del scratch
        graph = torch.cuda.CUDAGraph()
        trace = collections.Counter()
        model.transformer.trace = trace
        dump = os.environ.get("DSV4_GRAPH_DUMP") is not None
        if dump:
            graph.enable_debug_mode()
        try:
            with torch.inference_mode(), torch.cuda.graph(graph):
                self.out = model.step_device(state, self.sampling)
        except Exception as e:  # a capture that breaks is the one unsupported thing
            self.census = {"unsupported": 1}
            raise ReplayError(f"capture failed: {e}") from e
        finally:
            model.transformer.trace = None
        self.graph = graph
        self.captures += 1
        self.census = {"collectives": trace["collective"], "embedding": trace["embedding"],
                       "hc_posts": trace["hc_post"], "unsupported": 0}
        if dump:
            self.census.update(_dump_nodes(graph))

    def replay(self, state, sampling) -> torch.Tensor:
        if sampling != self.sampling:
            raise ReplayError(f"this state's graph was captured for {self.sampling}; got {sampling} "
                              "(a new graph would be a silent recapture)")
        if self.graph is None:
            self._capture(state)
        self.graph.replay()
        return self.out


def _dump_nodes(graph) -> dict[str, int]:
    """Kernel / memcpy / memset node counts from the graph's DOT dump."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "graph.dot")
        graph.debug_dump(path)
        if not os.path.exists(path):  # some torch builds write nothing; the census then lacks node counts
            return {}
        text = open(path).read()
    kinds = collections.Counter(re.findall(r'\b(KERNEL|MEMCPY|MEMSET|HOST|EVENT_RECORD|EVENT_WAIT|EMPTY|GRAPH)\b', text))
    nccl = len(re.findall(r"nccl\w*Kernel", text))
    return {"kernel_nodes": kinds["KERNEL"], "memcpy_nodes": kinds["MEMCPY"], "memset_nodes": kinds["MEMSET"],
            "host_nodes": kinds["HOST"], "nccl_kernels": nccl}


def enable(model, state, sampling):
    """Arm full-token replay for `state`: its next step captures once, every later step replays."""
    state.check_open()
    state.replay = FullTokenReplay(model, state, sampling)
    return state.replay
