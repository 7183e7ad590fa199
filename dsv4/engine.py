"""One rank's engine: build a rank's Model; make decode states, prefill, decode, step, generate.

`dsv4.load` (dsv4.api) builds through `build` here for one rank, and through dsv4.launch for
several (whose ranks each build here). Model offers the DecodeModel calls (dsv4.interface):

    model = dsv4.load("tiny")                     # preset: random weights, no download
    model = dsv4.load("/path/to/checkpoint")      # official format (FP8/FP4 or plain)
    state = model.new_state(capacity)
    logits = model.prefill(state, ids)            # logits of the last token
    logits = model.decode(state, token_id)        # one committed step
    token = model.step(state, token_id, sampling) # forward..sample on device, one readback
"""

from __future__ import annotations

import contextlib
import os
import sys
import weakref
from pathlib import Path
from typing import Iterator, Sequence

import torch

from . import generation, kernels
from .checkpoint.init import random_weights
from .checkpoint.load import load_weights
from .checkpoint.memory import check_fits
from .config import CSA, ModelConfig, PRESETS, preset
from .kernels import bookkeeping, moe as fused_moe
from .model.commit import Undo, commit
from .model.forward import Transformer
from .model.rows import short_chunk
from .parallel import SITES, Comm
from .profile import phase
from .replay import CONFIG as REPLAY, PrefillReplay, VerifyReplay
from .sampler import (TOP_LOGPROBS, Drawn, Processing, ProcessRows, SamplingParams, SamplingRows, Scored,
                      TokenCounts, restricts, sample, sample_processed, sample_rows, upload)
from .state import (CapacityError, DecodeState, LayerCache, Pools, QuarantineError, RefusalError,  # noqa: F401
                    StepHeld)
from .tokenizer import Tokenizer, build_tokenizer


def _default_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def placement(device=None, dtype=None) -> tuple[torch.device, torch.dtype]:
    """The device (cuda when available) and the compute dtype (bf16 on cuda, fp32 elsewhere) of a load."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return device, dtype or _default_dtype(device)


def build(path_or_preset: str | Path, device: torch.device, dtype: torch.dtype, *, rank: int = 0, world: int = 1,
          group=None, init: str | None = None, seed: int = 0, tokenizer: str | None = None,
          mtp: bool = False) -> "Model":
    """One rank's Model: rank `rank` of `world` (joined through `group` when world > 1).

    `path_or_preset` as dsv4.hub.resolve leaves it: a preset name (tiny, mini, flash) gets random
    weights (`init="random"`, `seed`), built directly on `device`, and the byte-level stand-in
    tokenizer; anything else is a checkpoint directory, read in the official format with its
    tokenizer.json (none is an error naming the file: `tokenizer="stand-in"` opts into the stand-in,
    said on stderr). Weights that cannot fit the device's free memory are refused before any is made. `mtp`: the MTP
    layers too (num_nextn_predict_layers), speculative decoding's drafter.
    """
    if tokenizer not in (None, "stand-in"):
        raise ValueError(f"tokenizer={tokenizer!r}: allowed None (the checkpoint's tokenizer.json) or 'stand-in'")
    name = str(path_or_preset)
    if name in PRESETS:
        if init not in (None, "random"):
            raise ValueError(f"init={init!r}: a preset has no checkpoint to read; allowed 'random'")
        cfg = preset(name)
        check_fits(cfg, rank, world, device, dtype, f"preset {name!r}", mtp)
        weights = random_weights(cfg, rank=rank, world=world, device=device, dtype=dtype, seed=seed, mtp=mtp)
        tok = _stand_in(cfg)
    else:
        path = Path(name)
        if not path.is_dir():
            raise FileNotFoundError(f"{name!r} is neither a checkpoint directory nor a preset "
                                    f"(allowed presets: {sorted(PRESETS)})")
        if tokenizer is None and not (path / "tokenizer.json").is_file():  # before a long load, not after
            raise FileNotFoundError(f"{path / 'tokenizer.json'}: no such file, and a checkpoint needs its "
                                    "tokenizer (--stand-in-tokenizer / tokenizer='stand-in': a byte-level "
                                    "stand-in with a random vocabulary)")
        if init == "random":
            cfg = ModelConfig.from_json(path / "config.json")
            check_fits(cfg, rank, world, device, dtype, f"{path} (random weights)", mtp)
            weights = random_weights(cfg, rank=rank, world=world, device=device, dtype=dtype, seed=seed, mtp=mtp)
        else:
            cfg, weights = load_weights(path, rank=rank, world=world, device=device, dtype=dtype, mtp=mtp)
        if tokenizer == "stand-in":
            if rank == 0:
                print(f"[dsv4] {path}: using the stand-in tokenizer (byte-level BPE, random vocabulary), "
                      "as asked; the checkpoint's own tokenizer is not read", file=sys.stderr)
            tok = _stand_in(cfg)
        else:
            tok = Tokenizer.from_dir(path)
    # DSV4_REDUCE=symm: the one-shot all-reduce over symmetric memory (CUDA, several ranks) instead of NCCL
    reduce = os.environ.get("DSV4_REDUCE", "nccl") if world > 1 and device.type == "cuda" else "nccl"
    layers = cfg.num_hidden_layers + (cfg.num_nextn_predict_layers if mtp else 0)  # the MTP layers' doors too
    comm = Comm(layers, device, rank=rank, world=world, group=group, reduce=reduce)
    return Model(cfg, Transformer(cfg, weights, comm, device, dtype), tok)


def _stand_in(cfg: ModelConfig) -> Tokenizer:
    return Tokenizer(build_tokenizer(cfg.vocab_size), bos_id=cfg.bos_token_id, eos_id=cfg.eos_token_id)


class ModelCommon:
    """What Model and DistributedModel share, written against the DecodeModel calls: generation, and
    per-rank views for gates and tests, one entry per rank, built on `each(name, *args)` (a Model has
    one rank; a DistributedModel asks every rank)."""

    def prefill_chunk(self, capacity: int) -> int:
        """The default prefill chunk for a state of `capacity` tokens (module function prefill_chunk): what
        prefill takes when not told, on every rank."""
        return prefill_chunk(self.cfg, capacity, self.world, self.index_kernel())

    def index_kernel(self) -> bool:
        """Whether the indexer's scores run as the kernel (its sort keys, not the reference's fp32 scores: see
        prefill_chunk); the shape conditions of dsv4.kernels.compressor.index_supported that the config sets."""
        from .kernels import compressor

        d = self.cfg.index_head_dim
        return (kernels.use_triton(torch.empty(0, device=self.device), gpu_checked=compressor.GPU_CHECKED)
                and d >= 16 and d & (d - 1) == 0)

    def generate(self, prompt: str | Sequence[int], max_tokens: int = 64, sampling=None,
                 capacity: int | None = None, stop_at_eos: bool = True) -> Iterator[str]:
        """Yield the text of each generated token (dsv4.generation.generate)."""
        return generation.generate(self, prompt, max_tokens, sampling, capacity, stop_at_eos)

    def sample_tokens(self, ids: Sequence[int], max_tokens: int, sampling=None,
                      capacity: int | None = None, progress: bool = False) -> Iterator[int]:
        """Prefill `ids`, then yield up to max_tokens sampled tokens (dsv4.generation.sample_tokens)."""
        return generation.sample_tokens(self, ids, max_tokens, sampling, capacity, progress)

    def digests_all(self, state) -> list[tuple[str, str, int]]:
        return self.each("digests", state)

    def logits_sha_all(self, state) -> list[str]:
        return self.each("logits_sha", state)

    def census_all(self) -> list[list[list[int]]]:
        return [torch.as_tensor(c).tolist() for c in self.each("census")]

    def replay_counts_all(self, state) -> list[list[int]]:
        return self.each("replay_counts", state)


# Model.prefill_scored on CUDA: off until benchmarks/score_check.py has run on a GPU (session 51 had no device);
# DSV4_UNCHECKED_SAMPLING=1 (the server's switch for its unchecked device paths) runs it anyway.
SCORED_GPU_CHECKED = os.environ.get("DSV4_UNCHECKED_SAMPLING") == "1"

# Most rows of one verify step (Model.verify: a token and its drafts); a model also caps them at its sliding window.
MAX_VERIFY_ROWS = 16

# Most tokens per default prefill chunk. A chunk reads the routed experts it picks once per tile of pairs
# (dsv4.kernels.moe_tc's long tiles; past ~96 pairs an expert, all of them dequantised once per chunk), while
# the sliding attention's logits span the whole chunk, so their cost per token grows with it; past a few
# thousand tokens the second outweighs the first.
PREFILL_CHUNK = 4096
PREFILL_BUDGET = 16 << 30  # bytes of a default chunk's largest activations


def prefill_chunk(cfg: ModelConfig, capacity: int, world: int = 1, index_kernel: bool = False) -> int:
    """The default prefill chunk: the largest power of two up to PREFILL_CHUNK (at least 64) whose largest
    activations fit PREFILL_BUDGET. Per query those are the lightning indexer's fp32 scores over the whole
    compressed store (index_n_heads x capacity / rate, ~3 alive), the sliding attention's logits over the
    window and the chunk (heads of a rank x (window + chunk), ~5 alive) and the CSA rows each query picks
    (index_topk x head_dim, ~3 alive); 2-byte activations assumed. Flash, 2 ranks: 4096 at a 4k capacity,
    1024 at 32k, 512 at 128k, 64 at 1M. `index_kernel`: the indexer's kernel runs (dsv4.kernels.compressor),
    whose scores are one int64 sort key per compressed row (~2 alive with top-k's): 4096 up to 128k, 2048 at 1M.
    A larger chunk reads every weight (the routed experts' above all) fewer times over a long prompt."""
    csa = [cfg.compress_rate(i) for i in range(cfg.num_hidden_layers) if cfg.layer_types[i] == CSA]
    per_row = 16 if index_kernel else 12 * cfg.index_n_heads
    scores = per_row * (capacity // min(csa) + 2) if csa else 0
    picked = 6 * cfg.index_topk * cfg.head_dim if csa else 0
    heads = cfg.num_attention_heads // world
    chunk = PREFILL_CHUNK
    while chunk > 64 and chunk * (scores + picked + 10 * heads * (cfg.sliding_window + chunk)) > PREFILL_BUDGET:
        chunk //= 2
    return chunk


class Batch:
    """The static buffers of a batched step over fixed states: what its graph reads (input tokens,
    active rows, sampling rows), rewritten in place before each step. With processors (a row asked for
    penalties, logit_bias, min_p, a grammar's mask or logprobs): `process` (ProcessRows) and `counts`, each
    state's TokenCounts; without them both are None and the step is the plain one."""

    def __init__(self, states: list[DecodeState], device, process: ProcessRows | None = None,
                 counts: list[TokenCounts] | None = None, restricted: bool = True):
        self.states = states
        self.input = torch.zeros(len(states), dtype=torch.int64, device=device)
        self.active = torch.zeros(len(states), dtype=torch.bool, device=device)
        # feed[b]: row b's input is the token its state drew in its last step, read on the device (a pipelined
        # step launched before the previous one's token reached the host); else input[b], from the host.
        self.feed = torch.zeros(len(states), dtype=torch.bool, device=device)
        self.rows = SamplingRows(len(states), device, restricted=restricted)
        # the states' token tensors' addresses: the step's start reads them and its end writes them in one launch each
        # (kernels.bookkeeping.batch_begin / batch_end); a state's tensors live as long as the state
        self.token_addr = torch.tensor([s.token.data_ptr() for s in states], dtype=torch.int64, device=device)
        self.process, self.counts = process, counts
        self.replay = None  # a dsv4.replay.BatchReplay when the step runs as a graph
        self.loaded: dict[str, tuple] = {}  # what each host-written buffer holds: unchanged ones are not rewritten

    def load(self, ids: list[int], active: list[bool], feed: list[bool], params: list[SamplingParams],
             non_blocking: bool) -> None:
        """Write the step's host inputs into the buffers its graph reads, each only when it changed (a pipelined
        step's copies are queued behind the running step: dsv4.sampler.upload)."""
        for name, values in (("input", ids), ("active", active), ("feed", feed)):
            if self.loaded.get(name) != tuple(values):
                upload(getattr(self, name), values, non_blocking)
                self.loaded[name] = tuple(values)
        if self.loaded.get("rows") != tuple(params):
            self.rows.load(params, non_blocking)
            self.loaded["rows"] = tuple(params)


class _Pending:
    """A launched pipelined step (Model.step_batch_launch): its live states and its readback on its way to pinned
    host memory, done when `event` has passed."""

    def __init__(self, live: list[DecodeState], active: list[bool], host: torch.Tensor, event):
        self.live, self.active, self.host, self.event = live, active, host, event


def _processing_mode(processing: list[Processing | None]) -> str | None:
    """None: no row needs processing (the plain step); "logprobs": some row reports logprobs; "process": rows
    only process their logits. Each mode is a step of its own (static shapes), a graph of its own."""
    needed = [r for r in processing if r is not None and r.needed]
    if not needed:
        return None
    return "logprobs" if any(r.params.logprobs is not None for r in needed) else "process"


def _drawn(out: list[float], B: int, active: list[bool], processing: list[Processing | None],
           process: ProcessRows | None) -> list[Drawn]:
    """Each row's Drawn from a step's readback (`step_batch_device`'s layout)."""
    rows = []
    for b in range(B):
        if not active[b]:
            rows.append(Drawn(-1))
            continue
        k = None if processing[b] is None else processing[b].params.logprobs
        if k is None or process is None or process.top is None:
            rows.append(Drawn(int(out[b])))
            continue
        K = process.top
        values = out[B + 1 + b * (K + 1):B + 1 + (b + 1) * (K + 1)]
        ids = out[B + 1 + B * (K + 1) + b * K:B + 1 + B * (K + 1) + (b + 1) * K]
        rows.append(Drawn(int(out[b]), values[0], tuple((int(t), v) for t, v in zip(ids[:k], values[1:k + 1]))))
    return rows


# "pinned_io" (DSV4_PINNED_IO=0 turns it off): Model.step on CUDA writes its token into a pinned host buffer copied
# without blocking and reads [token, verdict] back through another (_HostIO), instead of a new host tensor copied
# from pageable memory and `.tolist()` on the device tensor. The graph arm's GPU idles from one graph's end to the
# next one's start (the readback, the host's step, the input's copy, the launch): session 40 call 1
# (benchmarks/step_host_gap.py) pinned I/O 1,281 -> 1,244 us a step, call 4 1,066 -> 1,055.
CONFIG = {"pinned_io": os.environ.get("DSV4_PINNED_IO", "1") == "1"}


class _HostIO:
    """Pinned host buffers of one device for a solo step's input token and its readback. Reused step after step:
    each step waits for its readback, which follows its input's copy in the stream, so the buffer is free again
    when the next step writes it."""

    def __init__(self):
        self.token = torch.empty(1, dtype=torch.int64, pin_memory=True)
        self._token = self.token.numpy()  # a view: writing it costs no torch dispatch
        self.out: dict[tuple, torch.Tensor] = {}

    def put(self, dst: torch.Tensor, token: int) -> None:
        self._token[0] = token
        dst.copy_(self.token, non_blocking=True)

    def get(self, out: torch.Tensor) -> list:
        host = self.out.get((out.shape, out.dtype))
        if host is None:
            host = self.out[(out.shape, out.dtype)] = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
        host.copy_(out, non_blocking=True)
        torch.cuda.current_stream(out.device).synchronize()
        return host.numpy().tolist()


class Model(ModelCommon):
    def __init__(self, cfg: ModelConfig, transformer: Transformer, tokenizer=None):
        self.cfg, self.transformer, self.tokenizer = cfg, transformer, tokenizer
        self._batches: dict[tuple, Batch] = {}  # captured batch steps, by their states and processing mode
        # each state's token counts, made at its first processed step (a static buffer its graphs read)
        self._counts: weakref.WeakKeyDictionary[DecodeState, TokenCounts] = weakref.WeakKeyDictionary()
        # each state's captured verify steps (replay.VerifyReplay), by (rows, drafts, restricted-ness, stop tokens)
        self._verify_graphs: weakref.WeakKeyDictionary[DecodeState, dict] = weakref.WeakKeyDictionary()
        self.comm = transformer.comm
        self.device, self.dtype = transformer.device, transformer.dtype
        self._pools = Pools.from_env(cfg, self.device, self.dtype)  # DSV4_POOL=n: states are pool slots
        # The hold: set on the device by a batched step whose verdict refused, cleared by the host when it settles
        # that refusal. A batched step reads it first and, set, commits nothing for any row: a pipelined step
        # launched before the host learnt of a refusal changes nothing (the transaction's promise, kept across a
        # pipeline). Its readback says so (StepHeld).
        self.hold = torch.zeros((), dtype=torch.bool, device=self.device)
        self._pending: list[_Pending] = []  # launched pipelined steps, oldest first
        self._host_io: dict[torch.device, _HostIO] = {}  # Model.step's pinned token in / readback out (CONFIG)
        # DSV4_PREFILL_GRAPHS=1: a state's short prefill chunks replayed from CUDA graphs (prefill_graph_tokens)
        self.prefill_graphs = kernels.getenv("DSV4_PREFILL_GRAPHS", "0") == "1"
        # The memory pool the prefill graphs share, and the graphs alive in it: torch frees a pool with its last
        # graph and asserts when a capture names a freed pool (session 30 call 3), so a capture with none alive
        # makes a new one.
        self._prefill_pool = None
        self._prefill_live: weakref.WeakSet = weakref.WeakSet()

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def world(self) -> int:
        return self.comm.world

    # ---- states ------------------------------------------------------------
    def new_state(self, capacity: int) -> DecodeState:
        state = self._pools.new_state(capacity) if self._pools is not None else \
            DecodeState(self.cfg, capacity, self.device, self.dtype)
        n = self.cfg.num_hidden_layers
        state.mtp_caches = [LayerCache(self.cfg, n + j, capacity, self.device, self.dtype)
                            for j in range(len(self.transformer.mtp))]
        return state

    def pool_states(self, slots: int) -> None:
        """From now on new_state hands out slots of pools of `slots` states (dsv4.state.StatePool; 0: plain states), as
        DSV4_POOL=slots does from the start. On every rank: model.each("pool_states", slots)."""
        self._pools = Pools(slots, self.cfg, self.device, self.dtype) if slots else None

    def _tokens(self, ids, what: str) -> torch.Tensor:
        if isinstance(ids, torch.Tensor):
            ids = ids.flatten().tolist()
        ids = list(ids)
        if not ids:
            raise ValueError(f"{what}: no tokens")
        bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < self.cfg.vocab_size]
        if bad:
            raise ValueError(f"{what}: token id(s) {bad[:5]} outside [0, vocab_size={self.cfg.vocab_size})")
        return torch.tensor(ids, dtype=torch.int64)

    def _run(self, state: DecodeState, tokens: torch.Tensor) -> None:
        """One prefill chunk `tokens` (already on device) of one state, eager or replayed (prefill_graph_tokens);
        raises on a refusal."""
        T = tokens.shape[0]
        if not self.prefill_graph_tokens(T):
            verdict = self.transformer.transaction([state], tokens)
        else:
            graph = state.prefill_graphs.get(T)
            if graph is None:  # the first chunk of this length on this state: eager, its kernels compiled
                state.prefill_graphs[T] = 1
                verdict = self.transformer.transaction([state], tokens, by_position=False)
            else:
                if graph == 1:
                    if not self._prefill_live:
                        self._prefill_pool = torch.cuda.graph_pool_handle()
                    graph = state.prefill_graphs[T] = PrefillReplay(self, state, T, self._prefill_pool)
                    self._prefill_live.add(graph)
                verdict = graph.run(tokens)
        self._settle(state, float(verdict), T)

    def prefill_graph_tokens(self, T: int) -> bool:
        """Whether one state's prefill chunk of T tokens goes through its CUDA graph (dsv4.replay.PrefillReplay):
        DSV4_PREFILL_GRAPHS=1 (GPU-checked in session 30; off by default while a graph serves one length: see
        docs/DESIGN.md), one CUDA rank (several ranks' captures not yet run on GPUs), a short chunk
        (model.rows.short_chunk: up to 128 tokens, whose shapes depend on T alone). A state captures a length at
        its second chunk of it (the first, eager, compiles); every later one replays. A long prompt's chunks and a
        server slot's requests reuse them."""
        return (self.prefill_graphs and self.device.type == "cuda" and self.world == 1 and short_chunk(T)
                and not torch.cuda.is_current_stream_capturing())

    def _settle(self, state: DecodeState, verdict: float, n: int) -> None:
        """Host side of a step's readback: advance the host position or quarantine the state."""
        if verdict == 0:
            state.host_pos += n
            return
        state.quarantine = self.refusal_message()
        raise RefusalError(state.quarantine)

    def refusal_message(self) -> str:
        """Which rank refused where (gathered from every rank: only on the failure path)."""
        fired = self.comm.fired
        if self.world > 1:
            import torch.distributed as dist

            every = [torch.zeros_like(fired) for _ in range(self.world)]
            dist.all_gather(every, fired, group=self.comm.group)
        else:
            every = [fired]
        parts = [f"rank {r} layer {int(f[1])} site {SITES[int(f[2])]} word {int(f[0])}"
                 for r, f in enumerate(every) if int(f[0]) != 0]
        return "one-shot reduction refused: " + ("; ".join(parts) or "unknown rank") + "; nothing committed"

    def prefill(self, state: DecodeState, ids: Sequence[int], chunk_size: int | None = None) -> torch.Tensor:
        """Run the prompt through in chunks (default: prefill_chunk); returns the last token's logits (fp32 [vocab])."""
        state.check_open()
        tokens = self._tokens(ids, "prefill")
        if chunk_size is None:
            chunk_size = self.prefill_chunk(state.capacity)
        if not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size {chunk_size!r}: a positive integer")
        state.check_room(tokens.shape[0])
        tokens = tokens.to(self.device)
        with torch.inference_mode():
            for start in range(0, tokens.shape[0], chunk_size):
                self._run(state, tokens[start:start + chunk_size])
        return state.logits.clone()

    def prefill_scored(self, state: DecodeState, ids: Sequence[int], targets: Sequence[int],
                       top: int = 0) -> list[Scored]:
        """One prefill chunk `ids` that also scores the prompt: the state is left as `prefill(state, ids,
        chunk_size=len(ids))` leaves it (the same forward, eager), and row t's logits (the step's head, log_softmax in
        fp32) give the log-probability of targets[t] (the token after ids[t]), its rank, and the `top` most likely
        tokens -> one dsv4.sampler.Scored a row: OpenAI's echoed prompt logprobs, vLLM's prompt_logprobs, lm-eval's
        loglikelihoods. A refusal commits and returns nothing (RefusalError, as prefill)."""
        if self.device.type == "cuda" and not SCORED_GPU_CHECKED:
            raise RuntimeError("prefill_scored: not yet run on a GPU (benchmarks/score_check.py, in "
                               "gpu_s51_serve_checks.sh); DSV4_UNCHECKED_SAMPLING=1 runs it unchecked")
        state.check_open()
        tokens, wanted = self._tokens(ids, "prefill_scored"), self._tokens(targets, "prefill_scored targets")
        if wanted.shape != tokens.shape:
            raise ValueError(f"prefill_scored: {tokens.shape[0]} tokens and {wanted.shape[0]} targets: one each")
        if not isinstance(top, int) or not 0 <= top <= self.cfg.vocab_size:
            raise ValueError(f"prefill_scored: top {top!r}: an integer in [0, vocab_size={self.cfg.vocab_size}]")
        state.check_room(tokens.shape[0])
        streams: list = []
        with torch.inference_mode():
            verdict = self.transformer.transaction([state], tokens.to(self.device), streams=streams)
            self._settle(state, float(verdict), tokens.shape[0])
            scores = self.transformer.score(streams[0], wanted.to(self.device), top)
        chosen, top_lp, top_ids, ranks = (t.tolist() for t in scores)
        return [Scored(c, r, tuple(zip(i, v))) for c, r, i, v in zip(chosen, ranks, top_ids, top_lp)]

    def prefill_batch(self, states: Sequence[DecodeState], chunks: Sequence[Sequence[int]]) -> torch.Tensor:
        """One prefill chunk for each of several states in one forward: states[b] takes chunks[b], all of one
        length T, each at its own position; -> each chunk's last-token logits (fp32 [B, vocab]). Several states
        need a short T (dsv4.model.rows.short_chunk): every row is then computed as it would be alone, so each
        state's bytes are those of `prefill(states[b], chunks[b], chunk_size=T)`. One state takes any T (that
        prefill itself). One verdict: a refusal quarantines every state and raises RefusalError, nothing
        committed for any."""
        B = len(states)
        if not B or len(chunks) != B:
            raise ValueError(f"prefill_batch: {B} states and {len(chunks)} chunks: one each, at least one")
        if len({id(s) for s in states}) != B:
            raise ValueError("prefill_batch: a state appears twice in one forward")
        tokens = [self._tokens(c, "prefill_batch") for c in chunks]
        T = tokens[0].shape[0]
        if any(t.shape[0] != T for t in tokens):
            raise ValueError(f"prefill_batch: chunks of {sorted({t.shape[0] for t in tokens})} tokens; one length "
                             "per forward")
        if B > 1 and not short_chunk(T):
            raise ValueError(f"prefill_batch: chunks of {T} tokens; several states take at most "
                             f"{fused_moe.CONFIG['prefill_pair_tokens']} each (a longer chunk's rows depend on "
                             "the batch)")
        for s in states:
            s.check_open()
            s.check_room(T)
        if B == 1 and self.prefill_graph_tokens(T):  # one state's chunk: its graph (_run settles it)
            with torch.inference_mode():
                self._run(states[0], tokens[0].to(self.device))
            return torch.stack([states[0].logits])
        with torch.inference_mode():
            verdict = float(self.transformer.transaction(list(states), torch.cat(tokens).to(self.device)))
        if verdict != 0:
            message = self.refusal_message()
            for s in states:
                s.quarantine = message
            raise RefusalError(message)
        for s in states:
            s.host_pos += T
        return torch.stack([s.logits for s in states])

    def decode(self, state: DecodeState, token: int) -> torch.Tensor:
        """One committed step on `token`; returns its logits (fp32 [vocab])."""
        state.check_open()
        tokens = self._tokens([token], "decode")
        state.check_room(1)
        state.input.copy_(tokens)
        with torch.inference_mode():
            self._run(state, state.input)
        return state.logits.clone()

    # ---- sampling ----------------------------------------------------------
    def step(self, state: DecodeState, token: int, sampling=None) -> int:
        """forward -> verdict -> commit -> head -> sample on device; one readback of [token, verdict].

        The token drawn goes to position state.pos after the commit, and is drawn with pos = that position.
        """
        sampling = sampling or SamplingParams()
        state.check_open()
        state.check_room(1)
        if state.replay is not None and state.replay.host is not None:  # mapped I/O (dsv4.replay CONFIG)
            if not (type(token) is int and 0 <= token < self.cfg.vocab_size):
                token = int(self._tokens([token], "step")[0])  # validated (and refused, where wrong) as elsewhere
            token_out, verdict = state.replay.step_mapped(state, token, sampling)
            self._settle(state, verdict, 1)
            return int(token_out)
        io = self._io(state.device)
        if io is not None and type(token) is int and 0 <= token < self.cfg.vocab_size:
            io.put(state.input, token)
        else:  # validated (and refused, where wrong) as every other entry's tokens
            state.input.copy_(self._tokens([token], "step"))
        if state.replay is not None:
            out = state.replay.replay(state, sampling)
        else:
            with torch.inference_mode():
                out = self.step_device(state, sampling)
        token_out, verdict = out.tolist() if io is None else io.get(out)
        self._settle(state, verdict, 1)
        return int(token_out)

    def verify(self, state: DecodeState, token: int, drafts: Sequence[int], sampling=None,
               stops: Sequence[int] = (), graph: bool = False) -> tuple[int, ...]:
        """A speculative step (dsv4.speculative): `token` at state.pos and the drafted tokens after it, in one
        forward whose row j is the decode step at pos + j, bit for bit (Transformer.verify). Each row draws with
        pos + j + 1 as model.step would; draft j is accepted while it equals the draw before it and that draw is
        not in `stops` (model.step would have stopped there). Commits the rows up to the last accepted one and
        takes back the others, so the state's bytes are those of that many model.step calls; returns their draws
        (1 to len(drafts) + 1 tokens). One verdict, as a step: a refusal takes back every row, quarantines the
        state and raises RefusalError. graph (CUDA): the step replayed from the state's graph for its row count,
        kind of sampling and stops (replay.VerifyReplay, captured at the first such step, the sampling's values loaded
        before each replay; never GPU-run yet)."""
        return self._verify(state, token, drafts, sampling, stops, 0, graph)[0]

    def verify_draft(self, state: DecodeState, token: int, drafts: Sequence[int], sampling=None,
                     stops: Sequence[int] = (), k: int = 1,
                     graph: bool = False) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """verify, then the MTP layer's k drafts for the next step -> (the tokens, the drafts). The MTP layer runs
        on every row (the main model's streams there and the row's draw) and keeps the rows the step keeps (its
        window: state.mtp_caches); the last kept row drafts the token after the next input, each further draft
        runs the layer again on its own streams (those rows taken back after). A draft is drawn with the sampler's
        key at its position from the MTP layer's logits, so where the layer agrees with the model it drafts the
        very token the model will draw (greedy: its argmax). The tokens are verify's whatever the drafts; one
        verdict for both forwards. graph: as verify's."""
        if not self.transformer.mtp:
            raise ValueError("verify_draft: this model has no MTP layer (dsv4.load(..., mtp=True) reads it)")
        if not state.mtp_caches:
            raise ValueError("verify_draft: the state has no MTP window (a pool slot, or made before the MTP layer)")
        if not isinstance(k, int) or not 1 <= k < self._verify_rows():
            raise ValueError(f"verify_draft: k {k!r}: drafts for the next step, 1 to {self._verify_rows() - 1}")
        return self._verify(state, token, drafts, sampling, stops, k, graph)

    def prefill_drafted(self, state: DecodeState, ids: Sequence[int], token: int, chunk_size: int | None = None,
                        sampling=None, k: int = 0) -> tuple[int, ...]:
        """prefill(state, ids, chunk_size), the same bits, then the MTP layer over the prompt's last sliding_window
        positions (their streams kept as the prefill computes them; `token`, the one after ids, is the last one's
        next token), so the drafter's window holds the prompt as the reference's would before the first
        verify_draft; -> the layer's k drafts for that first step (drawn as verify_draft's: the token after `token`'s
        successor first). Its collectives a step of their own: a refusal quarantines the state (RefusalError).
        Without an MTP layer, or where a replayed prefill graph computed the streams unseen, the prefill alone (no
        drafts)."""
        if not (self.transformer.mtp and state.mtp_caches):
            self.prefill(state, ids, chunk_size)
            return ()
        with self._streams() as streams:
            self.prefill(state, ids, chunk_size)
        n = len(ids)
        if sum(h.shape[0] for h in streams) != n:
            return ()
        return self._warm_drafter([state], [torch.cat(streams)], [list(ids)], [token], sampling, k)[0]

    def prefill_batch_drafted(self, states: Sequence[DecodeState], chunks: Sequence[Sequence[int]],
                              nexts: Sequence[int]) -> torch.Tensor:
        """prefill_batch(states, chunks), the same bits, then each state's MTP layer window over its chunk's last
        sliding_window positions (nexts[b]: the token after chunks[b]), as prefill_drafted's for a prompt in chunks
        (dsv4 serve --speculate mtp). Without an MTP layer, prefill_batch alone."""
        if not (self.transformer.mtp and all(s.mtp_caches for s in states)):
            return self.prefill_batch(states, chunks)
        with self._streams() as streams:
            logits = self.prefill_batch(states, chunks)
        T = len(chunks[0])
        if sum(h.shape[0] for h in streams) == T * len(states):
            h = torch.cat(streams)
            self._warm_drafter(list(states), [h[b * T:(b + 1) * T] for b in range(len(states))],
                               [list(c) for c in chunks], list(nexts), None, 0)
        return logits

    @contextlib.contextmanager
    def _streams(self):
        """Within: every forward's final streams (all rows) appended to the list yielded (this instance's forward
        wrapped for the while; the same computation)."""
        tf, streams = self.transformer, []
        forward = tf.forward

        def keep(*args, **kwargs):
            writes, h = forward(*args, **kwargs)
            streams.append(h)
            return writes, h

        tf.forward = keep
        try:
            yield streams
        finally:
            del tf.forward

    def _warm_drafter(self, states: list[DecodeState], streams: list[torch.Tensor], ids: list[list[int]],
                      nexts: list[int], sampling, k: int) -> list[tuple[int, ...]]:
        """Each state's MTP window over the last sliding_window positions just prefilled (streams[b], their tokens
        ids[b], the token after them nexts[b]), as one chunk a state, one collective step for all; the k drafts a
        state's last position makes for its first verify step (k 0: none). A refusal quarantines every state."""
        tf, W = self.transformer, self.cfg.sliding_window
        sampling = sampling or SamplingParams()
        with torch.inference_mode():
            writes: list = []
            drafted: list[list[torch.Tensor]] = []
            tf.comm.begin_step()
            for state, h, chunk, nxt in zip(states, streams, ids, nexts):
                rows = min(len(chunk), W)
                tokens = self._tokens([*chunk[len(chunk) - rows + 1:], nxt], "the drafter's prompt").to(self.device)
                g, _ = tf.mtp_rows([state.ahead(-rows)], h[len(chunk) - rows:], tokens, None, writes=writes)
                drafted.append([])
                if k:  # the last position's row drafts the token after the next one's successor: position pos + 1
                    L = tf.mtp[0]
                    row = tf.head(g[-1:], L["hc_head"], L["norm"])[0]
                    drafted[-1] = self._mtp_drafts(state, g[-1:], row, torch.zeros((), dtype=torch.int64,
                                                                                    device=self.device), sampling, k)
            tf.comm.end_step()
            commit(writes, tf.comm.verdict)
            out = torch.cat([tf.comm.verdict.double().view(1), *(d.double().view(1) for ds in drafted for d in ds)])
            out = out.tolist()
        if out[0] != 0:
            message = self.refusal_message()
            for state in states:
                state.quarantine = message
            raise RefusalError(message)
        return [tuple(int(t) for t in out[1 + b * k:1 + (b + 1) * k]) for b in range(len(states))]

    def _mtp_drafts(self, state: DecodeState, g: torch.Tensor, row: torch.Tensor, at: torch.Tensor, sampling,
                    k: int, rows: SamplingRows | None = None) -> list[torch.Tensor]:
        """k drafts from the MTP layer's row at state.pos + at - 1 (its streams g [1, hc, D], its logits row): the
        first drawn from row with the sampler's key at pos + at + 1, each further one by the layer again at the
        next position on its own streams and the draft before (those rows' window writes taken back)."""
        tf, drafted, ahead = self.transformer, [], Undo()
        for r in range(k):
            drafted.append(sample(row.float(), sampling, state.pos + at + (r + 1), rows))
            if r + 1 < k:
                g, row = tf.mtp_rows([state.ahead(at + r)], g, drafted[-1].view(1), ahead)
                row = row[0]
        ahead.take_back(torch.zeros(1, dtype=torch.bool, device=g.device))
        return drafted

    def _verify(self, state: DecodeState, token: int, drafts: Sequence[int], sampling, stops: Sequence[int],
                k: int, graph: bool = False) -> tuple[tuple[int, ...], tuple[int, ...]]:
        sampling = sampling or SamplingParams()
        if not isinstance(sampling, SamplingParams):
            raise TypeError(f"verify: sampling {sampling!r}: a SamplingParams (logit processing is not speculated)")
        drafts = list(drafts)
        R = 1 + len(drafts)
        if R > self._verify_rows():
            raise ValueError(f"verify: {len(drafts)} drafts; at most {self._verify_rows() - 1} (a verify step's rows: at "
                             f"most {MAX_VERIFY_ROWS}, the sliding window and each compressor's ring)")
        state.check_open()
        state.check_room(R)
        tokens = self._tokens([token, *drafts], "verify").to(self.device)
        stop = self._tokens(list(stops), "verify stops").to(self.device) if stops else None
        if graph and self.device.type == "cuda":
            graphs = self._verify_graphs.setdefault(state, {})
            key = (R, k, restricts(sampling), tuple(stops))  # the sampling's values are loaded before each replay
            if key not in graphs:
                graphs[key] = VerifyReplay(self, state, R, k, sampling, stop)
            out = graphs[key].run(state, tokens, sampling)
        else:
            with torch.inference_mode():
                out = self.verify_device(state, tokens, sampling, stop, k).tolist()
        n = int(out[R]) + 1
        self._settle(state, out[R + 1], n)
        return tuple(int(t) for t in out[:n]), tuple(int(t) for t in out[R + 2:])

    def _verify_rows(self) -> int:
        """Most rows of one verify step on this model: within MAX_VERIFY_ROWS and every ring (the sliding window,
        each compressor's: 2m rows for CSA, m for HCA), so a step's rows write distinct ring slots (Flash: 8)."""
        cfg = self.cfg
        rings = [2 * m if cfg.layer_types[i] == CSA else m
                 for i in range(cfg.num_hidden_layers) if (m := cfg.compress_rate(i))]
        return min(MAX_VERIFY_ROWS, cfg.sliding_window, *rings)

    def verify_device(self, state: DecodeState, tokens: torch.Tensor, sampling: SamplingParams,
                      stop: torch.Tensor | None = None, k: int = 0,
                      rows: tuple[SamplingRows, SamplingRows] | None = None) -> torch.Tensor:
        """A verify step as device work alone (what a CUDA graph of it would hold; verify and verify_draft check
        their input and read this back): tokens [R] on the device, stop the stop tokens or None, k the MTP
        layer's drafts (0: none) -> [the R draws, drafts accepted, verdict, the k drafts] fp64. No host sync, no
        shape from data (tests/test_speculative.py runs it under NoHostSync). rows: the sampling as device rows (R
        for the draws, 1 for a draft; a graph's, loaded before each replay), else made here; every row draws as
        model.step's sample would (SamplingRows: each row's bits its own)."""
        R, tf = tokens.shape[0], self.transformer
        if rows is None:
            rows = (SamplingRows(R, tokens.device, sampling, restricted=restricts(sampling)),
                    SamplingRows(1, tokens.device, sampling, restricted=restricts(sampling)))
        h, logits, undo = tf.verify(state, tokens)  # the step's collectives still open: the MTP layer's join them
        logits = logits.float()  # what settle stores: the draw reads the fp32 logits, as model.step's does
        with phase("sampler"):
            draws = sample(logits, sampling, state.pos + torch.arange(1, R + 1, device=tokens.device), rows[0])
        match = tokens[1:] == draws[:-1]
        if stop is not None:
            match &= ~torch.isin(draws[:-1], stop)
        accepted = torch.cumprod(match.long(), 0).sum()  # drafts accepted: the leading matches
        last = accepted.view(1)
        undos, drafted = [undo], []
        if k:  # the layer at pos + accepted (the last kept row) drafts the token at pos + accepted + 2, and on
            undos.append(Undo())
            g, mtp_logits = tf.mtp_rows([state.ahead(j) for j in range(R)], h, draws, undos[-1])
            drafted = self._mtp_drafts(state, g.index_select(0, last), mtp_logits.index_select(0, last)[0],
                                       accepted + 1, sampling, k, rows[1])
        tf.comm.end_step()
        verdict = tf.comm.verdict  # one verdict for the model's rows and the MTP layer's
        ok = verdict == 0
        kept = ok & (torch.arange(R, device=tokens.device) <= accepted)
        for u in reversed(undos):
            u.take_back(kept)
        state.hidden.copy_(torch.where(ok, h.index_select(0, last)[0], state.hidden))
        state.logits.copy_(torch.where(ok, logits.index_select(0, last)[0], state.logits))
        state.token.copy_(torch.where(ok, draws.index_select(0, last)[0], state.token))
        state.pos.add_(ok.long() * (accepted + 1))
        state.counts[1].add_(ok.long())
        return torch.cat([draws.double(), accepted.double().view(1), verdict.double().view(1),
                          *(d.double().view(1) for d in drafted)])

    def _io(self, device: torch.device) -> "_HostIO | None":
        """The device's pinned step I/O (CONFIG pinned_io, CUDA), made at its first step."""
        if not CONFIG["pinned_io"] or device.type != "cuda":
            return None
        io = self._host_io.get(device)
        if io is None:
            io = self._host_io[device] = _HostIO()
        return io

    def step_device(self, state: DecodeState, sampling, rows=None, host=None) -> torch.Tensor:
        """The whole step as device work (what a full-token graph captures): -> [token, verdict] fp64. rows: the
        sampling's SamplingRows when the caller holds them (a graph's, built before its capture), else built here.
        host: a full-token graph's mapped I/O (dsv4.replay CONFIG mapped_io), (token, readback) in pinned host
        memory: the input token read from the first and the readback also stored into the second, inside the step."""
        if host is not None:
            if REPLAY["fetch"] == "kernel" and kernels.use_triton(state.input, gpu_checked=bookkeeping.GPU_CHECKED):
                bookkeeping.fetch(host[0], state.input)
            else:  # a memcpy node in a graph (dsv4.replay CONFIG fetch)
                state.input.copy_(host[0], non_blocking=True)
        verdict = self.transformer.transaction([state], state.input)
        with phase("sampler"):
            drawn = sample(state.logits, sampling, state.pos, rows)
        if (kernels.use_triton(drawn, gpu_checked=bookkeeping.GPU_CHECKED)
                and bookkeeping.readback_supported(drawn, state.token, verdict)):
            return bookkeeping.readback(drawn, state.token, verdict, None if host is None else host[1])
        state.token.copy_(drawn)
        out = torch.stack([state.token.double(), verdict.double()])
        if host is not None:
            host[1].copy_(out, non_blocking=True)
        return out

    # ---- batched decode (continuous batching) -------------------------------
    def step_batch(self, states: Sequence[DecodeState], tokens: Sequence[int], samplings: Sequence,
                   active: Sequence[bool] | None = None, graph: bool = False) -> tuple[int, ...]:
        """One sampled step for each of several sequences at once: states[b] takes tokens[b] and draws
        with samplings[b] (a SamplingParams or None). One forward over all of them, one verdict, one
        readback. Row b's token is bit-identical to `step(states[b], tokens[b], samplings[b])`: every
        row of the step is computed as it would be alone (see dsv4.model.linear.rows_alone).

        active[b] False: row b carries no sequence (a slot of a captured bucket that is free now); it
        computes, commits nothing and reads -1. graph=True (CUDA): the step of this exact list of
        states is captured into one CUDA graph at its first call and replayed after (dsv4.replay);
        the tokens, the active rows and the sampling parameters are rewritten in place before each
        replay, so sequences join and leave without a recapture. A refusal quarantines every active
        state and raises RefusalError: nothing was committed for any row.
        """
        return tuple(d.token for d in self._step_batch(states, tokens, samplings, active, graph, None))

    def step_batch_processed(self, states: Sequence[DecodeState], tokens: Sequence[int], samplings: Sequence,
                             processing: Sequence[Processing | None], active: Sequence[bool] | None = None,
                             graph: bool = False) -> tuple[Drawn, ...]:
        """`step_batch` with row b's logits processed as processing[b] says (dsv4.sampler.Processing:
        penalties, logit_bias, min_p, this step's allowed tokens, logprobs; None: nothing) before its draw,
        on the device (sampler.process_logits). Each state's token counts (TokenCounts) are updated inside
        the step from its drawn token, and restart from processing[b].prompt when given (a sequence's first
        step in its slot). -> one Drawn per row (an inactive row's token is -1).

        When no active row needs processing the step is exactly step_batch's (the same device work, the
        same graph); otherwise the step of this list of states with processors is a graph of its own
        (graph=True), captured at its first call. A row's draw is bit-identical alone or in any batch.
        """
        if processing is None or len(processing) != len(states):
            raise ValueError(f"step_batch_processed: {len(states)} states and "
                             f"{'no' if processing is None else len(processing)} Processing rows: one each")
        return tuple(self._step_batch(states, tokens, samplings, active, graph, list(processing)))

    def _step_batch(self, states, tokens, samplings, active, graph: bool,
                    processing: list[Processing | None] | None) -> list[Drawn]:
        B = len(states)
        active = [True] * B if active is None else [bool(a) for a in active]
        if not B or len(tokens) != B or len(samplings) != B or len(active) != B:
            raise ValueError(f"step_batch: {len(states)} states, {len(tokens)} tokens, {len(samplings)} "
                             f"samplings and {len(active)} active flags: one each, at least one")
        if len({id(s) for s in states}) != B:
            raise ValueError("step_batch: a state appears twice in one step")
        if self._pending:
            raise RuntimeError(f"step_batch: {len(self._pending)} pipelined step(s) not settled: "
                               "step_batch_settle() them first")
        ids = self._tokens([t if a else 0 for t, a in zip(tokens, active)], "step_batch").tolist()
        live = [s for s, a in zip(states, active) if a]
        for s in live:
            s.check_open()
            s.check_room(1)
        processing = [r if a else None for r, a in zip(processing or [None] * B, active)]
        mode = _processing_mode(processing)
        params = [p or SamplingParams() for p in samplings]
        batch = self._batch(list(states), graph, mode, any(restricts(p) for p in params))
        batch.load(ids, active, [False] * B, params, non_blocking=False)
        if batch.process is not None:
            for counts, r in zip(batch.counts, processing):
                if r is not None and r.prompt is not None:
                    counts.reset(r.prompt)
            batch.process.load(processing)
        if graph:
            out = batch.replay.run()
        else:
            with torch.inference_mode():
                out = self.step_batch_device(batch)
        out = out.tolist()
        if out[B] != 0:  # no pipelined step was pending (checked above): a hold here is this step's own
            self._refused(live)
        for s in live:
            s.host_pos += 1
        return _drawn(out, B, active, processing, batch.process)

    def _refused(self, live: list[DecodeState]):
        """A batched step refused: quarantine its states, lift the hold it set (queued after every step already
        launched, which stay held), raise."""
        message = self.refusal_message()
        for s in live:
            s.quarantine = message
        self.hold.zero_()
        raise RefusalError(message)

    # ---- pipelined batched steps ----------------------------------------------
    def step_batch_launch(self, states: Sequence[DecodeState], tokens: Sequence[int | None], samplings: Sequence,
                          active: Sequence[bool] | None = None, feed: Sequence[bool] | None = None,
                          graph: bool = False) -> None:
        """Launch step_batch's step without waiting for it; `step_batch_settle()` returns its tokens later, steps
        settling in launch order. feed[b] True: row b's input is the token its state drew in its last step, read
        on the device (tokens[b] is not read), so the next step can be launched before this one's tokens reach the
        host, and the host's work on them overlaps the device's next step (a server's decode loop). A row's token
        is the same as step_batch's (feed only moves where its input comes from).

        The states' host positions advance at launch. If an earlier step refuses, every step launched before the
        host settled that refusal commits nothing (the device's hold) and its settle raises StepHeld."""
        B = len(states)
        active = [True] * B if active is None else [bool(a) for a in active]
        feed = [False] * B if feed is None else [bool(f) for f in feed]
        if not B or len(tokens) != B or len(samplings) != B or len(active) != B or len(feed) != B:
            raise ValueError(f"step_batch_launch: {len(states)} states, {len(tokens)} tokens, {len(samplings)} "
                             f"samplings, {len(active)} active and {len(feed)} feed flags: one each, at least one")
        if len({id(s) for s in states}) != B:
            raise ValueError("step_batch_launch: a state appears twice in one step")
        ids = self._tokens([t if a and not f else 0 for t, a, f in zip(tokens, active, feed)],
                           "step_batch_launch").tolist()
        live = [s for s, a in zip(states, active) if a]
        for s in live:
            s.check_open()
            s.check_room(1)
        params = [p or SamplingParams() for p in samplings]
        batch = self._batch(list(states), graph, None, any(restricts(p) for p in params))
        batch.load(ids, active, feed, params, non_blocking=True)
        if graph:
            out = batch.replay.run()
        else:
            with torch.inference_mode():
                out = self.step_batch_device(batch)
        event = None
        if out.device.type == "cuda":
            host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
            host.copy_(out, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        else:
            host = out.clone()
        for s in live:
            s.host_pos += 1
        self._pending.append(_Pending(live, active, host, event))

    def step_batch_settle(self) -> tuple[int, ...]:
        """Wait for the oldest launched step and return its tokens (-1 for an inactive row). Raises RefusalError
        (its states quarantined, nothing committed) or StepHeld (nothing committed, its states as before it)."""
        if not self._pending:
            raise RuntimeError("step_batch_settle: no launched step to settle")
        step = self._pending.pop(0)
        if step.event is not None:
            step.event.synchronize()
        out = step.host.tolist()
        B = len(step.active)
        if out[B] != 0:
            for s in step.live:
                s.host_pos -= 1
            if out[B] == -1:
                raise StepHeld("this step was launched before an earlier step's refusal reached the host: "
                               "nothing committed; run it again")
            self._refused(step.live)
        return tuple(int(t) if a else -1 for t, a in zip(out[:B], step.active))

    def _batch(self, states: list[DecodeState], graph: bool, mode: str | None, restricted: bool) -> "Batch":
        """The step's buffers (and, graph, its graph): one per list of states, processing mode and whether some
        row needs the kept-set sort (top_k / top_p: dsv4.sampler.restricts)."""
        if not graph:
            return self._new_batch(states, mode, restricted)
        if self.device.type != "cuda":
            from .replay import ReplayError

            raise ReplayError("step_batch(graph=True) needs CUDA states (the graph arm does not exist on CPU)")
        key = (tuple(id(s) for s in states), mode, restricted)
        batch = self._batches.get(key)
        if batch is None or any(a is not b for a, b in zip(batch.states, states)):
            from . import replay

            batch = self._batches[key] = self._new_batch(states, mode, restricted)
            batch.replay = replay.BatchReplay(self, batch)
        return batch

    def _new_batch(self, states: list[DecodeState], mode: str | None, restricted: bool = True) -> "Batch":
        if mode is None:
            return Batch(states, self.device, restricted=restricted)
        top = TOP_LOGPROBS if mode == "logprobs" else None
        process = ProcessRows(len(states), self.cfg.vocab_size, self.device, top)
        return Batch(states, self.device, process, [self._token_counts(s) for s in states], restricted)

    def _token_counts(self, state: DecodeState) -> TokenCounts:
        counts = self._counts.get(state)
        if counts is None:
            counts = self._counts[state] = TokenCounts(self.cfg.vocab_size, self.device)
        return counts

    def step_batch_device(self, batch: "Batch") -> torch.Tensor:
        """The batched step as device work (what a batch graph captures): -> [tokens..., verdict] fp64
        (then, with processors reporting logprobs, `_sample_processed`'s values and ids)."""
        # A hold (an unsettled refusal) masks every row: the step computes and commits nothing.
        fused = self._fused_ends(batch)
        if fused:  # the lines below in one launch
            held, active, tokens = bookkeeping.batch_begin(self.hold, batch.active, batch.feed, batch.input,
                                                           batch.token_addr)
        else:
            held = self.hold.clone()
            active = batch.active & ~held
            last = torch.stack([s.token for s in batch.states])
            tokens = torch.where(batch.feed, last, batch.input)
        verdict = self.transformer.transaction(batch.states, tokens, active)
        plain = batch.process is None  # decided on the host: a batch without processors
        if not (fused and plain):
            self.hold.logical_or_(verdict != 0)
            # the readback's status: the verdict; -1 where it was 0 but the step was held (StepHeld)
            status = torch.where(verdict != 0, verdict.double(), -held.double()).view(1)
        with phase("sampler"):
            if plain and len(batch.states) == 1:  # the draw only reads them: the state's own, no stacked copy
                logits, pos = batch.states[0].logits.unsqueeze(0), batch.states[0].pos.unsqueeze(0)
            else:
                logits = torch.stack([s.logits for s in batch.states])
                pos = torch.stack([s.pos for s in batch.states])
            if not plain:
                return self._sample_processed(batch, active, logits, pos, status)
            drawn = sample_rows(logits, batch.rows, pos)
            if fused:  # the hold, the status, the rows' state tokens and the readback below in one launch
                return bookkeeping.batch_end(self.hold, held, verdict, drawn, active, batch.token_addr)
            for b, s in enumerate(batch.states):
                s.token.copy_(torch.where(active[b], drawn[b], s.token))
        return torch.cat([drawn.double(), status])

    def _fused_ends(self, batch: "Batch") -> bool:
        """Whether a batched step's start and end run as one launch each (kernels.bookkeeping.batch_begin / end)."""
        return (kernels.use_triton(batch.input, gpu_checked=bookkeeping.GPU_CHECKED)
                and bookkeeping.batch_supported(self.hold, batch.input, batch.token_addr))

    def _sample_processed(self, batch: "Batch", active: torch.Tensor, logits: torch.Tensor, pos: torch.Tensor,
                          status: torch.Tensor) -> torch.Tensor:
        """The draw with processors; counts each active row's token. -> [tokens..., verdict] fp64, then with
        logprobs the [B, 1 + TOP_LOGPROBS] values and the [B, TOP_LOGPROBS] ids, flattened."""
        generated = torch.stack([c.generated for c in batch.counts])
        prompt = torch.stack([c.prompt for c in batch.counts])
        drawn, lp = sample_processed(logits, batch.rows, batch.process, pos, generated, prompt)
        vocab = torch.arange(logits.shape[-1], device=logits.device)
        hits = (vocab == drawn.unsqueeze(-1)) & active.unsqueeze(-1)
        for b, (s, counts) in enumerate(zip(batch.states, batch.counts)):
            s.token.copy_(torch.where(active[b], drawn[b], s.token))
            counts.generated.add_(hits[b])
        parts = [drawn.double(), status]
        if lp is not None:
            parts += [lp[0].flatten().double(), lp[1].flatten().double()]
        return torch.cat(parts)

    def drop_batch_graphs(self):
        """Forget every captured batched step (before the process group goes: NCCL cannot tear down a
        communicator that a live graph still uses)."""
        self._batches.clear()

    def drop_batch(self, states: Sequence[DecodeState]) -> None:
        """Forget the batched steps captured over exactly these states (their graphs and buffers): a one-off
        list of states (dsv4.generation.pipelined_tokens) is not kept alive by its graph."""
        ids = tuple(id(s) for s in states)
        for key in [k for k in self._batches if k[0] == ids]:
            del self._batches[key]

    def batch_captures(self) -> int:
        """Batch graphs captured so far (one per list of states, i.e. per bucket of a server)."""
        return sum(b.replay.captures for b in self._batches.values())

    def check_capturable(self, state: DecodeState, ids: Sequence[int], sampling=None) -> int | None:
        """Run what a CUDA graph would capture under dsv4.syncguard.NoHostSync, then settle it as a step.

        One id: the full-token step (step_device: forward, commit, head, sample), returning the token.
        Several: one transaction over the chunk (a prefill chunk). Raises HostSyncError, naming the op
        and the line, where that work reads a device value on the host or sizes a tensor from data;
        raises RefusalError after a refused step, as step does. On any device (CI runs it on CPU).
        """
        from .syncguard import NoHostSync

        state.check_open()
        tokens = self._tokens(ids, "check_capturable")
        state.check_room(tokens.shape[0])
        with torch.inference_mode():
            if tokens.shape[0] == 1:
                state.input.copy_(tokens)
                with NoHostSync():
                    out = self.step_device(state, sampling or SamplingParams())
                token, verdict = out.tolist()
            else:
                tokens = tokens.to(self.device)
                with NoHostSync():
                    v = self.transformer.transaction([state], tokens)
                token, verdict = None, float(v)
        self._settle(state, verdict, tokens.shape[0])
        return None if token is None else int(token)

    def profile_steps(self, state: DecodeState, token: int, sampling, steps: int = 4, replays: int = 16) -> dict:
        """This rank's profile of the decode step of `state` on `token` (state is left as it was): the phase
        breakdown over `replays` timed steps (dsv4.measure: inside a replayed CUDA graph on CUDA, eager steps
        elsewhere) and the bytes read per token, with the routes of `steps` eager steps from state."""
        from . import measure

        start = self.new_state(state.capacity)
        start.restore(state)
        carry = token
        with measure.recording_routes() as picks:
            for _ in range(steps):
                carry = self.step(state, carry, sampling)
        state.restore(start)
        if self.device.type == "cuda":
            from .replay import TimedReplay

            rec = measure.graph_phases(self, state, start, token, sampling, replays,
                                       lambda marked: TimedReplay(self, state, sampling, marked))
        else:
            rec = measure.eager_phases(self, state, start, token, sampling, replays)
        return {**rec, "bytes_per_token": measure.bytes_per_token(self.transformer, picks, steps, start.host_pos)}

    def kernel_table(self, state: DecodeState, token: int, sampling, steps: int = 16) -> dict:
        """This rank's kernels of `steps` steps of state (graph replays once its graph is armed and captured):
        calls and GPU time per token by kernel name, against the wall (dsv4.measure.kernel_table)."""
        from . import measure

        carry = [token]

        def one():
            carry[0] = self.step(state, carry[0], sampling)

        return measure.kernel_table(one, steps, self.device)

    def kernel_table_batch(self, states: Sequence[DecodeState], tokens: Sequence[int], samplings: Sequence,
                           steps: int = 16) -> dict:
        """kernel_table of `steps` batched steps of these states (their batch graph on CUDA, captured at the
        first untimed step): calls and GPU time per step (B tokens) by kernel name, against the wall."""
        from . import measure

        graph = self.device.type == "cuda"
        carry = [list(self.step_batch(states, tokens, samplings, graph=graph))]

        def one():
            carry[0] = list(self.step_batch(states, carry[0], samplings, graph=graph))

        return measure.kernel_table(one, steps, self.device)

    def prefill_table(self, state: DecodeState, prefix: DecodeState, ids: Sequence[int], chunk_size: int | None = None,
                      runs: int = 2) -> dict:
        """This rank's time of `prefill(state, ids, chunk_size)` from `prefix` (restored before each run), by
        phase and kernel (dsv4.measure.prefill_table)."""
        from . import measure

        return measure.prefill_table(lambda: self.prefill(state, ids, chunk_size), lambda: state.restore(prefix),
                                     runs, self.device)

    # ---- full-token replay --------------------------------------------------
    def enable_replay(self, state: DecodeState, sampling=None):
        """Capture this state's step into one CUDA graph at its next step; replay it ever after."""
        from . import replay

        return replay.enable(self, state, sampling or SamplingParams())

    def replay_counts(self, state: DecodeState) -> list[int]:
        """[forward, commit] steps run on this state (eager or replayed), from its device counters."""
        return state.counts.tolist()

    def captures(self, state: DecodeState) -> int:
        return 0 if state.replay is None else state.replay.captures

    def graph_census(self, state: DecodeState) -> dict:
        return {} if state.replay is None else dict(state.replay.census)

    # ---- gates and tests ---------------------------------------------------
    def digests(self, state: DecodeState) -> tuple[str, str, int]:
        return state.digest()

    def arm_refusal(self, layer: int, rank: int, code: int, site: str = "attention"):
        self.comm.arm_refusal(layer, rank, code, site)

    def refusal_words(self) -> list[int]:
        return [int(self.comm.word)]

    def reset_refusals(self):
        self.comm.reset_refusals()

    def census(self) -> torch.Tensor:
        return self.comm.census.cpu().clone()

    def draw(self, state: DecodeState, sampling) -> int:
        """Sample the token for position state.pos from the state's logits, without a step."""
        return int(sample(state.logits, sampling, state.pos))

    def logits_sha(self, state: DecodeState) -> str:
        import hashlib

        return hashlib.sha256(state.logits.cpu().numpy().tobytes()).hexdigest()

    def memory_allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else 0

    def synchronize(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def each(self, name: str, *args) -> list:
        """Every rank's answer to `name(*args)` (one rank here; a DistributedModel asks all of them)."""
        return [getattr(self, name)(*args)]


__all__ = ["build", "placement", "Model", "ModelCommon", "RefusalError", "CapacityError", "QuarantineError"]
