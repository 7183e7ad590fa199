import json
import subprocess
import sys

import pytest

from dsv4.tokenizer import BOS_TOKEN, EOS_TOKEN, MIN_VOCAB, Tokenizer, build_tokenizer, save_tokenizer

TEXTS = [
    "Hello, world! The river starts high in the hills.",
    "  leading and trailing spaces  \n\ttabs\nnew lines\n\n",
    "héllo wörld, naïve café — “quotes” ‘and’ …",
    "日本語のテキスト, 中文, 한국어, emoji 🚀🧪👩‍💻, combining e\u0301",
    "",
    "x",
]


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(build_tokenizer(512), model_vocab_size=512)


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok, text):
    ids = tok.encode(text, add_bos=False)
    assert tok.decode(ids) == text
    assert tok.encode(text)[0] == tok.bos_id == 0
    assert tok.decode(tok.encode(text) + [tok.eos_id]) == text  # specials skipped


def test_layout_specials_then_bytes(tok):
    t = tok.tok
    assert t.id_to_token(0) == BOS_TOKEN == "<｜begin▁of▁sentence｜>"
    assert t.id_to_token(1) == EOS_TOKEN == "<｜end▁of▁sentence｜>"
    from tokenizers.pre_tokenizers import ByteLevel

    assert {t.id_to_token(i) for i in range(2, 258)} == set(ByteLevel.alphabet())
    assert tok.vocab_size <= 512 and tok.eos_id == 1


def test_vocab_bounds():
    assert build_tokenizer(MIN_VOCAB).get_vocab_size() <= MIN_VOCAB
    assert build_tokenizer(300).get_vocab_size() <= 300
    big = build_tokenizer(129280).get_vocab_size()
    assert 1000 < big <= 2000
    with pytest.raises(ValueError, match="vocab_size"):
        build_tokenizer(258)


def test_deterministic_across_processes():
    code = "from dsv4.tokenizer import build_tokenizer; import sys; sys.stdout.write(build_tokenizer(700).to_str())"
    outs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": str(s), "PATH": ""}).stdout for s in (1, 2)]
    assert outs[0] == outs[1] == build_tokenizer(700).to_str()


def test_decode_ids_beyond_tokenizer():
    tok = Tokenizer(build_tokenizer(400), model_vocab_size=512)
    hello = tok.encode("hi", add_bos=False)
    assert tok.vocab_size <= 400
    assert tok.decode([*hello, tok.vocab_size, 511]) == "hi"
    assert tok.decode([511]) == ""
    with pytest.raises(ValueError, match="512"):
        tok.decode([512])
    assert Tokenizer(tok.tok).decode([100000]) == ""  # no model vocab given: unknown ids are just dropped


def test_save_and_from_dir(tmp_path, tok):
    save_tokenizer(tok.tok, tmp_path, model_max_length=4096)
    conf = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert conf["bos_token"] == BOS_TOKEN and conf["eos_token"] == EOS_TOKEN
    assert conf["tokenizer_class"] == "PreTrainedTokenizerFast" and conf["model_max_length"] == 4096
    t2 = Tokenizer.from_dir(tmp_path)
    assert (t2.bos_id, t2.eos_id, t2.vocab_size) == (0, 1, tok.vocab_size)
    assert t2.encode(TEXTS[3]) == tok.encode(TEXTS[3])
    # The bos/eos strings come from tokenizer_config.json when it names them.
    conf["bos_token"], conf["eos_token"] = {"content": EOS_TOKEN}, BOS_TOKEN
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(conf))
    t3 = Tokenizer.from_dir(tmp_path)
    assert (t3.bos_id, t3.eos_id) == (1, 0)
    # A named token the vocabulary lacks is an error naming it, never a guessed id.
    conf["eos_token"] = "<|not-in-vocab|>"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(conf))
    with pytest.raises(ValueError, match=r"eos_token '<\|not-in-vocab\|>' is not in its vocabulary"):
        Tokenizer.from_dir(tmp_path)


def test_hf_reads_it(tmp_path, tok):
    transformers = pytest.importorskip("transformers")
    save_tokenizer(tok.tok, tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = TEXTS[2]
    assert hf.encode(text, add_special_tokens=False) == tok.encode(text, add_bos=False)
    assert (hf.bos_token_id, hf.eos_token_id) == (0, 1)


class _Scripted:
    """A DecodeModel stand-in whose `step` samples a fixed script of tokens."""

    def __init__(self, tok, script):
        from types import SimpleNamespace

        self.tokenizer, self.script = tok, list(script)
        self.cfg = SimpleNamespace(eos_token_id=tok.eos_id)
        self.device = SimpleNamespace(type="cpu")  # DecodeModel's device: on CPU generation runs model.step

    def new_state(self, capacity):
        from types import SimpleNamespace

        return SimpleNamespace(host_pos=0, capacity=capacity)

    def prefill(self, state, ids):
        state.host_pos = len(ids)

    def step(self, state, token, sampling=None):
        state.host_pos += 1
        return self.script.pop(0)


def test_text_stream_emits_split_characters_whole(tok):
    """'日本語' is nine byte tokens here: each character comes out once, whole, never as U+FFFD."""
    from dsv4.tokenizer import TextStream

    ids = tok.encode("日本語", add_bos=False)
    assert len(ids) > 3  # the tokenizer splits the characters
    stream = TextStream(tok, tok.eos_id)
    pieces = [stream.push(t) for t in ids] + [stream.end("length")]
    assert [p for p in pieces if p] == ["日", "本", "語"]


@pytest.mark.parametrize("text", ["日本語", "a 🚀 b é", "plain"])
def test_generate_decodes_incrementally(tok, text):
    from dsv4.generation import generate

    ids = tok.encode(text, add_bos=False)
    pieces = list(generate(_Scripted(tok, ids + [tok.eos_id]), [0, 5], max_tokens=len(ids) + 4))
    assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)
    # without the EOS stop: the script runs to max_tokens, the EOS decodes to nothing
    assert "".join(generate(_Scripted(tok, ids + [tok.eos_id]), [0], len(ids) + 1, stop_at_eos=False)) == text


def test_damaged_tokenizer_files_are_named(tok, tmp_path):
    save_tokenizer(tok.tok, tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{broken")
    with pytest.raises(ValueError, match=f"^{tmp_path / 'tokenizer_config.json'}: not valid JSON"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": [{"name": "default"}]}))
    with pytest.raises(ValueError, match=f"^{tmp_path / 'tokenizer_config.json'}: chat_template is a list, but"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{}")
    (tmp_path / "chat_template.jinja").write_bytes(b"\xff{{ x }}")
    with pytest.raises(ValueError, match=f"^{tmp_path / 'chat_template.jinja'}: not UTF-8"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_bytes(b"\x00\xff garbage")
    with pytest.raises(ValueError, match=f"^{tmp_path / 'tokenizer.json'}: not a readable tokenizer"):
        Tokenizer.from_dir(tmp_path)
