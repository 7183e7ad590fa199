"""What the server tests share: talking to a localhost `dsv4 serve` over HTTP and with the openai client."""

from __future__ import annotations

import json
import time

import httpx
import openai


def client(server, timeout: float = 60, api_key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key=api_key, max_retries=0, timeout=timeout)


def root(server) -> str:
    return server.url.removesuffix("/v1")


def post(server, path, body=None, timeout=60, **kw):
    if body is not None:  # json.dumps escapes a lone surrogate; httpx's encoder would refuse it
        kw.update(content=json.dumps(body), headers={"content-type": "application/json"})
    return httpx.post(root(server) + path, timeout=timeout, **kw)


def running(server) -> int:
    return httpx.get(root(server) + "/health", timeout=10).json()["running"]


def wait_for(cond, seconds=15.0):
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
