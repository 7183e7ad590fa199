"""What a CUDA graph captures must make no host sync: checked on CPU, in CI.

The step a full-token graph holds (Model.step_device: forward, verdict, commit, head, sampling) and
a prefill chunk's transaction run under dsv4.syncguard.NoHostSync, which raises on every op that
reads a device value on the host or sizes a tensor from data. 19bb0c3 broke every graph capture on
the GPU with one such op (`flat[last]` in Comm.end_step) while CPU CI stayed green; these tests fail
on that line (test_old_end_step_is_caught keeps it as the witness).
"""

from __future__ import annotations

import pytest
import torch

import dsv4
import dsv4.kernels
from dsv4 import RefusalError, SamplingParams
from dsv4.checkpoint.synth import synth
from dsv4.config import CSA, HCA, preset
from dsv4.parallel import SITES, Comm
from dsv4.syncguard import HostSyncError, NoHostSync

SAMPLINGS = [SamplingParams(temperature=1.0, top_p=0.9, top_k=5, seed=7), SamplingParams(temperature=0.0)]


@pytest.fixture(scope="module")
def tiny():
    return dsv4.load("tiny", device="cpu", dtype=torch.float32, seed=3)


def _layer_of(cfg, kind):
    return next(i for i, t in enumerate(cfg.layer_types) if t == kind)


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["sampled", "greedy"])
def test_captured_step_makes_no_host_sync(tiny, sampling):
    """Healthy steps across sliding-window wraps and CSA/HCA closes, each step under the guard."""
    cfg = tiny.cfg
    n = 2 * max(cfg.sliding_window, *(cfg.compress_rate(i) for i in range(cfg.num_hidden_layers))) + 3
    state = tiny.new_state(n + 4)
    token = 3
    for _ in range(n):
        token = tiny.check_capturable(state, [token], sampling)
    assert state.host_pos == n and int(state.pos) == n


def test_refused_step_makes_no_host_sync(tiny):
    """A refusal fires inside the guarded step; nothing commits, the state is quarantined."""
    cfg = tiny.cfg
    state = tiny.new_state(32)
    for t in (1, 2, 3):
        tiny.check_capturable(state, [t], SAMPLINGS[0])
    before = state.digest()
    for layer, site in ((0, "attention"), (_layer_of(cfg, CSA), "moe"), (_layer_of(cfg, HCA), "attention")):
        tiny.arm_refusal(layer, 0, 40043, site)
        with pytest.raises(RefusalError, match=f"layer {layer} site {site}"):
            tiny.check_capturable(state, [4], SAMPLINGS[0])
        assert state.digest() == before
        state.quarantine = None  # the test's own reset; users call discard(), which zeroes the state
    tiny.reset_refusals()


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_prefill_chunks_make_no_host_sync(tiny, chunk):
    """A prefill chunk is one transaction of the same forward, meant to be capturable as well."""
    state = tiny.new_state(200)
    ids = [(i * 37 + 11) % tiny.cfg.vocab_size for i in range(150)]
    for start in range(0, len(ids), chunk):
        tiny.check_capturable(state, ids[start:start + chunk]) if chunk > 1 else \
            tiny.check_capturable(state, ids[start:start + 1])
    assert state.host_pos == len(ids)


def test_two_ranks_each_make_no_host_sync(tmp_path):
    """Every rank of a 2-rank gloo group runs its captured step under the guard, a refusal included."""
    ckpt = synth(preset("tiny"), tmp_path / "tiny", seed=5, quant="none")
    with dsv4.load(ckpt, device="cpu", dtype=torch.float32, ranks=2) as two:
        state = two.new_state(64)
        two.check_capturable(state, [0, 5, 17, 42])
        token = 9
        for _ in range(20):
            token = two.check_capturable(state, [token], SAMPLINGS[0])
        two.arm_refusal(_layer_of(two.cfg, CSA), 1, 40044, "moe")
        with pytest.raises(RefusalError, match="rank 1"):
            two.check_capturable(state, [token], SAMPLINGS[0])


def _end_step_19bb0c3(self):
    """Comm.end_step as landed at 19bb0c3 (it broke every graph capture on the GPU)."""
    flat = self.armed.flatten()
    fired = flat != 0
    last = (fired.long() * self._order).argmax()
    code = flat[last]
    anyone = fired.any()
    self.word.copy_(torch.where(anyone, code, self.word))
    self.fired.copy_(torch.where(anyone, torch.stack([code, last // len(SITES), last % len(SITES)]), self.fired))
    self.armed.zero_()


def test_old_end_step_is_caught(tiny, monkeypatch):
    monkeypatch.setattr(Comm, "end_step", _end_step_19bb0c3)
    state = tiny.new_state(8)
    with pytest.raises(HostSyncError, match=r"aten\.(item|_local_scalar_dense).*test_syncguard.py:\d+ in _end_step_19bb0c3"):
        tiny.check_capturable(state, [1], SAMPLINGS[0])


@pytest.mark.parametrize("op", [
    lambda x: x.sum().item(),
    lambda x: x[x > 0],
    lambda x: torch.nonzero(x),
    lambda x: x.masked_select(x > 0),
    lambda x: torch.unique(x),
    lambda x: torch.equal(x, x),
    lambda x: x[torch.tensor(1)],
    lambda x: torch.repeat_interleave(x, torch.tensor([1, 2, 3])),
    lambda x: bool(x.sum() > 0),
], ids=["item", "bool_mask", "nonzero", "masked_select", "unique", "equal", "scalar_index", "repeat_tensor",
        "bool"])
def test_guard_refuses_host_reads(op):
    x = torch.tensor([1.0, -2.0, 3.0])
    with pytest.raises(HostSyncError), NoHostSync():
        op(x)


def test_guard_lets_device_work_through():
    x = torch.tensor([1.0, -2.0, 3.0])
    with NoHostSync():
        y = torch.where(x > 0, x, 0.0).cumsum(0)
        z = x.gather(0, x.argmax().view(1))[0] + torch.repeat_interleave(x, 2).sum()
    assert y.tolist() == [1.0, 1.0, 4.0] and float(z) == 3.0 + 4.0


@pytest.mark.slow  # about a minute under the interpreter; the CUDA replay tests check the captured step's syncs
@pytest.mark.skipif(not dsv4.kernels.interpreting(), reason="a CPU model through the kernels: Triton's interpreter")
def test_kernels_make_no_host_sync(monkeypatch, tmp_path):
    """Every Triton kernel's wrapper (DSV4_KERNELS=triton; the interpreter on CPU) in the captured step,
    the decode GEMV on FP8/FP4 bytes included (tiny written in the official quantised layout)."""
    monkeypatch.setenv("DSV4_KERNELS", "triton")
    ckpt = synth(preset("tiny"), tmp_path / "tiny_fp8", seed=4, quant="fp8")
    model = dsv4.load(ckpt, device="cpu", dtype=torch.float32)
    state = model.new_state(40)
    model.check_capturable(state, list(range(1, 8)))
    token = 5
    for _ in range(4):
        token = model.check_capturable(state, [token], SAMPLINGS[0])
    assert state.host_pos == 11


@pytest.mark.skipif(not dsv4.kernels.interpreting(), reason="a CPU model through the kernels: Triton's interpreter")
def test_doors_in_place_make_no_host_sync(monkeypatch, tiny):
    """The doors opened in place (dsv4.kernels.door CONFIG in_place): a short prefill chunk and steps, a refusal
    included, under the guard."""
    from dsv4.kernels import door

    monkeypatch.setenv("DSV4_KERNELS", "triton")
    monkeypatch.setitem(door.CONFIG, "in_place", True)
    state = tiny.new_state(16)
    tiny.check_capturable(state, [3, 1, 4])
    token = tiny.check_capturable(state, [5], SAMPLINGS[0])
    tiny.arm_refusal(1, 0, 31, "moe")
    with pytest.raises(RefusalError, match="layer 1 site moe word 31"):
        tiny.check_capturable(state, [token], SAMPLINGS[0])
    tiny.reset_refusals()
