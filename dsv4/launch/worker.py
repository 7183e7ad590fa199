"""A rank's end: its Model and its states by id, and the worker process that serves the driver's
calls over a pipe until told to stop."""

from __future__ import annotations

import datetime
import gc
import os
import pickle
import signal
import threading
import time
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..engine import build
from .group import backend, init_group, leave_group, rank_device, share_cores


@dataclass(frozen=True)
class Ref:
    """A state on the wire: the id every rank files its copy under."""

    sid: int


class Rank:
    def __init__(self, model):
        self.model, self.states = model, {}

    def run(self, frees, target, name, args, kwargs):
        for sid in frees:  # handles the driver let go of since the last call
            self.states.pop(sid, None)
        args = [self._resolve(a) for a in args]
        kwargs = {k: self._resolve(v) for k, v in kwargs.items()}
        if name == "new_state":
            sid, capacity = args
            self.states[sid] = self.model.new_state(capacity)
            return None
        obj = self.model if target is None else self.states[target.sid]
        return getattr(obj, name)(*args, **kwargs)

    def _resolve(self, a):
        if isinstance(a, (list, tuple)):
            return type(a)(self._resolve(b) for b in a)
        return self.states[a.sid] if isinstance(a, Ref) else a


def pack_error(e: BaseException) -> tuple[bytes, str]:
    """An exception for the pipe (its own pickle when it has one) and its traceback text."""
    tb = "".join(traceback.format_exception(e))
    try:
        return pickle.dumps(e), tb
    except Exception:  # noqa: BLE001 - an unpicklable exception still travels, as text
        return pickle.dumps(RuntimeError(f"{type(e).__name__}: {e}")), tb


def unpack_error(packed: tuple[bytes, str], rank: int) -> BaseException:
    try:
        e = pickle.loads(packed[0])
    except Exception:  # noqa: BLE001 - a class that pickles but does not unpickle (odd __init__)
        e = RuntimeError(packed[1].strip().splitlines()[-1])
    e.add_note(f"(raised on rank {rank}; its traceback:)\n{packed[1]}")
    return e


def drop_states(me: "Rank | None"):
    """Free every state's captured graph: NCCL cannot tear down a communicator a live graph still uses."""
    if me is None:
        return
    for state in me.states.values():
        state.replay = None  # handles the caller still holds keep their (graph-less) state
    me.states.clear()
    me.model.drop_batch_graphs()
    gc.collect()


def orphan_guard(parent: int):
    # A worker whose driver is gone (killed, say) may sit in a collective forever: leave.
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(1)


def serve(conn, rank: int, world: int, port: int, spec: dict):
    # Ctrl-C reaches the whole process group; the driver decides what an interrupt means.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=orphan_guard, args=(os.getppid(),), daemon=True).start()
    try:
        conn.send(("hello", os.getpid()))
        device = rank_device(torch.device(spec["device"]), rank)
        share_cores(device, world)
        store = dist.TCPStore("127.0.0.1", port, world, is_master=False,
                              timeout=datetime.timedelta(seconds=spec["timeout"]))
        group = init_group(store, backend(device), rank, world, spec["timeout"])
        me = Rank(build(spec["path"], device, spec["dtype"], rank=rank, world=world, group=group,
                         init=spec["init"], seed=spec["seed"], tokenizer=spec["tokenizer"], mtp=spec["mtp"]))
        conn.send(("ok", None))
    except BaseException as e:  # noqa: BLE001 - reported to the driver, which raises it
        conn.send(("err", pack_error(e)))
        return
    try:
        while True:
            try:
                cmd = conn.recv()
            except EOFError:  # the driver is gone
                break
            if cmd is None:
                drop_states(me)
                break
            *call, want = cmd
            try:
                value = me.run(*call)
                conn.send(("ok", value if want else None))
            except Exception as e:  # noqa: BLE001 - the same error is raised by the driver
                conn.send(("err", pack_error(e)))
    finally:
        leave_group(limit=spec["timeout"])
