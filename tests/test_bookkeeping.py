"""dsv4.kernels.bookkeeping against its references, bit for bit (integer and select operations): Comm.begin_step /
end_step's torch ops on the same armed doors (none, one, several firing; with and without the last door's unseen
flag), and one state's settle (kept and not); then a model's refused and committed steps with the kernels on equal
those with them off (words, fired doors, states)."""

from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4 import kernels
from dsv4.engine import RefusalError
from dsv4.kernels import bookkeeping
from dsv4.parallel import SITES, Comm

DEVICES = (["cpu"] if kernels.interpreting() else []) + (["cuda"] if torch.cuda.is_available() else [])
pytestmark = pytest.mark.skipif(not DEVICES, reason="the kernels need Triton's interpreter or a GPU")


def comms(device, layers=5):
    ref, fused = Comm(layers, device), Comm(layers, device)
    for c in (ref, fused):
        c.word.fill_(9)
        c.fired.copy_(torch.tensor([9, 8, 7]))
        c.verdict.fill_(3.0)
    return ref, fused


def same(a: Comm, b: Comm):
    for name in ("armed", "word", "fired", "verdict", "refusing"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("doors", [(), ((2, "moe", 5),), ((0, "attention", -3), (4, "attention", 71), (1, "moe", 72))],
                         ids=["none", "one", "three"])
@pytest.mark.parametrize("unseen", [None, 1.0], ids=["seen", "unseen"])
def test_begin_and_end_equal_the_reference(monkeypatch, device, doors, unseen):
    ref, fused = comms(device)
    for c in (ref, fused):
        for layer, site, code in doors:
            c.arm_refusal(layer, 0, code, site)
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    ref.begin_step()
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    fused.begin_step()
    same(ref, fused)
    assert ref.verdict.item() == 0.0 and int(ref.refusing.sum()) == len(doors)
    for c in (ref, fused):
        c._unseen = None if unseen is None else torch.tensor(unseen, dtype=torch.bfloat16, device=device)
    monkeypatch.setenv("DSV4_KERNELS", "torch")
    ref.end_step()
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    fused.end_step()
    same(ref, fused)
    assert fused._unseen is None and int(fused.armed.abs().sum()) == 0
    if doors:  # the last door in order (layer, then attention before moe)
        layer, site, code = max(doors, key=lambda d: (d[0], SITES.index(d[1])))
        assert fused.fired.tolist() == [code, layer, SITES.index(site)] and fused.word.item() == code
    else:
        assert fused.fired.tolist() == [9, 8, 7] and fused.word.item() == 9


def settle_case(device, seed: int, logits_dtype):
    """(last, logits, ref, got): a step's new hidden and logits, and a state's [hidden, logits, pos, counts] twice."""
    g = torch.Generator().manual_seed(seed)
    last = torch.randn(4, 96, generator=g).to(torch.bfloat16).to(device)
    logits = torch.randn(5000, generator=g).to(logits_dtype).to(device)
    ref = [torch.randn(4, 96, generator=g).to(torch.bfloat16).to(device), torch.randn(5000, generator=g).to(device),
           torch.tensor(17, device=device), torch.tensor([30, 11], device=device)]
    return last, logits, ref, [t.clone() for t in ref]


def settle_reference(ref, keep, last, logits):
    """The transaction's torch ops where a state's settle kernel does not run."""
    hidden, state_logits, pos, counts = ref
    hidden.copy_(torch.where(keep, last, hidden))
    pos.add_(keep.long() * 3)
    counts[1].add_(keep.long())
    state_logits.copy_(torch.where(keep, logits, state_logits))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kept", [True, False])
@pytest.mark.parametrize("logits_dtype", [torch.float32, torch.bfloat16])
def test_settle_equals_the_reference(device, kept, logits_dtype):
    """bf16 logits (the head's, since session 34) go into the state's fp32 ones widened by the store: torch's
    promoting where and copy give the same bits."""
    keep = torch.tensor(kept, device=device)
    last, logits, ref, got = settle_case(device, 1, logits_dtype)
    assert bookkeeping.settle_supported(keep, last, got[0], logits, got[1])
    bookkeeping.settle(keep, last, got[0], logits, got[1], got[2], got[3][1], 3)
    settle_reference(ref, keep, last, logits)
    for a, b in zip(ref, got):
        assert torch.equal(a, b)
    assert int(got[2]) == (20 if kept else 17) and got[3].tolist() == [30, 12 if kept else 11]
    assert not bookkeeping.settle_supported(keep, last.float(), got[0], logits, got[1])  # a promotion: torch's
    assert not bookkeeping.settle_supported(keep, last, got[0], logits.to(torch.float64), got[1])  # a narrowing


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("verdict", [0.0, 2.0])
@pytest.mark.parametrize("active", [None, True, False], ids=["solo", "active", "inactive"])
def test_settle_from_the_verdict_equals_the_reference(device, verdict, active):
    """CONFIG fold_settle's form: the keep mask from the verdict (and the row's active flag) and the forward count
    in the settle launch, against the transaction's torch ops (verdict == 0, & active, counts[0] += 1 or + active)."""
    v = torch.tensor(verdict, device=device)
    a = None if active is None else torch.tensor([not active, active], device=device)[1]  # a row's view, offset 1
    last, logits, ref, got = settle_case(device, 2, torch.bfloat16)
    assert bookkeeping.settle_supported(v, last, got[0], logits, got[1])
    bookkeeping.settle(v, last, got[0], logits, got[1], got[2], got[3][1], 3, forwards=got[3][0], active=a)
    ref[3][0].add_(1 if a is None else a.long())
    settle_reference(ref, v == 0 if a is None else (v == 0) & a, last, logits)
    for x, y in zip(ref, got):
        assert torch.equal(x, y)
    kept = verdict == 0 and active is not False
    assert int(got[2]) == (20 if kept else 17)
    assert got[3].tolist() == [30 if active is False else 31, 12 if kept else 11]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("verdict", [0.0, 3.0])
def test_readback_equals_the_reference(device, verdict):
    """A solo step's end: the drawn token into the state's, and [token, verdict] fp64 as torch's copy and stack."""
    drawn = torch.tensor(129279, device=device)
    token, v = torch.tensor(-1, device=device), torch.tensor(verdict, device=device)
    assert bookkeeping.readback_supported(drawn, token, v)
    out = bookkeeping.readback(drawn, token, v)
    ref_token = torch.tensor(-1, device=device)
    ref_token.copy_(drawn)
    assert torch.equal(out, torch.stack([ref_token.double(), v.double()])) and torch.equal(token, ref_token)
    assert not bookkeeping.readback_supported(drawn, token, v.double())  # another verdict type: torch's ops


@pytest.mark.parametrize("device", DEVICES)
def test_readback_into_host_memory_and_fetch(device):
    """Mapped I/O's kernels (dsv4.replay CONFIG mapped_io): the readback stores [token, verdict] into a pinned host
    buffer as well as its device output, and fetch copies a host buffer's token onto the device (on CUDA both read
    and write pinned host memory in place)."""
    pin = device == "cuda"
    drawn, v = torch.tensor(70001, device=device), torch.tensor(2.0, device=device)
    token = torch.tensor(-1, device=device)
    host = torch.full((2,), -5.0, dtype=torch.float64, pin_memory=pin)
    out = bookkeeping.readback(drawn, token, v, host)
    if pin:
        torch.cuda.synchronize()
    assert host.tolist() == out.tolist() == [70001.0, 2.0] and int(token) == 70001
    src = torch.tensor([129279], dtype=torch.int64, pin_memory=pin)
    dst = torch.zeros(1, dtype=torch.int64, device=device)
    bookkeeping.fetch(src, dst)
    assert dst.tolist() == [129279]  # (a synchronizing read: the launch is done before the host writes again)
    src[0] = 17  # the host's next token: read again by the next launch (a volatile load)
    bookkeeping.fetch(src, dst)
    assert dst.tolist() == [17]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("hold,verdict", [(False, 0.0), (True, 0.0), (False, 2.0), (True, 5.0)])
@pytest.mark.parametrize("B", [1, 5])
def test_batch_begin_and_end_equal_the_reference(device, hold, verdict, B):
    """A batched step's start (held, active rows, input tokens: fed rows from their state's token) and end (hold,
    status, the active rows' state tokens, the readback) against engine.Model.step_batch_device's torch ops, bit
    for bit (the status's -0.0 included)."""
    g = torch.Generator().manual_seed(B + 7 * hold)
    tokens = [torch.tensor(int(t), device=device) for t in torch.randint(0, 1000, (B,), generator=g)]
    active = torch.rand(B, generator=g).to(device) > 0.3
    feed = torch.rand(B, generator=g).to(device) > 0.5
    inp = torch.randint(0, 1000, (B,), generator=g).to(device)
    drawn = torch.randint(0, 1000, (B,), generator=g).to(device)
    addr = torch.tensor([t.data_ptr() for t in tokens], dtype=torch.int64, device=device)
    h = torch.tensor(hold, device=device)
    v = torch.tensor(verdict, device=device)
    assert bookkeeping.batch_supported(h, inp, addr)

    ref_h, ref_tokens = h.clone(), [t.clone() for t in tokens]
    ref_held = ref_h.clone()
    ref_active = active & ~ref_held
    ref_in = torch.where(feed, torch.stack(ref_tokens), inp)
    ref_h.logical_or_(v != 0)
    status = torch.where(v != 0, v.double(), -ref_held.double()).view(1)
    for b, t in enumerate(ref_tokens):
        t.copy_(torch.where(ref_active[b], drawn[b], t))
    ref_out = torch.cat([drawn.double(), status])

    held, act, got_in = bookkeeping.batch_begin(h, active, feed, inp, addr)
    assert torch.equal(held, ref_held) and torch.equal(act, ref_active) and torch.equal(got_in, ref_in)
    out = bookkeeping.batch_end(h, held, v, drawn, act, addr)
    assert torch.equal(h, ref_h) and all(torch.equal(a, b) for a, b in zip(tokens, ref_tokens))
    assert torch.equal(out.view(torch.int64), ref_out.view(torch.int64))  # -0.0 and 0.0 apart
    assert not bookkeeping.batch_supported(h, inp, None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fold", [False, True], ids=["settle", "fold_settle"])
def test_model_steps_equal_with_the_kernels(monkeypatch, device, fold):
    """tiny's steps, committed and refused (two doors armed in one step: the last one's word), with the kernels
    and with the torch ops (everything else as DSV4_KERNELS=auto runs it): the same tokens, words, fired doors and
    state digests (and step counts); with CONFIG fold_settle (the settle from the verdict, the forward counted there)
    both ways too, and the same as without it (test_fold_settle_keeps_the_steps)."""
    monkeypatch.setitem(bookkeeping.CONFIG, "fold_settle", fold)
    results, calls = [], {"begin": 0, "end": 0, "settle": 0}
    for name in calls:
        def counted(*args, _fn=getattr(bookkeeping, name), _name=name, **kw):
            calls[_name] += 1
            return _fn(*args, **kw)
        monkeypatch.setattr(bookkeeping, name, counted)
    use_triton = kernels.use_triton
    for on in (False, True):  # only the bookkeeping switched: every other op as "auto" runs it
        monkeypatch.setenv("DSV4_KERNELS", "auto")
        monkeypatch.setattr(bookkeeping, "GPU_CHECKED", "bookkeeping")  # marks its calls below
        monkeypatch.setattr(kernels, "use_triton", lambda t, gpu_checked=True, on=on: on if gpu_checked ==
                            "bookkeeping" else use_triton(t, gpu_checked))
        model = dsv4.load("tiny", device=device, dtype=torch.float32)
        L = model.cfg.num_hidden_layers
        state = model.new_state(16)
        model.prefill(state, [1, 2, 3])
        tokens = [model.step(state, 4, dsv4.SamplingParams(seed=1))]
        model.arm_refusal(L - 1, 0, 71, "attention")
        model.arm_refusal(1, 0, 72, "moe")
        with pytest.raises(RefusalError, match=f"rank 0 layer {L - 1} site attention word 71"):
            model.step(state, tokens[-1], dsv4.SamplingParams(seed=1))
        fired = model.comm.fired.tolist()
        model.reset_refusals()
        state.discard()
        state = model.new_state(16)
        model.prefill(state, [1, 2, 3])
        for _ in range(3):
            tokens.append(model.step(state, tokens[-1], dsv4.SamplingParams(seed=2)))
        results.append((tokens, fired, state.digest(),
                         int(state.pos), state.counts.tolist()))
    assert results[0] == results[1]
    assert results[0][1] == [71, L - 1, 0]
    assert calls["begin"] == calls["end"] >= 5 and calls["settle"] >= 3, calls  # the second pass's steps


# fold_settle is on by default (session 41), so every CPU test through the kernels runs it; its off arm against it is
# 55 s of interpreter on CPU (session 52): the slow set's there, CUDA's always
@pytest.mark.parametrize("device", [pytest.param(d, marks=pytest.mark.slow) if d == "cpu" else d for d in DEVICES])
def test_fold_settle_keeps_the_steps(monkeypatch, device):
    """CONFIG fold_settle on and off: tiny's solo steps (one refused) and a one-row batched step (the pipelined
    decode's) leave the same tokens, digests, positions and step counts [forward, commit]."""
    from dsv4.generation import pipelined_tokens

    monkeypatch.setenv("DSV4_KERNELS", "triton")
    results = []
    for fold in (False, True):
        monkeypatch.setitem(bookkeeping.CONFIG, "fold_settle", fold)
        model = dsv4.load("tiny", device=device, dtype=torch.float32)
        state = model.new_state(24)
        model.prefill(state, [1, 2, 3])
        tokens = [model.step(state, 4, dsv4.SamplingParams(seed=1))]
        model.arm_refusal(1, 0, 72, "moe")
        with pytest.raises(RefusalError):
            model.step(state, tokens[-1], dsv4.SamplingParams(seed=1))
        refused = (state.counts.tolist(), int(state.pos))
        model.reset_refusals()
        state.discard()
        state = model.new_state(24)
        model.prefill(state, [1, 2, 3])
        tokens += list(pipelined_tokens(model, state, 5, 4, dsv4.SamplingParams(seed=3), graph=device == "cuda"))
        results.append((tokens, refused, state.digest(), int(state.pos), state.counts.tolist()))
    assert results[0] == results[1]
    assert results[0][1][0][0] == results[0][1][0][1] + 1  # the refused step ran its forward, committed nothing


@pytest.mark.parametrize("device", DEVICES)
# the copy (replay CONFIG fetch "copy", not the default "kernel"): the slow set's on CPU (26 s, session 52)
@pytest.mark.parametrize("fetch", ["kernel", pytest.param("copy", marks=pytest.mark.slow if kernels.interpreting()
                                                               and not torch.cuda.is_available() else ())])
def test_step_device_with_host_tokens(monkeypatch, device, fetch):
    """Model.step_device with a full-token graph's mapped I/O (dsv4.replay CONFIG mapped_io), run eagerly: the token
    fetched from the host buffer (by the fetch kernel, or copied: CONFIG fetch) and the readback left in the host
    buffer give the tokens and states of the plain step, whose input is the state's own buffer."""
    from dsv4 import replay

    monkeypatch.setitem(replay.CONFIG, "fetch", fetch)
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    fetches = []
    kernel = bookkeeping.fetch
    monkeypatch.setattr(bookkeeping, "fetch", lambda *a: fetches.append(1) or kernel(*a))
    model = dsv4.load("tiny", device=device, dtype=torch.float32)
    sp = dsv4.SamplingParams(seed=5)
    results = []
    for form in ("plain", "mapped"):
        state = model.new_state(16)
        model.prefill(state, [1, 2, 3])
        pin = device == "cuda"
        host = (torch.zeros(1, dtype=torch.int64, pin_memory=pin), torch.zeros(2, dtype=torch.float64, pin_memory=pin))
        token, drawn = 4, []
        for _ in range(3):
            if form == "plain":
                state.input.fill_(token)
                out = model.step_device(state, sp).tolist()
            else:
                state.input.fill_(-1)  # the step must take the token from the host buffer
                host[0][0] = token
                model.step_device(state, sp, host=host)
                if pin:
                    torch.cuda.synchronize()
                out = host[1].tolist()
            assert out[1] == 0.0
            state.host_pos += 1
            token = int(out[0])
            drawn.append(token)
        results.append((drawn, state.digest(), int(state.pos), int(state.input[0])))
    assert results[0] == results[1] and len(fetches) == (3 if fetch == "kernel" else 0)
