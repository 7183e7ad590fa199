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

Branch topk (dsv4.kernels.topk, counted under DSV4_KERNELS=triton while GPU_CHECKED is False):
    tiny      373 / 619  ->  371 / 617
    tiny_fp8  228 / 269  ->  226 / 267
The cut: the indexer's torch.topk and its valid compare in one launch (2 -> 1 a CSA layer here, tiny has 2;
3 -> 1 on a GPU, where torch.topk is two kernels: gatherTopK and a bitonic sort).
Branch doorfuse, with kernels.door CONFIG in_place on (DSV4_DOOR_IN_PLACE=1; off by default):
    tiny      373 / 619  ->  368 / 614
    tiny_fp8  228 / 269  ->  218 / 259
The cut: the door's pack kernel, one a door (2 x layers): the mHC boundary kernel does its bookkeeping and
wo_b's GEMV and the routed down kernel write the partial sums into the payloads. tiny's experts (bf16: the
torch path) still hand their sum over by a copy into the payload (1 a layer back).
Branch qkvfuse, DSV4_FUSE_QKV=1 (dsv4.model.attention CONFIG fuse_qkv: wq_a and wkv in one linear, 1 a layer):
    tiny                                   373 / 619  ->  368 / 614
    tiny_fp8_q128 (tiny_fp8 with q_lora_rank 128: wq_a's rows whole FP8 scale blocks, as Flash's; tiny_fp8's 32
    are not, so there the switch stacks nothing)  228 / 269  ->  223 / 264
Branch xproj, DSV4_FUSE_XPROJ=1 (dsv4.layout CONFIG fuse_xproj: a compressed layer's bf16 linears of x in one linear,
4 a CSA layer and 1 an HCA layer; the consumers read the column views in place, no copy):
    tiny                                   371 / 617  ->  361 / 607
Session 12, pipelined batched steps (engine.step_batch_device reads the hold and the fed inputs; the form that ran
on the GPU in session 12's calls 2-4), pooled step only:
    tiny 617 -> 624, tiny_fp8 267 -> 269 (each bound below moved by as much)
Session 14, the sampler reads a step's kept set as int32 flags (kernels/sample.py _kept_arg: one-byte flags changed
its sums' order on the GPU), one conversion in a step whose rows keep a subset, pooled step only:
    every pooled bound below +1
"""

from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4 import kernels
from dsv4.kernels import door
from dsv4.kernels import moe as fused_moe
from dsv4.model import attention

from launches import pooled_census, solo_census

pytestmark = pytest.mark.skipif(not kernels.interpreting(), reason="counted on CPU (Triton's interpreter)")

# With topk's cut (2 a step on tiny's 2 CSA layers) in every row.
# Session 17's step kernels (dsv4.kernels.rope_table: the rope tables in one launch a step and one a rate;
# dsv4.kernels.bookkeeping: Comm's begin and end and a state's settle in one launch each): solo -35, pooled -27.
BOUNDS = {"tiny": {"solo": 336, "pooled": 598}, "tiny_fp8": {"solo": 191, "pooled": 243},
          "tiny+fuse_qkv": {"solo": 331, "pooled": 593}, "tiny_fp8_q128+fuse_qkv": {"solo": 186, "pooled": 238},
          "tiny+fuse_xproj": {"solo": 326, "pooled": 588}}
BOUNDS_IN_PLACE = {"tiny": {"solo": 331, "pooled": 593}, "tiny_fp8": {"solo": 181, "pooled": 233}}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from dsv4.checkpoint.synth import synth
    from dsv4.config import preset

    return {"tiny": "tiny", "tiny_fp8": synth(preset("tiny"), tmp_path_factory.mktemp("fp8") / "tiny", seed=3,
                                              quant="fp8"),
            "tiny_fp8_q128": synth(preset("tiny").replace(q_lora_rank=128), tmp_path_factory.mktemp("q128") / "tiny",
                                   seed=3, quant="fp8")}


@pytest.mark.parametrize("source, in_place", [("tiny", False), ("tiny_fp8", False), ("tiny", True),
                                              ("tiny_fp8", True), ("tiny+fuse_qkv", False),
                                              ("tiny_fp8_q128+fuse_qkv", False), ("tiny+fuse_xproj", False)])
def test_decode_step_launches(monkeypatch, checkpoints, source, in_place):
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    monkeypatch.setitem(fused_moe.CONFIG, "shared_add", True)
    monkeypatch.setitem(door.CONFIG, "in_place", in_place)
    name, _, fuse = source.partition("+")
    monkeypatch.setitem(attention.CONFIG, "fuse_qkv", fuse == "fuse_qkv")
    monkeypatch.setitem(attention.CONFIG, "fuse_xproj", fuse == "fuse_xproj")
    model = dsv4.load(checkpoints[name], device="cpu", dtype=torch.float32)
    counts = {"solo": solo_census(model), "pooled": pooled_census(model, 4)}
    bounds = (BOUNDS_IN_PLACE if in_place else BOUNDS)[source]
    for kind, census in counts.items():
        top = "\n".join(f"  {n:4d} {site} {op}" for (site, op), n in census.sites.most_common(25))
        assert census.total <= bounds[kind], f"{source} {kind}: {census.total} launches\n{top}"
        assert census.ops["triton::_pack_kernel"] == (0 if in_place else 2 * model.cfg.num_hidden_layers), kind


def test_lean_prologue_launches(monkeypatch):
    """bookkeeping.CONFIG lean_prologue: a solo step without the position's arange and add and the embedding's
    gather (3 launches), a pooled step without the gather (its positions are pos's rows already)."""
    from dsv4.kernels import bookkeeping

    monkeypatch.setenv("DSV4_KERNELS", "triton")
    # the census runs no Triton kernel: the batched step's input tokens must come from torch's ops (batch_ends off),
    # not from batch_begin's unwritten output, for the gather of the step without the lean prologue to read
    monkeypatch.setitem(bookkeeping.CONFIG, "batch_ends", False)
    model = dsv4.load("tiny", device="cpu", dtype=torch.float32)
    counts = {}
    for lean in (False, True):
        monkeypatch.setitem(bookkeeping.CONFIG, "lean_prologue", lean)
        counts[lean] = (solo_census(model), pooled_census(model, 4))
    assert counts[False][0].total - counts[True][0].total == 3
    assert counts[False][1].total - counts[True][1].total == 1
    for census in counts[True]:
        gone = [(site, op) for (site, op) in census.sites if (op, site.rsplit(" ", 1)[-1]) in
                {("aten::index_select", "_first_boundary"), ("aten::arange", "__init__"), ("aten::add", "__init__")}]
        assert not gone, gone
