"""`dsv4 serve`: the OpenAI API over FastAPI + uvicorn, in front of one scheduler thread.

Endpoints: GET /v1/models, POST /v1/completions, POST /v1/chat/completions (`"stream": true`
gives server-sent events ending with `data: [DONE]`), GET /health, GET /metrics (Prometheus).

A handler reads and validates the body and tokenises the prompt in a worker thread (a huge
prompt delays no one), hands a `Sequence` to the scheduler (429 with Retry-After when the
waiting queue is full) and turns the tokens that come back into text. A client that goes away,
streaming or not, cancels its sequence: the scheduler frees the slot at its next round. Every
error is OpenAI-shaped: {"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from .chat import ChatReply
from .metrics import Metrics
from .protocol import RequestError, TextStream, now, parse, response_id
from .scheduler import QueueFull, Scheduler, Sequence

log = logging.getLogger("dsv4.serve")
RETRY_AFTER_S = 1


class ClientGone(Exception):
    pass


class Server:
    """The app, its scheduler and its listening socket (bound at once: a port in use fails here)."""

    def __init__(self, model, host: str = "127.0.0.1", port: int = 8000, model_name: str = "dsv4",
                 max_model_len: int | None = None, verbose: bool = False, max_body: int = 16 << 20,
                 max_num_seqs: int = 16, max_waiting: int = 64, prefill_chunk: int = 64):
        limit = model.cfg.max_position_embeddings
        if max_model_len is not None and max_model_len > limit:
            raise ValueError(f"max_model_len {max_model_len}: the model's max_position_embeddings is {limit}")
        self.model, self.model_name, self.max_body = model, model_name, max_body
        self.max_model_len = min(max_model_len or 8192, limit)
        self.metrics = Metrics(model_name)
        self.scheduler = Scheduler(model, max_num_seqs, self.max_model_len, max_waiting, prefill_chunk,
                                   self.metrics)
        self.started = now()
        try:
            self.socket = socket.create_server((host, port))
        except OSError as e:
            raise ValueError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        config = uvicorn.Config(build_app(self), log_config=None, access_log=verbose, lifespan="off",
                                timeout_graceful_shutdown=3)
        self.uvicorn = uvicorn.Server(config)
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.socket.getsockname()[:2]
        return f"http://{host}:{port}/v1"

    def serve_forever(self):
        """Serve until SIGINT/SIGTERM (in the main thread) or `shutdown()`."""
        self.scheduler.start()
        try:
            self.uvicorn.run(sockets=[self.socket])
        finally:
            self.scheduler.stop()
            self.socket.close()

    def start(self) -> "Server":
        """Serve from a background thread; returns once requests are answered."""
        self.thread = threading.Thread(target=self.serve_forever, name="dsv4-http", daemon=True)
        self.thread.start()
        while not self.uvicorn.started:
            if not self.thread.is_alive():
                raise RuntimeError("dsv4 serve: the HTTP server did not start")
            self.thread.join(0.01)
        return self

    def shutdown(self):
        self.uvicorn.should_exit = True
        if self.thread is not None:
            self.thread.join(30)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.shutdown()


def _error(e: RequestError, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def build_app(server: Server) -> FastAPI:
    app = FastAPI(title="dsv4", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server

    @app.exception_handler(RequestError)
    async def request_error(_, e: RequestError):
        return _error(e)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):
        message = f"no route {request.method} {request.url.path}" if e.status_code in (404, 405) else str(e.detail)
        return _error(RequestError(message, status=e.status_code))

    @app.exception_handler(Exception)
    async def internal_error(_, e: Exception):
        log.exception("dsv4 serve: a handler failed")
        return _error(RequestError(f"internal error: {e!r}", status=500, kind="server_error"))

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": server.model_name, "object": "model", "created": server.started,
                                            "owned_by": "dsv4", "max_model_len": server.max_model_len}]}

    @app.get("/health")
    async def health():
        if not server.scheduler.alive:
            why = server.scheduler.error
            return _error(RequestError(f"the engine stopped: {why!r}" if why else "the engine is not running",
                                       status=503, kind="server_error"))
        running, waiting = server.scheduler.counts()
        return {"status": "ok", "running": running, "waiting": waiting}

    @app.get("/metrics")
    async def metrics():
        return Response(server.metrics.render(), media_type=server.metrics.content_type)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _serve(server, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _serve(server, request, chat=True)

    return app


async def _body(server: Server, request: Request) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > server.max_body:
        raise RequestError(f"request body of {length} bytes: the limit is {server.max_body}", status=413)
    data = bytearray()
    async for part in request.stream():
        data += part
        if len(data) > server.max_body:
            raise RequestError(f"request body over {server.max_body} bytes: the limit", status=413)
    return bytes(data)


def _parse(server: Server, raw: bytes, chat: bool):
    try:
        body = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(f"the request body is not JSON: {e}") from None
    except RecursionError:
        raise RequestError("the request body is not JSON this server reads: nested too deeply") from None
    name = body.get("model") if isinstance(body, dict) else None
    if name not in (None, server.model_name):
        raise RequestError(f"model {name!r} is not served here; this server serves {server.model_name!r}", "model",
                           status=404, code="model_not_found")
    return parse(body, server.model, server.max_model_len, chat)


async def _serve(server: Server, request: Request, chat: bool):
    arrived = time.perf_counter()  # time to first token counts reading and tokenising the prompt too
    raw = await _body(server, request)
    req = await run_in_threadpool(_parse, server, raw, chat)  # JSON and tokenisation: off the event loop
    loop, queue = asyncio.get_running_loop(), asyncio.Queue()

    def emit(event):  # from the scheduler thread
        try:
            loop.call_soon_threadsafe(queue.put_nowait, event)
        except RuntimeError:  # the loop is closed: the server is going down
            seq.cancel()

    seq = Sequence(req.prompt_ids, req.max_tokens, req.sampling, emit, arrived)
    try:
        server.scheduler.submit(seq)
    except QueueFull:
        server.metrics.rejected.inc()
        return _error(RequestError("the server is at capacity (every slot busy, the waiting queue full); retry later",
                                   status=429, kind="rate_limit_error", code="queue_full"),
                      headers={"Retry-After": str(RETRY_AFTER_S)})
    reply = _Reply(server, req, seq, queue)
    if req.stream:
        return _Stream(reply)
    watch = asyncio.create_task(_watch_disconnect(request, queue))
    try:
        return JSONResponse(await reply.whole())
    except ClientGone:
        return Response(status_code=499)  # nobody reads it; the slot is already freed
    finally:
        watch.cancel()
        reply.close()


async def _watch_disconnect(request: Request, queue: asyncio.Queue):
    while (await request.receive())["type"] != "http.disconnect":
        pass
    queue.put_nowait(("gone", None))


class _Stream(StreamingResponse):
    """Server-sent events that cancel their sequence however the response ends, even when the client
    left before the first event (then the event generator never runs)."""

    def __init__(self, reply: "_Reply"):
        super().__init__(reply.stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.reply = reply

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.reply.close()


class _Reply:
    """The handler's side of one request: tokens from the scheduler in, OpenAI objects out."""

    def __init__(self, server: Server, req, seq: Sequence, queue: asyncio.Queue):
        self.server, self.req, self.seq, self.queue = server, req, seq, queue
        self.text = TextStream(server.model.tokenizer, server.model.cfg.eos_token_id, req.stop,
                               skip_special=not req.reply.markup)
        self.reply = ChatReply(req.reply) if req.chat else None
        self.id = response_id(req.chat)
        self.closed = False

    def close(self):
        """Cancel the sequence (a no-op once it finished) and count how the request ended, once."""
        if self.closed:
            return
        self.closed = True
        self.seq.cancel()
        self.server.scheduler.wake()
        self.server.metrics.finish(self.text.finish or "abort")

    async def deltas(self):
        """(text delta, finish_reason or None); the last has a finish_reason. Closes the reply
        however it ends (finished, a stop string, an error, the client gone)."""
        try:
            while True:
                kind, value = await self.queue.get()
                if kind == "token":
                    delta = self.text.push(value)
                    if self.text.finish:
                        yield delta, self.text.finish
                        return
                    if delta:
                        yield delta, None
                elif kind == "done":
                    yield self.text.end(value), value
                    return
                elif kind == "error":
                    raise value
                else:
                    raise ClientGone
        finally:
            self.close()

    def usage(self) -> dict:
        p, n = len(self.req.prompt_ids), self.text.n
        return {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}

    def envelope(self, choices: list, stream: bool) -> dict:
        chat = self.req.chat
        kind = ("chat.completion.chunk" if stream else "chat.completion") if chat else "text_completion"
        return {"id": self.id, "object": kind, "created": now(), "model": self.server.model_name, "choices": choices}

    def choice(self, part, finish, delta: bool) -> dict:
        """`part`: the text (completions), or the chat delta or message (a dict)."""
        if not self.req.chat:
            return {"index": 0, "text": part or "", "logprobs": None, "finish_reason": finish}
        return {"index": 0, "delta" if delta else "message": part or {}, "logprobs": None, "finish_reason": finish}

    def parts(self, text: str, finish) -> list:
        """What a text delta releases: itself (completions), or chat deltas (content, reasoning_content,
        tool_calls; the end of the turn releases what the parser held back)."""
        if not self.req.chat:
            return [text] if text else []
        return [d for d in (self.reply.push(text), self.reply.end() if finish else None) if d]

    def finish_reason(self, finish: str) -> str:
        return self.reply.finish_reason(finish) if self.req.chat else finish

    async def whole(self) -> dict:
        pieces, finish = [], None
        async for text, finish in self.deltas():
            pieces.append(text)
        text = "".join(pieces)
        if self.req.chat:
            self.parts(text, finish)
            text, finish = self.reply.message(), self.reply.finish_reason(finish)
        out = self.envelope([self.choice(text, finish, False)], False)
        out["usage"] = self.usage()
        return out

    async def stream(self):
        def event(obj) -> bytes:
            if self.req.include_usage and "usage" not in obj:
                obj["usage"] = None
            return b"data: " + json.dumps(obj).encode() + b"\n\n"

        if self.req.chat:
            yield event(self.envelope([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                        "finish_reason": None}], True))
        try:
            async for text, finish in self.deltas():
                for part in self.parts(text, finish):
                    yield event(self.envelope([self.choice(part, None, True)], True))
                if finish:
                    yield event(self.envelope([self.choice(None, self.finish_reason(finish), True)], True))
        except RequestError as e:
            yield b"data: " + json.dumps(e.body()).encode() + b"\n\n"
        else:
            if self.req.include_usage:
                yield event({**self.envelope([], True), "usage": self.usage()})
        yield b"data: [DONE]\n\n"
