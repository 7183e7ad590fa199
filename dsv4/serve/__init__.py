"""OpenAI-compatible serving: `protocol` (requests, chat encoding, generation), `server` (HTTP)."""

from .protocol import RequestError, chat_text
from .server import Server

__all__ = ["RequestError", "Server", "chat_text"]
