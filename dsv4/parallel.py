"""Ranks and the one door to a collective.

`Comm.all_reduce(x, layer, site)` is how every rank joins the others after a
layer's attention and after its MoE (2 x layers per step). It keeps a census
per (layer, site) on the device, carries a health flag inside the payload (one
extra element: the number of ranks that refused) so one reduction tells every
rank about a refusal, and consults the device-side fault arming: a one-shot
refusal code per (layer, site) of this rank, consumed at the end of the step it
fires in, so it also fires inside a replayed CUDA graph. The reference door is
three kernels and the collective (census, payload, verdict), dsv4.kernels.door
one kernel and the collective; what a refusal records (word, where) is settled
once per step in `end_step`. With dsv4.kernels.door CONFIG["in_place"] a door is opened before its
sublayer runs (`open_door`, by the mHC boundary kernel that does its bookkeeping) and the sublayer's last
kernel writes the payload (`payload`): the door itself is then the collective alone.

Everything here is device tensor work: no host sync inside a step.

Backends: NCCL on GPU, gloo on CPU. Gloo reduces in fp32 whatever the model dtype
(gloo's half-precision sums are not on every torch build; fp32 is exact for the
health flag and costs nothing on CPU), and gathers through a tensor list
(the single-tensor gather is NCCL's fast path, not gloo's everywhere).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import kernels
from .kernels import bookkeeping, door

SITES = ("attention", "moe")


class Door(NamedTuple):
    """A door opened before its sublayer runs (Comm.open_door): the payload buffer and the cells of the
    bookkeeping the opener's kernel does: payload[n] = flag, census += 1, verdict += seen (when not None)."""
    layer: int
    site: int
    payload: torch.Tensor  # the partial sum's n elements, then the flag (the wire dtype; >= n + 1 elements)
    n: int
    shape: torch.Size  # the partial sum's
    flag: torch.Tensor  # this door's refusal flag, refusing[layer, site]
    census: torch.Tensor  # census[layer, site]
    seen: torch.Tensor | None  # the previous door's reduced flag, not yet in the verdict
    verdict: torch.Tensor


class Comm:
    def __init__(self, n_layers: int, device, rank: int = 0, world: int = 1, group=None, reduce: str = "nccl"):
        """reduce: "nccl" (torch.distributed all_reduce: NCCL on GPU, gloo on CPU) or "symm"
        (torch.ops.symm_mem.one_shot_all_reduce over a symmetric-memory buffer; CUDA, world > 1)."""
        self.rank, self.world, self.group, self.n_layers = rank, world, group, n_layers
        self.device = torch.device(device)
        if reduce not in ("nccl", "symm"):
            raise ValueError(f"reduce {reduce!r}: allowed 'nccl', 'symm'")
        if reduce == "symm" and (world == 1 or self.device.type != "cuda"):
            raise ValueError("reduce='symm' needs CUDA and more than one rank")
        self.reduce = reduce
        self._symm: dict[torch.dtype, torch.Tensor] = {}
        self.backend = None
        if world > 1:
            import torch.distributed as dist

            self.backend = dist.get_backend(group)
        i64 = dict(dtype=torch.int64, device=self.device)
        self.armed = torch.zeros(n_layers, len(SITES), **i64)  # refusal code to fire, 0 = none
        self.word = torch.zeros((), **i64)  # this rank's refusal word: the last code that fired
        self.fired = torch.zeros(3, **i64)  # [code, layer, site] of that refusal
        self.census = torch.zeros(n_layers, len(SITES), **i64)  # reductions run, per (layer, site)
        self.verdict = torch.zeros((), dtype=torch.float32, device=self.device)  # refusals seen this step
        self._order = torch.arange(1, n_layers * len(SITES) + 1, **i64)  # door order, 1-based
        self.refusing = torch.zeros(n_layers, len(SITES), device=self.device)
        self._unseen: torch.Tensor | None = None
        self._open: Door | None = None

    def site_index(self, site: str) -> int:
        if site not in SITES:
            raise ValueError(f"site {site!r}: allowed {list(SITES)}")
        return SITES.index(site)

    def begin_step(self):
        self._unseen = None  # the last door's reduced flag, not yet in the verdict (the next pack adds it)
        self._open = None
        # Which doors refuse this step, as the payload's flag (one op per step, not per door).
        if kernels.use_triton(self.verdict, gpu_checked=bookkeeping.GPU_CHECKED):
            bookkeeping.begin(self.armed, self.refusing, self.verdict)  # one launch, the same values
            return
        self.verdict.zero_()
        self.refusing.copy_(self.armed != 0)

    def all_reduce(self, x: torch.Tensor, layer: int, site: str) -> torch.Tensor:
        s = SITES.index(site)
        wire = self._wire(x.dtype)
        symm = self.reduce == "symm" and self.world > 1
        opened, self._open = self._open, None
        if opened is not None:  # its bookkeeping done by the kernel that opened it: the collective alone
            payload = self._send(self._filled(opened, x, layer, s), opened.payload, symm)
            self._unseen = payload[-1]
        elif kernels.use_triton(x, gpu_checked=door.GPU_CHECKED) and door.supported(x):
            # census + payload in one launch, written where the reduction reads it
            out = self._symm_buffer(x.numel() + 1, wire) if symm else torch.empty(x.numel() + 1, dtype=wire,
                                                                                   device=x.device)
            payload = door.pack(x, out, self.refusing[layer, s], self.census[layer, s], self._unseen, self.verdict)
            payload = self._send(payload, out, symm)
            self._unseen = payload[-1]
        else:
            self._see()
            self.census[layer, s].add_(1)
            flag = self.refusing[layer, s].view(1)
            payload = torch.cat([x.flatten().to(wire), flag if wire == torch.float32 else flag.to(wire)])
            if self.world > 1:
                payload = self._reduce(payload)
            self.verdict.add_(payload[-1])
        return payload[:-1].view_as(x).to(x.dtype)

    def open_door(self, layer: int, site: str, like: torch.Tensor) -> Door | None:
        """Open door (layer, site), the next one of the step, for a partial sum shaped like `like` (the caller's
        kernel does its bookkeeping: see Door; its producer may write into `payload`), or None where the
        pack runs instead: door.CONFIG["in_place"] off, or the door kernels not on for `like`."""
        if not (door.CONFIG["in_place"] and kernels.use_triton(like, gpu_checked=door.GPU_CHECKED)
                and door.supported(like)):
            return None
        s, n, wire = SITES.index(site), like.numel(), self._wire(like.dtype)
        buf = self._symm_buffer(n + 1, wire) if self.reduce == "symm" and self.world > 1 else \
            torch.empty(n + 1, dtype=wire, device=like.device)
        seen, self._unseen = self._unseen, None  # the opener's kernel adds it
        self._open = Door(layer, s, buf, n, like.shape, self.refusing[layer, s], self.census[layer, s], seen,
                          self.verdict)
        return self._open

    def payload(self, layer: int, site: str, dtype: torch.dtype) -> torch.Tensor | None:
        """Where the producer of door (layer, site)'s partial sum (in dtype) may write it: the open door's payload
        as the partial sum's shape, or None (no open door there, or the wire carries another dtype)."""
        opened = self._open
        if opened is None or (opened.layer, opened.site) != (layer, SITES.index(site)) or \
                opened.payload.dtype != dtype:
            return None
        return opened.payload[:opened.n].view(opened.shape)

    def _filled(self, opened: Door, x: torch.Tensor, layer: int, s: int) -> torch.Tensor:
        """The open door's payload holding x (copied there unless its producer wrote it in place)."""
        if (opened.layer, opened.site, opened.n) != (layer, s, x.numel()):
            raise RuntimeError(f"door ({layer}, {SITES[s]}) of {x.numel()} elements reached while door "
                               f"({opened.layer}, {SITES[opened.site]}) of {opened.n} is open")
        payload = opened.payload[:opened.n + 1]
        if payload.data_ptr() != x.data_ptr():  # the producer's path wrote elsewhere: one copy, as the pack's
            payload[:-1].view_as(x).copy_(x)
        return payload

    def _wire(self, dtype: torch.dtype) -> torch.dtype:
        return torch.float32 if self.backend == "gloo" and dtype != torch.float64 else dtype

    def _send(self, payload: torch.Tensor, buf: torch.Tensor, symm: bool) -> torch.Tensor:
        """The payload reduced over the ranks (symm: it sits at the symmetric buffer buf's start)."""
        if self.world > 1:
            payload = self._one_shot(payload, buf) if symm else self._reduce(payload)
        return payload

    def _see(self):
        """Add the flag a pack has not yet added into the verdict."""
        if self._unseen is not None:
            self.verdict.add_(self._unseen)
            self._unseen = None

    def end_step(self):
        """Consume this step's armed codes (every door ran: the census says so) and record the last
        one that fired, in door order (layer, then attention before moe), as this rank's word."""
        if kernels.use_triton(self.verdict, gpu_checked=bookkeeping.GPU_CHECKED):  # one launch, the same values
            bookkeeping.end(self.armed, self.word, self.fired, self.verdict, self._unseen)
            self._unseen = None
            return
        self._see()
        flat = self.armed.flatten()
        fired = flat != 0
        last = (fired.long() * self._order).argmax()  # the last firing door (0 when none fired)
        code = flat.gather(0, last.view(1))[0]  # not flat[last]: a 0-dim index is read on the host
        anyone = fired.any()
        self.word.copy_(torch.where(anyone, code, self.word))
        self.fired.copy_(torch.where(anyone, torch.stack([code, last // len(SITES), last % len(SITES)]), self.fired))
        self.armed.zero_()

    def _reduce(self, payload: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        if self.reduce == "nccl":
            dist.all_reduce(payload, group=self.group)
            return payload
        buf = self._symm_buffer(payload.numel(), payload.dtype)
        buf[:payload.numel()].copy_(payload)
        return self._one_shot(payload, buf)

    def _symm_buffer(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """This rank's symmetric-memory buffer for payloads of `dtype`, allocated (collectively, in step
        order) the first time a size is seen; padded to whole 4-byte words."""
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        buf = self._symm.get(dtype)
        if buf is None or buf.numel() < numel + 1:
            buf = symm_mem.empty(max(numel + 1, 8192), dtype=dtype, device=self.device)
            symm_mem.rendezvous(buf, (self.group or dist.group.WORLD).group_name)
            self._symm[dtype] = buf
        return buf

    def _one_shot(self, payload: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        """Every rank reads every peer's buffer over NVLink and sums (the payload already sits at buf's start)."""
        import torch.distributed as dist

        n = payload.numel() + payload.numel() % 2  # the kernel reads 4-byte words: pad a bf16 payload to even
        group = self.group or dist.group.WORLD
        return torch.ops.symm_mem.one_shot_all_reduce(buf[:n], "sum", group.group_name)[:payload.numel()]

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's x along dim 0 (the vocab-parallel head's logits)."""
        if self.world == 1:
            return x
        import torch.distributed as dist

        x = x.contiguous()
        if self.backend == "gloo":
            parts = [torch.empty_like(x) for _ in range(self.world)]
            dist.all_gather(parts, x, group=self.group)
            return torch.cat(parts)
        out = torch.empty((self.world * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
        # torch >= 2.13 renames all_gather_into_tensor (and warns on the old name).
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(out, x, group=self.group)
        return out

    # ---- fault arming (host calls, outside steps) --------------------------
    def arm_refusal(self, layer: int, rank: int, code: int, site: str = "attention"):
        if not 0 <= layer < self.n_layers:
            raise ValueError(f"layer {layer}: allowed 0..{self.n_layers - 1}")
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank}: allowed 0..{self.world - 1}")
        if not isinstance(code, int) or code == 0:
            raise ValueError(f"refusal code {code!r}: a non-zero integer")
        if rank == self.rank:
            self.armed[layer, self.site_index(site)] = code

    def reset_refusals(self):
        self.word.zero_()
        self.fired.zero_()
        self.armed.zero_()
