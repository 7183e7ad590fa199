"""Attention's wq_a and wkv stacked into one weight at load (dsv4.model.attention CONFIG fuse_qkv, DSV4_FUSE_QKV=1):
one linear over both, split into column views that the norm kernels read in place.

What is compared:
- formats.stack_rows: the stacked weight dequantises to the parts' rows, each part is a view of its storage (nothing
  held twice), and parts that cannot share one weight are refused (FP8 rows ending inside a scale block, ...);
- the norm kernels on a column slice (strided rows): bit for bit the kernel on the same values contiguous;
- the model (tiny: bf16 weights, the dense GEMV; tiny with q_lora_rank 128 in FP8: the FP8 GEMV, as Flash) with the
  switch on against off, DSV4_KERNELS=triton: the same greedy tokens and logits within 1e-5 of the largest (the
  stacked GEMV's split-K may follow its row count, so a row's sums may be ordered otherwise; on CPU they came out
  bit-equal); the official names still hold the weights' values (the oracle and checkpoint code read them);
- batched == solo with the switch on (rows > 1: the split's views are strided): each row's tokens and committed
  bytes are its sequence's solo ones. Eager == graph and 1 rank == 2 ranks run the same kernels in both arms
  (wq_a and wkv are replicated over ranks): their suites, run with DSV4_FUSE_QKV=1, cover them on the GPU.
"""

from __future__ import annotations

import pytest
import torch

import dsv4
from batching import assert_batched_equals_solo
from dsv4 import SamplingParams, kernels
from dsv4.checkpoint.synth import synth
from dsv4.config import preset
from dsv4.formats import QWeight, quantize_fp4, quantize_fp8, stack_rows
from dsv4.kernels import norm, normrope
from dsv4.model import attention

pytest.importorskip("triton")

DEVICES = (["cpu"] if kernels.interpreting() else []) + (["cuda"] if torch.cuda.is_available() else [])
# The whole-model cases cost 30-80 s each under the interpreter: on CPU they are in the slow set (fuse_qkv is on by
# default, so every other model test on CPU runs the stacked projection already).
MODEL_DEVICES = [pytest.param(d, marks=[pytest.mark.slow] if d == "cpu" else []) for d in DEVICES]

TOL = 1e-5  # of the largest logit, fp32 (tests/test_normrope.py's model tolerance)


def _weights(fmt: str, rows: list[int], cols: int, seed: int = 0) -> list[QWeight]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for r in rows:
        w = torch.randn(r, cols, generator=g)
        if fmt == "dense":
            out.append(QWeight(w, fmt="dense"))
        else:
            data, scale = (quantize_fp8 if fmt == "fp8" else quantize_fp4)(w)
            out.append(QWeight(data, scale, fmt))
    return out


@pytest.mark.parametrize("fmt, rows", [("dense", [32, 32]), ("fp8", [256, 96]), ("fp8", [128, 128]),
                                       ("fp4", [3, 5])])
def test_stack_rows_parts_are_views(fmt, rows):
    parts = _weights(fmt, rows, 192)
    stacked, views = stack_rows(parts)
    assert stacked.shape == (sum(rows), 192) and stacked.fmt == fmt
    assert torch.equal(stacked.dequant(torch.float32), torch.cat([p.dequant(torch.float32) for p in parts]))
    for part, view in zip(parts, views):
        assert torch.equal(view.dequant(torch.float32), part.dequant(torch.float32))
        assert view.data.untyped_storage().data_ptr() == stacked.data.untyped_storage().data_ptr()
        if fmt != "dense":
            assert view.scale.untyped_storage().data_ptr() == stacked.scale.untyped_storage().data_ptr()


def test_stack_rows_refuses_what_cannot_share_one_weight():
    assert stack_rows(_weights("fp8", [96, 128], 128)) is None  # wq_a's last scale block would cover wkv's rows
    assert stack_rows(_weights("dense", [8], 64) + _weights("dense", [8], 32)) is None  # other widths
    assert stack_rows(_weights("fp8", [128], 128) + _weights("dense", [8], 128)) is None  # other formats
    sliced = _weights("fp8", [128, 128], 128)
    sliced[1].row0 = 128  # a rank's slice of a larger tensor
    assert stack_rows(sliced) is None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_kernels_read_column_slices_in_place(device, dtype):
    """q's and kv's column views of the stacked output [rows, q_lora_rank + head_dim]: the same bits as the kernels
    on contiguous copies (the same operations on the same values; only the addresses differ)."""
    g = torch.Generator().manual_seed(5)
    both = (torch.randn(3, 96 + 64, generator=g) * 3).to(dtype).to(device)
    q_a, kv_a = both.split([96, 64], dim=-1)
    assert not q_a.is_contiguous() and not kv_a.is_contiguous()
    q_norm, kv_norm = (torch.rand(96, generator=g) + 0.5).to(device), (torch.rand(64, generator=g) + 0.5).to(device)
    angles = torch.rand(3, 16, generator=g) * 6.0
    cos, sin = angles.cos().to(device), angles.sin().to(device)
    assert norm.supported(q_a, q_norm) and normrope.supported(kv_a, kv_norm, cos, sin)
    got = norm.rms_norm(q_a, q_norm, 1e-6)
    assert got.is_contiguous() and torch.equal(got, norm.rms_norm(q_a.contiguous(), q_norm, 1e-6))
    got = normrope.norm_rope(kv_a, kv_norm, 1e-6, cos, sin)
    assert got.is_contiguous() and torch.equal(got, normrope.norm_rope(kv_a.contiguous(), kv_norm, 1e-6, cos, sin))


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """tiny (bf16 weights) and tiny in FP8 with q_lora_rank 128 (whole scale blocks, as Flash's 1024: wq_a and wkv
    stack; tiny's 32 does not)."""
    return {"tiny": "tiny", "fp8": synth(preset("tiny").replace(q_lora_rank=128),
                                         tmp_path_factory.mktemp("q128") / "tiny", seed=3, quant="fp8")}


def _load(source, fuse: bool, device, monkeypatch):
    monkeypatch.setitem(attention.CONFIG, "fuse_qkv", fuse)
    return dsv4.load(source, device=device, dtype=torch.float32, seed=3)


@pytest.mark.parametrize("device", MODEL_DEVICES)
@pytest.mark.parametrize("which", ["tiny", "fp8"])
def test_fused_model_against_unfused(monkeypatch, sources, which, device):
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    plain, fused = (_load(sources[which], on, device, monkeypatch) for on in (False, True))
    cfg = fused.cfg
    for i, layer in enumerate(fused.transformer.layers):
        w = layer["attn"]
        assert "wq_a_wkv" in w and "wq_a_wkv" not in plain.transformer.layers[i]["attn"]
        assert w["wq_a_wkv"].shape == (cfg.q_lora_rank + cfg.head_dim, cfg.hidden_size)
        for name in ("wq_a", "wkv"):
            official = fused.transformer.weights[f"layers.{i}.attn.{name}.weight"]
            assert official is w[name]
            assert official.data.untyped_storage().data_ptr() == w["wq_a_wkv"].data.untyped_storage().data_ptr()
            assert torch.equal(official.dequant(torch.float32),
                               plain.transformer.weights[f"layers.{i}.attn.{name}.weight"].dequant(torch.float32))

    def run(model):
        state = model.new_state(32)
        logits = [model.prefill(state, list(range(3, 8)))]
        for token in (12, 13):
            logits.append(model.decode(state, token))
        return torch.stack(logits)

    want, got = run(plain), run(fused)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    torch.testing.assert_close(got, want, rtol=0, atol=TOL * float(want.abs().max()))


@pytest.mark.parametrize("device", MODEL_DEVICES)
def test_fused_batched_equals_solo(monkeypatch, sources, device):
    """FP8, switch on: a batched step's 2 rows (the split's views strided) each equal their sequence stepped alone."""
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    model = _load(sources["fp8"], True, device, monkeypatch)
    prompts = [[5, 6, 7], [9, 10]]
    samplings = [SamplingParams(temperature=t, seed=i) for i, t in enumerate([1.0, 0.0])]

    assert_batched_equals_solo(model, prompts, samplings, 2)
