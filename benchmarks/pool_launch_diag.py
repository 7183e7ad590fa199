"""The per-sequence ops of a pooled step at B=1 and B=4 (test_pool's launch count), three times each way on one
model, with the ops that differ: session 8 saw that test's counts differ by 4 on CUDA in some runs and not others."""
import collections
import sys

import torch

import dsv4
from dsv4.model import step as model_step
from dsv4.receipts import emit, provenance
from dsv4.state import StatePool

sys.path.insert(0, "tests")
import test_pool as tp  # noqa: E402

model_step.rows_cos_sin = lambda rope, positions, kind: rope.cos_sin(positions, kind)
model = dsv4.load("tiny", device="cuda")


def count(B: int) -> collections.Counter:
    pool = StatePool(model.cfg, 5, tp.CAPACITY, model.device, model.dtype)
    states = [pool.state(s) for s in range(B)]
    tokens = torch.tensor([tp.PROMPTS[i % 3][-1] for i in range(B)], device=model.device)
    active = torch.ones(B, dtype=torch.bool, device=model.device)
    counter = tp._Launches()
    with tp.fused_attention(), torch.inference_mode(), tp._launches_counted(collections.Counter()):
        model.transformer.transaction(states, tokens, active)
        with tp._launches_counted(counter.ops), counter:
            model.transformer.transaction(states, tokens, active)
    return counter.ops


for order in ((1, 4), (4, 1), (1, 4)):
    got = {B: count(B) for B in order}
    emit("POOL_LAUNCHES", provenance(model.device, "tiny"), order=list(order),
         counts={B: sum(c.values()) for B, c in got.items()}, b1_minus_b4=dict(got[1] - got[4]),
         b4_minus_b1=dict(got[4] - got[1]))
