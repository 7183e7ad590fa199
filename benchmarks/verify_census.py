"""The kernel launches of one verify step, counted on CPU (tests/launches.py's census, its kernels run in Triton's
interpreter): a verify step of R rows with its rows in turn (model.attention._in_turn) and as one chunk (layout CONFIG
verify_chunk), torch's Undo or the fused one. A launch is a node of the step's CUDA graph, so the counts say what a
graph of the step holds; they say nothing of time.

    PYTHONPATH=$PWD TRITON_INTERPRET=1 python benchmarks/verify_census.py --preset tiny --rows 1 --rows 2 --rows 4
prints VERIFY_CENSUS records: launches in all and in plain steps' launches, and the attention's, the compressors'
and index keys', and the Undo's launches.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

os.environ.setdefault("DSV4_KERNELS", "triton")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import dsv4  # noqa: E402
from dsv4.kernels import undo as fused_undo  # noqa: E402
from dsv4.layout import CONFIG as LAYOUT  # noqa: E402
from dsv4.receipts import emit, provenance  # noqa: E402
from launches import solo_census, verify_census  # noqa: E402

KINDS = {"attention": ("_attn_split_kernel", "_attn_combine_kernel"),
         "compressor": ("_pool_kernel", "_pool_pair_kernel", "_index_keys_kernel", "_topk_kernel"),
         "undo": ("_apply_kernel", "_back_kernel")}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="tiny")
    p.add_argument("--rows", type=int, action="append", default=[], help="rows of a verify step (repeatable)")
    a = p.parse_args()
    model = dsv4.load(a.preset, device="cpu")
    where = provenance(model.device, a.preset)
    sampling = dsv4.SamplingParams(temperature=1.0, seed=2)
    plain = solo_census(model, sampling).total
    emit("VERIFY_CENSUS", where, arm="plain", rows=1, launches=plain)
    prompt = torch.randint(2, model.cfg.vocab_size, (12,), generator=torch.Generator().manual_seed(7)).tolist()
    for R in a.rows or [2, 4]:
        for chunk in (False, True):
            for fused in (False, True):
                LAYOUT["verify_chunk"], fused_undo.CONFIG["fused"] = chunk, fused
                state = model.new_state(len(prompt) + R + 4)
                model.prefill(state, prompt)
                census = verify_census(model, state, torch.tensor(prompt[:R]), sampling)
                by_kind = {kind: sum(n for op, n in census.ops.items() if op.split("::")[-1] in names)
                           for kind, names in KINDS.items()}
                emit("VERIFY_CENSUS", where, arm=("chunk" if chunk else "in_turn") + ("_fused_undo" if fused else ""),
                     rows=R, launches=census.total, in_plain_steps=round(census.total / plain, 2), **by_kind)
    return 0


if __name__ == "__main__":
    sys.exit(main())
