"""Kernel launches per decode step, counted on CPU with the kernels on (tests/launches.py: every aten op that
launches a CUDA kernel, every Triton launch), as upper bounds: a change that adds launches to a step fails
here and says where they come from.

Counts at issue 10's start (commit 9540044) and after it, solo step (Model.step_device) / pooled step of 4
rows (Model.step_batch_device over StatePool slots):
    tiny (bf16 weights: the experts' torch path)   516 / 740  ->  413 / 641
    tiny_fp8 (official layout: the decode GEMV and fused experts, as Flash)  406 / 425  ->  273 / 296
The cuts: a step's geometry in one launch per rate and one for the sliding window (kernels/geometry.py;
~90 launches a step), the verdict added inside the next door's pack (2 x layers -> 1), the fused experts'
path without the other ranks' weight zeroing (6 a layer).
"""

from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4 import kernels

from launches import pooled_census, solo_census

pytestmark = pytest.mark.skipif(not kernels.interpreting(), reason="counted on CPU (Triton's interpreter)")

BOUNDS = {"tiny": {"solo": 413, "pooled": 641}, "tiny_fp8": {"solo": 273, "pooled": 296}}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from dsv4.checkpoint.synth import synth
    from dsv4.config import preset

    return {"tiny": "tiny", "tiny_fp8": synth(preset("tiny"), tmp_path_factory.mktemp("fp8") / "tiny", seed=3,
                                              quant="fp8")}


@pytest.mark.parametrize("source", ["tiny", "tiny_fp8"])
def test_decode_step_launches(monkeypatch, checkpoints, source):
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    model = dsv4.load(checkpoints[source], device="cpu", dtype=torch.float32)
    counts = {"solo": solo_census(model), "pooled": pooled_census(model, 4)}
    for kind, census in counts.items():
        top = "\n".join(f"  {n:4d} {site} {op}" for (site, op), n in census.sites.most_common(25))
        assert census.total <= BOUNDS[source][kind], f"{source} {kind}: {census.total} launches\n{top}"
