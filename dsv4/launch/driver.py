"""The driver: rank 0 in the calling process, ranks 1..N-1 spawned; every call goes to every rank
and comes back checked (see dsv4.launch)."""

from __future__ import annotations

import atexit
import datetime
import multiprocessing as mp
import multiprocessing.connection as mpc
import signal
import time
import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..engine import ModelCommon, build, placement
from ..interface import RANK_CALLS
from .group import DEFAULT_TIMEOUT, backend, init_group, leave_group, rank_device, share_cores
from .worker import Rank, Ref, drop_states, serve, unpack_error

_CLOSE_GRACE = 10.0  # seconds a worker gets to leave after close() before it is terminated


class RankError(RuntimeError):
    """A rank died, hung or fell out of step: the distributed model cannot be used any more."""


@dataclass
class _Worker:
    rank: int
    proc: mp.process.BaseProcess
    conn: mpc.Connection

    def death(self) -> str:
        self.proc.join(1.0)
        code = self.proc.exitcode
        if code is None:
            return f"rank {self.rank} (pid {self.proc.pid}) closed its pipe"
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        return f"rank {self.rank} (pid {self.proc.pid}) died ({how})"


_LIVE: "weakref.WeakSet[DistributedModel]" = weakref.WeakSet()


@atexit.register
def _close_all():
    for model in list(_LIVE):
        model.close()


class DistributedState:
    """A decode state that lives on every rank under one id; attribute reads come from rank 0's copy."""

    def __init__(self, model: "DistributedModel", sid: int, local):
        self._model, self._sid, self._local = model, sid, local

    def __getattr__(self, name):  # capacity, host_pos, quarantine, pos, logits, counts, ...
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._local, name)

    def restore(self, other: "DistributedState"):
        self._model._call(self, "restore", other)

    def discard(self):
        self._model._call(self, "discard")

    def digest(self) -> tuple[str, str, int]:
        return self._local.digest()

    def __del__(self):
        model = getattr(self, "_model", None)
        if model is not None and not model.closed:
            model._freed.append(self._sid)  # freed on every rank with the next call

    def __repr__(self):
        return f"DistributedState(id={self._sid}, capacity={self.capacity}, host_pos={self.host_pos})"


class DistributedModel(ModelCommon):
    """The DecodeModel calls over N ranks (see the module docstring); rank 0 is `self.local`.

    Each call of dsv4.interface.RANK_CALLS is forwarded as that table says (see `_forward`)."""

    def __init__(self, spec: dict, world: int, timeout: float):
        self.world, self.timeout, self.rank = world, timeout, 0
        self.closed, self._broken = False, None
        self._freed: list[int] = []
        self._next_sid = 0
        self._workers: list[_Worker] = []
        self._group, self._threads = None, None
        self.last_tokens: list[int] = []  # every rank's token from the last step or draw
        if dist.is_initialized():
            raise RuntimeError("this process already belongs to a torch.distributed group (another "
                               "DistributedModel, or torchrun): close() that model, or use "
                               "dsv4.launch.from_torchrun under torchrun")
        device = torch.device(spec["device"])
        if device.type == "cuda" and torch.cuda.device_count() < world:
            raise ValueError(f"ranks={world} on cuda needs {world} GPUs; {torch.cuda.device_count()} visible")
        _LIVE.add(self)
        try:
            store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                                  timeout=datetime.timedelta(seconds=timeout))
            ctx = mp.get_context("spawn")
            for r in range(1, world):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=serve, args=(child, r, world, store.port, spec), daemon=True,
                                   name=f"dsv4-rank{r}")
                proc.start()
                child.close()
                self._workers.append(_Worker(r, proc, parent))
            try:
                self._collect("start")  # every worker is up before the rendezvous waits on it
            except RankError as e:
                e.add_note("a script that loads with ranks > 1 needs its top level under "
                           "`if __name__ == '__main__':` (spawned workers re-import the main module)")
                raise
            self._group = init_group(store, backend(device), 0, world, timeout)
            self._threads = share_cores(device, world)
            local_err = None
            try:
                self.local = build(spec["path"], rank_device(device, 0), spec["dtype"], rank=0, world=world,
                                   group=self._group, init=spec["init"], seed=spec["seed"],
                                   tokenizer=spec["tokenizer"], mtp=spec["mtp"])
            except Exception as e:  # noqa: BLE001 - raised after the workers' outcome is known
                local_err = e
            self._raise_first(local_err, self._collect("load"))
        except BaseException:
            self.close()
            raise
        self._rank = Rank(self.local)
        self.cfg, self.tokenizer = self.local.cfg, self.local.tokenizer
        self.device, self.dtype = self.local.device, self.local.dtype

    # ---- the protocol ------------------------------------------------------
    def _call(self, target, name: str, *args, want: bool = False, **kwargs):
        """Run target.name(*args, **kwargs) on every rank (target None: the Model).

        Returns rank 0's value, or every rank's when `want`.
        """
        self._check_usable()
        def wire(a):  # states, also inside a list of them (a batched step's), travel as Refs
            if isinstance(a, (list, tuple)):
                return type(a)(wire(b) for b in a)
            return self._ref(a) if isinstance(a, DistributedState) else a
        frees, self._freed = self._freed, []
        cmd = (frees, wire(target), name, [wire(a) for a in args], {k: wire(v) for k, v in kwargs.items()})
        for w in self._workers:
            try:
                w.conn.send((*cmd, want))
            except OSError:
                raise self._fail(w.death()) from None
        value, local_err = None, None
        try:
            value = self._rank.run(*cmd)
        except Exception as e:  # noqa: BLE001 - raised once every rank has answered
            local_err = e
        except BaseException:  # an interrupt mid-step leaves the ranks out of step
            self._fail("interrupted during a call: the ranks are out of step")
            raise
        replies = self._collect(name, cause=local_err)
        self._raise_first(local_err, replies)
        return [value] + [replies[w.rank] for w in self._workers] if want else value

    def _ref(self, state: DistributedState) -> Ref:
        if state._model is not self:
            raise ValueError("that state belongs to another model")
        return Ref(state._sid)

    def _check_usable(self):
        if self.closed:
            raise RankError("this distributed model is closed")
        if self._broken:
            raise RankError(f"this distributed model is unusable: {self._broken}")
        for w in self._workers:
            if not w.proc.is_alive():
                raise self._fail(w.death())

    def _collect(self, what: str, cause: BaseException | None = None) -> dict[int, object]:
        """Every worker's answer to the current call; RankError if one dies or stays silent past the timeout."""
        pending = {w.rank: w for w in self._workers}
        got: dict[int, object] = {}
        deadline = time.monotonic() + self.timeout
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fail(f"rank(s) {sorted(pending)} gave no answer to {what!r} within "
                                 f"{self.timeout:g} s (hung?)") from cause
            ready = set(mpc.wait([w.conn for w in pending.values()] + [w.proc.sentinel for w in pending.values()],
                                 timeout=left))
            for w in list(pending.values()):
                if w.conn in ready:
                    try:
                        got[w.rank] = w.conn.recv()
                    except (EOFError, OSError):
                        raise self._fail(w.death() + f" during {what!r}") from cause
                    del pending[w.rank]
                elif w.proc.sentinel in ready:
                    raise self._fail(w.death() + f" during {what!r}") from cause
        return got

    def _raise_first(self, local_err: BaseException | None, replies: dict[int, object]):
        """Raise rank 0's error, else the lowest failing rank's; return every worker's value in place."""
        errors = {}
        for r, (kind, v) in replies.items():
            if kind == "err":
                errors[r] = unpack_error(v, r)
            replies[r] = v
        failed = ([0] if local_err is not None else []) + sorted(errors)
        if not failed:
            return
        first = local_err if local_err is not None else errors[failed[0]]
        if len(failed) != self.world:
            first.add_note(f"only rank(s) {failed} raised: the ranks may be out of step")
        raise first

    def _fail(self, why: str) -> RankError:
        """Mark the model unusable and stop its workers; returns the error to raise."""
        self._broken = why
        self._shutdown(grace=0.0)
        return RankError(f"{why}; this distributed model is unusable: close() it and load again")

    # ---- lifecycle ---------------------------------------------------------
    def _shutdown(self, grace: float):
        """Workers out, group left. Past `grace` a worker is terminated; with grace 0 (broken) killed at once."""
        for w in self._workers:
            try:
                w.conn.send(None)
            except OSError:
                pass
        drop_states(getattr(self, "_rank", None))
        if self._group is not None:
            # While the workers leave theirs: NCCL's teardown wants every rank at once.
            leave_group(limit=max(grace, 5.0))
            self._group = None
        deadline = time.monotonic() + grace
        for w in self._workers:
            w.proc.join(max(0.0, deadline - time.monotonic()))
            if w.proc.is_alive() and grace > 0:
                w.proc.terminate()
                w.proc.join(2.0)
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join()
            w.conn.close()
        if self._threads is not None:
            torch.set_num_threads(self._threads)
            self._threads = None

    def close(self):
        """Stop every worker and leave the process group (idempotent)."""
        if self.closed:
            return
        self.closed = True
        _LIVE.discard(self)
        self._shutdown(grace=0.0 if self._broken else _CLOSE_GRACE)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing to report to at collection time
            pass

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]

    # ---- the Model API -----------------------------------------------------
    def new_state(self, capacity: int) -> DistributedState:
        sid, self._next_sid = self._next_sid, self._next_sid + 1
        self._call(None, "new_state", sid, capacity)
        return DistributedState(self, sid, self._rank.states[sid])

    def _forward(self, how: str, name: str, args, kwargs):
        """One call of RANK_CALLS, run as `how` says (see dsv4.interface)."""
        if how == "local":
            local = lambda a: a._local if isinstance(a, DistributedState) else a  # noqa: E731
            return getattr(self.local, name)(*map(local, args), **{k: local(v) for k, v in kwargs.items()})
        if how == "all":
            return self._call(None, name, *args, **kwargs)
        tokens = self._call(None, name, *args, want=True, **kwargs)
        self.last_tokens = tokens
        if len(set(tokens)) != 1:  # same logits and the same u on every rank, or a rank is wrong
            state = args[0] if args else kwargs.get("state", kwargs.get("states"))
            where = [s.host_pos for s in state] if isinstance(state, (list, tuple)) else state.host_pos
            raise self._fail(f"ranks sampled different tokens {tokens} at position(s) {where}")
        return tokens[0]

    # ---- per-rank views: one entry per rank, as Model's (which has one rank) --
    def each(self, name: str, *args) -> list:
        """Every rank's answer to Model.name(*args)."""
        return self._call(None, name, *args, want=True)

    def refusal_words(self) -> list[int]:
        return [w for per_rank in self.each("refusal_words") for w in per_rank]


def _forwarded(name: str, how: str):
    def call(self, *args, **kwargs):
        return self._forward(how, name, args, kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"Model.{name}, run on {'rank 0' if how == 'local' else 'every rank'} ({how!r}: dsv4.interface)."
    return call


for _name, _how in RANK_CALLS.items():
    setattr(DistributedModel, _name, _forwarded(_name, _how))


def load_spawned(path_or_preset, device, dtype, ranks: int, init=None, seed: int = 0,
                 timeout: float = DEFAULT_TIMEOUT, tokenizer: str | None = None, mtp: bool = False) -> DistributedModel:
    """Start ranks-1 workers, join them with this process as rank 0, and load every rank's slice."""
    if not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"ranks {ranks!r}: a positive integer")
    device, dtype = placement(device, dtype)
    spec = dict(path=str(path_or_preset), device=device.type, dtype=dtype, init=init, seed=seed,
                timeout=float(timeout), tokenizer=tokenizer, mtp=mtp)
    return DistributedModel(spec, ranks, float(timeout))
