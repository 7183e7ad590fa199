"""The MTP layer (DeepSeek-V4's multi-token prediction, `mtp.0.*`) and speculative decoding drafted by it.

The layer's math against a reference built from HF transformers 5.17.0's own decoder layer and the reference's
MTPBlock formula (dsv4.oracle.hf_mtp_logits): max |logits - ref| / max |ref| <= 1e-4 at every position (measured
~4e-7), on a plain and an FP8 checkpoint written with its MTP layer. Then the drafter's wiring: with greedy
sampling each draft Model.verify_draft returns is the argmax of the reference's MTP logits at its position, over
steps whose drafts are right (the layer keeps every row) and wrong (it takes rows back); the stream is the plain one
whatever the layer drafts (random weights draft badly: correctness never depends on it); a refusal in the MTP
layer's collectives changes nothing, its window included.
"""

from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4 import RefusalError, SamplingParams
from dsv4 import speculative as spec
from dsv4.checkpoint.load import CheckpointError
from dsv4.checkpoint.synth import synth
from dsv4.config import preset

TOL = 1e-4
IDS = [5, 9, 3, 7, 5, 9, 3, 7, 5, 9, 3, 7, 1, 2, 44, 12, 9, 100, 3, 3, 8]  # past the tiny window (8) twice


@pytest.fixture(scope="module")
def model():
    return dsv4.load("tiny", device="cpu", mtp=True)


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def mtp_logits(model, ids):
    """The MTP layer's logits at each position t < len(ids) - 1 from the main model's decode of ids (its window
    filled position by position)."""
    from dsv4.model.commit import Undo

    tf, state, out = model.transformer, model.new_state(len(ids) + 1), []
    with torch.inference_mode():
        for t in range(len(ids) - 1):
            model.decode(state, ids[t])
            tf.comm.begin_step()
            _, logits = tf.mtp_rows([state.ahead(-1)], state.hidden[None], torch.tensor([ids[t + 1]]), Undo())
            tf.comm.end_step()
            out.append(logits[0].float())
    return torch.stack(out)


@pytest.mark.parametrize("quant", ["none", "fp8"])
def test_mtp_layer_matches_the_reference(quant, tmp_path):
    pytest.importorskip("transformers")
    from dsv4.oracle import hf_mtp_logits

    path = synth(preset("tiny"), tmp_path / "ckpt", seed=3, quant=quant, mtp=True)
    model = dsv4.load(path, device="cpu", dtype=torch.float32, mtp=True)
    ref = hf_mtp_logits(model, IDS)
    got = mtp_logits(model, IDS)
    errors = [rel(got[t], ref[t]) for t in range(len(IDS) - 1)]
    assert max(errors) <= TOL, f"position {errors.index(max(errors))}: {max(errors):.3g}"


def test_checkpoints_with_and_without_the_mtp_layer(tmp_path):
    with_mtp = synth(preset("tiny"), tmp_path / "with", seed=3, mtp=True)
    without = synth(preset("tiny"), tmp_path / "without", seed=3)
    a = dsv4.load(with_mtp, device="cpu")  # the MTP layer left on disk
    b = dsv4.load(without, device="cpu")
    assert not a.transformer.mtp and not b.transformer.mtp
    assert list(a.sample_tokens(IDS[:6], 8)) == list(b.sample_tokens(IDS[:6], 8))  # the main model's same bytes
    with pytest.raises(CheckpointError, match="no MTP layer"):
        dsv4.load(without, device="cpu", mtp=True)
    transformers = pytest.importorskip("transformers")
    hf = transformers.DeepseekV4ForCausalLM.from_pretrained(with_mtp, dtype=torch.float32)  # HF skips mtp.*
    assert hf.config.num_hidden_layers == preset("tiny").num_hidden_layers


def test_greedy_drafts_are_the_layers_argmax(model):
    """Every draft verify_draft returns, drafted after right drafts (all rows kept) or wrong ones (rows taken
    back), is the reference's argmax at its position: the layer saw exactly the kept rows."""
    greedy = SamplingParams.greedy()
    stream = list(model.sample_tokens([IDS[0]], len(IDS) + 4, greedy))
    ids = [IDS[0], *stream]
    ref = mtp_logits(model, ids).argmax(-1)  # ref[t]: the layer at t drafts the token at t + 2
    state, token, done, drafted = model.new_state(64), ids[0], 0, 0
    while done + 3 <= len(stream):
        right = done % 2 == 0
        drafts = stream[done:done + 2] if right else [(t + 1) % model.cfg.vocab_size for t in stream[done:done + 2]]
        got, nxt = model.verify_draft(state, token, drafts, greedy, k=1)
        assert list(got) == stream[done:done + len(got)] and len(got) == (3 if right else 1)
        done += len(got)
        token = got[-1]
        # the layer at position done - 1 (the last kept row: h there, the token drawn there) drafts position done + 1
        assert nxt == (int(ref[done - 1]),), f"after {done} tokens"
        drafted += 1
    assert drafted >= 4


def test_a_prompt_fills_the_mtp_window(model):
    """prefill_drafted: the main state's bytes are prefill's, and the MTP layer's window holds the prompt's last
    positions, so its draft for the first step and the drafts after it are the reference's argmax there too (the
    window's rows computed as a chunk: within tolerance of the row-by-row ones, the argmax the same)."""
    greedy, prompt = SamplingParams.greedy(), IDS
    stream = list(model.sample_tokens(prompt, 6, greedy))
    ref = mtp_logits(model, [*prompt, *stream]).argmax(-1)
    plain, drafted = model.new_state(64), model.new_state(64)
    model.prefill(plain, prompt[:-1])
    first = model.prefill_drafted(drafted, prompt[:-1], prompt[-1], sampling=greedy, k=1)
    assert drafted.digest() == plain.digest() and drafted.mtp_caches[0].win.abs().sum() > 0
    assert first == (int(ref[len(prompt) - 2]),)  # the last prompt position's row drafts the first step's draft
    token, done = prompt[-1], 0
    for _ in range(3):
        got, nxt = model.verify_draft(drafted, token, [], greedy, k=1)
        done, token = done + 1, got[-1]
        assert got == (stream[done - 1],) and nxt == (int(ref[len(prompt) - 2 + done]),), f"after {done} tokens"


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=1.0, seed=3), SamplingParams.greedy(),
                                      SamplingParams(temperature=0.8, top_p=0.9, seed=4)], ids=["t1", "greedy", "p"])
@pytest.mark.parametrize("k", [1, 3])
def test_mtp_drafted_stream_is_the_plain_stream(model, sampling, k):
    plain = list(model.sample_tokens(IDS, 30, sampling))
    tally = spec.Tally()
    got = list(spec.sample_tokens(model, IDS, 30, sampling, drafter=spec.MtpDrafter(), k=k, tally=tally))
    assert got == plain and tally.tokens == 30 and tally.proposed > 0


def test_a_refusal_in_the_mtp_layer_changes_nothing(model):
    state = model.new_state(64)
    model.prefill(state, IDS[:-1])
    got, drafts = model.verify_draft(state, IDS[-1], [], k=2)
    before = (state.digest(), state.mtp_caches[0].win.clone(), state.host_pos)
    model.arm_refusal(model.cfg.num_hidden_layers, 0, 9, "moe")  # the MTP layer's door
    try:
        with pytest.raises(RefusalError, match=f"layer {model.cfg.num_hidden_layers} site moe"):
            model.verify_draft(state, got[-1], list(drafts), k=2)
    finally:
        model.reset_refusals()
    assert state.digest() == before[0] and torch.equal(state.mtp_caches[0].win, before[1])
    assert state.host_pos == before[2] and state.quarantine is not None


def test_bad_mtp_use_is_refused_naming_it(model):
    plain = dsv4.load("tiny", device="cpu")
    with pytest.raises(ValueError, match="no MTP layer"):
        plain.verify_draft(plain.new_state(8), 1, [])
    state = model.new_state(16)
    with pytest.raises(ValueError, match="k 0"):
        model.verify_draft(state, 1, [], k=0)
    with pytest.raises(ValueError, match=f"k {model.cfg.sliding_window}"):
        model.verify_draft(state, 1, [], k=model.cfg.sliding_window)
    state.mtp_caches = []
    with pytest.raises(ValueError, match="no MTP window"):
        model.verify_draft(state, 1, [])
    assert state.host_pos == 0


def test_two_ranks_mtp_drafts_agree_and_keep_the_stream(tmp_path):
    path = synth(preset("tiny"), tmp_path / "ckpt", seed=5, mtp=True)
    one = dsv4.load(path, device="cpu", dtype=torch.float32, mtp=True)
    two = dsv4.load(path, device="cpu", dtype=torch.float32, ranks=2, mtp=True)
    try:
        sampling = SamplingParams(temperature=1.0, seed=8)
        plain = list(two.sample_tokens(IDS, 16, sampling))
        got = list(spec.sample_tokens(two, IDS, 16, sampling, drafter=spec.MtpDrafter(), k=2))
        assert got == plain
        state = two.new_state(64)
        two.prefill(state, IDS[:-1])
        drafted = two.verify_draft(state, IDS[-1], [], sampling, k=2)  # "agree": every rank drafted the same
        alone = one.new_state(64)
        one.prefill(alone, IDS[:-1])
        assert one.verify_draft(alone, IDS[-1], [], sampling, k=2)[0] == drafted[0]
    finally:
        two.close()


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=1.0, seed=11), SamplingParams.greedy()],
                         ids=["t1", "greedy"])
def test_a_layer_that_agrees_is_accepted_every_time(sampling):
    """With the shared head zeroed every logit is 0, the model's and the MTP layer's alike: the same uniform
    distribution, so a draft drawn with the sampler's key at its position is the very token the model draws there
    (temperature 1: the same u over the same CDF; greedy: token 0). Every draft is then accepted: k + 1 tokens a
    verify step, the recursive drafts included, and the stream is still the plain one."""
    model = dsv4.load("tiny", device="cpu", mtp=True)
    model.transformer.head_w.data.zero_()  # (bf16 storage: the dequantised weight is 0 too)
    plain = list(model.sample_tokens(IDS, 24, sampling))
    for k in (1, 3):
        tally = spec.Tally()
        got = list(spec.sample_tokens(model, IDS, 24, sampling, drafter=spec.MtpDrafter(), k=k, tally=tally))
        assert got == plain
        assert tally.acceptance == 1.0 and tally.steps == -(-24 // (k + 1)), tally


def test_a_grouped_prefill_fills_each_window_as_alone(model):
    """prefill_batch_drafted (the server's prefill with --speculate mtp): each state's bytes are prefill_batch's and
    its MTP window is the one prefill_drafted leaves for the same chunk; a prompt in two chunks leaves the window
    of its last positions (the second chunk's, and the first's within the window)."""
    prompts = [IDS[:7], [9, 8, 7, 6, 5, 4, 3]]
    grouped = [model.new_state(32) for _ in prompts]
    model.prefill_batch_drafted(grouped, [p[:-1] for p in prompts], [p[-1] for p in prompts])
    for state, p in zip(grouped, prompts):
        alone, plain = model.new_state(32), model.new_state(32)
        model.prefill_drafted(alone, p[:-1], p[-1])
        model.prefill(plain, p[:-1], chunk_size=len(p) - 1)
        assert state.digest() == plain.digest()
        assert torch.equal(state.mtp_caches[0].win, alone.mtp_caches[0].win)
    chunked = model.new_state(32)
    model.prefill_batch_drafted([chunked], [IDS[:4]], [IDS[4]])
    model.prefill_batch_drafted([chunked], [IDS[4:12]], [IDS[12]])
    assert chunked.mtp_caches[0].win.abs().sum(-1).gt(0).all()  # every slot of the window written
