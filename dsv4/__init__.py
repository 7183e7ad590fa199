"""dsv4: a Python inference engine for DeepSeek-V4."""

from .api import load
from .config import ConfigError, ModelConfig
from .engine import CapacityError, Model, QuarantineError, RefusalError, StepHeld
from .interface import DecodeModel
from .sampler import SamplingParams

__all__ = ["load", "generate_many", "DecodeModel", "Model", "ModelConfig", "ConfigError", "SamplingParams", "RefusalError", "StepHeld",
           "CapacityError", "QuarantineError"]


def __getattr__(name):
    # the offline batch API drives the server's scheduler: imported on first use, so `import dsv4` does not load
    # the HTTP stack (FastAPI, uvicorn) that dsv4.serve brings
    if name == "generate_many":
        from .serve.offline import generate_many

        return generate_many
    raise AttributeError(f"module 'dsv4' has no attribute {name!r}")
