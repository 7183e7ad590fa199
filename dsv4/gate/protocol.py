"""The gate's protocol: prime the prefix, prove the replay correct step by step, refuse live
collectives; then hand the prefix to the timing (dsv4.gate.timing)."""

from __future__ import annotations

import hashlib
import time

from ..engine import RefusalError
from ..receipts import Receipts, provenance
from ..sampler import SamplingParams
from . import timing
from .batch import batched_vs_solo
from .prefix import prefix_vs_plain
from .speculative import verified_vs_plain
from .checks import capture_once, census, check_census, expect, identity, looped, same

PROMPT_TEXT = (
    "In the beginning the engine was slow and nobody trusted its fast path. So the builders wrote a "
    "gate: a program that tries, as hard as it can, to prove the fast path wrong. It replays every "
    "token of a long sampled stream twice, once plainly and once from a captured graph, and compares "
    "every byte of the state after each step. It refuses collectives on purpose and checks that "
    "nothing was committed. Only when all of that holds does it time the two paths against each "
    "other, in blocks, forwards and backwards, so that drift cannot favour either arm. "
)
REFUSAL_CODE = 40043


class Gate:
    def __init__(self, model, args, receipts: Receipts):
        self.model, self.args, self.r = model, args, receipts
        self.cfg = model.cfg
        self.L = self.cfg.num_hidden_layers
        self.prime, self.output = args.prime, args.output
        self.capacity = self.prime + self.output + 8
        self.sampling = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, seed=args.seed)
        self.graph_arm = model.device.type == "cuda"
        self.eos = self.cfg.eos_token_id
        self.world = model.world

    # ---- per-rank views --------------------------------------------------
    def counts(self, state) -> list[list[int]]:
        return self.model.each("replay_counts", state)

    def captures(self, state) -> list[int]:
        return self.model.each("captures", state)

    def words(self) -> list[int]:
        return self.model.refusal_words()

    def new_state(self, prefix=None, graph=False):
        state = self.model.new_state(self.capacity)
        if prefix is not None:
            state.restore(prefix)
        if graph and self.graph_arm:
            self.model.enable_replay(state, self.sampling)
        return state

    # ---- the protocol ----------------------------------------------------
    def prompt(self) -> tuple[list[int], str]:
        text = PROMPT_TEXT
        ids = self.model.tokenizer.encode(text)
        while len(ids) < self.prime:
            text += PROMPT_TEXT
            ids = self.model.tokenizer.encode(text)
        return ids[:self.prime], hashlib.sha256(text.encode()).hexdigest()

    def run(self) -> None:
        prompt, text_sha = self.prompt()
        schedule = "BBBBB AAAAA AAAAA BBBBB" if self.args.reverse else "AAAAA BBBBB BBBBB AAAAA"
        start = time.perf_counter_ns()
        prefix, first = self.prime_prefix(prompt)
        prime_wall = time.perf_counter_ns() - start
        same(self.prime, prefix.host_pos, "prefix position")
        same([0] * self.world, self.words(), "refusal words before the gate")
        self.r.emit("REPLAY_PROTOCOL", self.protocol_record(prime_wall, text_sha, schedule))
        inputs, expected_identity = self.correctness(prefix, first)
        self.refusals(prefix, inputs)
        if getattr(self.args, "batch", 0):
            batched_vs_solo(self, prefix, first)
        if getattr(self.args, "speculative", 0):
            verified_vs_plain(self, prefix, first)
        if getattr(self.args, "prefix_cache", False):
            prefix_vs_plain(self, prompt)
        self.r.note("PASS replay correctness and live refusal cells; beginning bounded 20-row ABBA")
        timing.abba(self, prefix, first, inputs, expected_identity, schedule)
        if self.args.profile:
            timing.profile(self, prompt, first)

    def prime_prefix(self, prompt):
        """The prefix state (first token by prefill, the rest one step at a time) and the first output draw."""
        prefix = self.new_state()
        self.model.prefill(prefix, prompt[:1])
        for t in prompt[1:]:
            self.model.decode(prefix, t)
        return prefix, self.model.draw(prefix, self.sampling)

    def protocol_record(self, prime_wall: int, text_sha: str, schedule: str) -> dict:
        model, args = self.model, self.args
        return {
            "prime_tokens": self.prime, "sampled_output_tokens": self.output, "prime_wall_ns": prime_wall,
            "prompt_sha256": text_sha, "rows": 20, "blocks": schedule,
            "timing_scope": "sample_plus_forward_envelope",
            "step_order": "forward_refusal_commit_head_sample_readback",
            "initial_carry_draw_outside_timing": True, "final_next_draw_inside_timing": True,
            "both_arms_same_draw_positions": True, "first_scored_graph_capture_inside_timing": True,
            "control_hash_provenance": "host_reconstructed_intended_sequence", "device_sampler": True,
            "speculative": False, "graph_arm": self.graph_arm, **provenance(model.device, args.preset),
            "ranks": self.world, "model": args.model, "dtype": str(model.dtype).removeprefix("torch."),
            "layers": self.L, "sampling_seed": self.sampling.seed,
            "differences": [
                "no split_k / diet / host_c4 switches: dsv4 has one decode path",
                "graph dumps are not written to qual-graphs/ or perf-graphs/: REPLAY_CENSUS carries the "
                "capture-time census (collectives, mHC posts, embedding, unsupported)",
                "the per-step census counts reductions per (layer, site), not all-reduce epoch blocks",
            ] + ([] if self.graph_arm else [
                "graph arm absent (no CUDA): the candidate runs the eager transaction, graph rows are "
                "skipped and marked, refusal cells run on the eager transaction"]),
        }

    def correctness(self, prefix, first):
        """OUTPUT sampled steps, eager control against graph candidate, every byte compared each step."""
        control, graph = self.new_state(prefix), self.new_state(prefix, graph=True)
        inputs, carry = [], first
        for step in range(self.output):
            expect(carry != self.eos, "correctness stream ended early (EOS)", position=self.prime + step)
            inputs.append(carry)
            carry = self.correct_step(control, graph, carry, step)
        expect(not looped(inputs), "looped correctness stream is not performance eligible",
               tail=inputs[-32:])
        self.r.emit("REPLAY_CENSUS", {"scope": "correctness",
                                      "rank_segments": self.model.each("graph_census", graph)})
        expected_identity = identity(self.model, control)
        graph.discard()
        return inputs, expected_identity

    def correct_step(self, control, graph, carry: int, step: int) -> int:
        """One step of both arms: the same token, position, logits, cache, hidden; returns the token."""
        model, position = self.model, self.prime + step + 1
        before = census(model)
        expected = model.step(control, carry, self.sampling)
        actual = model.step(graph, carry, self.sampling)
        same(expected, actual, "sampled token", position=position)
        same(control.host_pos, graph.host_pos, "position", position=position)
        ident_c, ident_g = identity(model, control), identity(model, graph)
        for rank, (c, g) in enumerate(zip(ident_c, ident_g, strict=True)):
            for field, a, b in zip(("logits_sha256", "cache_digest", "hidden_digest", "pos"), c, g, strict=True):
                same(a, b, f"full state: {field}", rank=rank, position=position, step=step)
        check_census(model, before, 2, position=position)
        same([[step + 1, step + 1]] * self.world, self.counts(graph), "replay counts", position=position)
        capture_once(model, graph, position=position)
        if graph.host_pos % 4 == 0 or step == 0:
            self.r.emit("REPLAY_EXACT", {"position": graph.host_pos, "all_rank_cache_hidden_logits": True,
                                         "token": actual, "device_replays": self.counts(graph),
                                         "captures": self.captures(graph) if self.graph_arm else None,
                                         "graph_arm": self.graph_arm})
        return expected

    def refusal_cells(self):
        """(position, layer) of the seed's cells, scaled to PRIME/OUTPUT: at the defaults 259, 383, 511."""
        return [(self.prime + 3, 0), (self.prime + self.output // 2 - 1, self.L // 2),
                (self.prime + self.output - 1, self.L - 1)]

    def refusals(self, prefix, inputs):
        for rank in range(min(self.world, 2)):
            for position, layer in self.refusal_cells():
                self.refusal_cell(prefix, inputs, rank, position, layer)

    def refusal_cell(self, prefix, inputs, rank: int, position: int, layer: int):
        """A live refusal at (rank, layer, position) after a capture and replays: nothing commits, the
        state is quarantined (REPLAY_REFUSAL)."""
        model, where = self.model, dict(rank=rank, layer=layer, position=position)
        failed = self.new_state(prefix, graph=True)
        for token in inputs[:position - self.prime]:
            model.step(failed, token, self.sampling)  # a live capture and replays before arming
        before, counts = identity(model, failed), self.counts(failed)
        code = REFUSAL_CODE + rank
        model.arm_refusal(layer, rank, code, "attention")
        error = self.refused_step(failed, inputs[position - self.prime])
        expect(error is not None and "one-shot reduction refused" in error, "refusal raised", **where, error=error)
        expect(f"rank {rank} layer {layer} site attention" in error, "refusal names rank/layer/site",
               **where, error=error)
        words = [code if r == rank else 0 for r in range(self.world)]
        same(words, self.words(), "refusal words", **where)
        for r, (b, a) in enumerate(zip(before, identity(model, failed), strict=True)):
            same(b[1:], a[1:], "refused step changed the cache/hidden/pos", state_rank=r, **where)
        after_counts = self.counts(failed)
        same([[c[0] + 1, c[1]] for c in counts], after_counts, "refusal committed", **where)
        self.check_quarantined(failed, prefix, inputs[position - self.prime], where)
        same(after_counts, self.counts(failed), "retry executed", **where)
        capture_once(model, failed, **where)
        self.r.emit("REPLAY_REFUSAL", {"rank": rank, "layer": layer, "position": position, "site": "attention",
                                       "words": words, "cache_unchanged": True, "commit_delta": [0, 0],
                                       "retry_quarantined": True, "graph_arm": self.graph_arm})
        model.reset_refusals()
        failed.discard()

    def refused_step(self, state, token) -> str | None:
        """The RefusalError's message of a step that must refuse (None if it did not)."""
        try:
            self.model.step(state, token, self.sampling)
        except RefusalError as e:
            return str(e)
        return None

    def check_quarantined(self, failed, prefix, token, where: dict):
        """After a refusal: a retry raises "unfinished transaction" and a restore is refused."""
        retry = None
        try:
            self.model.step(failed, token, self.sampling)
        except Exception as e:  # noqa: BLE001 - its message is the check
            retry = str(e)
        expect(retry is not None and "unfinished transaction" in retry, "retry quarantined", **where, error=retry)
        restored = True
        try:
            failed.restore(prefix)
        except Exception:  # noqa: BLE001 - raising is what quarantine must do
            restored = False
        expect(not restored, "restore bypassed quarantine", **where)
