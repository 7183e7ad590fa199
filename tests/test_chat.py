"""Chat for DeepSeek-V4 (dsv4/serve/chat.py): the prompt and the reply.

Checked: golden prompts of DeepSeek-V4's encoding for each message kind (system, developer, user,
assistant with and without reasoning, tool calls, tool results, tools, thinking), the refusals
naming their field; a chat template shipped in a synthetic checkpoint (tokenizer_config.json or
chat_template.jinja) is the one rendered, as HF renders it, and a served request's prompt is its
rendering; the output parser gives the same reasoning, content and tool calls at every split of
the text into deltas, releases malformed markup as content and loses no text; the server's reply
builder, fed a scripted token stream, answers what the openai client reads as tool_calls and
reasoning_content, streamed and not, each of n choices parsed on its own; the openai client's tools
API against a tiny server renders the prompt `chat.prompt` renders, and /tokenize gives its ids.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
import torch
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion

import dsv4
import serving
from dsv4.checkpoint import synth
from dsv4.config import preset
from dsv4.serve import Server, chat
from dsv4.serve.protocol import parse
from dsv4.serve.server import _Reply
from dsv4.tokenizer import Tokenizer

B, E = chat.BOS, chat.EOS
NAME = "tiny-chat"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                         "arguments": '{"city": "Paris", "days": 2}'}}

# The tools section exactly as DeepSeek-V4's reference encoder writes it for [WEATHER].
TOOLS_TEXT = """## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<｜DSML｜tool_calls>" block like the following:

<｜DSML｜tool_calls>
<｜DSML｜invoke name="$TOOL_NAME">
<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>
...
</｜DSML｜invoke>
<｜DSML｜invoke name="$TOOL_NAME2">
...
</｜DSML｜invoke>
</｜DSML｜tool_calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.

Otherwise, output directly after </think> with tool calls or final response.

### Available Tool Schemas

{"name": "get_weather", "description": "Weather of a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
"""  # noqa: E501

CALL_TEXT = ('\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
             '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
             '<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n'
             '</｜DSML｜invoke>\n</｜DSML｜tool_calls>')


def user(text):
    return {"role": "user", "content": text}


def assistant(text, reasoning=None, calls=None):
    out = {"role": "assistant", "content": text}
    if reasoning is not None:
        out["reasoning_content"] = reasoning
    if calls is not None:
        out["tool_calls"] = calls
    return out


def tool(call_id, text):
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def call(call_id, name="get_weather", arguments='{"city": "Paris"}'):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# ---- the encoding -------------------------------------------------------------------------------

@pytest.mark.parametrize("messages,tools,thinking,expected", [
    pytest.param([{"role": "system", "content": "be brief"}, user("hi")], None, False,
                 B + "be brief<｜User｜>hi<｜Assistant｜></think>", id="system-user"),
    pytest.param([user("hi"), assistant("hello"), user([{"type": "text", "text": "again"}])], None, False,
                 B + "<｜User｜>hi<｜Assistant｜></think>hello" + E + "<｜User｜>again<｜Assistant｜></think>",
                 id="chat-turns"),
    pytest.param([user("hi"), assistant("hello", reasoning="greet"), user("2+2?")], None, True,
                 B + "<｜User｜>hi<｜Assistant｜></think>hello" + E + "<｜User｜>2+2?<｜Assistant｜><think>",
                 id="thinking-drops-old-reasoning"),
    pytest.param([user("2+2?"), assistant("4", reasoning="add")], None, True,
                 B + "<｜User｜>2+2?<｜Assistant｜><think>add</think>4" + E + "<｜Assistant｜><think>",
                 id="thinking-keeps-last-reasoning"),
    pytest.param([{"role": "developer", "content": "rules"}, user("hi")], None, False,
                 B + "rules<｜User｜>hi<｜Assistant｜></think>", id="developer-is-system"),
    pytest.param([user("a"), user("b")], None, False, B + "<｜User｜>a\n\nb<｜Assistant｜></think>",
                 id="users-merge"),
    pytest.param([user("hi"), assistant("hello")], None, False,
                 B + "<｜User｜>hi<｜Assistant｜></think>hello" + E + "<｜Assistant｜></think>",
                 id="ends-in-assistant"),
    pytest.param([user("weather?")], [WEATHER], False,
                 B + "\n\n" + TOOLS_TEXT + "<｜User｜>weather?<｜Assistant｜></think>", id="tools-no-system"),
    pytest.param([{"role": "system", "content": "sys"}, user("weather?"), assistant(None, "look it up", [CALL]),
                  tool("call_1", "sunny"), assistant("Sunny.", "got it"), user("thanks")], [WEATHER], True,
                 B + "sys\n\n" + TOOLS_TEXT + "<｜User｜>weather?<｜Assistant｜><think>look it up</think>" + CALL_TEXT
                 + E + "<｜User｜><tool_result>sunny</tool_result><｜Assistant｜><think>got it</think>Sunny." + E
                 + "<｜User｜>thanks<｜Assistant｜><think>", id="tool-loop-thinking"),
    pytest.param([user("q"), assistant("", calls=[CALL]), tool("call_1", "sunny")], None, False,
                 B + "<｜User｜>q<｜Assistant｜></think>" + CALL_TEXT + E
                 + "<｜User｜><tool_result>sunny</tool_result><｜Assistant｜></think>", id="tool-loop-chat"),
    pytest.param([user("q"), assistant(None, calls=[call("a"), call("b", "f", "[1]")]), tool("b", "B"), tool("a", "A"),
                  user("and?")], None, False,
                 B + "<｜User｜>q<｜Assistant｜></think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
                 "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
                 "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"arguments\" string=\"true\">[1]"
                 "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>" + E
                 + "<｜User｜><tool_result>A</tool_result>\n\n<tool_result>B</tool_result>\n\nand?<｜Assistant｜></think>",
                 id="results-in-call-order"),
])
def test_golden_prompts(messages, tools, thinking, expected):
    assert chat.render(messages, tools=tools, thinking=thinking) == expected


@pytest.mark.parametrize("messages,tools,param,words", [
    ([user("hi"), {"role": "system", "content": "late"}], None, "messages[1].role", "come first"),
    ([user("q"), assistant(None, calls=[call("a")]), tool("b", "x")], None, "messages[2].tool_call_id", "'b'"),
    ([user("q"), tool("a", "x")], None, "messages[1].tool_call_id", "not the id"),
    ([{"role": "tool", "content": "x"}], None, "messages[0]", "tool_call_id: required"),
    ([{"role": "user", "content": None}], None, "messages[0].content", "null only for an assistant"),
    ([{"role": "user", "content": "x", "tool_calls": [CALL]}], None, "messages[0]", "only on an assistant"),
    ([{"role": "assistant", "content": "x", "tool_calls": [{"id": "a", "type": "function"}]}], None,
     "messages[0].tool_calls[0].function", "Field required"),
    ([{"role": "robot", "content": "x"}], None, "messages[0].role", "'developer'"),
    ([user("x")], [{"type": "function", "function": {"name": "f", "strict": "maybe"}}], "tools[0].function.strict",
     "boolean"),
    ([user("x")], [{"type": "web_search"}], "tools[0].type", "function"),
    ([user("x")], [{"type": "function", "function": {"name": ""}}], "tools[0].function.name", "non-empty"),
])
def test_refusals_name_the_field(messages, tools, param, words):
    with pytest.raises(chat.ChatError) as e:
        chat.render(messages, tools=tools)
    assert e.value.param == param and e.value.message.startswith(param) and words in e.value.message, e.value.message


MAX_EFFORT = ("Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough in your "
              "thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing "
              "your logic against all potential paths, edge cases, and adversarial scenarios.\nExplicitly write out your "
              "entire deliberation process, documenting every intermediate step, considered alternative, and rejected "
              "hypothesis to ensure absolutely no assumption is left unchecked.\n\n")


def test_maximum_effort_leads_the_first_message():
    """The reference encoder's reasoning_effort 'max': its effort prompt at index 0, thinking mode only."""
    msgs = [{"role": "system", "content": "S"}, user("q")]
    assert chat.render(msgs, thinking=True, effort_max=True) == B + MAX_EFFORT + "S<｜User｜>q<｜Assistant｜><think>"
    assert chat.render([user("q")], thinking=True, effort_max=True) == B + MAX_EFFORT + "<｜User｜>q<｜Assistant｜><think>"
    assert chat.render(msgs, thinking=False, effort_max=True) == chat.render(msgs)  # chat mode: no effort prompt


@pytest.mark.parametrize("kwargs,thinking,effort,expected", [
    (None, None, None, (False, False)), (None, None, "none", (False, False)), (None, None, "high", (True, False)),
    (None, None, "max", (True, True)), (None, None, "xhigh", (True, True)),
    ({"thinking": True}, None, "high", (True, False)), ({"reasoning_effort": "max"}, None, None, (True, True)),
    ({"enable_thinking": True}, None, "max", (True, True)), (None, chat.Thinking(type="disabled"), "none", (False, False)),
])
def test_reasoning_effort_is_the_thinking_mode_and_its_effort(kwargs, thinking, effort, expected):
    assert chat.thinking_switch(kwargs, thinking, effort) == expected


@pytest.mark.parametrize("kwargs,thinking,effort,words", [
    ({"thinking": True}, None, "none", "'none' with thinking enabled"),
    (None, chat.Thinking(type="disabled"), "max", "'max' with thinking disabled"),
    ({"reasoning_effort": "high"}, None, "max", "disagree"),
])
def test_reasoning_effort_against_the_switches(kwargs, thinking, effort, words):
    with pytest.raises(chat.ChatError, match=words) as e:
        chat.thinking_switch(kwargs, thinking, effort)
    assert e.value.param == "reasoning_effort"


def test_history_from_the_openai_client_is_taken_back():
    """A message as the client returns it (`model_dump()`: null refusal, audio, ...) renders as sent."""
    dumped = {"role": "assistant", "content": "hello", "refusal": None, "annotations": None, "audio": None,
              "function_call": None, "tool_calls": None, "name": None}
    assert chat.render([user("hi"), dumped, user("x")]) == chat.render([user("hi"), assistant("hello"), user("x")])
    with pytest.raises(chat.ChatError, match=r"messages\[1\]\.refusal"):
        chat.render([user("hi"), {**dumped, "refusal": "no"}])


def test_tool_calls_round_trip():
    """What the encoding writes for a history's tool calls, the parser reads back as those calls."""
    calls = [call("a", "f", json.dumps({"s": "x<y", "n": 1.5, "o": {"k": [True, None]}, "u": "日本"})),
             call("b", "g", "{}")]
    text = chat.encode_tool_calls([chat.ToolCall.model_validate(c) for c in calls])
    reply = chat.ChatReply(chat.ReplyFormat(tools=True))
    reply.push("before" + text)
    reply.end()
    message = reply.message()
    assert message["content"] == "before"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == \
        [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


# ---- the output parser --------------------------------------------------------------------------

INVOKE = ('<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
          '<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>')
ARGS = '{"city": "Paris", "days": 2}'
BLOCK = "\n\n<｜DSML｜tool_calls>\n" + INVOKE + "\n</｜DSML｜tool_calls>"
BAD_PARAM = '<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="x">1</｜DSML｜parameter>\n</｜DSML｜invoke>'

# (starts in reasoning, parse tools, text, (reasoning, content, [(name, arguments)]))
PARSES = [
    (True, True, "I should look.</think>Let me check." + BLOCK, ("I should look.", "Let me check.",
                                                                 [("get_weather", ARGS)])),
    (True, True, "only thinking, cut short", ("only thinking, cut short", "", [])),
    (False, True, "<think>r</think>answer", ("r", "answer", [])),
    (False, True, "<thinking> is a word", ("", "<thinking> is a word", [])),
    (False, True, "a\n\nb <｜DSML｜tool_ and <｜DSML｜x", ("", "a\n\nb <｜DSML｜tool_ and <｜DSML｜x", [])),
    (False, True, BLOCK.strip(), ("", "", [("get_weather", ARGS)])),
    (False, True, "c" + BLOCK + "\n", ("", "c", [("get_weather", ARGS)])),
    (False, True, "c" + BLOCK + "\nmore", ("", "c\nmore", [("get_weather", ARGS)])),
    (False, True, "two\n\n<｜DSML｜tool_calls>\n" + INVOKE + "\n" + INVOKE.replace("Paris", "Rome") + "\n</｜DSML｜tool_calls>",
     ("", "two", [("get_weather", ARGS), ("get_weather", ARGS.replace("Paris", "Rome"))])),
    (False, True, '<｜DSML｜tool_calls><｜DSML｜invoke name="f"></｜DSML｜invoke><｜DSML｜invoke name="g">'
     '<｜DSML｜parameter name="v" string="false">not json</｜DSML｜parameter><｜DSML｜parameter name="w" '
     'string="false">{"a": [1, "日本"]}</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜tool_calls>',
     ("", "", [("f", "{}"), ("g", '{"v": "not json", "w": {"a": [1, "日本"]}}')])),
    # malformed: the text no tool call took is content, whole
    (False, True, "c\n\n<｜DSML｜tool_calls>\n" + BAD_PARAM + "\n</｜DSML｜tool_calls>",
     ("", "c\n\n<｜DSML｜tool_calls>\n" + BAD_PARAM + "\n</｜DSML｜tool_calls>", [])),
    (False, True, "c\n\n<｜DSML｜tool_calls>\n" + INVOKE + "\n" + BAD_PARAM + "\n</｜DSML｜tool_calls>",
     ("", "c\n" + BAD_PARAM + "\n</｜DSML｜tool_calls>", [("get_weather", ARGS)])),
    (False, True, "c\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜param",
     ("", "c\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜param", [])),
    (False, True, "c<｜DSML｜tool_calls>junk", ("", "c<｜DSML｜tool_calls>junk", [])),
    (False, True, INVOKE + BLOCK, ("", INVOKE, [("get_weather", ARGS)])),  # an invoke outside a block is text
    (False, False, "c" + BLOCK, ("", "c" + BLOCK, [])),  # no tools asked for: markup is text
]


def run_parser(reasoning, tools, pieces):
    parser, got = chat.OutputParser(reasoning, tools), chat.Delta()
    for d in [parser.feed(p) for p in pieces] + [parser.finish()]:
        got.reasoning += d.reasoning
        got.content += d.content
        got.tool_calls += d.tool_calls
    assert [c["index"] for c in got.tool_calls] == list(range(len(got.tool_calls)))
    assert [c["id"] for c in got.tool_calls] == [c["id"] for c in parser.tool_calls]
    return got.reasoning, got.content, [(c["function"]["name"], c["function"]["arguments"]) for c in got.tool_calls]


@pytest.mark.parametrize("reasoning,tools,text,expected", PARSES)
def test_parser_at_every_split(reasoning, tools, text, expected):
    assert run_parser(reasoning, tools, [text]) == expected
    assert run_parser(reasoning, tools, list(text)) == expected  # one character per delta
    for i in range(len(text) + 1):
        assert run_parser(reasoning, tools, [text[:i], text[i:]]) == expected, i
    for i in range(0, len(text), 7):
        assert run_parser(reasoning, tools, [text[:i], text[i:i + 5], text[i + 5:]]) == expected, i


def test_parser_releases_content_before_markup_resolves():
    """Text that cannot begin the markup goes out at once; a tail that could is held, then released."""
    parser = chat.OutputParser(tools=True)
    assert parser.feed("Hello world").content == "Hello world"
    assert parser.feed("\n\n<｜DS").content == ""
    assert parser.feed("ML｜x").content == "\n\n<｜DSML｜x"
    thinking = chat.OutputParser(reasoning=True)
    assert thinking.feed("step one</thi").reasoning == "step one"
    d = thinking.feed("nk>done")
    assert (d.reasoning, d.content) == ("", "done")


# ---- a checkpoint's chat template ---------------------------------------------------------------

TEMPLATE = (
    "{{ bos_token }}{% if tools %}[tools: {{ tools | map(attribute='function') | map(attribute='name') | join(',') }}]"
    "{% endif %}{% for m in messages %}"
    "{% if m.role == 'system' %}{{ m.content }}\n{% elif m.role == 'user' %}<u>{{ m.content }}"
    "{% elif m.role == 'assistant' %}<a>{% generation %}{{ m.content or '' }}{% endgeneration %}"
    "{% for c in m.tool_calls or [] %}<call {{ c.function.name }} {{ c.function.arguments | tojson }}>{% endfor %}"
    "{{ eos_token }}{% elif m.role == 'tool' %}<r {{ m.tool_call_id }}>{{ m.content }}"
    "{% else %}{{ raise_exception('no role ' + m.role) }}{% endif %}{% endfor %}"
    "{% if messages[0].role == 'assistant' %}{{ raise_exception('an assistant cannot speak first') }}{% endif %}"
    "{% if add_generation_prompt %}<a>{% if greeting %}{{ greeting }} {% endif %}"
    "{% if thinking %}<think>{% endif %}{% endif %}")


@pytest.fixture(scope="module")
def templated(tmp_path_factory):
    """A synthetic tiny checkpoint whose tokenizer_config.json ships TEMPLATE."""
    path = synth(preset("tiny"), tmp_path_factory.mktemp("templated") / "ckpt", seed=1)
    conf = path / "tokenizer_config.json"
    conf.write_text(json.dumps({**json.loads(conf.read_text()), "chat_template": TEMPLATE}, ensure_ascii=False))
    return path


def test_template_is_read_from_the_checkpoint(templated, tmp_path):
    assert Tokenizer.from_dir(templated).chat_template == TEMPLATE
    other = tmp_path / "other"
    other.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (other / name).write_bytes((templated / name).read_bytes())
    (other / "chat_template.jinja").write_text("{{ bos_token }}jinja file")
    assert Tokenizer.from_dir(other).chat_template == "{{ bos_token }}jinja file"  # as HF: the file wins
    conf = other / "tokenizer_config.json"
    conf.write_text(json.dumps({**json.loads(conf.read_text()), "chat_template": [
        {"name": "default", "template": "plain"}, {"name": "tool_use", "template": "with tools"}]}))
    (other / "chat_template.jinja").unlink()
    tok = Tokenizer.from_dir(other)
    assert (chat.template_for(tok, False), chat.template_for(tok, True)) == ("plain", "with tools")


def test_template_renders_as_hf_does(templated):
    tok = Tokenizer.from_dir(templated)
    messages = [{"role": "system", "content": "sys"}, user("weather?"),
                assistant(None, calls=[call("a", arguments='{"city": "a<b"}')]), tool("a", "sunny")]
    text = chat.render(messages, tools=[WEATHER], thinking=True, template=tok.chat_template)
    assert text == (B + '[tools: get_weather]sys\n<u>weather?<a><call get_weather {"city": "a<b"}>' + E
                    + "<r a>sunny<a><think>")
    ids, fmt = chat.prompt(tok, messages, [WEATHER], "auto", {"thinking": True, "greeting": "hey"})
    assert ids == chat.prompt_ids(tok, text.replace("<a><think>", "<a>hey <think>"))
    assert ids[0] == tok.bos_id and ids.count(tok.bos_id) == 1
    assert fmt == chat.ReplyFormat(reasoning=True, tools=True, thinking=True)
    with pytest.raises(chat.ChatError, match="an assistant cannot speak first"):
        chat.render([assistant("x")], template=tok.chat_template)

    # HF's own renderer agrees (given arguments as a mapping, which is how HF templates take them)
    from transformers import PreTrainedTokenizerFast

    hf_messages = json.loads(json.dumps(messages))
    hf_messages[2]["tool_calls"][0]["function"]["arguments"] = {"city": "a<b"}
    hf = PreTrainedTokenizerFast.from_pretrained(str(templated))
    assert hf.apply_chat_template(hf_messages, tools=[WEATHER], thinking=True, tokenize=False,
                                  add_generation_prompt=True) == text


def test_encoding_refuses_template_variables_it_lacks(model):
    with pytest.raises(chat.ChatError) as e:
        chat.prompt(model.tokenizer, [user("x")], template_kwargs={"greeting": "hey"})
    assert e.value.param == "chat_template_kwargs.greeting"


# ---- the server ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model():
    return dsv4.load("tiny", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def server(model):
    with Server(model, "127.0.0.1", 0, model_name=NAME, max_model_len=2048, max_num_seqs=4) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return serving.client(server, timeout=120)


def scripted_reply(server, body: dict, *texts: str, finish: str | None = None):
    """The server's reply builder fed the tokens of `texts` (one per choice, interleaved token by
    token; then EOS, or `finish`) as the scheduler would feed them: the whole response, or the list
    of server-sent event payloads."""
    tok = server.model.tokenizer
    call = parse({"messages": [user("weather in Paris?")], "n": len(texts), **body}, server.model,
                 server.max_model_len, chat=True, max_choices=server.max_num_seqs)
    tokens = [tok.encode(text, add_bos=False) + ([] if finish else [tok.eos_id]) for text in texts]

    async def run():
        queue = asyncio.Queue()
        for step in range(max(map(len, tokens))):
            for index, ids in enumerate(tokens):
                if step < len(ids):
                    queue.put_nowait((index, "token", ids[step]))
        for index in range(len(texts)):
            if finish:
                queue.put_nowait((index, "done", finish))
        reply = _Reply(server, call, queue, 0.0)
        if call.stream:
            return [json.loads(e.removeprefix(b"data: ")) async for e in reply.stream() if e != b"data: [DONE]\n\n"]
        return await reply.whole()
    return asyncio.run(run())


SCRIPT = "The user wants the weather.</think>Let me check." + BLOCK


@pytest.mark.parametrize("body", [{"chat_template_kwargs": {"thinking": True}}, {"thinking": {"type": "enabled"}}])
def test_reply_builder_reads_a_scripted_tool_call(server, body):
    body = {**body, "tools": [WEATHER]}
    whole = ChatCompletion.model_validate(scripted_reply(server, body, SCRIPT))
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    assert choice.message.model_extra["reasoning_content"] == "The user wants the weather."
    [tc] = choice.message.tool_calls
    assert (tc.type, tc.function.name, tc.function.arguments) == ("function", "get_weather", ARGS)
    assert tc.id.startswith("call_")

    chunks = scripted_reply(server, {**body, "stream": True}, SCRIPT)
    state = ChatCompletionStreamState(input_tools=[WEATHER])
    for c in chunks:
        state.handle_chunk(openai.types.chat.ChatCompletionChunk.model_validate(c))
    final = state.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls" and final.message.content == "Let me check."
    assert [(t.function.name, t.function.arguments) for t in final.message.tool_calls] == [("get_weather", ARGS)]
    streamed = "".join(c["choices"][0]["delta"].get("reasoning_content", "") for c in chunks if c["choices"])
    assert streamed == "The user wants the weather."
    assert any(len(c["choices"][0]["delta"].get("reasoning_content", "")) < len(streamed)
               for c in chunks if c["choices"] and c["choices"][0]["delta"].get("reasoning_content"))  # in pieces


def test_reply_builder_cut_by_length_keeps_the_text(server):
    cut = SCRIPT[:SCRIPT.index("<｜DSML｜parameter")]
    out = scripted_reply(server, {"tools": [WEATHER], "chat_template_kwargs": {"thinking": True}}, cut,
                         finish="length")
    message, finish = out["choices"][0]["message"], out["choices"][0]["finish_reason"]
    assert finish == "length" and "tool_calls" not in message
    assert message["reasoning_content"] + "</think>" + message["content"] == cut


def test_each_choice_has_its_own_parser(server):
    """n = 2, the choices' tokens interleaved: each choice reads its own reasoning, content and tool calls."""
    other = "No tools needed.</think>It is sunny."
    body = {"tools": [WEATHER], "thinking": {"type": "enabled"}}
    whole = ChatCompletion.model_validate(scripted_reply(server, body, SCRIPT, other))
    first, second = whole.choices
    assert (first.index, first.finish_reason, first.message.content) == (0, "tool_calls", "Let me check.")
    assert [(t.function.name, t.function.arguments) for t in first.message.tool_calls] == [("get_weather", ARGS)]
    assert (second.index, second.finish_reason, second.message.content) == (1, "stop", "It is sunny.")
    assert second.message.model_extra["reasoning_content"] == "No tools needed." and not second.message.tool_calls

    chunks = scripted_reply(server, {**body, "stream": True}, SCRIPT, other)
    calls = [(c["choices"][0]["index"], t["index"]) for c in chunks if c["choices"]
             for t in c["choices"][0]["delta"].get("tool_calls", ())]
    assert calls == [(0, 0)]
    finishes = {c["choices"][0]["index"]: c["choices"][0]["finish_reason"] for c in chunks
                if c["choices"] and c["choices"][0]["finish_reason"]}
    assert finishes == {0: "tool_calls", 1: "stop"}
    for index, expected in ((0, "The user wants the weather."), (1, "No tools needed.")):
        assert "".join(c["choices"][0]["delta"].get("reasoning_content", "") for c in chunks
                       if c["choices"] and c["choices"][0]["index"] == index) == expected


def test_reply_builder_without_tools_or_thinking_is_content(server):
    out = scripted_reply(server, {}, "plain " + BLOCK)
    assert out["choices"][0]["message"] == {"role": "assistant", "content": "plain " + BLOCK}
    assert out["choices"][0]["finish_reason"] == "stop"


def test_markup_survives_a_vocabulary_that_makes_it_special():
    """Where <think> / </think> are special tokens, a reply that is parsed keeps them as text."""
    from dsv4.serve.protocol import TextStream
    from dsv4.tokenizer import build_tokenizer

    hf = build_tokenizer(512)
    hf.add_special_tokens(["<think>", "</think>"])
    tok = Tokenizer(hf)
    ids = tok.encode("weigh it</think>done", add_bos=False)
    assert hf.token_to_id("</think>") in ids
    fmt = chat.ReplyFormat(reasoning=True, thinking=True)
    for skip, expected in ((not fmt.markup, ("weigh it", "done")), (True, ("weigh itdone", ""))):
        stream, reply = TextStream(tok, tok.eos_id, [], skip_special=skip), chat.ChatReply(fmt)
        for t in ids + [tok.eos_id]:
            reply.push(stream.push(t))
        reply.end()
        assert (reply.message()["reasoning_content"], reply.message()["content"]) == expected


def prompt_tokens(model, messages, tools=None, **kw) -> int:
    return len(chat.prompt(model.tokenizer, messages, tools, **kw)[0])


@pytest.mark.parametrize("effort", ["high", "max", "xhigh"])
def test_reasoning_effort_renders_the_prompt(client, model, effort):
    """The request's reasoning_effort as the encoder's: the thinking prompt, at max with the effort prompt first."""
    messages = [user("Why?")]
    out = client.chat.completions.create(model=NAME, messages=messages, max_tokens=2, seed=1,
                                         reasoning_effort=effort)
    text = chat.render(messages, thinking=True, effort_max=effort != "high")
    assert out.usage.prompt_tokens == len(chat.prompt_ids(model.tokenizer, text))
    assert (effort != "high") == (out.usage.prompt_tokens > prompt_tokens(model, messages, thinking=chat.Thinking(
        type="enabled")))
    assert out.choices[0].message.model_extra.get("reasoning_content") is not None  # the reply starts in <think>


def test_openai_tools_api_renders_the_prompt(client, model):
    messages = [{"role": "system", "content": "You check the weather."}, user("Weather in Paris?")]
    out = client.chat.completions.create(model=NAME, messages=messages, tools=[WEATHER], tool_choice="auto",
                                         max_tokens=4, seed=1)
    assert out.usage.prompt_tokens == prompt_tokens(model, messages, [WEATHER])
    assert out.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert isinstance(out.choices[0].message.content, str) or out.choices[0].message.tool_calls

    # the tool loop, sent back as the client returns it, in thinking mode (vLLM's and DeepSeek's switch)
    history = messages + [out.choices[0].message.model_dump() | {"content": None, "tool_calls": [CALL]},
                          {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear"}'}]
    expected = prompt_tokens(model, history, [WEATHER], thinking=chat.Thinking(type="enabled"))
    for extra in ({"chat_template_kwargs": {"thinking": True}}, {"thinking": {"type": "enabled"}}):
        again = client.chat.completions.create(model=NAME, messages=history, tools=[WEATHER], max_tokens=3, seed=2,
                                               extra_body=extra)
        assert again.usage.prompt_tokens == expected
        assert isinstance(again.choices[0].message.model_extra["reasoning_content"], str)

    chunks = list(client.chat.completions.create(model=NAME, messages=history, tools=[WEATHER], max_tokens=3, seed=2,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage.prompt_tokens == prompt_tokens(model, history, [WEATHER])

    none = client.chat.completions.create(model=NAME, messages=messages, tools=[WEATHER], tool_choice="none",
                                          max_tokens=2, seed=1)
    assert none.usage.prompt_tokens == prompt_tokens(model, messages)  # tool_choice none: tools left out


def test_a_shipped_template_is_what_the_server_renders(templated):
    served = dsv4.load(str(templated), device="cpu", dtype=torch.float32)
    messages = [user("Weather?"), assistant(None, calls=[CALL]), tool("call_1", "sunny")]
    with Server(served, "127.0.0.1", 0, model_name=NAME, max_model_len=512, max_num_seqs=1) as srv:
        c = openai.OpenAI(base_url=srv.url, api_key="none", max_retries=0, timeout=120)
        out = c.chat.completions.create(model=NAME, messages=messages, tools=[WEATHER], max_tokens=2, seed=1,
                                        extra_body={"chat_template_kwargs": {"greeting": "hi"}})
    text = chat.render(messages, [WEATHER], template=TEMPLATE, template_kwargs={"greeting": "hi"})
    assert text.endswith("<a>hi ")
    assert out.usage.prompt_tokens == len(chat.prompt_ids(served.tokenizer, text))


def test_tokenize_takes_tools_and_the_thinking_switch(client, server, model):
    """/tokenize of messages with tools and chat_template_kwargs: the ids the chat endpoint prefills."""
    messages, kwargs = [user("Weather in Paris?")], {"thinking": True}
    root = server.url.removesuffix("/v1")
    r = httpx.post(root + "/tokenize", json={"messages": messages, "tools": [WEATHER], "chat_template_kwargs": kwargs},
                   timeout=60).json()
    assert r["tokens"] == chat.prompt(model.tokenizer, messages, [WEATHER], template_kwargs=kwargs)[0]
    used = client.chat.completions.create(model=NAME, messages=messages, tools=[WEATHER], max_tokens=1,
                                          extra_body={"chat_template_kwargs": kwargs}).usage.prompt_tokens
    assert r["count"] == used
    for body, param in [({"prompt": "x", "tools": [WEATHER]}, "tools"),
                        ({"messages": messages, "chat_template_kwargs": {"greeting": "x"}},
                         "chat_template_kwargs.greeting")]:
        bad = httpx.post(root + "/tokenize", json=body, timeout=60)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == param, bad.text


@pytest.mark.parametrize("body,param", [
    ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
     "tool_choice.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": 2}}]}, "tools[0].function.strict"),
    ({"chat_template_kwargs": {"greeting": "x"}}, "chat_template_kwargs.greeting"),
    ({"chat_template_kwargs": {"thinking": "yes"}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"thinking": True}, "thinking": {"type": "disabled"}}, "thinking"),
    ({"thinking": {"type": "auto"}}, "thinking.type"),
    ({"reasoning_effort": "medium"}, "reasoning_effort"),
    ({"reasoning_effort": "none", "thinking": {"type": "enabled"}}, "reasoning_effort"),
    ({"chat_template_kwargs": {"reasoning_effort": "low"}}, "chat_template_kwargs"),
    ({"messages": [user("q"), tool("nope", "x")]}, "messages[1].tool_call_id"),
])
def test_bad_chat_fields_are_400s_naming_them(server, body, param):
    r = httpx.post(server.url + "/chat/completions", json={"messages": [user("hi")], "max_tokens": 2, **body},
                   timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and r.json()["error"]["message"].startswith(param), r.text
