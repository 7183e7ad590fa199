"""`dsv4 serve`: the OpenAI API over FastAPI + uvicorn, in front of one scheduler thread.

Endpoints: GET /v1/models, POST /v1/completions, POST /v1/chat/completions (`"stream": true`
gives server-sent events ending with `data: [DONE]`), POST /v1/responses (OpenAI's Responses API over the chat
path: dsv4.serve.responses; its stream is the typed events), POST /v1/messages and /v1/messages/count_tokens
(Anthropic's Messages API over the chat path: dsv4.serve.messages_api), GET /health, GET /metrics (Prometheus),
GET /version, POST /tokenize and /detokenize (vLLM's shapes). With an API key, every route but
/health needs `Authorization: Bearer <key>`.

A handler reads and parses the body and tokenises the prompts in a worker thread (a huge prompt
delays no one), hands one `Sequence` per choice to the scheduler (all or none: 429 with
Retry-After when the waiting queue is full) and turns the tokens that come back into text (a chat
choice's text through its own parser into reasoning_content, content and tool_calls). A
client that goes away, streaming or not, cancels its sequences: the scheduler frees their slots
at its next round. Every error is OpenAI-shaped: {"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import socket
import threading
import time
from importlib import metadata

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from ..prefix import SERVE_STATES
from . import messages_api, protocol, responses
from .chat import END_THINK, ChatReply
from .metrics import Metrics
from .protocol import RequestError, TextStream, now, response_id
from .scheduler import QueueFull, Scheduler, Sequence

log = logging.getLogger("dsv4.serve")
RETRY_AFTER_S = 1


class ClientGone(Exception):
    pass


class Server:
    """The app, its scheduler and its listening socket (bound at once: a port in use fails here; port None: no
    socket, the app driven in-process, as `dsv4 run-batch` does)."""

    def __init__(self, model, host: str = "127.0.0.1", port: int | None = 8000, model_name: str = "dsv4",
                 max_model_len: int | None = None, verbose: bool = False, max_body: int = 16 << 20,
                 max_num_seqs: int = 16, max_waiting: int = 64, prefill_chunk: int | None = None, api_key: str | None = None,
                 precapture: bool = True, speculate: str | None = None, draft_tokens: int = 4,
                 prefix_cache: int | None = 0):
        limit = model.cfg.max_position_embeddings
        if max_model_len is not None and max_model_len > limit:
            raise ValueError(f"max_model_len {max_model_len}: the model's max_position_embeddings is {limit}")
        self.model, self.model_name, self.max_body, self.api_key = model, model_name, max_body, api_key
        self.max_num_seqs = max_num_seqs  # the most choices one request may ask for
        self.max_model_len = min(max_model_len or 8192, limit)
        self.metrics = Metrics(model_name)
        # A prompt's prefill chunk: the model's default for a state of max_model_len tokens (4,096 on Flash), as
        # Model.sample_tokens takes; a prefill's cost hardly grows with its length up to there (session 6: flash,
        # 2 x H200, 64 tokens 0.30 s, 4,096 tokens 0.64 s), so small chunks multiply a prompt's time to first token.
        if prefill_chunk is None:
            prefill_chunk = model.prefill_chunk(self.max_model_len)
        # prefix_cache None: dsv4.prefix.SERVE_STATES where a prompt can reach a chunk boundary (a prefill chunk below
        # max_model_len; the model's default chunk is 4,096, so a max_model_len of 4,096 or less has none), else off
        # and `prefix_note` says why (a number asked for is the cache's, and its own error where it cannot be)
        self.prefix_note = None
        if prefix_cache is None:
            prefix_cache = SERVE_STATES if prefill_chunk < self.max_model_len else 0
            if not prefix_cache:
                self.prefix_note = (f"prefix cache off: the prefill chunk {prefill_chunk} leaves no chunk boundary "
                                    f"below max_model_len {self.max_model_len} (a smaller --prefill-chunk caches "
                                    "prefixes at its multiples)")
        self.scheduler = Scheduler(model, max_num_seqs, self.max_model_len, max_waiting, prefill_chunk,
                                   self.metrics, speculate=speculate, draft_tokens=draft_tokens,
                                   prefix_cache=prefix_cache)
        if precapture:  # on CUDA: every bucket's graph now, not in a request's first step (GPU-checked, session 5)
            self.scheduler.capture_buckets()
            if model.device.type == "cuda":  # and the prefill kernels' compiles
                self.scheduler.warm_prefill()
        self.started = now()
        self.app = build_app(self)
        self.thread: threading.Thread | None = None
        self.socket = self.uvicorn = None
        if port is None:  # in-process only (dsv4.serve.batch): the app's routes without a socket
            return
        try:
            self.socket = socket.create_server((host, port))
        except OSError as e:
            raise ValueError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        config = uvicorn.Config(self.app, log_config=None, access_log=verbose, lifespan="off",
                                timeout_graceful_shutdown=3)
        self.uvicorn = uvicorn.Server(config)

    @property
    def url(self) -> str:
        host, port = self.socket.getsockname()[:2]
        return f"http://{host}:{port}/v1"

    def serve_forever(self):
        """Serve until SIGINT/SIGTERM (in the main thread) or `shutdown()`."""
        if self.socket is None:
            raise RuntimeError("dsv4 serve: this Server was made without a port (port None): it has no socket")
        self.scheduler.start()
        try:
            self.uvicorn.run(sockets=[self.socket])
        finally:
            self.scheduler.stop()
            self.socket.close()

    def start(self) -> "Server":
        """Serve from a background thread; returns once requests are answered."""
        if self.socket is None:
            raise RuntimeError("dsv4 serve: this Server was made without a port (port None): it has no socket")
        self.thread = threading.Thread(target=self.serve_forever, name="dsv4-http", daemon=True)
        self.thread.start()
        while not self.uvicorn.started:
            if not self.thread.is_alive():
                raise RuntimeError("dsv4 serve: the HTTP server did not start")
            self.thread.join(0.01)
        return self

    def shutdown(self):
        if self.uvicorn is not None:
            self.uvicorn.should_exit = True
        if self.thread is not None:
            self.thread.join(30)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.shutdown()


def _error(e: RequestError, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def version() -> str:
    """dsv4's installed version (what `dsv4 --version` prints)."""
    try:
        return metadata.version("dsv4")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


class _ApiKey:
    """ASGI middleware: every route but /health needs `Authorization: Bearer <key>`, else a 401."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] != "/health" and not self._allowed(scope):
            e = RequestError("a missing or wrong API key: send the header Authorization: Bearer <key> or x-api-key: "
                             "<key> (the key given to dsv4 serve --api-key or DSV4_API_KEY)", status=401,
                             code="invalid_api_key")
            if scope["path"].startswith("/v1/messages"):  # Anthropic's error shape on its endpoints
                response = JSONResponse(messages_api.error_body(e), status_code=401)
            else:
                response = _error(e, headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _allowed(self, scope) -> bool:
        headers = dict(scope["headers"])
        scheme, _, key = headers.get(b"authorization", b"").partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(key.strip(), self.key):
            return True
        given = headers.get(b"x-api-key")  # Anthropic's clients send the key so
        return given is not None and hmac.compare_digest(given.strip(), self.key)


def build_app(server: Server) -> FastAPI:
    app = FastAPI(title="dsv4", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server
    if server.api_key:
        app.add_middleware(_ApiKey, key=server.api_key)

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

    @app.get("/version")
    async def get_version():
        return {"version": version()}

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

    @app.post("/v1/responses")
    async def create_response(request: Request):
        return await _serve(server, request, chat=True, api="responses")

    @app.post("/v1/messages")
    async def create_message(request: Request):
        try:
            return await _serve(server, request, chat=True, api="messages")
        except RequestError as e:  # Anthropic's error shape on its endpoints
            return JSONResponse(messages_api.error_body(e), status_code=e.status)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request):
        try:
            body = await _json(server, request)
            ids = await run_in_threadpool(_count_messages, server, body)
        except RequestError as e:
            return JSONResponse(messages_api.error_body(e), status_code=e.status)
        return {"input_tokens": len(ids)}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await _json(server, request)
        return await run_in_threadpool(protocol.tokenize, body, server.model, server.max_model_len)

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = await _json(server, request)
        return await run_in_threadpool(protocol.detokenize, body, server.model)

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


async def _json(server: Server, request: Request):
    """The body as JSON, read and parsed off the event loop, for the model this server serves."""
    return await run_in_threadpool(_loads, server, await _body(server, request))


def _loads(server: Server, raw: bytes):
    try:
        body = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(f"the request body is not JSON: {e}") from None
    except RecursionError:
        raise RequestError("the request body is not JSON this server reads: nested too deeply") from None
    except ValueError:  # Python's limit on int() of a decimal string
        raise RequestError("the request body is not JSON this server reads: a number of over 4300 digits") from None
    name = protocol.model_name(body)
    if name not in (None, server.model_name):
        raise RequestError(f"model {name!r} is not served here; this server serves {server.model_name!r}", "model",
                           status=404, code="model_not_found")
    return body


def _parse(server: Server, body, chat: bool) -> protocol.Call:
    return protocol.parse(body, server.model, server.max_model_len, chat, server.max_num_seqs)


def _parse_responses(server: Server, body) -> tuple[protocol.Call, responses.Echo]:
    """A Responses request as its chat request; an error names the Responses field."""
    chat, echo = responses.to_chat(body)
    return _renamed(echo.param, lambda: _parse(server, chat, True)), echo


def _parse_messages(server: Server, body) -> protocol.Call:
    """A Messages request as its chat request; an error names the Messages field."""
    chat, sources = messages_api.to_chat(body)
    return _renamed(lambda p: messages_api.param(p, sources), lambda: _parse(server, chat, True))


def _count_messages(server: Server, body) -> list[int]:
    """The prompt ids of a Messages request (count_tokens: no max_tokens, no limit on the length)."""
    chat, sources = messages_api.to_chat({**body, "max_tokens": 1})
    return _renamed(lambda p: messages_api.param(p, sources), lambda: protocol.chat_prompt_ids(chat, server.model))


def _renamed(param, run):
    """run(); a RequestError it raises names the field as param(chat field) says (another API's request)."""
    try:
        return run()
    except RequestError as e:
        ours = param(e.param)
        if e.param and ours != e.param and e.message.startswith(e.param):
            e.message = ours + e.message[len(e.param):]
        e.param = ours
        raise


async def _serve(server: Server, request: Request, chat: bool, api: str = "openai"):
    arrived = time.perf_counter()  # time to first token counts reading and tokenising the prompt too
    body = await _json(server, request)
    echo = None
    if api == "responses":
        call, echo = await run_in_threadpool(_parse_responses, server, body)
    elif api == "messages":
        call = await run_in_threadpool(_parse_messages, server, body)
    else:
        call = await run_in_threadpool(_parse, server, body, chat)  # tokenisation: off the event loop
    reply = _Reply(server, call, asyncio.Queue(), arrived)
    try:
        reply.submit()
    except QueueFull:
        server.metrics.rejected.inc()
        full = RequestError("the server is at capacity (every slot busy, the waiting queue full); retry later",
                            status=429, kind="rate_limit_error", code="queue_full")
        if api == "messages":
            return JSONResponse(messages_api.error_body(full), status_code=429,
                                headers={"Retry-After": str(RETRY_AFTER_S)})
        return _error(full, headers={"Retry-After": str(RETRY_AFTER_S)})
    if call.stream:
        events = {"responses": lambda: reply.response_events(echo), "messages": reply.message_events}.get(api)
        return _Stream(reply, None if events is None else events())
    watch = asyncio.create_task(_watch_disconnect(request, reply.queue))
    try:
        if api == "responses":
            return JSONResponse(await reply.response(echo))
        if api == "messages":
            return JSONResponse(await reply.message())
        return JSONResponse(await reply.whole())
    except ClientGone:
        return Response(status_code=499)  # nobody reads it; the slots are already freed
    finally:
        watch.cancel()
        reply.close()


async def _watch_disconnect(request: Request, queue: asyncio.Queue):
    while (await request.receive())["type"] != "http.disconnect":
        pass
    queue.put_nowait((None, "gone", None))


class _Stream(StreamingResponse):
    """Server-sent events that cancel their sequences however the response ends, even when the client
    left before the first event (then the event generator never runs)."""

    def __init__(self, reply: "_Reply", events=None):
        super().__init__(events or reply.stream(), media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"})
        self.reply = reply

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.reply.close()


class _Choice:
    """One choice of a request: its sequence in the scheduler, its text so far and, for chat, its own
    reply parser (reasoning, content, tool calls)."""

    def __init__(self, server: Server, call: protocol.Call, choice: protocol.Choice, emit, arrived: float):
        self.index, self.echo, self.prompt = choice.index, choice.prompt.echo, choice.prompt
        eos = None if call.ignore_eos else server.model.cfg.eos_token_id
        rules, vocab = call.text, server.model.cfg.vocab_size
        # A reply that is parsed decodes special tokens as text: its markup must reach the parser.
        self.text = TextStream(server.model.tokenizer, eos, call.stop,
                               skip_special=not call.reply.markup and rules.skip_special, stop_ids=rules.stop_ids,
                               keep_stop=rules.keep_stop, min_tokens=rules.min_tokens)
        self.reply = ChatReply(call.reply) if call.chat else None
        constraint = allowed = min_mask = bad_words = None
        if call.grammar is not None:
            from .grammar import Constraint

            constraint = Constraint(call.grammar, vocab)
        if rules.allowed is not None or rules.min_tokens:
            from .grammar import token_mask

            allowed = None if rules.allowed is None else token_mask(vocab, rules.allowed)
            # min_tokens keeps out what would end the text: EOS (unless ignored) and the stop ids (vLLM's)
            if rules.min_tokens:
                min_mask = token_mask(vocab, banned=rules.stop_ids + ((eos,) if eos is not None else ()))
        if rules.bad_words:
            from .grammar import BadWords

            bad_words = BadWords(rules.bad_words, vocab)
        self.seq = Sequence(choice.prompt.ids, choice.prompt.max_tokens, choice.sampling, emit, arrived,
                            ignore_eos=call.ignore_eos, logits=call.logits, constraint=constraint,
                            prompt_logprobs=call.prompt_logprobs, stop_ids=frozenset(rules.stop_ids),
                            allowed=allowed, min_tokens=rules.min_tokens, min_mask=min_mask, bad_words=bad_words)
        wanted = call.logits is not None and call.logits.logprobs is not None
        self.logprobs = _Logprobs(server.model.tokenizer, call.chat, len(self.echo)) if wanted else None
        self.scored = 0  # prompt tokens whose logprobs came (echo with logprobs: the scheduler's "prompt" events)
        self.tokenizer = server.model.tokenizer
        self.prompt_logprobs: list | None = [None] if call.prompt_shape == "vllm" else None  # vLLM's shape
        self.prompt_ids = choice.prompt.ids if call.token_ids else None  # return_token_ids: not sent yet
        self.ids: list[int] | None = [] if call.token_ids else None  # sampled, not sent yet
        # The tokens of the reasoning (a reply that starts inside <think>): those up to the one whose text closes it.
        self.reasoning, self.reasoning_tokens, self.tail = call.reply.reasoning, 0, ""

    def parts(self, text: str, finish) -> list:
        """What a text delta releases: itself (completions), or chat deltas (content, reasoning_content,
        tool_calls; the end of the turn releases what the parser held back)."""
        if self.reply is None:
            return [text] if text else []
        return [d for d in (self.reply.push(text), self.reply.end() if finish else None) if d]

    def scores(self, scores: list):
        """A prompt chunk's scores (echo with logprobs): its tokens' logprob entries, the prompt's first token's
        (null: nothing before it) ahead of them."""
        ids = self.prompt.ids
        for k, score in enumerate(scores):
            token = ids[self.scored + 1 + k]
            if self.prompt_logprobs is not None:
                self.prompt_logprobs.append(_vllm_logprobs(self.tokenizer, token, score))
                continue
            if not self.scored and not k:
                self.logprobs.add_prompt(ids[0], None)
            self.logprobs.add_prompt(token, score)
        self.scored += len(scores)

    def push(self, value) -> str:
        """The text delta of a token event's value: the token, or its Drawn (logprobs recorded)."""
        if self.logprobs is not None:
            self.logprobs.add(value)
        token = getattr(value, "token", value)
        if self.ids is not None:
            self.ids.append(token)
        delta = self.text.push(token)
        if self.reasoning:
            self.reasoning_tokens += 1
            seen = self.tail + delta
            self.reasoning, self.tail = END_THINK not in seen, seen[-(len(END_THINK) - 1):]
        return delta

    def taken_ids(self) -> dict:
        """return_token_ids' fields of the next chunk (or the whole answer): the ids sampled since the last one
        and, the first time, the prompt's; {} without return_token_ids."""
        if self.ids is None:
            return {}
        out = {"token_ids": self.ids}
        self.ids = []
        if self.prompt_ids is not None:
            out["prompt_token_ids"], self.prompt_ids = self.prompt_ids, None
        return out

    def taken_logprobs(self, everything: bool = False) -> dict | None:
        """The logprobs of the tokens not sent yet (every token's: `everything`), in the response's shape."""
        return None if self.logprobs is None else self.logprobs.shape(everything)

    def finish_reason(self) -> str:
        finish = self.text.finish
        return self.reply.finish_reason(finish) if self.reply is not None else finish

    def message(self, text: str) -> dict:
        """The whole chat message of the choice's whole text."""
        self.parts(text, self.text.finish)
        return self.reply.message()


LOGPROB_FLOOR = -9999.0  # a token outside the distribution drawn from (-inf is not JSON); vLLM's value


def _vllm_logprobs(tokenizer, token: int, score) -> dict:
    """vLLM's prompt_logprobs entry of one prompt token: {token id: {logprob, rank, decoded_token}} of the token and
    the most likely ones (ranks 1, 2, ...)."""
    out = {str(token): {"logprob": max(score.logprob, LOGPROB_FLOOR), "rank": score.rank,
                        "decoded_token": tokenizer.decode([token], skip_special_tokens=False)}}
    for rank, (t, v) in enumerate(score.top, 1):
        out.setdefault(str(t), {"logprob": max(v, LOGPROB_FLOOR), "rank": rank,
                                "decoded_token": tokenizer.decode([t], skip_special_tokens=False)})
    return out


class _Logprobs:
    """One choice's logprobs, in OpenAI's shapes: chat's content entries (token, logprob, bytes,
    top_logprobs), completions' parallel lists (tokens, token_logprobs, top_logprobs, text_offset)."""

    def __init__(self, tokenizer, chat: bool, offset: int):
        self.tokenizer, self.chat, self.offset = tokenizer, chat, offset
        self.entries: list[tuple] = []  # (token text, its bytes, logprob, [(text, bytes, logprob)], text offset)
        self.prompt: list[tuple] = []  # the echoed prompt's entries (echo with logprobs): before the sampled ones
        self.prompt_offset = 0
        self.sent = 0

    def _piece(self, token: int) -> tuple[str, bytes]:
        from .grammar import token_bytes

        raw = token_bytes(self.tokenizer, token)
        return raw.decode(errors="replace"), raw

    def add_prompt(self, token: int, score):
        """An echoed prompt token's entry: score (logprob, ((id, logprob), ...)), None for the first token. Its text
        offset counts what the echoed text holds of each token before it (a special token, BOS, none of it)."""
        text, raw = self._piece(token)
        top = None if score is None else [(*self._piece(t), max(v, LOGPROB_FLOOR)) for t, v in score.top]
        logprob = None if score is None else max(score.logprob, LOGPROB_FLOOR)
        self.prompt.append((text, raw, logprob, top, self.prompt_offset))
        from .grammar import special_ids

        if token not in special_ids(self.tokenizer):
            self.prompt_offset += len(text)

    def add(self, drawn):
        text, raw = self._piece(drawn.token)
        top = [(*self._piece(t), max(v, LOGPROB_FLOOR)) for t, v in drawn.top]
        self.entries.append((text, raw, max(drawn.logprob, LOGPROB_FLOOR), top, self.offset))
        self.offset += len(text)

    def shape(self, everything: bool) -> dict | None:
        if self.prompt:  # the echoed prompt's entries lead (they all come before the first sampled token's)
            self.entries[:0], self.prompt = self.prompt, []
        entries = self.entries if everything else self.entries[self.sent:]
        self.sent = len(self.entries)
        if not entries and not everything:
            return None
        if self.chat:
            return {"content": [{"token": t, "logprob": v, "bytes": list(b),
                                 "top_logprobs": [{"token": tt, "logprob": tv, "bytes": list(tb)} for tt, tb, tv in top]}
                                for t, b, v, top, _ in entries]}
        return {"tokens": [e[0] for e in entries], "token_logprobs": [e[2] for e in entries],
                "top_logprobs": [None if e[3] is None else {tt: tv for tt, _, tv in e[3]} for e in entries],
                "text_offset": [e[4] for e in entries]}


class _Reply:
    """The handler's side of one request: tokens of its choices from the scheduler in, OpenAI objects out."""

    def __init__(self, server: Server, call: protocol.Call, queue: asyncio.Queue, arrived: float):
        self.server, self.call, self.queue = server, call, queue
        self.loop = asyncio.get_running_loop()
        self.choices = [_Choice(server, call, c, self._emitter(c.index), arrived) for c in call.choices()]
        self.id = response_id(call.chat)
        self.closed = False

    def _emitter(self, index: int):
        def emit(event):  # from the scheduler thread
            try:
                self.loop.call_soon_threadsafe(self.queue.put_nowait, (index, *event))
            except RuntimeError:  # the loop is closed: the server is going down
                self.choices[index].seq.cancel()
        return emit

    def submit(self):
        """All the choices' sequences or none: a refusal cancels those already queued."""
        try:
            for c in self.choices:
                self.server.scheduler.submit(c.seq)
        except BaseException:
            self.closed = True  # never served: not counted as finished
            self._cancel()
            raise

    def _cancel(self):
        for c in self.choices:
            c.seq.cancel()
        self.server.scheduler.wake()

    def close(self):
        """Cancel the sequences (a no-op for those finished) and count how each choice ended, once."""
        if self.closed:
            return
        self.closed = True
        self._cancel()
        ended = time.perf_counter()
        for c in self.choices:
            self.server.metrics.finish(c.text.finish or "abort")
            self.server.metrics.ended(ended - c.seq.arrived)

    async def deltas(self):
        """(choice index, text delta, finish_reason or None) until every choice has its finish_reason.
        Closes the reply however it ends (finished, an error, the client gone)."""
        left = len(self.choices)
        try:
            while left:
                index, kind, value = await self.queue.get()
                if kind == "gone":
                    raise ClientGone
                c = self.choices[index]
                if c.text.finish:
                    continue  # a step that ran before the cancel of a stop string reached the scheduler
                if kind == "error":
                    raise value
                if kind == "prompt":
                    c.scores(value)
                    continue
                delta = c.push(value) if kind == "token" else c.text.end(value)
                if c.text.finish:
                    left -= 1
                    c.seq.cancel()  # a stop string: free the slot now, the other choices go on
                    self.server.scheduler.wake()
                elif not delta and not c.ids:  # return_token_ids: a token whose text is empty still gets a chunk
                    continue
                yield index, delta, c.text.finish
        finally:
            self.close()

    def usage(self) -> dict:
        p, n = sum(len(p.ids) for p in self.call.prompts), sum(c.text.n for c in self.choices)
        usage = {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}
        if self.server.scheduler.prefix is not None:  # OpenAI's field: the prompt tokens a cache gave, per prompt once
            cached = {}
            for c in self.choices:
                cached.setdefault(id(c.prompt), c.seq.cached or 0)
            usage["prompt_tokens_details"] = {"cached_tokens": sum(cached.values())}
        return usage

    def envelope(self, choices: list, stream: bool) -> dict:
        chat = self.call.chat
        kind = ("chat.completion.chunk" if stream else "chat.completion") if chat else "text_completion"
        return {"id": self.id, "object": kind, "created": now(), "model": self.server.model_name, "choices": choices}

    def choice(self, index: int, part, finish, delta: bool, logprobs: dict | None = None) -> dict:
        """`part`: the text (completions), or the chat delta or message (a dict); with return_token_ids, the
        choice's ids not sent yet."""
        ids = self.choices[index].taken_ids()
        # vLLM's stop_reason: the stop string or stop_token_ids' id that ended the choice (None: EOS, the length, ...)
        stop = {"stop_reason": self.choices[index].text.stop_reason if finish else None}
        if not self.call.chat:
            scored = self.choices[index].prompt_logprobs  # vLLM's prompt_logprobs (never streamed)
            return {"index": index, "text": part or "", "logprobs": logprobs, "finish_reason": finish, **stop, **ids,
                    **({} if scored is None else {"prompt_logprobs": scored})}
        return {"index": index, "delta" if delta else "message": part or {}, "logprobs": logprobs,
                "finish_reason": finish, **stop, **ids}

    async def whole(self) -> dict:
        pieces = [[c.echo] for c in self.choices]
        async for index, text, _ in self.deltas():
            pieces[index].append(text)
        texts = ["".join(pieces[c.index]) for c in self.choices]
        out = self.envelope([self.choice(c.index, c.message(text) if self.call.chat else text, c.finish_reason(),
                                         False, c.taken_logprobs(everything=True))
                             for c, text in zip(self.choices, texts)], False)
        if self.call.chat and self.choices[0].prompt_logprobs is not None:  # vLLM's: the response's, one prompt
            out["prompt_logprobs"] = self.choices[0].prompt_logprobs
        out["usage"] = self.usage()
        return out

    async def response(self, echo: responses.Echo) -> dict:
        """The Responses API's whole response (one choice)."""
        whole = await self.whole()
        choice, c = whole["choices"][0], self.choices[0]
        return responses.response(echo, responses.response_id(), whole["created"], self.server.model_name,
                                  choice["message"], choice["finish_reason"], whole["usage"], c.reasoning_tokens)

    async def response_events(self, echo: responses.Echo):
        """The Responses API's stream: its typed events, one choice."""
        events = responses.Events(echo, responses.response_id(), now(), self.server.model_name)
        c = self.choices[0]
        error = lambda e: {"type": "error", "sequence_number": events.sequence, "code": e.code,  # noqa: E731
                           "message": e.message, "param": e.param}
        async for event in self._events(events, lambda: events.finish(c.finish_reason(), self.usage(),
                                                                     c.reasoning_tokens), error):
            yield responses.sse(event)

    async def message(self) -> dict:
        """Anthropic's Messages response (one choice)."""
        whole = await self.whole()
        choice, c = whole["choices"][0], self.choices[0]
        return messages_api.message(messages_api.message_id(), self.server.model_name, choice["message"],
                                    choice["finish_reason"], c.text.stop_string, whole["usage"])

    async def message_events(self):
        """Anthropic's Messages stream: its events, one choice."""
        c = self.choices[0]
        events = messages_api.Events(messages_api.message_id(), self.server.model_name, len(c.prompt.ids))
        async for event in self._events(events, lambda: events.finish(c.finish_reason(), c.text.stop_string,
                                                                     c.text.n), messages_api.error_body):
            yield messages_api.sse(event)

    async def _events(self, events, finish, error):
        """Another API's stream of one choice (Responses', Messages'): `events` (its start(), delta(chat delta)) over
        the choice's chat deltas, finish() at its end; an error as error(RequestError) once the events have begun."""
        c = self.choices[0]
        for e in events.start():
            yield e
        try:
            async for _, text, done in self.deltas():
                for part in c.parts(text, done):
                    for e in events.delta(part):
                        yield e
                if done:
                    for e in finish():
                        yield e
        except RequestError as e:
            yield error(e)
        except Exception as e:  # noqa: BLE001 - the headers are sent: the error goes as an event, not a cut
            log.exception("dsv4 serve: a stream failed")
            yield error(RequestError(f"internal error: {e!r}", status=500, kind="server_error", code="server_error"))

    async def stream(self):
        def event(obj) -> bytes:
            if self.call.include_usage and "usage" not in obj:
                obj["usage"] = None
            return b"data: " + json.dumps(obj).encode() + b"\n\n"

        for c in self.choices:
            if self.call.chat:
                yield event(self.envelope([{"index": c.index, "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None, "finish_reason": None, **c.taken_ids()}], True))
            elif c.echo:
                yield event(self.envelope([self.choice(c.index, c.echo, None, True)], True))
        try:
            async for index, text, finish in self.deltas():
                c = self.choices[index]
                for part in c.parts(text, finish) or ([None] if c.ids else []):
                    yield event(self.envelope([self.choice(index, part, None, True, c.taken_logprobs())], True))
                if finish:
                    yield event(self.envelope([self.choice(index, None, c.finish_reason(), True, c.taken_logprobs())],
                                              True))
        except RequestError as e:
            yield b"data: " + json.dumps(e.body()).encode() + b"\n\n"
        except Exception as e:  # noqa: BLE001 - the headers are sent: the error goes as an event, not a cut
            log.exception("dsv4 serve: a stream failed")
            error = RequestError(f"internal error: {e!r}", status=500, kind="server_error")
            yield b"data: " + json.dumps(error.body()).encode() + b"\n\n"
        else:
            if self.call.include_usage:
                yield event({**self.envelope([], True), "usage": self.usage()})
        yield b"data: [DONE]\n\n"
