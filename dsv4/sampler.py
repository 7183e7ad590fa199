"""The device sampler: temperature / top-k / top-p sampling driven by a counter-based draw.

Every random number is a pure function of ``(seed, pos)``, so a token can be
re-drawn anywhere (host or device, plain or fast path, replay or first run)
and comes out the same. The draw for the token at position ``p`` uses
``pos = p``: ``p`` is the position the sampled token will occupy in the
sequence (the gate that compares decode paths relies on this convention).

The draw, all arithmetic on unsigned 64-bit integers (mod 2**64)::

    G  = 0x9E3779B97F4A7C15
    M1 = 0xBF58476D1CE4E5B9
    M2 = 0x94D049BB133111EB
    mix(z) = z ^= z >> 30; z *= M1; z ^= z >> 27; z *= M2; z ^= z >> 31
    key    = mix(seed + G)                 # first SplitMix64 output for `seed`
    x      = mix(key + (pos + 1) * G)      # output number `pos` of SplitMix64 started at `key`
    u(seed, pos) = (x >> 40) * 2**-24      # top 24 bits: exact in float32, in [0, 1)

Mixing the seed first means nearby seeds give unrelated streams (plain
SplitMix64 streams of seeds s and s + G are shifted copies of each other).

`uniform` computes this in Python integers for an int ``pos`` and with int64
tensor ops (on the tensor's device, no host sync) for a tensor ``pos``; the two
agree bit for bit. `sample` is branch-free on tensor values and has static
shapes, so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import NamedTuple

import torch

from . import kernels
from .kernels import draw
from .kernels import gumbel as gumbel_kernel
from .kernels import sample as sample_kernel

__all__ = ["SamplingParams", "SamplingRows", "GREEDY", "uniform", "sample", "sample_rows", "LogitsParams",
           "Processing", "ProcessRows", "TokenCounts", "TOP_LOGPROBS", "process_logits", "sample_processed", "Drawn"]

_MASK64 = (1 << 64) - 1
_G = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


def _check(ok: bool, field: str, value, allowed: str) -> None:
    if not ok:
        raise ValueError(f"SamplingParams.{field} must be {allowed}, got {value!r}")


def _is_int(v) -> bool:
    # bool is an int subclass but `seed=True` is always a mistake.
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick a token from logits. ``temperature == 0`` means greedy (argmax)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int = 0

    def __post_init__(self) -> None:
        t, p, k, s = self.temperature, self.top_p, self.top_k, self.seed
        real = isinstance(t, numbers.Real) and not isinstance(t, bool)
        _check(real and math.isfinite(t) and t >= 0, "temperature", t, "a finite real number >= 0")
        real = isinstance(p, numbers.Real) and not isinstance(p, bool)
        _check(real and 0 < p <= 1, "top_p", p, "a real number in (0, 1]")
        _check(_is_int(k) and k >= 0, "top_k", k, "an int >= 0 (0 = off)")
        _check(_is_int(s) and 0 <= s < 2**64, "seed", s, "an int in [0, 2**64)")
        # Normalise numpy scalars etc. so equal params compare and hash equal.
        object.__setattr__(self, "temperature", float(t))
        object.__setattr__(self, "top_p", float(p))
        object.__setattr__(self, "top_k", int(k))
        object.__setattr__(self, "seed", int(s))

    @classmethod
    def greedy(cls) -> SamplingParams:
        return cls(temperature=0.0)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0


GREEDY = SamplingParams.greedy()


# ---------------------------------------------------------------------------
# The counter-based draw.


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * _M1) & _MASK64
    z = ((z ^ (z >> 27)) * _M2) & _MASK64
    return z ^ (z >> 31)


def _signed(v: int) -> int:
    """The int64 with the same bits as the uint64 `v` (torch has no uint64 arithmetic)."""
    return v - (1 << 64) if v >= 1 << 63 else v


def _lsr(x: torch.Tensor, s: int) -> torch.Tensor:
    # torch's >> is arithmetic on int64; masking off the sign-extended bits makes it logical.
    return (x >> s) & ((1 << (64 - s)) - 1)


def _mix_t(z: torch.Tensor) -> torch.Tensor:
    # int64 multiply wraps mod 2**64 (two's complement), i.e. the low 64 bits we want.
    z = (z ^ _lsr(z, 30)) * _signed(_M1)
    z = (z ^ _lsr(z, 27)) * _signed(_M2)
    return z ^ _lsr(z, 31)


def _key(seed: int) -> int:
    if not _is_int(seed) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an int in [0, 2**64), got {seed!r}")
    return _mix((int(seed) + _G) & _MASK64)


def _integer_tensor(pos: torch.Tensor) -> None:
    if pos.dtype.is_floating_point or pos.dtype.is_complex or pos.dtype == torch.bool:
        raise TypeError(f"pos must be an integer tensor, got dtype {pos.dtype}")


def uniform(seed: int, pos: int | torch.Tensor) -> float | torch.Tensor:
    """The draw u(seed, pos) in [0, 1) (formula in the module docstring).

    An int `pos` (0 <= pos < 2**63) gives a Python float. An integer tensor `pos`
    (any shape, any device) gives a float32 tensor of that shape on that device,
    bit-identical to the int path, computed without a host sync.
    """
    key = _key(seed)
    if isinstance(pos, torch.Tensor):
        _integer_tensor(pos)
        x = _mix_t((pos.to(torch.int64) + 1) * _signed(_G) + _signed(key))
        return _lsr(x, 40).to(torch.float32) * 2.0**-24
    if not _is_int(pos) or not 0 <= pos < 2**63:
        raise ValueError(f"pos must be an int in [0, 2**63), got {pos!r}")
    x = _mix((key + (int(pos) + 1) * _G) & _MASK64)
    return (x >> 40) * 2.0**-24


# ---------------------------------------------------------------------------
# Sampling.

_SCAN_ROW = 1024


def _cumsum(x: torch.Tensor) -> torch.Tensor:
    """Inclusive cumsum over the last dim that is bit-reproducible on CUDA, and the same for a row
    alone as for that row in a batch.

    torch.cumsum picks its CUDA kernel and its association from the whole tensor's shape: CUB's scan
    when the tensor is one row (numel == size(dim); for a long row a decoupled look-back whose order
    depends on timing), else the per-row kernel, whose threads per row depend on how many rows there
    are. So each row is scanned on its own, as the [1, V] it would be alone: the same kernels, the same
    association, in eager and in a replay, alone or beside any other rows.
    """
    if x.dim() < 2 or x.shape[:-1].numel() == 1:
        return _cumsum_row(x)
    flat = x.reshape(-1, x.shape[-1])
    return torch.cat([_cumsum_row(flat[b:b + 1]) for b in range(flat.shape[0])]).view(x.shape)


def _cumsum_row(x: torch.Tensor) -> torch.Tensor:
    """One row [..., V] (a single row): rows of 1024 scanned by the per-row kernel, plus the rows'
    offsets by a second scan. A long 1-D CUDA scan would run CUB's look-back, whose float association
    depends on timing; a scan of at most one tile does not."""
    V = x.shape[-1]
    R = -(-V // _SCAN_ROW)
    if R == 1:
        return torch.cumsum(x, dim=-1)  # one tile: no look-back, already deterministic
    rows = torch.nn.functional.pad(x, (0, R * _SCAN_ROW - V)).unflatten(-1, (R, _SCAN_ROW))
    inner = torch.cumsum(rows, dim=-1)
    # Row r's offset: the totals of rows < r, by a second one-tile scan (not a masked sum over R, whose
    # CUDA reduction would split its inputs by the number of outputs).
    offsets = torch.cumsum(torch.nn.functional.pad(inner[..., :-1, -1], (1, 0)), dim=-1)
    return (inner + offsets.unsqueeze(-1)).flatten(-2)[..., :V]


class SamplingRows:
    """Per-row sampling parameters as device tensors [B]: what a batched step samples with.

    A captured graph reads these buffers, so rows are rewritten in place between replays (`load`),
    never reallocated. Row b of `sample_rows` equals `sample` with that row's SamplingParams, bit for
    bit, whatever the other rows hold: every operation is per row.
    """

    def __init__(self, n: int, device, params: SamplingParams | None = None, restricted: bool = True):
        p = params or SamplingParams()
        # False: every row draws from its whole softmax (no top-k, no top-p), so the step skips the sort that
        # finds the kept tokens; load() refuses a row that would need it. A row without them draws the same
        # token either way (the kept set is then every token).
        self.restricted = restricted
        self.temperature = torch.full((n,), p.temperature, dtype=torch.float32, device=device)
        self.top_p = torch.full((n,), p.top_p, dtype=torch.float32, device=device)
        self.top_k = torch.full((n,), p.top_k, dtype=torch.int64, device=device)
        self.key = torch.full((n,), _signed(_key(p.seed)), dtype=torch.int64, device=device)
        self._check_restricted([p])
        if CONFIG["method"] == "gumbel":
            gumbel_table(device)  # its copy to the device now, before any capture that draws with these rows

    def _check_restricted(self, params: list[SamplingParams]) -> None:
        wide = [p for p in params if restricts(p)]
        if wide and not self.restricted:
            raise ValueError(f"SamplingRows(restricted=False) cannot hold {wide[0]}: its top_k / top_p need the "
                             "kept-set sort that these rows' step leaves out")

    def load(self, params: list[SamplingParams], non_blocking: bool = False) -> None:
        """Row b takes params[b] (a host-to-device copy of four small tensors, outside any capture).
        non_blocking: the copies are queued behind the stream's work from pinned memory (dsv4.engine's
        pipelined steps); a plain copy from pageable memory waits for the stream to drain."""
        if len(params) != self.key.shape[0]:
            raise ValueError(f"{len(params)} SamplingParams for {self.key.shape[0]} rows")
        self._check_restricted(params)
        for dst, values in ((self.temperature, [p.temperature for p in params]), (self.top_p, [p.top_p for p in params]),
                            (self.top_k, [p.top_k for p in params]),
                            (self.key, [_signed(_key(p.seed)) for p in params])):
            upload(dst, values, non_blocking)


def upload(dst: torch.Tensor, values: list, non_blocking: bool = False) -> None:
    """dst (a device buffer a graph reads) takes `values`. non_blocking on CUDA: from pinned memory, queued on the
    stream without waiting for it (the pinned block is not reused before the copy ran: torch's host allocator
    records the copy)."""
    src = torch.tensor(values, dtype=dst.dtype)
    if non_blocking and dst.device.type == "cuda":
        dst.copy_(src.pin_memory(), non_blocking=True)
    else:
        dst.copy_(src)


def sample(logits: torch.Tensor, params: SamplingParams, pos: int | torch.Tensor,
           rows: SamplingRows | None = None) -> torch.Tensor:
    """Pick token ids from `logits` [..., vocab] with the draw u(params.seed, pos).

    The draw for the token at position p uses pos = p (the position that token
    will occupy in the sequence). `pos` is an int or an integer tensor on
    logits' device whose shape broadcasts against ``logits.shape[:-1]``;
    the result is an int64 tensor of the broadcast shape (0-dim for a
    [vocab] logits and an int / 0-dim pos). Every row is `sample_rows` with these params.
    rows: `SamplingRows` already holding params in each of the broadcast shape's rows (a captured step's: built
    before its capture, so that the graph holds no fills of them); None builds them here.
    """
    vocab = logits.shape[-1]
    if isinstance(pos, torch.Tensor):
        _integer_tensor(pos)
    else:
        uniform(params.seed, pos)  # the draw's own checks of an int pos
        pos = torch.full((), pos, dtype=torch.int64, device=logits.device)  # a fill: capturable, unlike a copy
    out_shape = torch.broadcast_shapes(logits.shape[:-1], pos.shape)
    n = math.prod(out_shape)
    if rows is None:
        rows = SamplingRows(n, logits.device, params, restricted=restricts(params))
    elif rows.key.shape != (n,) or rows.restricted != restricts(params):
        raise ValueError(f"sample: SamplingRows of {rows.key.shape[0]} rows (restricted={rows.restricted}) "
                         f"for {n} row(s) of {params}")
    flat = logits.expand(*out_shape, vocab).reshape(n, vocab)
    return sample_rows(flat, rows, pos.expand(out_shape).reshape(n)).view(out_shape)


def restricts(params: SamplingParams) -> bool:
    """Whether a row draws from fewer than all tokens (top_k or top_p, for a sampled row): its kept set needs the
    sort (`_kept_set`); a row without them skips it and draws the same token it would draw with it."""
    return not params.is_greedy and (params.top_k > 0 or params.top_p < 1)


def sample_rows(logits: torch.Tensor, rows: SamplingRows, pos: torch.Tensor) -> torch.Tensor:
    """Pick one token id per row of `logits` [B, vocab] (`_draw`); -> int64 [B]."""
    return _draw(logits, rows, pos)[0]


def _draw(logits: torch.Tensor, rows: SamplingRows, pos: torch.Tensor, need_kept: bool = False):
    """Pick one token id per row of `logits` [B, vocab] with row b's parameters and the draw
    u(seed_b, pos[b]); -> (int64 [B], the distribution it drew from: `_Kept`, or None when neither the rows
    nor `need_kept` ask for it).

    temperature == 0: argmax, ties to the lowest token id.
    Otherwise the kept tokens: probs = softmax(logits.float() / temperature) in fp32, ranked by a stable
    descending sort (ties to the lowest id); the first top_k ranks (0 = all) and, when top_p < 1, only ranks
    whose mass before them is < top_p (rank 0 is always kept) (`_kept_set`). Then the token: the kept tokens'
    CDF inverted in vocabulary order at u x their total, a chunk at a time (`_token`). Rows without top_k and
    top_p keep every token, and their step (rows.restricted False) skips the sort: the same token.
    Branch-free on the parameters (a greedy row computes the draw too and takes the argmax), no host sync and
    static shapes, so it is CUDA-graph capturable with the rows as static buffers.
    """
    kept = _kept_set(logits, rows) if rows.restricted or need_kept else None
    return _token(logits, rows, pos, None if kept is None else _kept_mask(kept)), kept


def _kept_set(logits: torch.Tensor, rows: SamplingRows) -> "_Kept":
    """The tokens top-k and top-p keep (see `_draw`), as the sorted distribution and its kept prefix."""
    vocab = logits.shape[-1]
    greedy = rows.temperature == 0
    temperature = rows.temperature.masked_fill(greedy, 1.0).unsqueeze(-1)  # a scalar where() would launch a fill
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)

    # How many leading ranks survive top-p and top-k. Counting (rather than
    # masking rank by rank) keeps the kept set a prefix even if a parallel
    # cumsum is not exactly monotone. top_p == 1 keeps everything: a rounded
    # cumsum reaching 1.0 early must not drop the tail. Rank 0's mass before it is 0 < top_p: always counted.
    top_p = rows.top_p.unsqueeze(-1)
    n_keep = ((_cumsum(sorted_p)[..., :-1] < top_p).sum(dim=-1, keepdim=True) + 1).masked_fill(top_p >= 1, vocab)
    top_k = rows.top_k.unsqueeze(-1)
    n_keep = torch.where(top_k > 0, torch.minimum(n_keep, top_k), n_keep)
    keep = torch.arange(vocab, device=logits.device) < n_keep
    kept_total = _cumsum(torch.where(keep, sorted_p, 0.0)).gather(-1, n_keep - 1)  # [B, 1]
    return _Kept(probs, sorted_p, order, n_keep, kept_total)


def _kept_mask(kept: "_Kept") -> torch.Tensor:
    """The kept tokens as a bool [B, vocab] in vocabulary order."""
    ranks = torch.arange(kept.order.shape[-1], device=kept.order.device) < kept.n_keep
    return torch.zeros_like(ranks).scatter_(-1, kept.order, ranks)


def _token(logits: torch.Tensor, rows: SamplingRows, pos: torch.Tensor, kept: torch.Tensor | None) -> torch.Tensor:
    """The drawn (or greedy) token of each row: dsv4.kernels.sample's two launches where they run, else
    `_token_reference`; with CONFIG method "gumbel", `_token_gumbel`."""
    if CONFIG["method"] == "gumbel":
        if kernels.use_triton(logits, gpu_checked=gumbel_kernel.GPU_CHECKED) and gumbel_kernel.supported(logits, kept):
            return gumbel_kernel.token(logits, rows.temperature, rows.key, pos, kept, gumbel_table(logits.device))
        return _token_gumbel(logits, rows.temperature, rows.key, pos, kept)
    if kernels.use_triton(logits, gpu_checked=sample_kernel.GPU_CHECKED) and sample_kernel.supported(logits, kept):
        return sample_kernel.token(logits, rows.temperature, rows.key, pos.to(torch.int64), kept)
    return _token_reference(logits, rows.temperature, rows.key, pos, kept)


def _token_reference(logits: torch.Tensor, temperature: torch.Tensor, key: torch.Tensor, pos: torch.Tensor,
                     kept: torch.Tensor | None) -> torch.Tensor:
    """Each row's token (see dsv4.kernels.sample, whose steps `_row_token` takes), every row computed alone: ATen's
    CPU loops compute a tensor's last elements with scalar math and the rest with SIMD, and a CUDA reduction splits
    by its number of outputs, so a row's exp and sums must not see the rows beside it. A greedy row (temperature
    0): argmax, ties to the lowest id (torch.argmax's first maximal index on CPU and CUDA)."""
    u = _uniform_rows(key, pos)
    t = temperature.masked_fill(temperature == 0, 1.0)
    drawn = torch.cat([_row_token(logits[b], t[b], u[b], None if kept is None else kept[b])
                       for b in range(logits.shape[0])])
    return torch.where(temperature == 0, torch.argmax(logits, dim=-1), drawn)


def _row_token(x: torch.Tensor, t: torch.Tensor, u: torch.Tensor, kept: torch.Tensor | None) -> torch.Tensor:
    """One row's draw: the chunks' maxima m_c, weights w = exp(z - m_c) of the kept tokens and sums s_c; the chunk
    where the running sum of s_c exp(m_c - m) passes u x total, then in it the first token whose running w passes
    the target's share; the last token of positive weight where rounding passes none. -> int64 [1]. Indices are
    1-element tensors (gather, index_select): no host sync."""
    V = x.shape[-1]
    width = sample_kernel.chunk(V)
    C = -(-V // width)
    z = torch.nn.functional.pad(x.float() / t, (0, C * width - V), value=-math.inf).view(C, width)
    m_c = z.amax(dim=-1)
    w = torch.where(z == -math.inf, 0.0, torch.exp(z - m_c.unsqueeze(-1)))
    if kept is not None:
        w = torch.where(torch.nn.functional.pad(kept, (0, C * width - V)).view(C, width), w, 0.0)
    scale = torch.where(m_c == -math.inf, 0.0, torch.exp(m_c - m_c.amax()))
    weight = _cumsum(w)[:, -1] * scale
    through = _cumsum(weight)
    target = u * through[-1:]
    chunks = torch.arange(C, device=x.device)
    last_chunk = torch.where(weight > 0, chunks, 0).amax(dim=-1, keepdim=True)
    pick = torch.minimum((through <= target).sum(dim=-1, keepdim=True), last_chunk)  # [1]
    share = (target - (through - weight).gather(0, pick)) / scale.gather(0, pick)
    w = w.index_select(0, pick).squeeze(0)
    i = torch.arange(width, device=x.device)
    first = torch.where(_cumsum(w) > share, i, width).amin(dim=-1, keepdim=True)
    last = torch.where(w > 0, i, 0).amax(dim=-1, keepdim=True)
    return pick * width + torch.minimum(first, last)


# The draw's method, for the whole process (every rank reads it from the environment):
#   "inverse" (the default): the kept tokens' CDF inverted in vocabulary order at u(seed, pos) (_row_token);
#   "gumbel" (DSV4_SAMPLER=gumbel, opt-in; dsv4.kernels.gumbel where it runs, else torch ops): the Gumbel-max draw
#       argmax_i(z_i + G_i) over the kept tokens, z = logits / temperature, one G_i a token from (seed, pos, i)
#       (_token_gumbel). Another stream, as exact and as reproducible, and the coupling a speculative step wants: a
#       drafter drawing with the same G agrees with the model within a few points of rejection sampling's bound
#       (benchmarks/coupling_acceptance.py), where the inverse draw loses most drafts at flat distributions.
CONFIG = {"method": kernels.getenv("DSV4_SAMPLER", "inverse")}
if CONFIG["method"] not in ("inverse", "gumbel"):
    raise ValueError(f"DSV4_SAMPLER={CONFIG['method']!r}: 'inverse' (the default) or 'gumbel'")

_GUMBEL_BITS = 24
_GUMBEL: dict = {}  # device -> the table of G over the 2**24 values of u


def gumbel_table(device) -> torch.Tensor:
    """G(u) = -log(-log(u)) at u = (k + 1/2) 2**-24, k = 0 .. 2**24 - 1, as float32 [2**24] (64 MiB) on `device`:
    computed once on the host in float64 and copied, so every device adds the very same G (each device's own log
    could round differently, and the draw must be the host's bit for bit)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:  # one table a GPU, whichever way its device is named
        device = torch.device("cuda", torch.cuda.current_device())
    table = _GUMBEL.get(device)
    if table is None:
        u = (torch.arange(1 << _GUMBEL_BITS, dtype=torch.float64) + 0.5) * 2.0**-_GUMBEL_BITS
        table = _GUMBEL[device] = (-torch.log(-torch.log(u))).to(torch.float32).to(device)
    return table


def _gumbel_index(key: torch.Tensor, pos: torch.Tensor, vocab: int) -> torch.Tensor:
    """Each row's G index of each token [B, vocab]: the top 24 bits of SplitMix64 output i + 1 started at the row's
    draw state mix(key + (pos + 1) G) (the state u(seed, pos) takes its bits from), elementwise over int64."""
    x = _mix_t((pos.to(torch.int64) + 1) * _signed(_G) + key)
    i = torch.arange(1, vocab + 1, dtype=torch.int64, device=key.device)
    return _lsr(_mix_t(x.unsqueeze(-1) + i * _signed(_G)), 64 - _GUMBEL_BITS)


def _token_gumbel(logits: torch.Tensor, temperature: torch.Tensor, key: torch.Tensor, pos: torch.Tensor,
                  kept: torch.Tensor | None) -> torch.Tensor:
    """The Gumbel-max draw of each row: argmax over the kept tokens of z + G, z = logits.float() / temperature in
    fp32 and G from the table (fp32 adds, correctly rounded everywhere; argmax's ties to the lowest id), so every row
    is its own and the host recomputes it bit for bit; a greedy row (temperature 0): the argmax of its logits."""
    t = temperature.masked_fill(temperature == 0, 1.0).unsqueeze(-1)
    z = logits.float() / t + gumbel_table(logits.device)[_gumbel_index(key, pos, logits.shape[-1])]
    if kept is not None:
        z = z.masked_fill(~kept, -math.inf)
    return torch.where(temperature == 0, torch.argmax(logits, dim=-1), torch.argmax(z, dim=-1))


def _uniform_rows(key: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """_uniform_keyed of the rows' keys [B] and positions [B]: one launch of dsv4.kernels.draw where it runs."""
    if kernels.use_triton(key, gpu_checked=draw.GPU_CHECKED) and draw.supported(key, pos):
        return draw.uniform(key, pos)
    return _uniform_keyed(key, pos)


def _uniform_keyed(key: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """uniform(seed, pos) from the seed's key (int64 bits), elementwise over tensors."""
    x = _mix_t((pos.to(torch.int64) + 1) * _signed(_G) + key)
    return _lsr(x, 40).to(torch.float32) * 2.0**-24


# ---------------------------------------------------------------------------
# Logit processing (OpenAI's and vLLM's request fields) and logprobs: an optional stage before the draw.
# A batched step runs it only when a row asks (dsv4.engine.Model.step_batch_processed); without it the
# step is `sample_rows` alone, as before.

TOP_LOGPROBS = 20  # the most top logprobs a row may ask for (OpenAI chat's limit)


class _Kept(NamedTuple):
    """The distribution a row drew from: the softmax after temperature (1 for a greedy row), its stable
    descending order, and the leading ranks top-k / top-p kept with their total mass."""

    probs: torch.Tensor  # [B, vocab]
    sorted_p: torch.Tensor  # [B, vocab]
    order: torch.Tensor  # [B, vocab]
    n_keep: torch.Tensor  # [B, 1]
    kept_total: torch.Tensor  # [B, 1]


def _real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class LogitsParams:
    """A sequence's logit processing before the draw and the logprobs it reports; the defaults change nothing.

    presence_penalty, frequency_penalty (OpenAI's): logits[t] -= presence * (count[t] > 0) + frequency *
    count[t], counts over the generated tokens. repetition_penalty (vLLM's and HF's, > 0): for a token of the
    prompt or generated, logit / p where the logit is > 0, logit * p otherwise. logit_bias (OpenAI's): (token
    id, bias) pairs added to the logits (a dict is taken too). min_p (vLLM's, in [0, 1]): a token whose
    probability after temperature is < min_p x the largest is dropped. logprobs: None, or k in
    [0, TOP_LOGPROBS]: report the chosen token's log-probability and the k most likely tokens' (`logprobs`).
    """

    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None

    def __post_init__(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            _check(_real(v), name, v, "a finite real number")
            object.__setattr__(self, name, float(v))
        r, m, k = self.repetition_penalty, self.min_p, self.logprobs
        _check(_real(r) and r > 0, "repetition_penalty", r, "a finite real number > 0")
        _check(_real(m) and 0 <= m <= 1, "min_p", m, "a real number in [0, 1]")
        _check(k is None or (_is_int(k) and 0 <= k <= TOP_LOGPROBS), "logprobs", k,
               f"None or an int in [0, {TOP_LOGPROBS}]")
        bias = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
        pairs = tuple(sorted((t, b) for t, b in bias))
        _check(all(_is_int(t) and t >= 0 and _real(b) for t, b in pairs) and len({t for t, _ in pairs}) == len(pairs),
               "logit_bias", self.logit_bias, "(token id >= 0, finite bias) pairs, each id once")
        object.__setattr__(self, "repetition_penalty", float(r))
        object.__setattr__(self, "min_p", float(m))
        object.__setattr__(self, "logprobs", None if k is None else int(k))
        object.__setattr__(self, "logit_bias", tuple((int(t), float(b)) for t, b in pairs))

    @property
    def processes(self) -> bool:
        """Whether the logits change (logprobs only read them)."""
        return (self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1
                or self.min_p != 0 or bool(self.logit_bias))


@dataclass(frozen=True, eq=False)
class Processing:
    """A row's processing for one batched step: its params; on a sequence's first step in its slot, its
    prompt (the token counts restart from it); and this step's allowed tokens, an int32 bitmask
    [ceil(vocab / 32)] (bit j of word i: token 32 i + j; a grammar's, from xgrammar), None: all."""

    params: LogitsParams
    prompt: tuple[int, ...] | None = None
    mask: torch.Tensor | None = None

    @property
    def needed(self) -> bool:
        return self.params.processes or self.params.logprobs is not None or self.mask is not None


class Drawn(NamedTuple):
    """A row's token from a processed step, with its logprob and the top ones ((id, logprob), most likely
    first) when its params ask for logprobs (else None and ())."""

    token: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()


class Scored(NamedTuple):
    """A prompt token's score (Model.prefill_scored): its log-probability after the tokens before it, its rank in
    that distribution (1: the most likely), and the `top` most likely tokens ((id, logprob), most likely first)."""

    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...] = ()


class TokenCounts:
    """One sequence's token counts on the device, static buffers a captured step updates in place:
    `generated` fp32 [vocab] (its sampled tokens), `prompt` bool [vocab] (its prompt's tokens)."""

    def __init__(self, vocab: int, device):
        self.generated = torch.zeros(vocab, dtype=torch.float32, device=device)
        self.prompt = torch.zeros(vocab, dtype=torch.bool, device=device)

    def reset(self, prompt_ids) -> None:
        """Start over from a prompt (outside any capture)."""
        self.generated.zero_()
        self.prompt.zero_()
        if prompt_ids:
            self.prompt.index_fill_(0, torch.tensor(list(prompt_ids), device=self.prompt.device), True)


def _words(vocab: int) -> int:
    return -(-vocab // 32)


class ProcessRows:
    """Per-row processing as device tensors [B] (and [B, vocab] biases, [B, words] masks): what a batched step
    with processors reads, rewritten in place before each step (`load`), never reallocated. `top`: None (no
    row reports logprobs) or TOP_LOGPROBS: a static shape of the step, the same for every row."""

    def __init__(self, n: int, vocab: int, device, top: int | None = None):
        self.vocab, self.top = vocab, top
        self.presence = torch.zeros(n, dtype=torch.float32, device=device)
        self.frequency = torch.zeros(n, dtype=torch.float32, device=device)
        self.repetition = torch.ones(n, dtype=torch.float32, device=device)
        self.min_p = torch.zeros(n, dtype=torch.float32, device=device)
        self.bias = torch.zeros(n, vocab, dtype=torch.float32, device=device)
        self.mask = torch.full((n, _words(vocab)), -1, dtype=torch.int32, device=device)
        ids = torch.arange(vocab, device=device)
        self.word, self.bit = ids // 32, (ids % 32).to(torch.int32)

    def load(self, rows: list[Processing | None]) -> None:
        """Row b takes rows[b] (None: the defaults, every token allowed), by host-to-device copies."""
        if len(rows) != self.presence.shape[0]:
            raise ValueError(f"{len(rows)} Processing rows for {self.presence.shape[0]} rows")
        params = [LogitsParams() if r is None else r.params for r in rows]
        for name, field in (("presence", "presence_penalty"), ("frequency", "frequency_penalty"),
                            ("repetition", "repetition_penalty"), ("min_p", "min_p")):
            getattr(self, name).copy_(torch.tensor([getattr(p, field) for p in params], dtype=torch.float32))
        at = [(b, t, v) for b, p in enumerate(params) for t, v in p.logit_bias]
        bad = [t for _, t, _ in at if t >= self.vocab]
        if bad:
            raise ValueError(f"logit_bias: token ids {bad[:4]} outside [0, {self.vocab})")
        self.bias.zero_()
        if at:
            b, t, v = zip(*at)
            self.bias.index_put_((torch.tensor(b, device=self.bias.device), torch.tensor(t, device=self.bias.device)),
                                 torch.tensor(v, dtype=torch.float32, device=self.bias.device))
        self.mask.fill_(-1)
        for b, r in enumerate(rows):
            if r is not None and r.mask is not None:
                self.mask[b].copy_(r.mask.reshape(-1))


def process_logits(logits: torch.Tensor, rows: SamplingRows, proc: ProcessRows, generated: torch.Tensor,
                   prompt: torch.Tensor) -> torch.Tensor:
    """The logits [B, vocab] (fp32) each row draws from after its processing, in vLLM's order: the allowed
    tokens (the others -inf), logit_bias, repetition_penalty, frequency and presence penalties; then min_p
    over the softmax after temperature (a greedy row's: temperature 1, which never drops its argmax).
    `generated` [B, vocab] fp32 and `prompt` [B, vocab] bool: each row's TokenCounts. A row with the defaults
    comes out bit-identical (x + 0, x / 1, x * 1 and x - 0 are exact; min_p 0 drops nothing). All per row,
    static shapes, no host sync."""
    x = logits.float()
    allowed = ((proc.mask[:, proc.word] >> proc.bit) & 1).bool()
    x = torch.where(allowed, x, -math.inf) + proc.bias
    repetition = torch.where(prompt | (generated > 0), proc.repetition.unsqueeze(-1), 1.0)
    x = torch.where(x > 0, x / repetition, x * repetition)
    x = x - proc.frequency.unsqueeze(-1) * generated - proc.presence.unsqueeze(-1) * (generated > 0)
    temperature = torch.where(rows.temperature == 0, 1.0, rows.temperature).unsqueeze(-1)
    probs = torch.softmax(x / temperature, dim=-1)
    floor = proc.min_p.unsqueeze(-1) * probs.amax(dim=-1, keepdim=True)
    return torch.where(probs < floor, -math.inf, x)


def logprobs(kept: _Kept, token: torch.Tensor, top: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, 1 + top] log-probabilities: the chosen token's, then the `top` most likely tokens'; [B, top] their
    ids) in the distribution the token was drawn from: after processing, temperature and top-k / top-p,
    renormalised over the tokens kept (vLLM's "processed" logprobs; a greedy row's: temperature 1). A token
    outside it has -inf."""
    chosen = kept.probs.gather(-1, token.unsqueeze(-1))
    ranks = torch.arange(top, device=token.device)
    lead = torch.where(ranks < kept.n_keep, kept.sorted_p[:, :top], 0.0)
    return torch.log(torch.cat([chosen, lead], dim=-1) / kept.kept_total), kept.order[:, :top]


def sample_processed(logits: torch.Tensor, rows: SamplingRows, proc: ProcessRows, pos: torch.Tensor,
                     generated: torch.Tensor, prompt: torch.Tensor):
    """`sample_rows` of the processed logits (`process_logits`): -> (int64 [B], `logprobs` or None when
    proc.top is None). Row b's token is what it draws alone: every operation is per row."""
    token, kept = _draw(process_logits(logits, rows, proc, generated, prompt), rows, pos, need_kept=True)
    return token, None if proc.top is None else logprobs(kept, token, proc.top)
