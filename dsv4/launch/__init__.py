"""One model over N ranks (TP/EP, SPMD): spawned from this process, or under torchrun.

group.py sets up process groups (and joins torchrun's), worker.py is a rank's end, driver.py the
DistributedModel that rank 0 drives them with.

Spawned (what `dsv4.load(path, ranks=N)` does):

    model = dsv4.load("tiny", device="cpu", ranks=2)       # a DistributedModel
    with model:                                            # close() on exit
        state = model.new_state(256)
        logits = model.prefill(state, ids)
        token = model.step(state, ids[-1], sampling)

Rank 0 lives in the calling process and drives; ranks 1..N-1 are `spawn`ed
worker processes. torch.distributed joins them (gloo on CPU, NCCL on GPU with
rank r on cuda:r, rendezvous on a free localhost port) and every rank builds
only its own slice of the weights (`dsv4.engine.build(..., rank=r, world=N, group=...)`).
Each call on the DistributedModel is sent to every worker over a pipe and run
by every rank on its local Model (the same forward everywhere, so the
collectives pair up); the driver then collects each rank's outcome. States
live in every process under one id; `new_state` returns a handle whose reads
come from rank 0's copy. An error on any rank is raised by the driver with its
type and message (the rank in a note).

Failures are bounded. A worker found dead before a call, or dying during one
on gloo (its sockets close), fails that call at once with `RankError`; a rank
that hangs fails it within about 2 x `timeout` (the process group's timeout on
rank 0's collective, then as long again for the silent rank's answer). The
model is then unusable and its workers are stopped. On NCCL a rank that dies
in the middle of a call leaves rank 0 waiting on the device, where only
torch's NCCL watchdog reaches (after `timeout`, and by torch's default
TORCH_NCCL_ASYNC_ERROR_HANDLING it ends the process): an abort from rank 0
alone does not end that wait (measured: NCCL's abort wants every rank).
`close()` (also the context manager, `__del__` and an atexit hook) drops every
state's captured graph first (NCCL cannot tear down a communicator a live graph
uses), leaves the group together with the workers and stops them. On CPU every rank, the calling process included (until close()),
keeps at most cpu_count // N intra-op threads (torch.set_num_threads). Workers are
spawned, so a script that loads with ranks > 1 must keep its top level under
`if __name__ == "__main__":`.

The control plane is pipes rather than a second process group: a worker
waiting for its next command must wait without a deadline, while the driver
waiting for an answer must not; a pipe plus the process sentinel give both.

torchrun (multi-node is torchrun's job): every process runs the same script,

    torchrun --nproc-per-node 2 script.py
    # script.py
    model = dsv4.launch.from_torchrun("/path/to/checkpoint")   # this rank's Model
    state = model.new_state(256)
    ...                                # every rank makes the same calls, in the same order

`from_torchrun` initialises the default process group from the environment
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) when it is not yet, puts rank r
on cuda:LOCAL_RANK (or the CPU with gloo) and returns the rank-local `Model`.
"""

from .driver import DistributedModel, DistributedState, RankError, load_spawned
from .group import DEFAULT_TIMEOUT, from_torchrun

__all__ = ["DistributedModel", "DistributedState", "RankError", "load_spawned", "from_torchrun", "DEFAULT_TIMEOUT"]
