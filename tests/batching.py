"""What the switches' tests share: a batched decode step's rows against their sequences stepped alone (test_qkvfuse,
test_xproj, where a switch makes a batch's rows strided views), and two decode steps of a prompt under the Triton
kernels (decode_twice: a switch's steps against the defaults', test_compressor_kernel, test_normrope,
test_gate_route)."""

from __future__ import annotations


def assert_batched_equals_solo(model, prompts: list[list[int]], samplings: list, steps: int) -> None:
    """Each prompt's last token stepped `steps` times alone, then the sequences batched in reverse order: every row's
    token and state digest equal its solo step's."""

    def prefilled(i):
        state = model.new_state(32)
        model.prefill(state, prompts[i][:-1])
        return state

    solos = []
    for i in range(len(prompts)):
        state, token, out = prefilled(i), prompts[i][-1], []
        for _ in range(steps):
            token = model.step(state, token, samplings[i])
            out.append((token, state.digest()))
        solos.append(out)
    rows = list(reversed(range(len(prompts))))
    states, tokens = [prefilled(i) for i in rows], [prompts[i][-1] for i in rows]
    for step in range(steps):
        tokens = list(model.step_batch(states, tokens, [samplings[i] for i in rows]))
        for b, i in enumerate(rows):
            assert (tokens[b], states[b].digest()) == solos[i][step], f"sequence {i}, step {step}"


def decode_twice(model, monkeypatch, prompt=(3, 1, 4, 1, 5), first: int = 9):
    """`prompt` prefilled by the torch reference (DSV4_KERNELS=torch), then two decode steps with the Triton kernels
    (the second feeds the first's argmax): (their logits stacked, the state's digests)."""
    import torch

    monkeypatch.setenv("DSV4_KERNELS", "torch")
    state = model.new_state(16)
    model.prefill(state, list(prompt))
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    logits = [model.decode(state, first).reshape(-1)]
    logits.append(model.decode(state, int(logits[-1].argmax())).reshape(-1))
    return torch.stack(logits), model.digests(state)
