"""The replay census' node count read from the captured graph (dsv4.graph_nodes), against the profiler's activities
of a replay of the same graph (GPU), and the driver's kernel-node parameters as cuda.h lays them out (CPU)."""

from __future__ import annotations

import ctypes

import pytest
import torch

from dsv4 import graph_nodes, kernels
from dsv4.kernels import pdl_wait

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

try:
    import triton.language as tl
except ImportError:  # pragma: no cover
    tl = None


def _add_one_kernel(x_ptr, N):
    pdl_wait()
    i = tl.arange(0, 16)
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < N) + 1, mask=i < N)


def test_kernel_node_params_layout():
    """CUDA_KERNEL_NODE_PARAMS_v2 (cuda.h): func, 6 dims and the shared bytes (7 unsigned ints), then pointers from
    byte 40: kernelParams, extra, kern, ctx."""
    P = graph_nodes._KernelParams
    assert (P.func.offset, P.gridDimX.offset, P.sharedMemBytes.offset) == (0, 8, 32)
    assert (P.kernelParams.offset, P.extra.offset, P.kern.offset, P.ctx.offset) == (40, 48, 56, 64)
    assert ctypes.sizeof(P) == 72


@cuda
def test_census_matches_the_profiled_replay():
    """A graph of torch kernels, Triton kernels (under the process's DSV4_PDL) and a device copy: the census from
    the graph before it is instantiated equals the profiler's kernel / memcpy activities of one replay, and the
    replay computes what the eager run did."""
    x = torch.zeros(16, device="cuda")
    y = torch.empty_like(x)
    k = kernels.launcher(_add_one_kernel, x)

    def body():
        k[(1,)](x, 16)
        x.mul_(2)
        y.copy_(x)
        k[(1,)](x, 16)

    body()
    torch.cuda.synchronize()
    x.zero_()
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        body()
    nodes = graph_nodes.census(graph.raw_cuda_graph())
    graph.instantiate()
    x.zero_()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    # Every node ran once. The copy is a memcpy node, which the driver may run as a kernel of its own: session 40
    # call 3 saw 4 kernel activities and no memcpy one for the census' 3 kernel nodes, so the kinds are compared
    # where they must agree (the kernels captured, the total).
    assert len(names) == sum(nodes[f"{k}_nodes"] for k in ("kernel", "memcpy", "memset", "other")) == 4, names
    assert nodes["kernel_nodes"] == 3 and nodes["memcpy_nodes"] == 1, nodes  # two Triton kernels, the multiply
    assert nodes.get("collective_kernels") == 0, nodes  # the driver named every kernel, none a collective
    assert torch.equal(x, torch.full_like(x, 3.0)) and torch.equal(y, torch.full_like(x, 2.0))
