"""`dsv4 serve`: an OpenAI-compatible HTTP server (stdlib http.server, no extra dependency).

Endpoints: GET /v1/models, GET /health, POST /v1/completions, POST /v1/chat/completions
(`"stream": true` gives server-sent events ending with `data: [DONE]`). One model, one sequence
at a time: requests wait for the engine in arrival order (dsv4 decodes one sequence per step).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .protocol import RequestError, generate, now, parse, response_id


class Handler(BaseHTTPRequestHandler):
    server: "Server"
    protocol_version = "HTTP/1.0"  # the connection's close ends a stream; no chunked framing needed

    def log_message(self, fmt, *args):  # quiet by default; --verbose logs each request
        if self.server.verbose:
            super().log_message(fmt, *args)

    def _json(self, status: int, obj: dict):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self.server.model_name, "object": "model",
                                                         "created": self.server.started, "owned_by": "dsv4"}]})
        elif self.path == "/health":
            self._json(200, {"status": "ok"})
        else:
            self._json(404, RequestError(f"no route GET {self.path}", status=404).body())

    def do_POST(self):
        chat = self.path == "/v1/chat/completions"
        if not chat and self.path != "/v1/completions":
            return self._json(404, RequestError(f"no route POST {self.path}", status=404).body())
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if length > self.server.max_body:
                raise RequestError(f"request body of {length} bytes: the limit is {self.server.max_body}")
            try:
                body = json.loads(self.rfile.read(length) or b"null")
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise RequestError(f"the request body is not JSON: {e}") from None
            name = body.get("model") if isinstance(body, dict) else None
            if name not in (None, self.server.model_name):
                raise RequestError(f"model {name!r} is not served here; this server serves "
                                   f"{self.server.model_name!r}", "model", status=404, code="model_not_found")
            req = parse(body, self.server.model, self.server.max_model_len, chat)
        except RequestError as e:
            return self._json(e.status, e.body())
        with self.server.engine:
            if req.stream:
                self._stream(req)
            else:
                self._complete(req)

    def _choice(self, req, text: str | None, finish, delta: bool) -> dict:
        if not req.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        if delta:
            return {"index": 0, "delta": {} if text is None else {"content": text}, "finish_reason": finish}
        return {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}

    def _envelope(self, req, rid: str, choice: dict, stream: bool) -> dict:
        kind = ("chat.completion.chunk" if stream else "chat.completion") if req.chat else "text_completion"
        return {"id": rid, "object": kind, "created": now(), "model": self.server.model_name, "choices": [choice]}

    def _usage(self, req, n: int) -> dict:
        p = len(req.prompt_ids)
        return {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}

    def _complete(self, req):
        pieces, finish, n = [], None, 0
        for text, finish, n in generate(self.server.model, req):
            pieces.append(text)
        out = self._envelope(req, response_id(req.chat), self._choice(req, "".join(pieces), finish, False), False)
        out["usage"] = self._usage(req, n)
        self._json(200, out)

    def _stream(self, req):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        rid = response_id(req.chat)

        def send(obj):
            self.wfile.write(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n")
            self.wfile.flush()

        try:
            if req.chat:
                send(self._envelope(req, rid, {"index": 0, "delta": {"role": "assistant", "content": ""},
                                               "finish_reason": None}, True))
            for text, finish, n in generate(self.server.model, req):
                if text:
                    send(self._envelope(req, rid, self._choice(req, text, None, True), True))
                if finish:
                    last = self._envelope(req, rid, self._choice(req, None if req.chat else "", finish, True), True)
                    last["usage"] = self._usage(req, n)
                    send(last)
            send(b"[DONE]")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client left; the generator is dropped and the engine freed


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, model, host: str = "127.0.0.1", port: int = 8000, model_name: str = "dsv4",
                 max_model_len: int | None = None, verbose: bool = False, max_body: int = 16 << 20):
        self.model, self.model_name, self.verbose, self.max_body = model, model_name, verbose, max_body
        limit = model.cfg.max_position_embeddings
        self.max_model_len = min(max_model_len or 8192, limit)
        if max_model_len is not None and max_model_len > limit:
            raise ValueError(f"max_model_len {max_model_len}: the model's max_position_embeddings is {limit}")
        self.engine = threading.Lock()
        self.started = now()
        super().__init__((host, port), Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/v1"
