"""The gate's prefix-cache check (`dsv4 gate --prefix-cache`): prompts prefilled through dsv4.prefix.PrefixCache
against the same prompts prefilled plainly at the cache's chunk, every byte compared on every rank, then sampled
steps from both; and a refusal inside a cached prefill.

The prompts make the cache take each of its paths: a cold prompt (its end kept), a longer one from that entry (a
conversation's next turn), one that leaves the cached prompts inside a chunk (a snapshot at their shared boundary)
and one from that snapshot (a shared system prompt). The refusal, armed inside the prefill that goes on from a
restored prefix, must raise, quarantine the state and leave the cache as it was (no snapshot of a refused prefill):
the same prompt then hits the same entry and equals the plain prefill again.
"""

from __future__ import annotations

from ..engine import RefusalError
from ..prefix import PrefixCache
from .checks import expect, identity, same

PREFIX_REFUSAL_CODE = 40099


def _plain(gate, prompt: list[int], chunk: int):
    state = gate.model.new_state(gate.capacity)
    gate.model.prefill(state, prompt[:-1], chunk_size=chunk)
    return state


def _equal(gate, a, b, check: str, **where):
    for rank, (x, y) in enumerate(zip(identity(gate.model, a), identity(gate.model, b), strict=True)):
        for field, u, v in zip(("logits_sha256", "cache_digest", "hidden_digest", "pos"), x, y, strict=True):
            same(u, v, f"{check}: {field}", rank=rank, **where)


def prefix_vs_plain(gate, prompt: list[int]) -> None:
    model, n = gate.model, len(prompt)
    chunk = max(1, n // 4)
    m, vocab = chunk + chunk // 2, gate.cfg.vocab_size
    other = [(t * 7 + 3) % vocab for t in reversed(prompt)]  # tails unlike the prompt, from its first token on
    cold = prompt[:n // 2 + 1]
    leaving = prompt[:m] + [(prompt[m] + 1) % vocab] + other[:2 * chunk]
    shared = prompt[:m] + [(prompt[m] + 2) % vocab] + other[2 * chunk:3 * chunk]
    cases = [("cold", cold, 0), ("next turn", prompt, (len(cold) - 1) // chunk * chunk),
             ("leaves the cache", leaving, 0), ("shared prefix", shared, chunk)]
    cache = PrefixCache(model, 3, gate.capacity, chunk)
    states = []
    for name, p, hit in cases:
        state, plain = model.new_state(gate.capacity), _plain(gate, p, chunk)
        got = cache.prefill(state, p)
        same(hit, got, "prefix cache tokens restored", case=name)
        _equal(gate, plain, state, "cached prefill equals plain", case=name, prompt_tokens=len(p))
        states.append((state, plain))
        if name != "next turn":
            state.discard()
            plain.discard()
    state, plain = states[1]
    carry = prompt[-1]
    steps = min(gate.output, 16)
    for step in range(steps):
        a, b = model.step(plain, carry, gate.sampling), model.step(state, carry, gate.sampling)
        same(a, b, "a cached prefill's stream equals the plain one's", position=n + step)
        _equal(gate, plain, state, "stepped from a cached prefill", position=n + step)
        carry = a
    state.discard()
    plain.discard()
    gate.r.emit("PREFIX_IDENTITY", {
        "chunk": chunk, "prompts": [len(p) for _, p, _ in cases], "restored": [hit for _, _, hit in cases],
        "entries": sorted(len(e.ids) for e in cache.entries.values()), "steps_after": steps,
        "all_rank_cache_hidden_logits": True})
    refused_prefill(gate, cache, prompt, chunk)


def refused_prefill(gate, cache: PrefixCache, prompt: list[int], chunk: int) -> None:
    """A refusal inside the prefill that goes on from a restored prefix: it raises, quarantines the state, and the
    cache keeps what it had (no snapshot of a refused prefill); the prompt then equals the plain prefill again."""
    model = gate.model
    rank, layer = min(1, gate.world - 1), gate.L // 2
    entries = lambda: sorted((len(e.ids), identity(model, e.state)) for e in cache.entries.values())  # noqa: E731
    before = entries()
    if (len(prompt) - 1) % chunk == 0:  # a prompt whose prefill is all cached runs no forward to refuse
        prompt = prompt[:-1]
    state = model.new_state(gate.capacity)
    model.arm_refusal(layer, rank, PREFIX_REFUSAL_CODE, "moe")
    error = None
    try:
        cache.prefill(state, prompt)
    except RefusalError as e:
        error = str(e)
    finally:
        model.reset_refusals()
    expect(error is not None and f"rank {rank} layer {layer} site moe" in error, "cached prefill refusal raised",
           error=error)
    expect(state.quarantine is not None, "refused cached prefill quarantined")
    state.discard()
    same(before, entries(), "a refused prefill left the prefix cache as it was")
    again, plain = model.new_state(gate.capacity), _plain(gate, prompt, chunk)
    restored = cache.prefill(again, prompt)
    _equal(gate, plain, again, "after the refusal, cached prefill equals plain")
    again.discard()
    plain.discard()
    gate.r.emit("PREFIX_REFUSAL", {"rank": rank, "layer": layer, "site": "moe", "quarantined": True,
                                   "cache_unchanged": True, "restored_after": restored})
