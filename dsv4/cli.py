"""`dsv4 generate | chat | serve | bench | synth | gate`: the command line."""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import math
import os
import re
import sys
import time
import warnings
from pathlib import Path

from .prefix import SERVE_STATES


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each option's default, unless there is none to show or its text already says it."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or action.default is argparse.SUPPRESS \
                or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _add_model_args(p: argparse.ArgumentParser, stand_in: bool = True, serving: bool = False):
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="checkpoint directory (official format) or Hugging Face repo id "
                                     "(owner/name[@revision]; HF_HUB_OFFLINE=1: from the cache only); "
                                     "never a preset")
    src.add_argument("--preset", help="tiny | mini | flash (random weights, no download); never a directory")
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cuda when available)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                   help="compute dtype (default: bfloat16 on cuda, float32 on cpu)")
    p.add_argument("--ranks", type=int, default=1, help="TP/EP ranks (spawned on this host)")
    p.add_argument("--weight-seed", type=int, default=0, help="seed of a preset's random weights")
    p.add_argument("--gemv", choices=["v2", "v3", "mma"], default=None,
                   help="decode GEMV kernels on CUDA: v2 (fastest for one sequence), v3 (tensor-core tiles of 16 "
                        "rows: batched steps much faster, a lone sequence slower) or mma (the FP8 weights as "
                        "m16n8k16 products, up to 8 rows their columns). Default: "
                        + ("mma (a server's steps are batched; its bf16 GEMVs v3's), unless DSV4_QGEMV / "
                           "DSV4_DENSE_GEMV name the kernels"
                           if serving else "v2, or what DSV4_QGEMV / DSV4_DENSE_GEMV name")
                        + ". Tokens are the same alone or batched under each, but the families differ from each other")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch's intra-op work (default: OMP_NUM_THREADS when set, else the "
                        "cores this process may use that the load average leaves idle, at most 8 and at most "
                        "torch's own default, at least 1)")
    if stand_in:
        p.add_argument("--stand-in-tokenizer", action="store_true",
                       help="a checkpoint without tokenizer.json: use a byte-level stand-in with a random "
                            "vocabulary (without this flag its absence is an error)")


def _add_sampling_args(p: argparse.ArgumentParser, temperature: float, top_p: float, seed_help: str):
    p.add_argument("--temperature", type=float, default=temperature, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=top_p, help="nucleus: keep the smallest set of mass >= top-p")
    p.add_argument("--top-k", type=int, default=0, help="keep the k likeliest tokens (0 = all)")
    p.add_argument("--seed", type=int, default=0, help=seed_help)


@contextlib.contextmanager
def _model(args):
    """The loaded model, closed (its ranks stopped) however the command ends."""
    model = _load(args)
    try:
        yield model
    finally:
        close = getattr(model, "close", None)
        if close:
            close()


def _load(args):
    import torch

    from .api import load

    source = _source(args)
    dtype = getattr(torch, args.dtype) if args.dtype else None
    _select_gemv(args)
    with warnings.catch_warnings():
        # --preset tiny beside a ./tiny directory: the flag already said which one is meant
        warnings.filterwarnings("ignore", message=".* is the preset; the directory")
        return load(source, device=_device(args.device), dtype=dtype, ranks=args.ranks, seed=args.weight_seed,
                    tokenizer="stand-in" if getattr(args, "stand_in_tokenizer", False) else None,
                    mtp=getattr(args, "speculate", None) == "mtp")  # the MTP layer only where it drafts


def _select_gemv(args):
    if getattr(args, "gemv", None) is not None:
        from .kernels import select_gemv

        select_gemv(args.gemv)  # before the load: spawned ranks read it at import


def _source(args):
    """What --preset or --model names, each only what its flag says: --preset a preset (a ./tiny
    directory never shadows it), --model a directory or a Hugging Face repo id (never a preset)."""
    from .config import PRESETS
    from .hub import REPO_ID

    if args.preset is not None:
        if args.preset not in PRESETS:
            raise ValueError(f"--preset {args.preset!r}: allowed {sorted(PRESETS)}")
        return args.preset
    if Path(args.model).is_dir():
        return Path(args.model)
    if REPO_ID.match(args.model):
        return args.model
    hint = f" (the preset: --preset {args.model})" if args.model in PRESETS else ""
    raise FileNotFoundError(f"--model {args.model!r}: no such directory, and not a Hugging Face repo id "
                            f"(owner/name){hint}")


def _device(name: str | None):
    """--device checked before any load: an unknown name, or CUDA where there is none, is one line."""
    import torch

    if name is None:
        return None
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device {name!r}: not a device (cpu, cuda, cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: no CUDA device here (torch {torch.__version__}"
                         f"{', a CPU-only build' if torch.version.cuda is None else ''})")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {name!r}: allowed cpu, cuda, cuda:N")
    return device


def cmd_generate(args) -> int:
    import torch

    from .generation import text_deltas
    from .sampler import SamplingParams

    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                              seed=args.seed)
    if args.prompts_file is not None:
        return _generate_file(args, sampling)
    given = [f for f, v in (("--out", args.out), ("--max-num-seqs", args.max_num_seqs),
                            ("--prefill-chunk", args.prefill_chunk), ("--prefix-cache", args.prefix_cache)) if v]
    if given:
        raise ValueError(f"{given[0]} goes with --prompts-file")
    if args.speculate != "none" and not 0 <= args.draft_tokens:
        raise SystemExit(f"dsv4 generate: --draft-tokens {args.draft_tokens}: an integer >= 0")
    with _model(args) as model:
        start = time.perf_counter()
        n = 0
        _show(args.prompt)
        ids = model.tokenizer.encode(args.prompt)
        tokens, tally = None, None
        if args.speculate != "none":
            from . import speculative

            tally = speculative.Tally()
            # on CUDA each full verify step replays its graph (freed with the generation's state), as the plain
            # generation replays its step's
            tokens = speculative.sample_tokens(model, ids, args.max_tokens, sampling,
                                               speculative.DRAFTERS[args.speculate](), args.draft_tokens,
                                               stops=[model.cfg.eos_token_id], tally=tally,
                                               graph=model.device.type == "cuda")
        for piece, n in text_deltas(model, ids, args.max_tokens, sampling, progress=True, tokens=tokens):
            _show(piece)
        wall = time.perf_counter() - start
        sys.stdout.write("\n")
        threads = f", {torch.get_num_threads()} CPU threads" if model.device.type == "cpu" else ""
        print(f"[dsv4] {n} tokens in {wall:.2f} s ({n / wall:.1f} tok/s incl. prefill) "
              f"on {model.device} x{model.world}, dtype {str(model.dtype).removeprefix('torch.')}{threads}",
              file=sys.stderr)
        if tally is not None:
            print(f"[dsv4] speculative ({args.speculate}, up to {args.draft_tokens} drafts): {tally.steps} verify "
                  f"steps, {tally.accepted} of {tally.proposed} drafts accepted, {tally.tokens_per_step:.2f} tokens "
                  "a step", file=sys.stderr)
    return 0


_LINE_FIELDS = {"prompt", "max_tokens", "temperature", "top_p", "top_k", "seed"}


def _read_prompts(path: str, max_tokens: int, sampling) -> tuple[list, list, list]:
    """A JSON-lines file of prompts: each line a text, or an object with "prompt" (a text or token ids) and any of
    max_tokens, temperature, top_p, top_k, seed (the command's flags otherwise); blank lines skipped."""
    from dataclasses import replace

    prompts, budgets, samplings = [], [], []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path} line {n}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not JSON ({e.msg})") from None
            if isinstance(row, str):
                row = {"prompt": row}
            if not isinstance(row, dict) or "prompt" not in row:
                raise ValueError(f"{where}: a JSON text, or an object with a \"prompt\"")
            unknown = sorted(set(row) - _LINE_FIELDS)
            if unknown:
                raise ValueError(f"{where}: unknown field {unknown[0]!r} (allowed: {', '.join(sorted(_LINE_FIELDS))})")
            try:
                samplings.append(replace(sampling, **{k: row[k] for k in ("temperature", "top_p", "top_k", "seed")
                                                      if k in row}))
            except (TypeError, ValueError) as e:
                raise ValueError(f"{where}: {e}") from None
            prompts.append(row["prompt"])
            budgets.append(row.get("max_tokens", max_tokens))
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts, budgets, samplings


def _generate_file(args, sampling) -> int:
    """`dsv4 generate --prompts-file`: every prompt batched as a server batches requests (dsv4.generate_many); one
    JSON line a prompt, in the file's order, written whole or not at all."""
    from .serve.offline import GenerationError, generate_many

    if args.speculate != "none":
        raise ValueError("--speculate decodes one sequence; --prompts-file batches many (use one or the other)")
    prompts, budgets, samplings = _read_prompts(args.prompts_file, args.max_tokens, sampling)
    with _model(args) as model:
        start = time.perf_counter()
        try:
            done = generate_many(model, prompts, budgets, samplings, max_num_seqs=args.max_num_seqs or 16,
                                 prefill_chunk=args.prefill_chunk, prefix_cache=args.prefix_cache, progress=True)
            failed = {}
        except GenerationError as e:
            done, failed = e.completions, e.failed
        wall = time.perf_counter() - start
        lines = []
        for i, c in enumerate(done):
            row = {"index": i, "error": str(failed[i])} if c is None else {
                "index": i, "text": c.text, "token_ids": c.token_ids, "finish_reason": c.finish_reason,
                "prompt_tokens": len(c.prompt_token_ids), "cached_tokens": c.cached_tokens}
            lines.append(json.dumps(row, ensure_ascii=False) + "\n")
        if args.out is None:
            sys.stdout.writelines(lines)
        else:
            tmp = f"{args.out}.tmp-{os.getpid()}"
            try:
                with open(tmp, "w", encoding="utf-8") as f:
                    f.writelines(lines)
                os.replace(tmp, args.out)
            finally:
                if os.path.exists(tmp):
                    os.remove(tmp)
        n = sum(len(c.token_ids) for c in done if c is not None)
        print(f"[dsv4] {len(done)} prompts, {n} tokens in {wall:.2f} s ({n / wall:.1f} tok/s incl. prefill) on "
              f"{model.device} x{model.world}" + (f"; {len(failed)} failed" if failed else ""), file=sys.stderr)
    return 1 if failed else 0


def _add_speculate_args(p: argparse.ArgumentParser):
    p.add_argument("--speculate", choices=["none", *speculative_drafters()], default="none",
                   help="speculative decoding with this drafter (ngram: prompt lookup; mtp: the checkpoint's MTP "
                        "layer, loaded for it); the tokens are the plain loop's, bit for bit (dsv4.speculative)")
    p.add_argument("--draft-tokens", type=int, default=4, help="drafts per verify step, with --speculate")


def speculative_drafters() -> list[str]:
    from .speculative import DRAFTERS

    return list(DRAFTERS)


# C0/C1 controls but newline and tab, line/paragraph separators, bidi embeddings and isolates: on a
# terminal they ring, move the cursor or reorder what follows (a random model samples them freely).
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def terminal_text(text: str) -> str:
    """`text` with its unprintable characters escaped as Python spells them (\\x07, \\u202e)."""
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _show(text: str) -> None:
    """Write generated text to stdout: escaped on a terminal, raw into a pipe or file."""
    sys.stdout.write(terminal_text(text) if sys.stdout.isatty() else text)
    sys.stdout.flush()


def cmd_synth(args) -> int:
    from .checkpoint.synth import synth
    from .config import ModelConfig, preset

    if bool(args.preset) == bool(args.config):
        print("dsv4 synth: give exactly one of --preset NAME or --config FILE", file=sys.stderr)
        return 2
    cfg = preset(args.preset) if args.preset else ModelConfig.from_json(args.config)
    try:
        out = synth(cfg, args.out, seed=args.seed, quant=args.quant, overwrite=args.overwrite, mtp=args.mtp)
    except FileExistsError:
        print(f"dsv4 synth: {args.out} already exists and is not empty (--overwrite replaces it)", file=sys.stderr)
        return 2
    print(f"[dsv4] wrote {out}")
    return 0


def cmd_chat(args) -> int:
    """A terminal chat: each line you type is a user turn; the reply streams back. EOF ends it."""
    from .sampler import SamplingParams
    from .serve import chat
    from .serve.protocol import Request, generate

    messages = [{"role": "system", "content": args.system}] if args.system else []
    switches = {"thinking": True} if args.thinking else None
    if args.prefix_cache and args.speculate != "none":
        raise ValueError("--prefix-cache and --speculate: one or the other (a verify loop prefills on its own)")
    if args.prefill_chunk is not None and not args.prefix_cache:
        raise ValueError("--prefill-chunk goes with --prefix-cache")
    with _model(args) as model:
        cache = None
        if args.prefix_cache:  # each turn resends the conversation: from the last turn's prompt on, prefilled once
            from .generation import sample_tokens
            from .prefix import PrefixCache

            cache = PrefixCache(model, args.prefix_cache, args.max_model_len,
                                args.prefill_chunk or model.prefill_chunk(args.max_model_len))
        for turn in itertools.count():
            if sys.stdin.isatty():
                sys.stderr.write("> ")
                sys.stderr.flush()
            line = sys.stdin.readline()
            while line and not line.strip():
                line = sys.stdin.readline()
            if not line:
                return 0
            messages.append({"role": "user", "content": line.rstrip("\n")})
            # The checkpoint's chat template when it ships one, else DeepSeek-V4's encoding (as the server).
            ids, fmt = chat.prompt(model.tokenizer, messages, template_kwargs=switches)
            room = args.max_model_len - len(ids)
            if room < 1:
                print(f"dsv4 chat: the conversation is {len(ids)} tokens, at --max-model-len {args.max_model_len}",
                      file=sys.stderr)
                return 2
            # Each turn draws from its own stream: seed + turn, so a replayed session repeats.
            sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                      seed=args.seed + turn)
            reply = chat.ChatReply(fmt)
            request = Request(ids, min(args.max_tokens, room), sampling, skip_special=not fmt.markup)
            tokens = None
            if args.speculate != "none":  # the same tokens, in fewer forwards where the drafts are right
                from . import speculative

                tokens = speculative.sample_tokens(model, ids, request.max_tokens, sampling,
                                                   speculative.DRAFTERS[args.speculate](), args.draft_tokens,
                                                   stops=[model.cfg.eos_token_id], graph=model.device.type == "cuda")
            elif cache is not None:
                tokens = sample_tokens(model, ids, request.max_tokens, sampling, prefix=cache)
            for text, finish, _ in generate(model, request, progress=True, tokens=tokens):
                for delta in (reply.push(text), reply.end() if finish else None):
                    if delta and delta.get("reasoning_content"):
                        thought = delta["reasoning_content"]  # the thinking, to stderr
                        sys.stderr.write(terminal_text(thought) if sys.stderr.isatty() else thought)
                        sys.stderr.flush()
                    if delta and delta.get("content"):
                        _show(delta["content"])
            sys.stdout.write("\n")
            messages.append(reply.message())
            if cache is not None:
                print(f"[dsv4] prefix cache: {cache.hits} of {cache.queries} prompt tokens reused so far",
                      file=sys.stderr)
    return 0


def cmd_serve(args) -> int:
    import os

    from . import kernels
    from .serve import Server

    _port_free(args.host, args.port)  # before a load that may take minutes
    args.gemv = serve_gemv(args.gemv)
    if args.verbose:
        import logging

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with _model(args) as model:
        server = Server(model, args.host, args.port, args.served_model_name, args.max_model_len, args.verbose,
                        max_num_seqs=args.max_num_seqs, max_waiting=args.max_waiting, prefill_chunk=args.prefill_chunk,
                        api_key=args.api_key or os.environ.get("DSV4_API_KEY"), precapture=args.precapture,
                        speculate=None if args.speculate == "none" else args.speculate, draft_tokens=args.draft_tokens,
                        prefix_cache=args.prefix_cache)
        from .state import state_bytes

        cache = server.scheduler.prefix
        mib = state_bytes(model.cfg, server.max_model_len, model.dtype) / 2**20
        print(f"[dsv4] serving {args.served_model_name!r} at {server.url} (max_model_len {server.max_model_len}, "
              f"max_num_seqs {args.max_num_seqs}, {model.device} x{model.world}, gemv {kernels.gemv()}"
              + (f", prefix cache {cache.size} states at chunks of {cache.chunk}" if cache else "")
              + f"; a state {mib:,.1f} MiB a rank)", file=sys.stderr, flush=True)
        if server.prefix_note:
            print(f"[dsv4] {server.prefix_note}", file=sys.stderr, flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
    return 0


def cmd_run_batch(args) -> int:
    """OpenAI batch file in, one answer a line out (dsv4.serve.batch): the input checked whole before the load."""
    from .serve import Server
    from .serve.batch import check_output, read_requests, run_batch, write_output

    requests = read_requests(args.input_file)
    out = check_output(args.output_file, args.input_file)
    args.gemv = serve_gemv(args.gemv)
    with _model(args) as model:
        server = Server(model, port=None, model_name=args.served_model_name, max_model_len=args.max_model_len,
                        max_num_seqs=args.max_num_seqs, prefill_chunk=args.prefill_chunk,
                        prefix_cache=args.prefix_cache)
        if server.prefix_note:
            print(f"[dsv4] {server.prefix_note}", file=sys.stderr, flush=True)
        bar = _progress(len(requests), "requests")
        try:
            records = run_batch(server, requests, progress=bar.update if bar else None)
        finally:
            if bar:
                bar.close()
    write_output(out, records)
    codes = collections.Counter(r["response"]["status_code"] for r in records)
    failed = sum(n for code, n in codes.items() if code != 200)
    print(f"[dsv4] {len(records)} requests answered ({len(records) - failed} ok"
          + (f", {failed} refused: status {dict(sorted((c, n) for c, n in codes.items() if c != 200))}" if failed
             else "") + f"), written to {out}", file=sys.stderr)
    return 0


def _progress(total: int, unit: str):
    """A tqdm bar on stderr when it is a terminal, else None."""
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit=unit.rstrip("s"), file=sys.stderr)


def cmd_plan(args) -> int:
    """A rank's memory on each world size (or --ranks), from the config alone (dsv4.plan)."""
    import torch

    from .plan import config_of, plan, table, worlds

    cfg = config_of(_source(args))
    max_model_len = args.max_model_len or min(8192, cfg.max_position_embeddings)
    ranks = args.ranks or worlds(cfg)
    dtype = getattr(torch, args.dtype)
    plans = [plan(cfg, r, max_model_len, args.max_num_seqs, args.prefix_cache, dtype, args.mtp) for r in ranks]
    gpu = int(args.gpu_memory * 2**30) if args.gpu_memory else None
    print(f"[dsv4] {_source(args)}: {args.max_num_seqs} slots + {args.prefix_cache} prefix states of "
          f"{max_model_len:,} tokens (a state {plans[0].state / 2**20:,.1f} MiB a rank), weights in "
          f"{args.dtype}{' with the MTP layer' if args.mtp else ''}")
    for line in table(plans, gpu):
        print(line)
    return 0


def serve_gemv(flag: str | None) -> str | None:
    """The server's decode GEMVs: --gemv when given; else mma (its steps are batched, up to 8 rows a program's
    columns; the weights it refuses and the bf16 GEMVs run v3, whose tiles of 16 rows beat v2 at batched steps: mini,
    session 11, 827 tok/s at concurrency 16 against 610), unless the environment names the kernels (None: theirs).
    Session 28 call 2, the server on mini in one call, mma against v3 at concurrency 1 / 4 / 16 / 32: 615 / 1,456 /
    2,543 / 3,013 tok/s against 591 / 1,229 / 2,567 / 2,564 (benchmarks/RESULTS.md)."""
    import os

    if flag is not None or {"DSV4_QGEMV", "DSV4_DENSE_GEMV"} & os.environ.keys():
        return flag
    return "mma"


def _port_free(host: str, port: int) -> None:
    import socket

    try:
        socket.create_server((host, port)).close()
    except OSError as e:
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def cmd_bench(args) -> int:
    from .bench import run_bench

    if min(args.prime, args.steps, args.rows) < 1:
        print("dsv4 bench: --prime, --steps and --rows must be at least 1", file=sys.stderr)
        return 2
    try:
        prefill = tuple(int(n) for n in args.prefill.split(",")) if args.prefill else ()
    except ValueError:
        prefill = (0,)
    if any(n < 2 for n in prefill):
        print(f"dsv4 bench: --prefill {args.prefill}: prompt lengths, integers >= 2 separated by commas",
              file=sys.stderr)
        return 2
    start = time.perf_counter()
    with _model(args) as model:
        return run_bench(model, args.prime, args.steps, args.rows, time.perf_counter() - start, args.preset,
                         args.profile, None if args.speculate == "none" else args.speculate, args.draft_tokens,
                         prefill)


def cmd_perplexity(args) -> int:
    import torch

    from .perplexity import perplexity

    if (args.text is None) == (args.text_file is None):
        print("dsv4 perplexity: one of --text or --text-file", file=sys.stderr)
        return 2
    try:
        text = args.text if args.text is not None else Path(args.text_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--text-file {args.text_file}: {getattr(e, 'strerror', None) or e}") from None
    with _model(args) as model:
        if model.device.type == "cuda" and os.environ.get("DSV4_UNCHECKED_SAMPLING") != "1":
            raise ValueError("on CUDA the scored prefill (Model.prefill_scored) is not yet GPU-checked "
                             "(benchmarks/score_check.py); DSV4_UNCHECKED_SAMPLING=1 runs it unchecked")
        ids = model.tokenizer.encode(text, add_bos=not args.no_bos)
        start = time.perf_counter()
        result = perplexity(model, ids, args.ctx, args.chunk)
        model.synchronize()
        seconds = time.perf_counter() - start
    print(json.dumps({"tokens": result.tokens, "windows": result.windows, "ctx": result.ctx, "nll": result.nll,
                      "ppl": result.ppl, "seconds": round(seconds, 3),
                      "tok_s": round(result.tokens / seconds, 1) if seconds else None, "device": str(model.device),
                      "torch": torch.__version__}))
    return 0


def cmd_gate(args) -> int:
    from .config import PRESETS
    from .gate import run_gate

    _device(args.device)
    if isinstance(_source(args), Path) and args.model in PRESETS:
        args.model = f"./{args.model}"  # the directory, as dsv4.load reads a bare preset name as the preset
    _select_gemv(args)
    return run_gate(args)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="dsv4", description="DeepSeek-V4 inference engine",
                                     formatter_class=_Help)
    parser.add_argument("--version", action="version", version=f"dsv4 {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser = sub.add_parser
    # every subcommand's --help shows its defaults
    sub.add_parser = lambda *a, **k: add_parser(*a, formatter_class=_Help, **k)

    g = sub.add_parser("generate", help="generate text from a prompt")
    _add_model_args(g)
    g.add_argument("--prompt", default="The quick brown fox", help="the text to continue")
    g.add_argument("--max-tokens", type=int, default=32, help="tokens to generate")
    _add_sampling_args(g, temperature=1.0, top_p=1.0, seed_help="sampling seed")
    _add_speculate_args(g)
    g.add_argument("--prompts-file", default=None, metavar="JSONL",
                   help="generate for every prompt of a JSON-lines file (a text a line, or {\"prompt\": text or token "
                        "ids, and any of max_tokens, temperature, top_p, top_k, seed}), batched as a server batches "
                        "requests, each prompt's tokens its own stream alone; one JSON line a prompt out")
    g.add_argument("--out", default=None, help="with --prompts-file: write the JSON lines here (whole, or nothing) "
                                               "instead of stdout")
    g.add_argument("--max-num-seqs", type=int, default=None,
                   help="with --prompts-file: sequences decoding at once (default 16)")
    g.add_argument("--prefill-chunk", type=int, default=None,
                   help="with --prompts-file: prompt tokens per prefill chunk (default: the model's)")
    g.add_argument("--prefix-cache", type=int, default=0, metavar="STATES",
                   help="with --prompts-file: prompt prefixes kept (dsv4 serve --prefix-cache); 0: off")
    g.set_defaults(fn=cmd_generate)

    c = sub.add_parser("chat", help="chat in the terminal (DeepSeek's chat encoding)")
    _add_model_args(c)
    c.add_argument("--system", default="", help="a system message")
    c.add_argument("--thinking", action="store_true",
                   help="DeepSeek-V4's thinking mode: the reasoning streams to stderr, the answer to stdout")
    c.add_argument("--max-tokens", type=int, default=256, help="per reply")
    c.add_argument("--max-model-len", type=int, default=8192, help="the whole conversation, in tokens")
    c.add_argument("--prefix-cache", type=int, default=0, metavar="STATES",
                   help="keep up to STATES prompt states (each at its prompt's last prefill chunk boundary; 2 serve one "
                        "conversation), so each turn prefills only from the last one's (each turn a state of "
                        "--max-model-len tokens; the tokens those of a plain prefill at that capacity and chunk); "
                        "0: off")
    c.add_argument("--prefill-chunk", type=int, default=None,
                   help="with --prefix-cache: prompt tokens per prefill chunk (default: the model's for "
                        "--max-model-len); a smaller chunk reuses more of each turn")
    _add_speculate_args(c)
    _add_sampling_args(c, temperature=0.7, top_p=0.95, seed_help="sampling seed (turn n uses seed + n)")
    c.set_defaults(fn=cmd_chat)

    sv = sub.add_parser("serve", help="an OpenAI- and Anthropic-compatible HTTP server (/v1/completions, "
                        "/v1/chat/completions, /v1/responses, /v1/messages)")
    _add_model_args(sv, serving=True)
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on")
    sv.add_argument("--port", type=int, default=8000, help="port to listen on")
    sv.add_argument("--served-model-name", default="dsv4", help="the model id clients send and /v1/models lists")
    sv.add_argument("--max-model-len", type=int, default=None,
                    help="prompt + completion tokens per request (default min(8192, max_position_embeddings))")
    sv.add_argument("--max-num-seqs", type=int, default=16,
                    help="sequences decoding at once (each holds a preallocated state of --max-model-len tokens)")
    sv.add_argument("--max-waiting", type=int, default=64,
                    help="requests that may wait for a sequence slot; beyond it: 429 with Retry-After")
    sv.add_argument("--prefill-chunk", type=int, default=None,
                    help="prompt tokens prefilled per scheduler round (the running sequences step between rounds; "
                         "default: the model's prefill chunk for --max-model-len, 4096 on Flash)")
    sv.add_argument("--api-key", default=None,
                    help="require `Authorization: Bearer KEY` on every route but /health (unset: $DSV4_API_KEY)")
    sv.add_argument("--precapture", action=argparse.BooleanOptionalAction, default=True,
                    help="CUDA: capture every batch bucket's graph before listening, so no request pays a "
                         "capture (default; --no-precapture: capture each bucket at its first use)")
    sv.add_argument("--verbose", action="store_true", help="log each request")
    sv.add_argument("--speculate", choices=["none", *speculative_drafters()], default="none",
                    help="speculative decoding of a sequence decoding alone (ngram: prompt lookup; mtp: the "
                         "checkpoint's MTP layer, loaded for it); every request's tokens stay the plain step's")
    sv.add_argument("--draft-tokens", type=int, default=4, help="drafts per verify step, with --speculate")
    sv.add_argument("--prefix-cache", type=int, default=None, metavar="STATES",
                    help="keep the decode states of up to STATES prompt prefixes (each a state of --max-model-len "
                         "tokens, allocated at start: the banner prints their bytes): a prompt that begins with a "
                         "cached prefix (a conversation's earlier turns, a shared system prompt) prefills only the "
                         "rest, and requests arriving together with one prompt (n choices) prefill it once; their "
                         "tokens are those without the cache. Prefixes are cached at multiples of --prefill-chunk, "
                         f"so a smaller chunk reuses more (default {SERVE_STATES} where the chunk is below "
                         "--max-model-len, else off; 0: off)")
    sv.set_defaults(fn=cmd_serve)

    rb = sub.add_parser("run-batch", help="answer a file of OpenAI batch requests (JSON lines: custom_id, method, "
                        "url, body) through the server's routes, in-process; one answer a line out")
    rb.add_argument("-i", "--input-file", required=True,
                    help="OpenAI batch input: one request a line, url /v1/chat/completions, /v1/completions or "
                         "/v1/responses (checked whole before the model loads)")
    rb.add_argument("-o", "--output-file", required=True,
                    help="where the answers go (JSON lines in the input's order; written whole, or not at all)")
    _add_model_args(rb, serving=True)
    rb.add_argument("--served-model-name", default="dsv4", help="the model id the requests' bodies name")
    rb.add_argument("--max-model-len", type=int, default=None,
                    help="prompt + completion tokens per request (default min(8192, max_position_embeddings))")
    rb.add_argument("--max-num-seqs", type=int, default=16, help="sequences decoding at once")
    rb.add_argument("--prefill-chunk", type=int, default=None,
                    help="prompt tokens prefilled per scheduler round (default: the model's prefill chunk)")
    rb.add_argument("--prefix-cache", type=int, default=None, metavar="STATES",
                    help="decode states of prompt prefixes kept (a shared system prompt prefilled once): as dsv4 "
                         f"serve's (default {SERVE_STATES} where the prefill chunk is below --max-model-len, "
                         "else off; 0: off)")
    rb.set_defaults(fn=cmd_run_batch)

    pl = sub.add_parser("plan", help="a rank's memory (weights, the server's states) on 1, 2, 4 and 8 ranks, from "
                        "the config alone: which GPUs run a model, before downloading its weights")
    src = pl.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="checkpoint directory or Hugging Face repo id (only its config.json is read)")
    src.add_argument("--preset", help="tiny | mini | flash")
    pl.add_argument("--ranks", type=int, action="append", default=None,
                    help="a world size to plan (repeat it for several; default: those of 1, 2, 4, 8 that split the "
                         "model)")
    pl.add_argument("--max-model-len", type=int, default=None,
                    help="tokens a state holds (default min(8192, max_position_embeddings), as dsv4 serve's)")
    pl.add_argument("--max-num-seqs", type=int, default=16, help="the server's slots (dsv4 serve's default)")
    pl.add_argument("--prefix-cache", type=int, default=SERVE_STATES, help="the server's prefix states")
    pl.add_argument("--gpu-memory", type=float, default=None, metavar="GIB",
                    help="a GPU's memory in GiB (nvidia-smi's total: H100 80GB 79.6, H200 140.4): what is left "
                         "and whether it fits")
    pl.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"], help="the compute dtype")
    pl.add_argument("--mtp", action="store_true", help="with the MTP layer (--speculate mtp)")
    pl.set_defaults(fn=cmd_plan)

    s = sub.add_parser("synth", help="write a random-weight checkpoint in the official format")
    s.add_argument("--preset", help="tiny | mini | flash: the config to write")
    s.add_argument("--config", help="a config.json")
    s.add_argument("--out", required=True, help="the checkpoint directory to write")
    s.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    s.add_argument("--quant", choices=["none", "fp8"], default="none",
                   help="fp8 = the official layout: FP8 e4m3 dense, FP4 e2m1 experts, ue8m0 scales")
    s.add_argument("--overwrite", action="store_true", help="replace a non-empty --out (atomically)")
    s.add_argument("--mtp", action="store_true", help="also the MTP layer (mtp.0.*), as the official release has it")
    s.set_defaults(fn=cmd_synth)

    b = sub.add_parser("bench", help="decode tok/s, eager against full-token graph replay (JSON records)")
    _add_model_args(b)
    b.add_argument("--prime", type=int, default=128, help="prompt tokens before the timed rows")
    b.add_argument("--steps", type=int, default=32, help="sampled steps per row")
    b.add_argument("--rows", type=int, default=4, help="rows per arm (ABBA order)")
    b.add_argument("--prefill", default=None, metavar="N[,M...]",
                   help="also: the prefill of prompts of these lengths, --rows timed runs each (BENCH_PREFILL: median "
                        "wall, tok/s)")
    b.add_argument("--profile", action="store_true",
                   help="also: GPU time and kernels per phase per token, bytes read per token per rank, "
                        "the copy bandwidth measured now and the roofline fraction (BENCH_PROFILE)")
    _add_speculate_args(b)
    b.set_defaults(fn=cmd_bench)

    pp = sub.add_parser("perplexity", help="a text's perplexity: its tokens scored by the prefill (one JSON line)")
    _add_model_args(pp)
    text = pp.add_mutually_exclusive_group()
    text.add_argument("--text", help="the text")
    text.add_argument("--text-file", help="a UTF-8 text file")
    pp.add_argument("--ctx", type=int, default=512, help="window: tokens per state (each window's first unscored)")
    pp.add_argument("--chunk", type=int, default=None, help="prefill chunk (default: the model's for --ctx)")
    pp.add_argument("--no-bos", action="store_true", help="the text's tokens without BOS first")
    pp.set_defaults(fn=cmd_perplexity)

    gt = sub.add_parser("gate", help="the full-token replay falsification gate (JSON receipts)")
    _add_model_args(gt, stand_in=False)
    gt.add_argument("--prime", type=int, default=256, help="prompt tokens primed before the checks")
    gt.add_argument("--output", type=int, default=256, help="sampled tokens per correctness stream and ABBA row")
    gt.add_argument("--seed", type=int, default=20260907, help="sampling seed")
    gt.add_argument("--reverse", action="store_true", help="ABBA rows start with the graph arm")
    gt.add_argument("--batch", type=int, default=0, metavar="B",
                    help="also: B sequences decoded in one batched step against each alone, every byte "
                         "compared (BATCH_IDENTITY), and a refusal inside a batched step (BATCH_REFUSAL)")
    gt.add_argument("--speculative", type=int, default=0, metavar="K",
                    help="also: verify steps of K drafts (a third of them wrong) against the plain steps, every byte "
                         "compared (SPECULATIVE_IDENTITY), and a refusal inside a verify step (SPECULATIVE_REFUSAL)")
    gt.add_argument("--prefix-cache", action="store_true",
                    help="also: prompts prefilled through the prefix cache (dsv4.prefix) against plain prefills at its "
                         "chunk, every byte compared on every rank, steps from both (PREFIX_IDENTITY), and a refusal "
                         "inside a cached prefill that leaves the cache as it was (PREFIX_REFUSAL)")
    gt.add_argument("--profile", action="store_true", help="also an unscored 32-step window under NVTX ranges")
    gt.add_argument("--out", help="also write the records to this file")
    gt.set_defaults(fn=cmd_gate)

    args = parser.parse_args(argv)
    try:
        if hasattr(args, "threads"):
            _set_threads(args.threads)
        return args.fn(args)
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        print(f"dsv4 {args.command}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C ends a command quietly
        print(file=sys.stderr)
        return 130


def _set_threads(requested: int | None) -> None:
    """torch's intra-op threads here, and OMP_NUM_THREADS for the ranks this process spawns. OpenMP
    threads spin at every barrier: more of them than idle cores (a CPU quota, a busy machine) makes
    a CPU decode many times slower than one thread would."""
    import torch

    if requested is not None and requested < 1:
        raise ValueError(f"--threads {requested}: at least 1")
    if requested is None and os.environ.get("OMP_NUM_THREADS"):
        return  # the user's choice, which torch already read
    n = requested or cpu_threads(torch.get_num_threads(), _usable_cores(), os.cpu_count() or 1, os.getloadavg()[0])
    torch.set_num_threads(n)
    os.environ["OMP_NUM_THREADS"] = str(n)


def cpu_threads(torch_default: int, cores: int, cpus: int, load: float) -> int:
    """The default thread count: of the `cores` this process may use, those its share of the machine's
    load average (`load` over all `cpus`) leaves idle; at most 8 and torch's own default; at least 1."""
    busy = round(load * cores / cpus)
    return max(1, min(torch_default, 8, cores - busy))


def _usable_cores() -> int:
    """The CPUs this process may run on (its affinity), fewer under a cgroup CPU quota."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = _cpu_quota()
    return cores if quota is None else max(1, min(cores, math.ceil(quota)))


def _cpu_quota() -> float | None:
    """CPUs' worth of time this cgroup may use (v2 cpu.max, else v1 cfs), None without a quota."""
    v1 = Path("/sys/fs/cgroup/cpu")
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
    except (OSError, ValueError):
        try:
            quota, period = (v1 / "cpu.cfs_quota_us").read_text(), (v1 / "cpu.cfs_period_us").read_text()
        except OSError:
            return None
    try:
        return None if quota.strip() in ("max", "-1") else int(quota) / int(period)
    except ValueError:
        return None


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dsv4")
    except PackageNotFoundError:
        return "unknown (not installed)"


if __name__ == "__main__":
    sys.exit(main())
