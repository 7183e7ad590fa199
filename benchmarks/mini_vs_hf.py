"""`mini` random weights on one GPU against HF DeepseekV4ForCausalLM holding the same weights.

Both run fp32. HF holds its routed experts in bf16 (exact: FP4 x power-of-two fits bf16) and
upcasts each expert it runs, so an fp32 HF `mini` fits one H200 beside dsv4. HF runs one full
forward over the sequence; dsv4 runs the same positions by prefill, then one-token decode.
Per position: max |diff| / max |logit|; argmax agreement. A bf16 dsv4 run is reported beside it.
"""

import sys

import torch

import dsv4
from dsv4.oracle import hf_model_from
from dsv4.receipts import emit, provenance

N, P = int(sys.argv[1]) if len(sys.argv) > 1 else 300, 40


def rel(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def run(model, ids):
    s = model.new_state(N + 1)
    out = [model.prefill(s, ids[:P])] + [model.decode(s, t) for t in ids[P:]]
    return torch.stack(out)


ids = torch.randint(2, 129280, (N,), generator=torch.Generator().manual_seed(3)).tolist()
m32 = dsv4.load("mini", device="cuda", dtype=torch.float32, seed=0)
ours32 = run(m32, ids)
hf = hf_model_from(m32, dtype=torch.float32, expert_dtype=torch.bfloat16)
with torch.no_grad():
    ref = hf(torch.tensor([ids], device="cuda")).logits[0, P - 1:].float()
del hf, m32
torch.cuda.empty_cache()
m16 = dsv4.load("mini", device="cuda", dtype=torch.bfloat16, seed=0)
ours16 = run(m16, ids)
res = {}
for name, ours in (("dsv4_fp32", ours32), ("dsv4_bf16", ours16)):
    errs = [rel(a, b) for a, b in zip(ours, ref)]
    agree = float((ours.argmax(-1) == ref.argmax(-1)).float().mean())
    res[name] = {"max_rel_err": max(errs), "median_rel_err": sorted(errs)[len(errs) // 2], "argmax_agree": agree}
emit("MINI_VS_HF", provenance("cuda", "mini"), positions=N - P + 1, prefill=P, hf_dtype="float32 (experts stored bf16)",
     **res, finite=bool(torch.isfinite(ours16).all() and torch.isfinite(ours32).all()))
