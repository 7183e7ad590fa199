"""dsv4's decode against HF transformers' `generate` on the same weights, in one process (issue 10, target 5: mini's
graph >= 40 x HF's generate "on the same weights in the same call").

    python benchmarks/hf_generate_bench.py --preset mini --device cuda [--prompt-tokens 64] [--new-tokens 64] [--rows 3]
    python benchmarks/hf_generate_bench.py --preset tiny --device cpu --dtype float32 --new-tokens 8 --rows 1   # smoke

One dsv4 load; HF's DeepseekV4ForCausalLM built from its weights (dsv4.oracle.hf_model_from, as benchmarks/mini_vs_hf.py:
the routed experts dequantised, so HF reads more bytes a token than dsv4's FP4/FP8: the comparison a user makes).
Both decode greedily from the same prompt:
  - HF: `generate(max_new_tokens=N, do_sample=False)` with its cache, timed whole, and again with max_new_tokens=1
    (the prompt's prefill and one token): its decode is (t_N - t_1) / (N - 1) a token. The median over --rows.
  - dsv4: prefill, then N greedy steps of Model.step (forward, commit, head, sampling, readback: the bench's timing
    scope), in the replayed full-token graph on CUDA (captured before the timed rows) and eager; medians over --rows.
Records (dsv4.receipts): HF_GENERATE_ROW per timed row, and HF_GENERATE with each arm's ms a token, dsv4's graph (or,
on CPU, eager) over HF, and how many of the N greedy tokens agree from the start (`same_prefix`: in fp32 all of them;
in bf16 the two sums round differently and a near tie may diverge; a divergence does not change the timing, each arm
decodes its own N tokens).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import dsv4
from dsv4.bench import PROMPT
from dsv4.gate.timing import sync, timed_steps
from dsv4.oracle import hf_model_from
from dsv4.receipts import emit, provenance
from dsv4.sampler import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def hf_decode_ms(hf, prompt: list[int], new: int, device) -> tuple[float, list[int]]:
    """HF generate's ms a decoded token ((t_new - t_1) / (new - 1)) and its greedy tokens."""
    ids = torch.tensor([prompt], device=device)

    def generate(n: int):
        sync_device(device)
        start = time.perf_counter()
        with torch.no_grad():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, use_cache=True)
        sync_device(device)
        return time.perf_counter() - start, out[0, len(prompt):].tolist()

    t1, _ = generate(1)
    tn, tokens = generate(new)
    return (tn - t1) / (new - 1) * 1e3, tokens


def dsv4_decode_ms(model, state, first: int, new: int) -> tuple[float, list[int]]:
    """dsv4's ms a token over `new` greedy steps from `first` (the prompt's argmax) and the tokens fed in."""
    tokens, last, ns = timed_steps(model, state, first, new, GREEDY)
    return ns / new / 1e6, tokens[:new]


def sync_device(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def same_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rows", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.new_tokens < 2 or args.prompt_tokens < 1 or args.rows < 1:
        ap.error("--new-tokens >= 2, --prompt-tokens >= 1 and --rows >= 1")
    dtype = getattr(torch, args.dtype)
    model = dsv4.load(args.preset, device=args.device, dtype=dtype, seed=args.seed)
    device = model.device
    text = model.tokenizer.encode(PROMPT)
    prompt = (text * (args.prompt_tokens // len(text) + 1))[:args.prompt_tokens]

    cap = args.prompt_tokens + args.new_tokens + 8
    prefix = model.new_state(cap)
    first = int(model.prefill(prefix, prompt).argmax())
    arms = {"eager": model.new_state(cap)}
    if device.type == "cuda":
        graph = arms["graph"] = model.new_state(cap)
        graph.restore(prefix)
        model.enable_replay(graph, GREEDY)
        model.step(graph, first, GREEDY)  # the capture, outside the timed rows
    ms = {arm: [] for arm in arms}
    ours = None
    for row in range(args.rows):
        for arm, state in arms.items():
            state.restore(prefix)
            t, ours = dsv4_decode_ms(model, state, first, args.new_tokens)
            ms[arm].append(t)
            emit("HF_GENERATE_ROW", row=row, arm=arm, ms_per_token=round(t, 4))

    hf = hf_model_from(model, dtype=dtype)
    ms["hf"] = []
    theirs = None
    for row in range(args.rows):
        t, theirs = hf_decode_ms(hf, prompt, args.new_tokens, device)
        ms["hf"].append(t)
        emit("HF_GENERATE_ROW", row=row, arm="hf", ms_per_token=round(t, 4))
    med = {arm: statistics.median(v) for arm, v in ms.items()}
    best = "graph" if "graph" in med else "eager"
    emit("HF_GENERATE", provenance(device, args.preset), dtype=args.dtype, prompt_tokens=args.prompt_tokens,
         new_tokens=args.new_tokens, rows=args.rows, **{f"{arm}_ms_per_token": round(v, 4) for arm, v in med.items()},
         dsv4_arm=best, dsv4_over_hf=round(med["hf"] / med[best], 2),
         same_prefix=same_prefix(ours, theirs), timing_scope="dsv4: model.step per token (forward, commit, head, "
         "sampling, readback), median row; hf: (generate(N) - generate(1)) / (N - 1), median row")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
