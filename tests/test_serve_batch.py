"""`dsv4 run-batch` (dsv4.serve.batch): OpenAI batch files through the server's routes, in-process, on tiny (CPU).

Checked: every line's answer is what `dsv4 serve` answers the same body over HTTP (the choices, their text, tokens
and finish reasons; ids and times aside), in the input's order, across the three routes; a request the server
refuses keeps its status and error body while the others are answered; a waiting queue smaller than the batch is
waited out (429s sent again), the answers unchanged; every malformed line is refused before any model loads, naming
the file, the line and the field, and no output file is left behind; the command writes the file and says what it did.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import dsv4
from dsv4.serve import Server
from dsv4.serve.batch import read_requests, run_batch

sys.path.insert(0, str(Path(__file__).parent))
from serving import post  # noqa: E402
from test_cli import dsv4_cli, dsv4_main  # noqa: E402

NAME = "tiny-batch"


@pytest.fixture(scope="module")
def model():
    return dsv4.load("tiny", device="cpu", dtype=torch.float32)


def lines(*requests) -> str:
    return "".join(json.dumps(r) + "\n" for r in requests)


def request(cid, url, **body):
    return {"custom_id": cid, "method": "POST", "url": url, "body": {"model": NAME, **body}}


REQUESTS = [
    request("chat-1", "/v1/chat/completions", messages=[{"role": "user", "content": "hello there"}], max_tokens=12,
            seed=3, temperature=1.0),
    request("cmpl-n2", "/v1/completions", prompt="Once upon a time", max_tokens=10, n=2, seed=5, logprobs=2),
    request("resp-1", "/v1/responses", input="Say something.", max_output_tokens=9, temperature=0.0),
    request("bad-field", "/v1/chat/completions", messages=[{"role": "user", "content": "x"}], max_tokens=4,
            frobnicate=True),
    request("chat-2", "/v1/chat/completions", messages=[{"role": "user", "content": "a second one"}],
            max_tokens=7, seed=11, stop=["e"]),
    request("cmpl-2", "/v1/completions", prompt=[5, 9, 3, 7], max_tokens=6, seed=2),
]


def answer(body: dict) -> object:
    """What a request's answer says, without its ids and times."""
    if "choices" in body:
        return [(c.get("text") if "text" in c else c["message"], c["finish_reason"], c.get("logprobs"))
                for c in body["choices"]], body["usage"]
    if "output" in body:
        return body["output"][-1]["content"], body["status"], body["usage"]
    return body


def test_each_line_is_the_server_s_answer(model, tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text(lines(*REQUESTS) + "\n")  # a blank line at the end holds no request
    reqs = read_requests(path)
    assert [r.custom_id for r in reqs] == [r["custom_id"] for r in REQUESTS] and reqs[-1].line == len(REQUESTS)
    server = Server(model, port=None, model_name=NAME, max_model_len=128, max_num_seqs=4)
    got = run_batch(server, reqs)
    assert not server.scheduler.alive  # stopped once the batch is answered
    assert [r["custom_id"] for r in got] == [r["custom_id"] for r in REQUESTS]
    assert len({r["id"] for r in got}) == len(got) and all(r["error"] is None for r in got)
    with Server(model, "127.0.0.1", 0, model_name=NAME, max_model_len=128, max_num_seqs=4) as live:
        for req, rec in zip(REQUESTS, got):
            over_http = post(live, req["url"], req["body"])
            status, body = rec["response"]["status_code"], rec["response"]["body"]
            assert status == over_http.status_code, req["custom_id"]
            assert answer(body) == answer(over_http.json()), req["custom_id"]
    statuses = {r["custom_id"]: r["response"]["status_code"] for r in got}
    assert statuses == {**{r["custom_id"]: 200 for r in REQUESTS}, "bad-field": 400}
    bad = got[3]["response"]["body"]["error"]
    assert "frobnicate" in bad["message"] and bad["type"] == "invalid_request_error"
    chat = got[0]["response"]
    assert chat["request_id"] == chat["body"]["id"] and chat["body"]["object"] == "chat.completion"
    assert len(got[1]["response"]["body"]["choices"]) == 2 and got[2]["response"]["body"]["object"] == "response"


def test_a_small_waiting_queue_is_waited_out(model, tmp_path):
    """Eight requests (two of n=2) against two slots and one waiting place: the requests past the queue are answered
    429 (the metrics count them) and sent again; the answers are those of a server with room for all."""
    reqs = [request(f"r{i}", "/v1/completions", prompt=f"number {i}", max_tokens=5, seed=i, n=2 if i in (2, 5) else 1)
            for i in range(8)]
    path = tmp_path / "in.jsonl"
    path.write_text(lines(*reqs))
    tight = Server(model, port=None, model_name=NAME, max_model_len=64, max_num_seqs=2, max_waiting=1)
    small = run_batch(tight, read_requests(path))
    roomy = run_batch(Server(model, port=None, model_name=NAME, max_model_len=64, max_num_seqs=8),
                      read_requests(path))
    rejected = [line for line in tight.metrics.render().decode().splitlines()
                if line.startswith("dsv4_requests_rejected_total")]
    assert len(rejected) == 1 and float(rejected[0].split()[-1]) > 0, rejected
    assert [r["response"]["status_code"] for r in small] == [200] * 8
    assert [answer(r["response"]["body"]) for r in small] == [answer(r["response"]["body"]) for r in roomy]


@pytest.mark.parametrize("text,why", [
    ("{not json\n", "line 1: not JSON"),
    ("[1, 2]\n", "line 1: a request is a JSON object, not list"),
    (lines(request("ok", "/v1/completions")) + '{"custom_id": "a", "method": "POST", "url": "/v1/completions"}\n',
     "line 2: fields ['custom_id', 'method', 'url', 'body'] are needed, and no others; missing ['body']"),
    ('{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}, "x": 1}\n', "unknown ['x']"),
    ('{"custom_id": "", "method": "POST", "url": "/v1/completions", "body": {}}\n', "'custom_id' must be a non-empty"),
    (lines(request("a", "/v1/completions"), request("a", "/v1/completions")), "line 2: 'custom_id' 'a' repeats line 1"),
    ('{"custom_id": "a", "method": "GET", "url": "/v1/completions", "body": {}}\n', "'method' must be 'POST'"),
    ('{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {}}\n', "'url' '/v1/embeddings'"),
    ('{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": "hi"}\n', "'body' must be a JSON object"),
    (lines(request("a", "/v1/completions", stream=True)), "'body.stream'"),
    ("\n\n", "no requests in it"),
])
def test_a_bad_input_line_is_named_before_the_model_loads(tmp_path, text, why):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(text)
    # --model names a directory that does not exist: a load would fail, so the refusal came first
    r = dsv4_main("run-batch", "-i", str(src), "-o", str(out), "--model", str(tmp_path / "absent"))
    assert r.returncode == 2 and f"batch input {src}" in r.stderr and why in r.stderr, r.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == [src]


def test_output_paths_that_cannot_be_written_are_refused(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(lines(request("a", "/v1/completions", prompt="x")))
    for out, why in ((src, "it is the input file"), (tmp_path, "a directory"),
                     (tmp_path / "nowhere" / "out.jsonl", "does not exist")):
        r = dsv4_main("run-batch", "-i", str(src), "-o", str(out), "--preset", "tiny", "--device", "cpu")
        assert r.returncode == 2 and why in r.stderr, r.stderr
    assert src.read_text() == lines(request("a", "/v1/completions", prompt="x"))


def test_the_command_writes_every_answer(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(lines(REQUESTS[0], REQUESTS[3], REQUESTS[5]))
    r = dsv4_cli("run-batch", "-i", str(src), "-o", str(out), "--preset", "tiny", "--device", "cpu",
                 "--served-model-name", NAME, "--max-model-len", "128", "--max-num-seqs", "2", "--prefill-chunk", "32")
    assert r.returncode == 0, r.stderr
    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert [g["custom_id"] for g in got] == ["chat-1", "bad-field", "cmpl-2"]
    assert [g["response"]["status_code"] for g in got] == [200, 400, 200]
    assert "3 requests answered (2 ok, 1 refused: status {400: 1})" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]  # no temporary file left
