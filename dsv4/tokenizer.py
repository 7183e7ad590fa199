"""Tokenizer: a thin wrapper over `tokenizers.Tokenizer`, and a small byte-level BPE for synthetic checkpoints.

Real checkpoints ship their own tokenizer.json. Synthetic ones get `build_tokenizer`: DeepSeek's special
tokens at ids 0/1, the 256 byte tokens, then merges learned on the short text below, so every string
round-trips and random-weight models still print something readable-ish.

`TextStream` turns sampled tokens into text deltas of whole characters: the one incremental decoder
of every surface (`generate`, `dsv4 generate | chat`, the server).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

BOS_TOKEN = "<｜begin▁of▁sentence｜>"
EOS_TOKEN = "<｜end▁of▁sentence｜>"
MAX_LEARNED_VOCAB = 2000
MIN_VOCAB = 2 + 256 + 6  # specials + bytes + a few merges

_TRAINING_TEXT = """\
The river starts high in the hills, where snow melts slowly in the spring and feeds a hundred small
streams. By the time it reaches the town it is wide and brown, and the old stone bridge has stood over
it for more than three hundred years. People cross the bridge every morning on their way to work, to
school, to the market in the square. Some of them stop in the middle and look down at the water, and
some of them never look at all.

A good engineer learns to read a system the way a sailor reads the weather. There are signs before
every storm: a queue that grows a little longer each hour, a cache that hits a little less often, a
log line that appears once a day and then twice. None of these is a failure yet. Each of them is a
question, and the work is to ask it early, while the answer is still cheap.

The library opened at nine. The first visitor was an old man who wanted a book about birds, and the
second was a girl who wanted every book about the moon. The librarian found them both, and then she
sat down with a cup of tea and began to sort the returns from the night before: novels and histories,
a cookbook with flour between its pages, a guide to the mountains with a map folded wrong.

Numbers have their own small poetry. One, two, three, four, five, six, seven, eight, nine, ten. The
first prime numbers are 2, 3, 5, 7, 11, 13, 17, 19, 23 and 29. A year has 365 days, or 366 in a leap
year; a day has 24 hours, an hour 60 minutes, and a minute 60 seconds. In 1969 people walked on the
moon for the first time, and in 1989 a wall came down in the middle of a city.

When you write a program, write it for the person who will read it next. That person may be you, six
months from now, tired and in a hurry. Choose names that say what a thing is. Keep functions short
enough to hold in your head. Test the edges: the empty list, the single element, the very large input,
the input that arrives twice. If something can fail, make it fail loudly and early, with a message
that names what went wrong and where.

def greet(name):
    return "Hello, " + name + "!"

for i in range(10):
    print(i, i * i)

The weather today is cloudy with a chance of rain in the afternoon. Temperatures will reach about
eighteen degrees, falling to nine overnight. Tomorrow should be brighter, with sunshine in the morning
and a light wind from the west. Farmers will welcome the rain after a dry month; the reservoirs are
lower than they have been for years, and the fields along the valley have turned from green to gold.

She asked him what he wanted to be when he grew up. He thought about it for a long time. "Someone who
fixes things," he said at last. "Bicycles, clocks, radios. Maybe computers." She smiled and told him
that was a fine thing to be, because the world is full of broken things and not nearly enough people
who know how to mend them.

Questions and answers:
What is the capital of France? Paris.
How many legs does a spider have? Eight.
What colour is the sky on a clear day? Blue.
Why is the sea salty? Rivers carry minerals from the rocks into the sea, and the water evaporates
but the salt stays behind.

Every language has words for water, fire, bread and home. Most have words for mother and father, for
sun and moon, for yesterday and tomorrow. The sounds differ, but the needs behind them are the same,
and a traveller who learns even a few of them will find doors opening that would otherwise stay shut.
"""


def build_tokenizer(vocab_size: int, bos_id: int = 0, eos_id: int = 1) -> _HFTokenizer:
    """A deterministic byte-level BPE with at most `vocab_size` (and at most 2000) tokens."""
    if vocab_size < MIN_VOCAB:
        raise ValueError(f"vocab_size={vocab_size} is too small for a byte-level tokenizer: need >= {MIN_VOCAB}")
    if {bos_id, eos_id} != {0, 1}:
        raise ValueError(f"build_tokenizer places the special tokens at ids 0 and 1; got bos_id={bos_id}, "
                         f"eos_id={eos_id}")
    specials = [BOS_TOKEN, EOS_TOKEN] if bos_id == 0 else [EOS_TOKEN, BOS_TOKEN]
    tok = _HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=min(vocab_size, MAX_LEARNED_VOCAB), min_frequency=1, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(_TRAINING_TEXT.splitlines(keepends=True), trainer)
    assert tok.get_vocab_size() <= vocab_size
    return tok


def save_tokenizer(tok: _HFTokenizer, directory: str | Path, model_max_length: int = 1048576) -> None:
    """Write tokenizer.json and a tokenizer_config.json that HF's PreTrainedTokenizerFast reads."""
    directory = Path(directory)
    tok.save(str(directory / "tokenizer.json"))
    bos, eos = tok.id_to_token(0), tok.id_to_token(1)
    config = {
        "add_bos_token": True, "add_eos_token": False, "bos_token": bos, "eos_token": eos,
        "clean_up_tokenization_spaces": False, "legacy": True, "model_max_length": model_max_length,
        "pad_token": eos, "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": None,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def _chat_templates(path: Path, configured) -> dict[str, str]:
    """The templates HF would use: chat_template.jinja over tokenizer_config.json's `chat_template`
    (a string, or a list of {name, template})."""
    if isinstance(configured, list):
        if not all(isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)
                   for t in configured):
            raise ValueError(f"{path / 'tokenizer_config.json'}: chat_template is a list, but not of "
                             "{name, template} strings")
        templates = {t["name"]: t["template"] for t in configured}
    else:
        templates = {"default": configured} if isinstance(configured, str) else {}
    file = path / "chat_template.jinja"
    if file.is_file():
        try:
            templates["default"] = file.read_text()
        except UnicodeDecodeError as e:
            raise ValueError(f"{file}: not UTF-8 ({_first_line(e)})") from None
    return templates


def _token_string(v) -> str | None:
    # tokenizer_config.json spells a token either as a string or as an AddedToken dict.
    return v.get("content") if isinstance(v, dict) else v


class Tokenizer:
    """encode/decode with a BOS id, an EOS id and tolerance for ids the model has but the tokenizer lacks.

    `chat_templates`: the checkpoint's jinja chat templates by name ("default", maybe "tool_use"),
    empty when it ships none (DeepSeek-V4 ships none: its chat encoding is dsv4/serve/chat.py's).
    """

    def __init__(self, tok: _HFTokenizer, bos_id: int = 0, eos_id: int = 1, model_vocab_size: int | None = None,
                 chat_templates: dict[str, str] | None = None):
        self.tok = tok
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self.model_vocab_size = model_vocab_size
        self.chat_templates = chat_templates or {}

    @property
    def chat_template(self) -> str | None:
        return self.chat_templates.get("default")

    @classmethod
    def from_dir(cls, path: str | Path, model_vocab_size: int | None = None) -> "Tokenizer":
        path = Path(path)
        file = path / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"{file}: no tokenizer.json")
        try:
            tok = _HFTokenizer.from_file(str(file))
        except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception
            raise ValueError(f"{file}: not a readable tokenizer ({_first_line(e)})") from None
        bos_s, eos_s, c = BOS_TOKEN, EOS_TOKEN, {}
        conf = path / "tokenizer_config.json"
        if conf.is_file():
            try:
                c = json.loads(conf.read_text())
            except ValueError as e:
                raise ValueError(f"{conf}: not valid JSON ({_first_line(e)})") from None
            if not isinstance(c, dict):
                raise ValueError(f"{conf}: not a JSON object")
            bos_s = _token_string(c.get("bos_token")) or bos_s
            eos_s = _token_string(c.get("eos_token")) or eos_s
        bos, eos = tok.token_to_id(bos_s), tok.token_to_id(eos_s)
        for role, text, tid in (("bos", bos_s, bos), ("eos", eos_s, eos)):
            if tid is None:  # never a guessed id: generation would stop (or start) on the wrong token
                source = f"{conf}'s {role}_token" if conf.is_file() and c.get(f"{role}_token") else f"the default {role} token"
                raise ValueError(f"{file}: {source} {text!r} is not in its vocabulary")
        return cls(tok, bos, eos, model_vocab_size, _chat_templates(path, c.get("chat_template")))

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        # encode_batch, not encode: it releases the GIL, so a long text stalls no other thread (a server's).
        ids = self.tok.encode_batch([text], add_special_tokens=False)[0].ids
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """Ids the tokenizer does not know (a random model samples any id of its vocab) decode to ""."""
        ids = [int(i) for i in ids]
        top = self.model_vocab_size
        bad = [i for i in ids if i < 0 or (top is not None and i >= top)]
        if bad:
            raise ValueError(f"token ids {bad[:8]} are outside the model vocabulary [0, {top})")
        known = [i for i in ids if i < self.vocab_size]
        return self.tok.decode(known, skip_special_tokens=skip_special_tokens)


class TextStream:
    """Tokens in, text deltas out: characters split across tokens come out whole, and a tail that
    could begin a stop string is held back until it cannot.

    Each token decodes a short window (the tokens since the last whole character, after one
    token of context), not the whole output: a long generation costs O(1) per token. `eos_id`
    None: no token ends the text. One decoder for every surface (generate, chat, the server).
    `skip_special` False: special tokens are text (a chat reply that is parsed needs <think>,
    </think> or DSML pieces even where the vocabulary makes them special).
    vLLM's extras: `stop_ids` end the text after their own (stop_token_ids: their text kept, unless special and
    skipped); `keep_stop` keeps the stop string that ends the text (include_stop_str_in_output); before `min_tokens`
    tokens neither a stop string nor a stop id ends it (min_tokens; the sampler keeps EOS and the stop ids out).
    `stop_reason`: the stop string or stop id that ended it (vLLM's field), None otherwise.
    """

    def __init__(self, tokenizer, eos_id: int | None, stop: Sequence[str] = (), skip_special: bool = True,
                 stop_ids: Sequence[int] = (), keep_stop: bool = False, min_tokens: int = 0):
        self.tokenizer, self.eos_id, self.stop, self.skip_special = tokenizer, eos_id, stop, skip_special
        self.stop_ids, self.keep_stop, self.min_tokens = frozenset(stop_ids), keep_stop, min_tokens
        self.stop_reason: str | int | None = None
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.out: list[int] = []
        self.text = ""  # the whole characters decoded so far
        self.prefix = self.read = 0  # out[prefix:read]: context already in text; out[read:]: not yet
        self.sent = 0  # characters of text released
        self.finish: str | None = None
        self.stop_string: str | None = None  # the stop string that ended the text (the first in it), if one did
        self.n = 0  # tokens sampled (an EOS counts; a token past a stop string does not exist)

    def push(self, token: int) -> str:
        """The text this token releases; sets `finish` to "stop" at EOS or a stop string."""
        self.n += 1
        if token == self.eos_id:
            self.finish = "stop"
            return self._rest()
        self.out.append(token)
        if token in self.stop_ids and self.n >= self.min_tokens:
            self.finish, self.stop_reason = "stop", token
            return self._rest()
        if not self._decode(final=False):
            return ""  # a character still being spelt out by the next token
        hits = [(i, s) for s in self.stop if (i := self.text.find(s, max(0, self.sent - self.hold))) >= 0] \
            if self.n >= self.min_tokens else []
        if hits:
            first, self.stop_string = min(hits)
            self.finish, self.stop_reason = "stop", self.stop_string
            end = first + len(self.stop_string) if self.keep_stop else first
            delta, self.sent = self.text[self.sent:max(self.sent, end)], len(self.text)
            return delta
        safe = len(self.text) - self.hold
        if safe <= self.sent:
            return ""
        delta, self.sent = self.text[self.sent:safe], safe
        return delta

    def end(self, reason: str) -> str:
        """The held-back tail when generation ends for `reason` (length, ...)."""
        self.finish = reason
        return self._rest()

    def _decode(self, final: bool) -> bool:
        """Append the window's new whole characters to text (any at all when final)."""
        before = self.tokenizer.decode(self.out[self.prefix:self.read], self.skip_special)
        now = self.tokenizer.decode(self.out[self.prefix:], self.skip_special)
        if not final and (len(now) <= len(before) or now.endswith("\ufffd")):
            return False
        self.text += now[len(before):]
        self.prefix, self.read = self.read, len(self.out)
        return True

    def _rest(self) -> str:
        self._decode(final=True)
        delta, self.sent = self.text[self.sent:], len(self.text)
        return delta
