"""Barriers, instructions and registers of the mHC boundary and decode attention kernels for sm_90, by option,
compiled on this machine (no GPU; Triton's ptxas, nvdisasm and cuobjdump).

    PYTHONPATH=$PWD python benchmarks/barrier_census.py

A latency-bound kernel's serial phases cost about one shared-memory round trip per cross-warp reduction or layout
conversion, each between BAR.SYNCs: the count is a static proxy for them (the boundary's finish: its instructions
after the ticket's ATOMG). Flash's shapes (rank 0 of 2): a mid boundary (hc 4, D 4096, bf16), attention of one
token over 32 heads of 512 with a store of 6 rows (sliding and HCA at 5 splits). Prints
  CENSUS {"kernel", "options", "instructions", "bar", "bar_after_ticket", "registers", "stack"}
"""

from __future__ import annotations

import re

import torch

from benchmarks.sass_census import compile_only, compiled, tool
from dsv4.kernels import attention, hc_boundary
from dsv4.receipts import emit  # noqa: E402

def census(name: str, options: dict, kernel):
    cubin = kernel.asm["cubin"]
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", tool("nvdisasm", cubin, "-c"))
    ticket = next((i for i, op in enumerate(ops) if op.startswith("ATOMG")), len(ops))
    usage = re.search(r"REG:(\d+).*?STACK:(\d+)", tool("cuobjdump", cubin, "-res-usage"))
    emit("CENSUS", kernel=name, options=options, instructions=len(ops), bar=sum(op.startswith("BAR") for op in ops),
         bar_after_ticket=sum(op.startswith("BAR") for op in ops[ticket:]), registers=int(usage.group(1)),
         stack=int(usage.group(2)))


def boundary():
    h, fn = torch.zeros(1, 4, 4096, dtype=torch.bfloat16), torch.zeros(24, 4 * 4096)
    hc_boundary.boundary(torch.zeros(1, 4096, dtype=torch.bfloat16), torch.zeros(1, 4), torch.zeros(1, 4, 4), h, fn,
                         torch.zeros(24), torch.ones(3), torch.ones(4096, dtype=torch.bfloat16), 4, 20, 1e-6, 1e-6)


def attention_hca():
    z = dict(dtype=torch.bfloat16)
    args = (torch.zeros(1, 32, 512, **z), torch.zeros(128, 512, **z), torch.zeros(1, 512, **z),
            torch.zeros(1, 129, dtype=torch.bool), torch.zeros(32), torch.zeros(1, 32), torch.zeros(1, 32))
    attention.attention(*args, comp=torch.zeros(6, 512, **z), new=torch.zeros(2, 512, **z),
                        committed=torch.zeros(6, dtype=torch.bool), new_visible=torch.zeros(1, 2, dtype=torch.bool))


def main():
    hc_boundary.launcher = attention.launcher = compile_only
    arms = [(hc_boundary.CONFIG, boundary, {"one_pass_finish": a, "warp_maps": b}) for a in (False, True)
            for b in (False, True)]
    arms += [(attention.CONFIG, attention_hca, {"fused_combine": a}) for a in (False, True)]
    for config, build, options in arms:
        saved = dict(config)
        config.update(options)
        compiled.clear()
        build()
        config.update(saved)
        for name, _, kernel in compiled:
            census(name, options, kernel)


if __name__ == "__main__":
    main()
