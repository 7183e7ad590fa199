"""The official DeepSeek-V4 checkpoint format: quantisation, synthetic writer, loader, random init."""

from .init import random_weights
from .load import CheckpointError, load_weights
from .quant import quantize_fp4, quantize_fp8
from .synth import synth

__all__ = ["CheckpointError", "load_weights", "quantize_fp4", "quantize_fp8", "random_weights", "synth"]
