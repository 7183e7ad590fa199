"""`dsv4 gate`: the full-token replay falsification gate (the seed's protocol, in Python).

One process group, one model load. It tries to prove the fast path wrong:

1. prime PRIME tokens of a fixed text (first by prefill, the rest one step at a time), draw the
   first output token, print REPLAY_PROTOCOL;
2. correctness: OUTPUT sampled steps on an eager control and a graph candidate restored from the
   same prefix; at every step on every rank the same token, position, logits sha256, cache and
   hidden digests; 2 x layers reductions per step per rank; replay counts; one capture.
   REPLAY_EXACT every 4th position, REPLAY_CENSUS at the end;
3. six live refusal cells (ranks 0 and 1 x three position/layer cells: a CSA window close, an HCA
   window close, a sliding-window wrap with the default sizes), each armed after a live capture and
   replay of the inputs before it: nothing commits, the state is quarantined (REPLAY_REFUSAL);
4. 20 ABBA rows (eager A, graph B) timing OUTPUT tokens end to end from the prefix, each checked
   against the correctness stream (MEASURE), then REPLAY_SUMMARY;
5. --profile: an unscored 32-step window under NVTX ranges, crossing an HCA boundary.

Exit 0 only when every check held; the first failing check prints GATE_FAIL with the position,
the field and both values. Where the seed's protocol has no meaning here, the protocol record
says so (`differences`).
"""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch

PROMPT_TEXT = (
    "In the beginning the engine was slow and nobody trusted its fast path. So the builders wrote a "
    "gate: a program that tries, as hard as it can, to prove the fast path wrong. It replays every "
    "token of a long sampled stream twice, once plainly and once from a captured graph, and compares "
    "every byte of the state after each step. It refuses collectives on purpose and checks that "
    "nothing was committed. Only when all of that holds does it time the two paths against each "
    "other, in blocks, forwards and backwards, so that drift cannot favour either arm. "
)
REFUSAL_CODE = 40043


class GateFailure(Exception):
    def __init__(self, check: str, **detail):
        super().__init__(check)
        self.check, self.detail = check, detail


class Receipts:
    def __init__(self, out: str | None):
        self.file = open(out, "w") if out else None

    def emit(self, tag: str, record: dict):
        line = f"{tag} {json.dumps(record, separators=(',', ':'))}"
        print(line, flush=True)
        if self.file:
            self.file.write(line + "\n")
            self.file.flush()

    def note(self, text: str):
        print(text, flush=True)
        if self.file:
            self.file.write(text + "\n")


def expect(ok: bool, check: str, **detail):
    if not ok:
        raise GateFailure(check, **detail)


def same(a, b, check: str, **where):
    expect(a == b, check, **where, expected=_plain(a), actual=_plain(b))


def _plain(v):
    if isinstance(v, torch.Tensor):
        return v.tolist()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def sha256_tokens(tokens: list[int]) -> str:
    h = hashlib.sha256()
    for t in tokens:
        h.update(int(t).to_bytes(4, "little"))
    return h.hexdigest()


def looped(tokens: list[int], max_period: int = 16) -> bool:
    """The stream's tail (its last half, at most 64 tokens) repeats with a period of at most 16."""
    k = min(64, len(tokens) // 2)
    if k < 2 * max_period:
        return False
    tail = tokens[-k:]
    return any(all(tail[i] == tail[i - p] for i in range(p, k)) for p in range(1, max_period + 1))


def commit_id() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True,
                                       cwd=Path(__file__).resolve().parent, stderr=subprocess.DEVNULL).strip()
    except Exception:  # noqa: BLE001 - an installed copy has no git
        return "unknown"


class Gate:
    def __init__(self, model, args, receipts: Receipts):
        import dsv4

        self.model, self.args, self.r = model, args, receipts
        self.cfg = model.cfg
        self.L = self.cfg.num_hidden_layers
        self.prime, self.output = args.prime, args.output
        self.capacity = self.prime + self.output + 8
        self.sampling = dsv4.SamplingParams(temperature=1.0, top_p=1.0, top_k=0, seed=args.seed)
        self.graph_arm = model.device.type == "cuda"
        self.eos = self.cfg.eos_token_id
        self.world = model.world

    # ---- per-rank views --------------------------------------------------
    def identity(self, state) -> list:
        """Per rank: (logits sha256, cache digest, hidden digest, pos)."""
        shas = self.model.each("logits_sha", state)
        digests = self.model.each("digests", state)
        return [(s, d[0], d[1], d[2]) for s, d in zip(shas, digests, strict=True)]

    def census(self):
        return [torch.as_tensor(c).clone() for c in self.model.each("census")]

    def check_census(self, before, steps: int, **where):
        for rank, (b, a) in enumerate(zip(before, self.census(), strict=True)):
            delta = a - b
            expect(bool((delta == steps).all()), "collective census", rank=rank, steps=steps, **where,
                   expected=f"{steps} per (layer, site), {2 * self.L * steps} in all",
                   actual=delta.tolist())

    def counts(self, state) -> list[list[int]]:
        return self.model.each("replay_counts", state)

    def captures(self, state) -> list[int]:
        return self.model.each("captures", state)

    def capture_once(self, state, **where):
        if not self.graph_arm:
            return
        same([1] * self.world, self.captures(state), "captured exactly once", **where)
        for r, census in enumerate(self.model.each("graph_census", state)):
            same(2 * self.L, census.get("collectives"), "captured collectives", graph_rank=r, **where)
            same(2 * self.L, census.get("hc_posts"), "captured mHC posts", graph_rank=r, **where)
            same(1, census.get("embedding"), "captured embedding", graph_rank=r, **where)
            same(0, census.get("unsupported"), "unsupported graph nodes", graph_rank=r, **where)

    def words(self) -> list[int]:
        return self.model.refusal_words()

    def new_state(self, prefix=None, graph=False):
        state = self.model.new_state(self.capacity)
        if prefix is not None:
            state.restore(prefix)
        if graph and self.graph_arm:
            self.model.enable_replay(state, self.sampling)
        return state

    def sync(self):
        if self.model.device.type == "cuda":
            self.model.each("synchronize")

    # ---- the protocol ----------------------------------------------------
    def prompt(self) -> tuple[list[int], str]:
        text = PROMPT_TEXT
        ids = self.model.tokenizer.encode(text)
        while len(ids) < self.prime:
            text += PROMPT_TEXT
            ids = self.model.tokenizer.encode(text)
        return ids[:self.prime], hashlib.sha256(text.encode()).hexdigest()

    def run(self) -> None:
        args, model = self.args, self.model
        prompt, text_sha = self.prompt()
        schedule = "BBBBB AAAAA AAAAA BBBBB" if args.reverse else "AAAAA BBBBB BBBBB AAAAA"
        start = time.perf_counter_ns()
        prefix = self.new_state()
        model.prefill(prefix, prompt[:1])
        for t in prompt[1:]:
            model.decode(prefix, t)
        first = model.draw(prefix, self.sampling)
        prime_wall = time.perf_counter_ns() - start
        same(self.prime, prefix.host_pos, "prefix position")
        same([0] * self.world, self.words(), "refusal words before the gate")
        self.r.emit("REPLAY_PROTOCOL", {
            "prime_tokens": self.prime, "sampled_output_tokens": self.output, "prime_wall_ns": prime_wall,
            "prompt_sha256": text_sha, "rows": 20, "blocks": schedule,
            "timing_scope": "sample_plus_forward_envelope",
            "step_order": "forward_refusal_commit_head_sample_readback",
            "initial_carry_draw_outside_timing": True, "final_next_draw_inside_timing": True,
            "both_arms_same_draw_positions": True, "first_scored_graph_capture_inside_timing": True,
            "control_hash_provenance": "host_reconstructed_intended_sequence", "device_sampler": True,
            "speculative": False, "graph_arm": self.graph_arm, "device": str(model.device),
            "device_name": torch.cuda.get_device_name() if self.graph_arm else "cpu", "ranks": self.world,
            "preset": args.preset, "model": args.model, "dtype": str(model.dtype).removeprefix("torch."),
            "layers": self.L, "sampling_seed": self.sampling.seed, "commit": commit_id(),
            "differences": [
                "no split_k / diet / host_c4 switches: dsv4 has one decode path",
                "graph dumps are not written to qual-graphs/ or perf-graphs/: REPLAY_CENSUS carries the "
                "capture-time census (collectives, mHC posts, embedding, unsupported)",
                "the per-step census counts reductions per (layer, site), not all-reduce epoch blocks",
            ] + ([] if self.graph_arm else [
                "graph arm absent (no CUDA): the candidate runs the eager transaction, graph rows are "
                "skipped and marked, refusal cells run on the eager transaction"]),
        })
        inputs, expected_identity = self.correctness(prefix, first)
        self.refusals(prefix, inputs)
        self.r.note("PASS replay correctness and live refusal cells; beginning bounded 20-row ABBA")
        self.abba(prefix, first, inputs, expected_identity, schedule)
        if args.profile:
            self.profile(prompt, first)

    def correctness(self, prefix, first):
        model = self.model
        control, graph = self.new_state(prefix), self.new_state(prefix, graph=True)
        inputs, carry = [], first
        for step in range(self.output):
            position = self.prime + step + 1
            expect(carry != self.eos, "correctness stream ended early (EOS)", position=position - 1)
            inputs.append(carry)
            before = self.census()
            expected = model.step(control, carry, self.sampling)
            actual = model.step(graph, carry, self.sampling)
            same(expected, actual, "sampled token", position=position)
            same(control.host_pos, graph.host_pos, "position", position=position)
            ident_c, ident_g = self.identity(control), self.identity(graph)
            for rank, (c, g) in enumerate(zip(ident_c, ident_g, strict=True)):
                for field, a, b in zip(("logits_sha256", "cache_digest", "hidden_digest", "pos"), c, g, strict=True):
                    same(a, b, f"full state: {field}", rank=rank, position=position, step=step)
            self.check_census(before, 2, position=position)
            same([[step + 1, step + 1]] * self.world, self.counts(graph), "replay counts", position=position)
            self.capture_once(graph, position=position)
            if graph.host_pos % 4 == 0 or step == 0:
                self.r.emit("REPLAY_EXACT", {"position": graph.host_pos, "all_rank_cache_hidden_logits": True,
                                             "token": actual, "device_replays": self.counts(graph),
                                             "captures": self.captures(graph) if self.graph_arm else None,
                                             "graph_arm": self.graph_arm})
            carry = expected
        expect(not looped(inputs), "looped correctness stream is not performance eligible",
               tail=inputs[-32:])
        self.r.emit("REPLAY_CENSUS", {"scope": "correctness",
                                      "rank_segments": model.each("graph_census", graph)})
        identity = self.identity(control)
        graph.discard()
        return inputs, identity

    def refusal_cells(self):
        """(position, layer) of the seed's cells, scaled to PRIME/OUTPUT: at the defaults 259, 383, 511."""
        return [(self.prime + 3, 0), (self.prime + self.output // 2 - 1, self.L // 2),
                (self.prime + self.output - 1, self.L - 1)]

    def refusals(self, prefix, inputs):
        from ..engine import RefusalError

        model = self.model
        for rank in range(min(self.world, 2)):
            for position, layer in self.refusal_cells():
                failed = self.new_state(prefix, graph=True)
                for token in inputs[:position - self.prime]:
                    model.step(failed, token, self.sampling)  # a live capture and replays before arming
                before = self.identity(failed)
                counts = self.counts(failed)
                code = REFUSAL_CODE + rank
                model.arm_refusal(layer, rank, code, "attention")
                error = None
                try:
                    model.step(failed, inputs[position - self.prime], self.sampling)
                except RefusalError as e:
                    error = str(e)
                where = dict(rank=rank, layer=layer, position=position)
                expect(error is not None and "one-shot reduction refused" in error, "refusal raised", **where,
                       error=error)
                expect(f"rank {rank} layer {layer} site attention" in error, "refusal names rank/layer/site",
                       **where, error=error)
                words = [code if r == rank else 0 for r in range(self.world)]
                same(words, self.words(), "refusal words", **where)
                after = self.identity(failed)
                for r, (b, a) in enumerate(zip(before, after, strict=True)):
                    same(b[1:], a[1:], "refused step changed the cache/hidden/pos", state_rank=r, **where)
                after_counts = self.counts(failed)
                same([[c[0] + 1, c[1]] for c in counts], after_counts, "refusal committed", **where)
                retry = None
                try:
                    model.step(failed, inputs[position - self.prime], self.sampling)
                except Exception as e:  # noqa: BLE001 - its message is the check
                    retry = str(e)
                expect(retry is not None and "unfinished transaction" in retry, "retry quarantined", **where,
                       error=retry)
                restored = True
                try:
                    failed.restore(prefix)
                except Exception:  # noqa: BLE001 - raising is what quarantine must do
                    restored = False
                expect(not restored, "restore bypassed quarantine", **where)
                same(after_counts, self.counts(failed), "retry executed", **where)
                self.capture_once(failed, **where)
                self.r.emit("REPLAY_REFUSAL", {"rank": rank, "layer": layer, "position": position, "site": "attention",
                                               "words": words, "cache_unchanged": True, "commit_delta": [0, 0],
                                               "retry_quarantined": True, "graph_arm": self.graph_arm})
                model.reset_refusals()
                failed.discard()

    def abba(self, prefix, first, inputs, expected_identity, schedule):
        from ..sampler import uniform

        model = self.model
        expected_tokens = sha256_tokens(inputs)
        eager = self.new_state(prefix)
        candidate = self.new_state(prefix, graph=True)
        walls = {"eager": 0, "graph": 0}
        rows = {"eager": 0, "graph": 0}
        graph_first = self.args.reverse
        for row in range(20):
            graph_row = (row // 5 in (1, 2)) != graph_first
            arm = "graph" if graph_row else "eager"
            if graph_row and not self.graph_arm:
                self.r.emit("MEASURE", {"row": row, "arm": "graph", "skipped": True,
                                        "reason": "no graph arm on this device", "eligible": False})
                continue
            active = candidate if graph_row else eager
            active.restore(prefix)
            before_census = self.census()
            before_counts = self.counts(active)
            carry, tokens = first, []
            self.sync()
            start = time.perf_counter_ns()
            for _ in range(self.output):
                expect(carry != self.eos, "early EOS row is not eligible", row=row)
                tokens.append(carry)
                carry = model.step(active, carry, self.sampling)
            self.sync()
            elapsed = time.perf_counter_ns() - start
            expect(not looped(tokens), "looped row is not eligible", row=row)
            same(expected_tokens, sha256_tokens(tokens), "scored token stream", row=row, arm=arm)
            same(expected_identity, self.identity(active), "scored final state", row=row, arm=arm)
            same([0] * self.world, self.words(), "refusal words", row=row)
            self.check_census(before_census, self.output, row=row)
            control = hashlib.sha256()
            for i, token in enumerate(tokens):
                control.update((int(token) | ((self.prime + i) << 32)).to_bytes(8, "little"))
                control.update(struct_f32(uniform(self.sampling.seed, self.prime + i + 1)))
                control.update((0).to_bytes(8, "little"))
            after_counts = self.counts(active)
            for rb, ra in zip(before_counts, after_counts, strict=True):
                same([self.output, self.output], [ra[0] - rb[0], ra[1] - rb[1]], "row replay counts", row=row)
            if graph_row:
                self.capture_once(active, row=row)
            walls[arm] += elapsed
            rows[arm] += 1
            self.r.emit("MEASURE", {
                "row": row, "arm": arm, "generated_tokens": self.output, "decode_wall_ns": elapsed,
                "decode_tok_s": self.output * 1e9 / elapsed, "timing_scope": "sample_plus_forward_envelope",
                "eligible": True, "looped": False, "generated_sha256": expected_tokens,
                "final_logits_sha256": expected_identity[0][0], "final_cache_digest": expected_identity[0][1],
                "final_hidden_digest": expected_identity[0][2], "device_replays": after_counts,
                "captures": self.captures(active) if graph_row else [0] * self.world,
                "control_sha256": control.hexdigest(), "speculative": False})
            if row == (0 if self.args.reverse else 5) and graph_row:
                self.r.emit("REPLAY_CENSUS", {"scope": "scored",
                                              "rank_segments": model.each("graph_census", active)})
        eager_tok_s = rows["eager"] * self.output * 1e9 / walls["eager"]
        graph_tok_s = rows["graph"] * self.output * 1e9 / walls["graph"] if rows["graph"] else None
        self.r.emit("REPLAY_SUMMARY", {
            "rows": 20, "rows_per_arm": {"eager": rows["eager"], "graph": rows["graph"]}, "blocks": schedule,
            "eager_tok_s": eager_tok_s, "graph_tok_s": graph_tok_s,
            "delta_pct": 100.0 * (graph_tok_s / eager_tok_s - 1.0) if graph_tok_s else None,
            "speculative": False, "same_load": True, "recapture": False, "graph_arm": self.graph_arm,
            "ranks": self.world, "decision": "return to root; no automatic qualification or merge"})

    def profile(self, prompt, first):
        """An unscored 32-step window under NVTX ranges that crosses an HCA window boundary."""
        model = self.model
        hca = self.cfg.compress_rates["heavily_compressed_attention"]
        boundary = max(hca * math.ceil((self.prime + 17) / hca), hca)
        start_pos = boundary - 16
        end_pos = start_pos + 32
        cap = end_pos + 8
        prefix = model.new_state(cap)
        model.prefill(prefix, prompt[:1])
        for t in prompt[1:]:
            model.decode(prefix, t)
        tape = list(prompt)
        carry = model.draw(prefix, self.sampling)
        while prefix.host_pos < start_pos:
            expect(carry != self.eos, "profile prefix early EOS")
            tape.append(carry)
            carry = model.step(prefix, carry, self.sampling)
        self.r.emit("PROFILE_PROTOCOL", {"start_position": start_pos, "end_position": end_pos,
                                         "crosses_hca": boundary, "prefix_sha256": sha256_tokens(tape),
                                         "profile_only": True, "scored": False, "nvtx": self.graph_arm})
        oracle = None
        for graph_row in (False, True):
            if graph_row and not self.graph_arm:
                self.r.emit("PROFILE_ONLY", {"arm": "graph", "skipped": True, "scored": False})
                continue
            state = model.new_state(cap)
            state.restore(prefix)
            if graph_row:
                model.enable_replay(state, self.sampling)
                model.step(state, carry, self.sampling)  # capture outside the window
                state.discard()
                state.restore(prefix)
            before = self.census()
            tokens, c = [], carry
            self.sync()
            nvtx = torch.cuda.nvtx if self.graph_arm else None
            if nvtx:
                nvtx.range_push("FULL_TOKEN_PROFILE")
                nvtx.range_push("FULL_TOKEN_REPLAY_WINDOW" if graph_row else "FULL_TOKEN_EAGER_WINDOW")
            for _ in range(32):
                if nvtx:
                    nvtx.range_push("FULL_TOKEN_STEP")
                expect(c != self.eos, "profile early EOS")
                tokens.append(c)
                c = model.step(state, c, self.sampling)
                if nvtx:
                    nvtx.range_pop()
            self.sync()
            if nvtx:
                nvtx.range_pop()
                nvtx.range_pop()
            same(end_pos, state.host_pos, "profile end position")
            self.check_census(before, 32, scope="profile")
            result = (tokens, c, self.identity(state))
            if graph_row:
                same(oracle, result, "profile arms differ")
                self.capture_once(state)
            else:
                oracle = result
            self.r.emit("PROFILE_ONLY", {"arm": "graph" if graph_row else "eager", "steps": 32,
                                         "start_position": start_pos, "end_position": end_pos,
                                         "tokens_sha256": sha256_tokens(tokens), "identical": True, "scored": False,
                                         "capture_outside_window": True})
            state.discard()
        self.r.note("PASS separate profile-only eager/replay windows; no scored rate")


def struct_f32(x: float) -> bytes:
    import struct

    return struct.pack("<f", x)


def run_gate(args) -> int:
    import dsv4

    receipts = Receipts(getattr(args, "out", None))
    if args.prime < 8 or args.output < 8:
        print("dsv4 gate: --prime and --output must be at least 8", file=sys.stderr)
        return 2
    source = args.model or args.preset or "tiny"
    dtype = getattr(torch, args.dtype) if args.dtype else None
    model = dsv4.load(source, device=args.device, dtype=dtype, ranks=args.ranks, seed=args.weight_seed)
    try:
        Gate(model, args, receipts).run()
        return 0
    except GateFailure as f:
        receipts.emit("GATE_FAIL", {"check": f.check, **{k: _plain(v) for k, v in f.detail.items()}})
        return 1
    finally:
        close = getattr(model, "close", None)
        if close:
            close()
