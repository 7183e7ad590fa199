"""`mini` random weights on one GPU against HF DeepseekV4ForCausalLM holding the same weights.

HF runs bf16 (an fp32 HF `mini` needs ~155 GB for its dequantised experts), full forward over
the prompt; dsv4 runs the same positions by prefill then one-token decode, in bf16 and in fp32
(dsv4 keeps FP8/FP4 weights quantised and dequantises where used). Per position:
max |diff| / max |logit|, and argmax agreement.
"""

import json
import subprocess
import sys

import torch

import dsv4
from dsv4.oracle import hf_model_from

N, P = int(sys.argv[1]) if len(sys.argv) > 1 else 300, 40


def rel(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def run(model, ids):
    s = model.new_state(N + 1)
    out = [model.prefill(s, ids[:P])] + [model.decode(s, t) for t in ids[P:]]
    return torch.stack(out)


ids = torch.randint(2, 129280, (N,), generator=torch.Generator().manual_seed(3)).tolist()
m16 = dsv4.load("mini", device="cuda", dtype=torch.bfloat16, seed=0)
ours16 = run(m16, ids)
hf = hf_model_from(m16, dtype=torch.bfloat16)
with torch.no_grad():
    ref = hf(torch.tensor([ids], device="cuda")).logits[0, P - 1:].float()
del hf
torch.cuda.empty_cache()
del m16
m32 = dsv4.load("mini", device="cuda", dtype=torch.float32, seed=0)
ours32 = run(m32, ids)
res = {}
for name, ours in (("dsv4_bf16", ours16), ("dsv4_fp32", ours32)):
    errs = [rel(a, b) for a, b in zip(ours, ref)]
    agree = float((ours.argmax(-1) == ref.argmax(-1)).float().mean())
    res[name] = {"max_rel_err": max(errs), "median_rel_err": sorted(errs)[len(errs) // 2], "argmax_agree": agree}
res["dsv4_bf16_vs_fp32"] = max(rel(a, b) for a, b in zip(ours16, ours32))
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
print("MINI_VS_HF", json.dumps({"positions": N - P + 1, "prefill": P, "hf_dtype": "bfloat16", **res,
                                "finite": bool(torch.isfinite(ours16).all() and torch.isfinite(ours32).all()),
                                "device": torch.cuda.get_device_name(), "commit": commit}))
