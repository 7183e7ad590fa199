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

Branch glue2 (counted with kernels.moe CONFIG shared_add on, as below):
    tiny      413 / 641  ->  373 / 619
    tiny_fp8  273 / 296  ->  228 / 269
The cuts: the indexer's picks are top-k's indices (1 a CSA layer), the shared expert added in the routed down
kernel's store (1 a layer), the sampler's draw in one launch (kernels/draw.py; 18 -> 1), its scalar where()s
as masked_fill and the kept count without pad/clamp (3), sample()'s check of pos without ops on an empty
tensor (16 in this census; none on a GPU, where an empty op launches nothing).

Branch qkvfuse, DSV4_FUSE_QKV=1 (dsv4.model.attention CONFIG fuse_qkv: wq_a and wkv in one linear, 1 a layer):
    tiny                                   373 / 619  ->  368 / 614
    tiny_fp8_q128 (tiny_fp8 with q_lora_rank 128: wq_a's rows whole FP8 scale blocks, as Flash's; tiny_fp8's 32
    are not, so there the switch stacks nothing)  228 / 269  ->  223 / 264
"""

from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4 import kernels
from dsv4.kernels import moe as fused_moe
from dsv4.model import attention

from launches import pooled_census, solo_census

pytestmark = pytest.mark.skipif(not kernels.interpreting(), reason="counted on CPU (Triton's interpreter)")

BOUNDS = {"tiny": {"solo": 373, "pooled": 619}, "tiny_fp8": {"solo": 228, "pooled": 269},
          "tiny+fuse_qkv": {"solo": 368, "pooled": 614}, "tiny_fp8_q128+fuse_qkv": {"solo": 223, "pooled": 264}}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from dsv4.checkpoint.synth import synth
    from dsv4.config import preset

    return {"tiny": "tiny", "tiny_fp8": synth(preset("tiny"), tmp_path_factory.mktemp("fp8") / "tiny", seed=3,
                                              quant="fp8"),
            "tiny_fp8_q128": synth(preset("tiny").replace(q_lora_rank=128), tmp_path_factory.mktemp("q128") / "tiny",
                                   seed=3, quant="fp8")}


@pytest.mark.parametrize("source", ["tiny", "tiny_fp8", "tiny+fuse_qkv", "tiny_fp8_q128+fuse_qkv"])
def test_decode_step_launches(monkeypatch, checkpoints, source):
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    monkeypatch.setitem(fused_moe.CONFIG, "shared_add", True)
    name, _, fuse = source.partition("+")
    monkeypatch.setitem(attention.CONFIG, "fuse_qkv", fuse == "fuse_qkv")
    model = dsv4.load(checkpoints[name], device="cpu", dtype=torch.float32)
    counts = {"solo": solo_census(model), "pooled": pooled_census(model, 4)}
    for kind, census in counts.items():
        top = "\n".join(f"  {n:4d} {site} {op}" for (site, op), n in census.sites.most_common(25))
        assert census.total <= BOUNDS[source][kind], f"{source} {kind}: {census.total} launches\n{top}"
