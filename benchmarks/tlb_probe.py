"""Does a routed expert's first read pay for address translation? One launch's programs read an expert-like region at a
random place in a buffer of each size; a larger buffer than the GPU's translation caches reach makes each launch's
first touch of its region a page walk.

Session 44's stamps (benchmarks/moe_stamps.py) and session 45 call 1's split: a Flash rank's local routed program of
kernel 1 (16 rows of gate and up, 64 KB) takes ~9.5-12 us from its release whether it reads 64 or 32 KB; the loads are
two DRAM round trips. A Flash rank's experts are ~66 GB of weights (43 layers x 128 local experts x 3 matrices of 4 MB),
a token reads ~3 of them a layer, each for the first time in ~43 layers' time: if translation misses cost microseconds,
that is where the fixed part goes.

Each launch: PROGRAMS programs of 128 threads, program p reads CHUNK bytes (two load steps, as kernel 1's) at
base + p * CHUNK, base a random multiple of REGION in a buffer of SIZE bytes (a new base every launch: the region cold
in L2 as an expert is; hot: the same base every launch, the region in L2; cold_touched: cold, and one more program
of each launch reads one word of each 2 MB page of the next launch's region, its translations made ahead).
LAUNCHES launches are captured in one CUDA graph and replayed REPS times; the median time a launch over the replays:

    TLB_PROBE {"size_gib", "pattern", "programs", "chunk_kib", "region_mib", "us_per_launch", "launches", "reps"}

If the large buffers' launches take microseconds longer than the small one's (both cold in L2), the cost is the
translation's (session 45 calls 5-6, benchmarks/RESULTS.md: ~1-2 us more at 96 GiB than at 1 GiB; the touched pages
take back ~0.3 us). One GPU, about 20 s:

    python benchmarks/tlb_probe.py [--sizes 1,8,32,96] [--programs 128] [--chunk-kib 64]
"""

from __future__ import annotations

import argparse
import statistics

import torch
import triton
import triton.language as tl

from dsv4.receipts import emit, provenance


@triton.jit
def _probe_kernel(buf_ptr, base_ptr, out_ptr, CHUNK: tl.constexpr, STEPS: tl.constexpr, PROGRAMS: tl.constexpr,
                  PAGE: tl.constexpr, PAGES: tl.constexpr):
    """Program p < PROGRAMS: CHUNK int32 words at base + p * CHUNK in STEPS loads, their sum stored (so nothing is
    elided). With PAGES, one more program reads one word of each of the next launch's region's PAGES pages (PAGE
    words apart): its translations made a launch ahead."""
    p = tl.program_id(0)
    if PAGES > 0:
        if p == PROGRAMS:
            pg = tl.arange(0, PAGES)
            nxt = tl.load(base_ptr + 1).to(tl.int64)
            tl.store(out_ptr + p, tl.sum(tl.load(buf_ptr + nxt + pg.to(tl.int64) * PAGE), axis=0))
            return
    base = tl.load(base_ptr).to(tl.int64) + p.to(tl.int64) * CHUNK
    r = tl.arange(0, CHUNK // STEPS)
    acc = tl.zeros([CHUNK // STEPS], dtype=tl.int32)
    for s in tl.static_range(STEPS):
        acc += tl.load(buf_ptr + base + s * (CHUNK // STEPS) + r)
    tl.store(out_ptr + p, tl.sum(acc, axis=0))


PAGE_WORDS = (2 << 20) // 4  # the driver's 2 MB pages


def probe(buf: torch.Tensor, programs: int, chunk: int, region: int, launches: int, reps: int, hot: bool,
          gen: torch.Generator, touch: bool = False) -> float:
    """Median us a launch (int32 word units for chunk and region); touch: each launch also reads one word of each
    page of the next launch's region (one more program)."""
    slots = buf.numel() // region
    picks = torch.zeros(launches + 1, dtype=torch.int64) if hot else \
        torch.randint(0, slots, (launches + 1,), generator=gen)
    bases = (picks * region).to(buf.device)
    out = torch.empty(programs + 1, dtype=torch.int32, device=buf.device)
    pages = max(1, region // PAGE_WORDS) if touch else 0

    def run():
        for i in range(launches):
            _probe_kernel[(programs + (1 if touch else 0),)](buf, bases[i:], out, CHUNK=chunk, STEPS=2,
                                                             PROGRAMS=programs, PAGE=PAGE_WORDS, PAGES=pages,
                                                             num_warps=4)

    run()  # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    times = []
    for _ in range(reps):
        if not hot:  # new regions every replay: the graph reads the bases it was captured with, so redraw them
            bases.copy_((torch.randint(0, slots, (launches + 1,), generator=gen) * region).to(buf.device))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / launches)
    return statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1,8,32,96", help="buffer sizes in GiB")
    ap.add_argument("--programs", type=int, default=128, help="programs a launch (one local expert's in kernel 1)")
    ap.add_argument("--chunk-kib", type=int, default=64, help="bytes a program reads (kernel 1: 64 KB)")
    ap.add_argument("--launches", type=int, default=200)
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args(argv)
    chunk = a.chunk_kib * 1024 // 4
    region = a.programs * chunk
    gen = torch.Generator().manual_seed(0)
    emit("TLB_PROBE_RUN", provenance(torch.device("cuda")), programs=a.programs, chunk_kib=a.chunk_kib,
         region_mib=region * 4 / 2 ** 20, launches=a.launches, reps=a.reps)
    for size in (float(s) for s in a.sizes.split(",")):
        words = int(size * 2 ** 30) // 4 // region * region
        free = torch.cuda.mem_get_info()[0]
        if words * 4 > free - (2 << 30):
            emit("TLB_PROBE", size_gib=size, error=f"{words * 4} bytes asked, {free} free")
            continue
        buf = torch.empty(words, dtype=torch.int32, device="cuda")
        for pattern in ("cold", "hot", "cold_touched"):
            us = probe(buf, a.programs, chunk, region, a.launches, a.reps, pattern == "hot", gen,
                       touch=pattern == "cold_touched")
            emit("TLB_PROBE", size_gib=size, pattern=pattern, programs=a.programs,
                 chunk_kib=a.chunk_kib, region_mib=region * 4 / 2 ** 20, us_per_launch=round(us, 2),
                 launches=a.launches, reps=a.reps)
        del buf
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
