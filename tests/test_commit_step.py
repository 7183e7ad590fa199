"""The commit of a whole step in one launch (dsv4.kernels.commit_step) against the reference loop
(dsv4.model.commit.commit under DSV4_KERNELS=torch): bit-identical buffers (a commit copies; a dtype
change rounds to nearest even as torch's .to does), the same verdict and keep semantics.

On CPU the kernel runs through Triton's interpreter; on CUDA it is compiled, and a captured graph
replays it from the table it was captured with.
"""

from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4 import kernels
from dsv4.kernels import commit_step
from dsv4.model.commit import Write, commit

pytest.importorskip("triton")

DEVICES = (["cpu"] if kernels.interpreting() else []) + (["cuda"] if torch.cuda.is_available() else [])

# A tiny model through every kernel: minutes under the interpreter, so its CPU case joins the slow set
# (DSV4_SLOW=1); CI keeps the kernels' own tests, and on a GPU machine the CUDA case runs.
MODEL_DEVICES = [pytest.param(d, marks=[pytest.mark.slow] if d == "cpu" else []) for d in DEVICES]
FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def random_writes(device, g: torch.Generator, count: int = 7) -> list[Write]:
    """Writes like a step's: distinct buffers, rows of 1..5, widths not a multiple of the block, every
    dtype pair, keep or none, rows with a trailing axis."""
    writes = []
    for k in range(count):
        buf_dtype, rows_dtype = FLOATS[k % 3], FLOATS[(k // 3 + k) % 3]
        n, slots = 1 + k % 5, 12
        shape = (3, 40) if k % 4 == 3 else (600 + 37 * k,)
        buf = torch.randn(slots, *shape, generator=g).to(buf_dtype).to(device)
        rows = (torch.randn(n, *shape, generator=g) * 3).to(rows_dtype).to(device)
        index = torch.randperm(slots, generator=g)[:n].to(device)
        keep = (torch.rand(n, generator=g) < 0.6).to(device) if k % 3 else None
        writes.append(Write(buf, index, rows, keep))
    return writes


def run(writes, verdict, mode, monkeypatch):
    monkeypatch.setenv("DSV4_KERNELS", mode)
    bufs = [w.buf.clone() for w in writes]
    commit([Write(b, w.index, w.rows, w.keep) for b, w in zip(bufs, writes)], verdict)
    return bufs


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    view = {4: torch.int32, 2: torch.int16}[a.element_size()]
    return a.dtype == b.dtype and torch.equal(a.view(view), b.view(view))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("verdict", [0.0, 1.0])
def test_one_launch_matches_the_reference_loop(monkeypatch, device, verdict):
    g = torch.Generator().manual_seed(11)
    writes = random_writes(device, g)
    assert commit_step.supported(writes)
    v = torch.tensor(verdict, device=device)
    want = run(writes, v, "torch", monkeypatch)
    launches = []
    real = commit_step.commit
    monkeypatch.setattr(commit_step, "commit", lambda ws, vd: launches.append(len(ws)) or real(ws, vd))
    got = run(writes, v, "triton", monkeypatch)
    assert launches == [len(writes)]  # one launch took every write
    assert all(same_bits(a, b) for a, b in zip(got, want))
    changed = [not torch.equal(w.buf, b) for w, b in zip(writes, got)]
    assert any(changed) == (verdict == 0)


@pytest.mark.parametrize("device", DEVICES)
def test_rows_beyond_the_programs_of_a_write(monkeypatch, device):
    """A write with more rows than programs per write (a prefill chunk): each program strides over them."""
    monkeypatch.setattr(commit_step, "MAX_SPLIT", 2)
    g = torch.Generator().manual_seed(12)
    buf = torch.randn(40, 24, generator=g).to(device)
    rows = torch.randn(17, 24, generator=g).to(torch.bfloat16).to(device)
    keep = (torch.rand(17, generator=g) < 0.7).to(device)
    writes = [Write(buf, torch.randperm(40, generator=g)[:17].to(device), rows, keep),
              Write(torch.zeros(3, 24, device=device), torch.zeros(0, dtype=torch.int64, device=device),
                    torch.zeros(0, 24, device=device))]  # no rows: nothing to do
    v = torch.zeros((), device=device)
    want = run(writes, v, "torch", monkeypatch)
    got = run(writes, v, "triton", monkeypatch)
    assert all(same_bits(a, b) for a, b in zip(got, want))


def test_writes_the_table_cannot_hold():
    """Two writes into one buffer (the loop's order would matter), strided rows, an int32 index, a 0-dim keep."""
    buf = torch.zeros(8, 4)
    w = Write(buf, torch.tensor([1]), torch.ones(1, 4))
    assert commit_step.supported([w])
    assert not commit_step.supported([w, Write(buf, torch.tensor([2]), torch.ones(1, 4))])
    assert not commit_step.supported([Write(buf, torch.tensor([1]), torch.ones(4, 2).t()[:1])])
    assert not commit_step.supported([Write(buf, torch.tensor([1], dtype=torch.int32), torch.ones(1, 4))])
    assert not commit_step.supported([Write(buf, torch.tensor([1]), torch.ones(1, 4), torch.tensor(True))])


@pytest.mark.parametrize("device", MODEL_DEVICES)
def test_model_steps_through_one_launch_as_through_one_per_write(monkeypatch, device):
    """tiny (every layer kind), a prefill and steps across compressed-window closes: the caches after one
    launch per step are the caches after one launch per write, byte for byte."""
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    model = dsv4.load("tiny", device=device, dtype=torch.float32, seed=4)
    sp = dsv4.SamplingParams(temperature=1.0, seed=5)

    def digests():
        state = model.new_state(32)
        model.prefill(state, list(range(1, 14)))
        token = 14
        for _ in range(4):
            token = model.step(state, token, sp)
        return model.digests(state), token

    one_launch = digests()
    monkeypatch.setattr(commit_step, "supported", lambda writes: False)
    assert digests() == one_launch


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_captured_graph_replays_its_table(monkeypatch):
    """The graph holds the table of its capture (in the device buffer an eager step made, filled once the capture
    ended): no memcpy node; replays commit the rows' current contents, and a refused verdict writes nothing.
    Replayed before the fill (commit_step.captured), its table's rows are empty: it writes nothing."""
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    g = torch.Generator().manual_seed(13)
    writes = random_writes("cuda", g, count=5)
    verdict = torch.zeros((), device="cuda")
    commit(writes, verdict)  # eager: compiles, and leaves a device spare for the capture
    assert commit_step.ready(writes)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        commit(writes, verdict)
    before = [w.buf.clone() for w in writes]
    for w in writes:
        w.rows.add_(1)
    graph.replay()  # not filled yet
    torch.cuda.synchronize()
    assert all(torch.equal(w.buf, b) for w, b in zip(writes, before))
    commit_step.captured()
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    assert not any("Memcpy" in n for n in names), names
    for w in writes:
        w.rows.copy_(torch.randn(w.rows.shape, generator=g).to(w.rows.dtype))
    want = run(writes, verdict, "torch", monkeypatch)
    graph.replay()
    torch.cuda.synchronize()
    assert all(same_bits(w.buf, b) for w, b in zip(writes, want))
    before = [w.buf.clone() for w in writes]
    for w in writes:
        w.rows.add_(1)
    verdict.fill_(1.0)
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(w.buf, b) for w, b in zip(writes, before))
