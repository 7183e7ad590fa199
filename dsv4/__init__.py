"""dsv4: a Python inference engine for DeepSeek-V4."""

from .config import ConfigError, ModelConfig
from .engine import CapacityError, Model, QuarantineError, RefusalError, load
from .sampler import SamplingParams

__all__ = ["load", "Model", "ModelConfig", "ConfigError", "SamplingParams", "RefusalError", "CapacityError",
           "QuarantineError"]
