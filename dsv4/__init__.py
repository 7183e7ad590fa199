"""dsv4: a Python inference engine for DeepSeek-V4."""

from .api import load
from .config import ConfigError, ModelConfig
from .engine import CapacityError, Model, QuarantineError, RefusalError, StepHeld
from .interface import DecodeModel
from .sampler import SamplingParams

__all__ = ["load", "DecodeModel", "Model", "ModelConfig", "ConfigError", "SamplingParams", "RefusalError", "StepHeld",
           "CapacityError", "QuarantineError"]
