"""`dsv4 run-batch`: a file of OpenAI Batch API requests through the server's own routes, in-process.

The input is OpenAI's batch file (what vLLM's `run-batch` reads): one JSON object a line, `custom_id` (unique),
`method` "POST", `url` (/v1/chat/completions, /v1/completions or /v1/responses) and `body` (that route's request).
The whole file is read and checked before the model loads, so a bad line costs seconds and names its line and field.
Each request then goes to the app `dsv4 serve` runs (`Server(..., port=None)`: the same routes, validation, errors and
scheduler, no socket) through httpx's ASGI transport; as many are in flight as the scheduler admits (its slots and
waiting queue), so they are batched as concurrent clients are, and a request answered 429 (queue full) is sent again
after its Retry-After. A request's tokens are those it draws alone (the scheduler's promise), so a line's answer is
the one `dsv4 serve` gives the same body.

The output has one line a request, in the input's order: {"id", "custom_id", "response": {"status_code",
"request_id", "body"}, "error": null}, as OpenAI's batch output; a request the server refuses keeps its status code
and error body there (the other lines are unaffected). It is written whole or not at all (a temporary file beside it,
renamed once every request has its answer).
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

URLS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
FIELDS = ("custom_id", "method", "url", "body")


@dataclass(frozen=True)
class BatchRequest:
    line: int  # 1-based, in the input file
    custom_id: str
    url: str
    body: dict


def read_requests(path: str | os.PathLike) -> list[BatchRequest]:
    """Every request of a batch file, each line checked: ValueError naming the file, the line and the field."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"batch input {path}: cannot read it ({e})") from None
    requests, seen = [], {}
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue  # a blank line (a file's trailing newline, a separator) holds no request

        def bad(why: str):
            raise ValueError(f"batch input {path} line {n}: {why}")

        try:
            item = json.loads(raw)
        except json.JSONDecodeError as e:
            bad(f"not JSON ({e.msg} at column {e.colno})")
        if not isinstance(item, dict):
            bad(f"a request is a JSON object, not {type(item).__name__}")
        missing = [k for k in FIELDS if k not in item]
        extra = sorted(set(item) - set(FIELDS))
        if missing or extra:
            bad(f"fields {list(FIELDS)} are needed, and no others" + (f"; missing {missing}" if missing else "")
                + (f"; unknown {extra}" if extra else ""))
        cid, method, url, body = (item[k] for k in FIELDS)
        if not isinstance(cid, str) or not cid:
            bad(f"'custom_id' must be a non-empty string, not {cid!r}")
        if cid in seen:
            bad(f"'custom_id' {cid!r} repeats line {seen[cid]} (each request's id is unique)")
        if method != "POST":
            bad(f"'method' must be 'POST', not {method!r}")
        if url not in URLS:
            bad(f"'url' {url!r}: allowed {list(URLS)}")
        if not isinstance(body, dict):
            bad(f"'body' must be a JSON object (the {url} request), not {type(body).__name__}")
        if body.get("stream") not in (None, False):
            bad("'body.stream': a batch request's answer is one body; streaming is not offered here")
        seen[cid] = n
        requests.append(BatchRequest(n, cid, url, body))
    if not requests:
        raise ValueError(f"batch input {path}: no requests in it")
    return requests


def run_batch(server, requests: list[BatchRequest], progress=None) -> list[dict]:
    """Every request through `server`'s app (a Server made with port None; its scheduler started here and stopped
    after), concurrently; the output records in the requests' order. `progress`: called once per answered request."""
    server.scheduler.start()
    try:
        return asyncio.run(_run(server, requests, progress))
    finally:
        server.scheduler.stop()


async def _run(server, requests: list[BatchRequest], progress) -> list[dict]:
    import httpx

    headers = {"Authorization": f"Bearer {server.api_key}"} if server.api_key else {}
    # in flight at once: what the scheduler takes without a 429 (its slots and waiting queue); a request of n > 1
    # choices holds n of them, so 429s still come, and are waited out
    room = asyncio.Semaphore(server.max_num_seqs + server.scheduler.max_waiting)
    transport = httpx.ASGITransport(app=server.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://dsv4", headers=headers, timeout=None) as client:

        async def one(req: BatchRequest) -> dict:
            async with room:
                while True:
                    r = await client.post(req.url, content=json.dumps(req.body),
                                          headers={"content-type": "application/json"})
                    if r.status_code != 429:
                        break
                    await asyncio.sleep(float(r.headers.get("retry-after", 1)))
            try:
                body = r.json()
            except ValueError:  # every route answers JSON; anything else is kept as the error it is
                body = {"error": {"message": r.text[:1000], "type": "server_error", "param": None, "code": None}}
            if progress is not None:
                progress()
            rid = body.get("id") if r.status_code == 200 and isinstance(body.get("id"), str) else None
            return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": req.custom_id,
                    "response": {"status_code": r.status_code, "request_id": rid or f"req_{uuid.uuid4().hex}",
                                 "body": body},
                    "error": None}

        return await asyncio.gather(*(one(req) for req in requests))


def check_output(path: str | os.PathLike, input_path: str | os.PathLike) -> Path:
    """The output path, refused before any work where it cannot be written or is the input."""
    path = Path(path)
    if path.resolve() == Path(input_path).resolve():
        raise ValueError(f"batch output {path}: it is the input file (the output is written beside it, then renamed "
                         "over it: the requests would be lost)")
    if path.is_dir():
        raise ValueError(f"batch output {path}: a directory, not a file")
    parent = path.parent  # "." for a bare file name
    if not parent.is_dir():
        raise ValueError(f"batch output {path}: its directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise ValueError(f"batch output {path}: its directory {parent} is not writable")
    return path


def write_output(path: str | os.PathLike, records: list[dict]):
    """The records as JSON lines, whole or not at all: a temporary file in the same directory, renamed over `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for rec in records:
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
