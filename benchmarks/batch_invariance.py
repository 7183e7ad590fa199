"""Which operation makes a batched row differ from the same row alone (a GPU diagnostic).

    python benchmarks/batch_invariance.py [--preset mini] [--steps 8] [--rows 4]

Two copies of one primed state: one steps alone (Model.step, eager), the other as row 0 of an
eager batched step beside rows-1 other sequences. After each step the streams after every mHC post
(attention and MoE of each layer) are compared for row 0. Runs under the default kernels, under
DSV4_KERNELS=torch, and with each GPU-checked kernel module switched off in turn, so the module
whose kernel (or whose torch fallback) is not row-invariant shows. One record per variant:

  INVARIANCE  variant, first mismatch (step, layer, site) or null, logits equal, tokens equal
"""

from __future__ import annotations

import argparse
import importlib
import os

import torch

import dsv4
from dsv4.model import forward as fwd
from dsv4.receipts import emit
from dsv4.sampler import SamplingParams

MODULES = ["qgemv", "moe", "route", "hc", "hc_post", "hc_boundary", "norm", "attention", "compressor", "commit", "door"]


def run(model, args, variant: str) -> dict:
    cfg = model.cfg
    trace: list = []
    boundary = fwd.Transformer._boundary

    def recording(self, out, p, comb, h, *rest):
        result = boundary(self, out, p, comb, h, *rest)
        if h is not None:  # the streams after an mHC post
            trace.append(result[0][0].detach().clone())
        return result

    fwd.Transformer._boundary = recording
    try:
        prompt = [(i * 7919 + 13) % cfg.vocab_size for i in range(args.prime)]
        base = model.new_state(args.prime + args.steps + 8)
        model.prefill(base, prompt)
        alone, row0 = model.new_state(base.capacity), model.new_state(base.capacity)
        alone.restore(base)
        row0.restore(base)
        others = []
        for r in range(1, args.rows):
            s = model.new_state(base.capacity)
            model.prefill(s, [(i * 31 + r) % cfg.vocab_size for i in range(args.prime // 2 + r)])
            others.append(s)
        sp = [SamplingParams(temperature=1.0, seed=r) for r in range(args.rows)]
        tok = [prompt[-1]] + [7 + r for r in range(1, args.rows)]
        for step in range(args.steps):
            trace.clear()
            a = model.step(alone, tok[0], sp[0])
            solo = list(trace)
            trace.clear()
            out = model.step_batch([row0] + others, tok, sp)
            batched = list(trace)
            for i, (x, y) in enumerate(zip(solo, batched)):
                if not torch.equal(x, y):
                    return {"variant": variant, "step": step, "layer": i // 2, "site": ("attention", "moe")[i % 2],
                            "max_abs": float((x.float() - y.float()).abs().max()), "tokens_equal": a == out[0]}
            if not torch.equal(alone.logits, row0.logits) or a != out[0]:
                return {"variant": variant, "step": step, "layer": None, "site": "head/sampler",
                        "logits_equal": torch.equal(alone.logits, row0.logits), "tokens_equal": a == out[0]}
            tok = [a] + list(out[1:])
        return {"variant": variant, "step": None, "all_equal": True}
    finally:
        fwd.Transformer._boundary = boundary


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--prime", type=int, default=64)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    model = dsv4.load(args.preset, device=args.device)
    emit("INVARIANCE", run(model, args, "auto"))
    for name in MODULES:
        mod = importlib.import_module(f"dsv4.kernels.{name}")
        if not getattr(mod, "GPU_CHECKED", False):
            continue
        mod.GPU_CHECKED = False
        try:
            emit("INVARIANCE", run(model, args, f"auto without {name}"))
        finally:
            mod.GPU_CHECKED = True
    os.environ["DSV4_KERNELS"] = "torch"
    emit("INVARIANCE", run(model, args, "torch"))


if __name__ == "__main__":
    main()
