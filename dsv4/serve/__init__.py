"""OpenAI-compatible serving: `protocol` (requests), `chat` (chat prompt and reply), `scheduler` (the
engine's one thread), `server` (FastAPI + uvicorn), `metrics` (Prometheus)."""

from .protocol import RequestError, chat_text
from .scheduler import Scheduler
from .server import Server

__all__ = ["RequestError", "Scheduler", "Server", "chat_text"]
