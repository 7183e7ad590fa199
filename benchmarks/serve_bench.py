"""Load on `dsv4 serve` through the real HTTP server and the `openai` client, at several concurrencies.

Starts `python -m dsv4.cli serve` on a free localhost port (or drives --url), then for each
concurrency C runs --requests requests (default 2 C) from C client threads, each a streamed
completion of --max-tokens tokens from a --prompt-tokens prompt of random token ids (seeded, so
reruns send the same prompts; with --prompt-tokens-min, of lengths drawn from [min, --prompt-tokens]). Bounded: every level stops issuing requests after --level-timeout
seconds. Prints one record per line, `TAG {json}`:

  BUILD    the server's command line and how long it took to answer
  REQUEST  per request: ttft_s (request sent -> first sampled token), tpot_s (time per output token
           after the first), completion tokens, e2e_s; requests ask for return_token_ids, so the stream
           carries a chunk per sampled token (its text possibly empty) and its ids
  LEVEL    per concurrency: aggregate tok/s (completion tokens / wall time of the level), ttft and
           tpot percentiles as the client saw them, errors; server_ttft_mean_s / server_tpot_mean_s: the
           server's own means over the level (GET /metrics)
  IDENTITY request i has the same prompt and seed at every level: its token ids must be the same alone
           and among others (exit 1 when not)
  FIRST    the server's first request (prompt_tokens, max_tokens 4): time to first token, untimed otherwise
  WARMUP   with --warmup N: each level run N times first, untimed (its requests are not REQUEST records)
  COMPILE  with DSV4_LOG_COMPILES=1 in the environment: each kernel the server compiled after it answered
           (dsv4/kernels/compile_log.py), printed when it happened, between the levels' records

CPU smoke (seconds):  python benchmarks/serve_bench.py --preset tiny --device cpu --concurrency 1,4 \\
                      --prompt-tokens 32 --max-tokens 8
GPU:                  python benchmarks/serve_bench.py --preset flash --device cuda --ranks 2
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

import openai

from dsv4.receipts import emit




def start_server(args) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "dsv4.cli", "serve", "--port", "0", "--served-model-name", "bench",
           "--max-num-seqs", str(max(args.levels)), "--max-waiting", str(4 * max(args.levels)),
           "--max-model-len", str(args.prompt_tokens + args.max_tokens + 8)]
    cmd += ["--model", args.model] if args.model else ["--preset", args.preset]
    cmd += ["--ranks", str(args.ranks)] + (["--device", args.device] if args.device else [])
    cmd += ["--no-precapture"] if args.no_precapture else []
    cmd += ["--gemv", args.gemv] if args.gemv else []
    cmd += ["--prefill-chunk", str(args.prefill_chunk)] if args.prefill_chunk else []
    cmd += ["--prefix-cache", str(args.prefix_cache)] if args.prefix_cache is not None else []
    cmd += ["--speculate", args.speculate, "--draft-tokens", str(args.draft_tokens)] if args.speculate else []
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    for line in proc.stderr:
        found = re.search(r"at (http://\S+/v1)", line)
        if found:
            # keep it drained; the server's COMPILE lines (DSV4_LOG_COMPILES=1) join this output
            threading.Thread(target=lambda: [sys.stdout.write(x) for x in proc.stderr if x.startswith("COMPILE ")],
                             daemon=True).start()
            emit("BUILD", cmd=" ".join(cmd[1:]), ready_s=round(time.perf_counter() - start, 2), banner=line.strip())
            return proc, found.group(1)
        sys.stderr.write(line)
    raise SystemExit(f"the server exited (code {proc.wait()}) before it answered")


def one_request(client, model: str, prompt: list[int], max_tokens: int, seed: int) -> dict:
    sent = time.perf_counter()
    first = last = None
    usage = None
    stream = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=1.0, seed=seed,
                                       stream=True, stream_options={"include_usage": True},
                                       extra_body={"return_token_ids": True})
    ids = []
    for chunk in stream:
        now = time.perf_counter()
        if chunk.choices and chunk.choices[0].token_ids:  # a chunk per sampled token (return_token_ids)
            first = first or now
            last = now
            ids += chunk.choices[0].token_ids
        if chunk.usage is not None:
            usage = chunk.usage
    n = usage.completion_tokens if usage else 0
    if n != len(ids):
        raise RuntimeError(f"usage says {n} completion tokens, the chunks carried {len(ids)} token ids")
    end = time.perf_counter()
    first = first or end
    return {"ttft_s": round(first - sent, 4), "tpot_s": round((last - first) / (n - 1), 5) if n > 1 and last else None,
            "completion_tokens": n, "e2e_s": round(end - sent, 4),
            "ids_sha": hashlib.sha256(repr(ids).encode()).hexdigest()[:16]}


def server_times(url: str) -> dict[str, float]:
    """The server's own histogram sums and counts (GET /metrics): time to first token and time per output token,
    as the scheduler measures them per sampled token. The client's view misses tokens whose text is empty (random
    weights draw many ids the tokenizer spells as nothing, and empty deltas are not streamed)."""
    import urllib.request

    base = url.rsplit("/v1", 1)[0]
    text = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    out = {}
    for name in ("dsv4_time_to_first_token_seconds", "dsv4_time_per_output_token_seconds"):
        for part in ("sum", "count"):
            found = re.search(rf"^{name}_{part}{{[^}}]*}} (\S+)$", text, re.M)
            out[f"{name}_{part}"] = float(found.group(1)) if found else 0.0
    return out


def server_means(before: dict, after: dict) -> dict:
    means = {}
    for key, name in (("server_ttft_mean_s", "dsv4_time_to_first_token_seconds"),
                      ("server_tpot_mean_s", "dsv4_time_per_output_token_seconds")):
        count = after[f"{name}_count"] - before[f"{name}_count"]
        means[key] = round((after[f"{name}_sum"] - before[f"{name}_sum"]) / count, 5) if count else None
    tpot = means["server_tpot_mean_s"]
    means["server_decode_tok_s_per_sequence"] = round(1 / tpot, 1) if tpot else None
    return means


def pct(values: list[float], q: float) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    return round(values[min(len(values) - 1, int(q * len(values)))], 5)


def run_level(client, model, args, concurrency: int, prompts: list[list[int]], url: str,
              warmup: bool = False) -> list[dict]:
    """One level: its REQUEST records and its LEVEL record (warmup: only a WARMUP record, its requests uncounted)."""
    total = args.requests or 2 * concurrency
    deadline = time.monotonic() + args.level_timeout
    lock, issued, records, errors = threading.Lock(), [0], [], []

    def worker():
        while True:
            with lock:
                if issued[0] >= total or time.monotonic() > deadline:
                    return
                i = issued[0]
                issued[0] += 1
            try:
                rec = one_request(client, model, prompts[i % len(prompts)], args.max_tokens, seed=i)
            except Exception as e:  # noqa: BLE001 - a failed request is a result too
                with lock:
                    errors.append(repr(e)[:200])
                continue
            with lock:  # one record per line: the threads' prints do not interleave
                if not warmup:
                    emit("REQUEST", concurrency=concurrency, index=i, **rec)
                records.append({"index": i, **rec})

    before = server_times(url)
    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    server = server_means(before, server_times(url))
    tokens = sum(r["completion_tokens"] for r in records)
    if warmup:
        emit("WARMUP", concurrency=concurrency, requests=len(records), errors=len(errors), wall_s=round(wall, 3))
        return records
    emit("LEVEL", concurrency=concurrency, requests=len(records), errors=len(errors), first_error=errors[:1],
         wall_s=round(wall, 3), completion_tokens=tokens, aggregate_tok_s=round(tokens / wall, 2),
         per_request_tok_s=round(statistics.median(r["completion_tokens"] / r["e2e_s"] for r in records), 2)
         if records else None,
         ttft_p50_s=pct([r["ttft_s"] for r in records], 0.5), ttft_p90_s=pct([r["ttft_s"] for r in records], 0.9),
         tpot_p50_s=pct([r["tpot_s"] for r in records], 0.5), tpot_p90_s=pct([r["tpot_s"] for r in records], 0.9),
         prompt_tokens=args.prompt_tokens, prompt_tokens_min=args.prompt_tokens_min, max_tokens=args.max_tokens,
         timed_out=time.monotonic() > deadline, **server)
    return records


def identity(levels: dict[int, list[dict]]) -> bool:
    """Request i sends the same prompt and seed at every level: its token ids must not depend on the company it
    had."""
    texts: dict[int, set[str]] = {}
    for records in levels.values():
        for r in records:
            texts.setdefault(r["index"], set()).add(r["ids_sha"])
    compared = [i for i in texts if sum(any(r["index"] == i for r in rs) for rs in levels.values()) > 1]
    differ = sorted(i for i in compared if len(texts[i]) > 1)
    emit("IDENTITY", requests_compared=len(compared), differing=differ)
    return not differ


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="an already running server's base URL (http://host:port/v1); else one is started")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--model", help="checkpoint directory or Hugging Face repo id (instead of --preset)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--concurrency", default="1,4,16,32", help="comma-separated levels")
    ap.add_argument("--requests", type=int, default=0, help="requests per level (default 2 x concurrency)")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens-min", type=int, default=None,
                    help="prompts of lengths drawn uniformly from [this, --prompt-tokens] (default: all of "
                         "--prompt-tokens): traffic whose prompt lengths vary")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--level-timeout", type=float, default=300.0, help="seconds a level may issue requests")
    ap.add_argument("--no-precapture", action="store_true",
                    help="start the server with --no-precapture (each bucket's graph captured at its first use)")
    ap.add_argument("--gemv", choices=["v2", "v3"], help="start the server with --gemv (its decode GEMVs' kernels)")
    ap.add_argument("--prefill-chunk", type=int, help="start the server with --prefill-chunk (its prefill chunks' tokens)")
    ap.add_argument("--prefix-cache", type=int, default=None,
                    help="start the server with --prefix-cache (states kept; 0: off; default: the server's)")
    ap.add_argument("--speculate", choices=["ngram", "mtp"], default=None,
                    help="start the server with --speculate (on CUDA it needs DSV4_SPECULATIVE=1 in the environment)")
    ap.add_argument("--draft-tokens", type=int, default=4, help="with --speculate: the server's --draft-tokens")
    ap.add_argument("--shared-prefix", type=int, default=0,
                    help="every prompt begins with the same this many tokens (a system prompt)")
    ap.add_argument("--warmup", type=int, default=0,
                    help="untimed passes of every level first (the kernels' first compiles for the prefill shapes a "
                         "level makes stay out of its figures: the steady state of a server that has run a while)")
    args = ap.parse_args()
    args.levels = [int(c) for c in args.concurrency.split(",")]
    if args.prompt_tokens_min is not None and not 1 <= args.prompt_tokens_min <= args.prompt_tokens:
        raise SystemExit(f"--prompt-tokens-min {args.prompt_tokens_min}: between 1 and --prompt-tokens "
                         f"({args.prompt_tokens})")
    proc = None
    if args.url:
        url = args.url
        emit("BUILD", url=url)
    else:
        proc, url = start_server(args)
    try:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=args.level_timeout + 60)
        model = client.models.list().data[0].id
        vocab_hi = 256  # random ids among the first tokens: every vocabulary has them
        rng = random.Random(0)
        lo = args.prompt_tokens_min

        def length() -> int:  # one length for all unless varied (the same prompts as before when not)
            return args.prompt_tokens if lo is None else rng.randint(lo, args.prompt_tokens)

        prompts = [[rng.randrange(2, vocab_hi) for _ in range(length())] for _ in range(64)]
        if args.shared_prefix:  # one system prompt: every prompt's first tokens the same
            shared = prompts[-1][:args.shared_prefix]
            prompts = [shared + p[len(shared):] for p in prompts]
        # warm-up: first-call costs stay out of the levels; FIRST shows them (kernels the server's own warm-up,
        # before it listened, did not compile for this prompt length)
        emit("FIRST", prompt_tokens=args.prompt_tokens, **one_request(client, model, prompts[0], 4, seed=0))
        for _ in range(args.warmup):
            for c in args.levels:
                run_level(client, model, args, c, prompts, url, warmup=True)
        levels = {c: run_level(client, model, args, c, prompts, url) for c in args.levels}
        if not identity(levels):
            raise SystemExit(1)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
