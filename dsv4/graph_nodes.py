"""The nodes of a captured CUDA graph by kind, read from its cudaGraph_t through the CUDA driver (libcuda), with no
profiler: the replay census (dsv4.replay) of kernel, memcpy and memset nodes, and the collectives' kernels by name.

Why not the profiler, which counted them until session 40 (the activities of a graph's first replay): a
torch.profiler session leaves CUPTI subscribed to the process's later launches. Session 40 call 2
(benchmarks/graph_launch_bench.py): a graph of 128 trivial kernels took 4 us of host time a launch before a profiler
session and 33-60 us after it, its kernels 67 -> 123 us on the GPU; mini's full-token graph, counted that way at its
first replay, 116 us a launch. The driver reads the same graph before it is instantiated and changes nothing.
"""

from __future__ import annotations

import collections
import ctypes

KINDS = {0: "kernel", 1: "memcpy", 2: "memset"}  # CUgraphNodeType (cuda.h); every other kind is "other"


class _KernelParams(ctypes.Structure):
    """CUDA_KERNEL_NODE_PARAMS_v2 (cuda.h): the function or, for a library kernel, the CUkernel."""
    _fields_ = [("func", ctypes.c_void_p), ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint),
                ("blockDimZ", ctypes.c_uint), ("sharedMemBytes", ctypes.c_uint), ("kernelParams", ctypes.c_void_p),
                ("extra", ctypes.c_void_p), ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


_driver: ctypes.CDLL | None = None


def driver() -> ctypes.CDLL:
    global _driver
    if _driver is None:
        _driver = ctypes.CDLL("libcuda.so.1")
    return _driver


def _check(status: int, call: str) -> None:
    if status != 0:
        raise RuntimeError(f"{call} returned CUresult {status}")


def census(raw_graph: int) -> dict[str, int]:
    """{"kernel_nodes", "memcpy_nodes", "memset_nodes", "other_nodes"} of the cudaGraph_t `raw_graph`
    (torch.cuda.CUDAGraph(keep_graph=True).raw_cuda_graph()), and "collective_kernels" (kernels named nccl or
    all_reduce) where the driver names every kernel (cuFuncGetName / cuKernelGetName, CUDA 12.3+)."""
    cu = driver()
    graph = ctypes.c_void_p(raw_graph)
    count = ctypes.c_size_t(0)
    _check(cu.cuGraphGetNodes(graph, None, ctypes.byref(count)), "cuGraphGetNodes")
    nodes = (ctypes.c_void_p * count.value)()
    _check(cu.cuGraphGetNodes(graph, nodes, ctypes.byref(count)), "cuGraphGetNodes")
    kinds: collections.Counter = collections.Counter()
    collective, named = 0, True
    for node in nodes[:count.value]:
        kind = ctypes.c_int()
        _check(cu.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind)), "cuGraphNodeGetType")
        kinds[KINDS.get(kind.value, "other")] += 1
        if kind.value == 0 and named:
            name = kernel_name(node)
            if name is None:
                named = False
            else:
                collective += "nccl" in name.lower() or "all_reduce" in name.lower()
    out = {f"{k}_nodes": kinds[k] for k in ("kernel", "memcpy", "memset", "other")}
    if named:
        out["collective_kernels"] = collective
    return out


def kernel_name(node) -> str | None:
    """The kernel node's function name, or None where this driver cannot say."""
    cu = driver()
    params = _KernelParams()
    try:
        get = cu.cuGraphKernelNodeGetParams_v2
    except AttributeError:
        return None
    if get(ctypes.c_void_p(node), ctypes.byref(params)) != 0:
        return None
    name = ctypes.c_char_p()
    try:
        if params.func:
            status = cu.cuFuncGetName(ctypes.byref(name), ctypes.c_void_p(params.func))
        elif params.kern:
            status = cu.cuKernelGetName(ctypes.byref(name), ctypes.c_void_p(params.kern))
        else:
            return None
    except AttributeError:
        return None
    return name.value.decode(errors="replace") if status == 0 and name.value else None
