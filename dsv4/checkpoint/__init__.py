"""The official DeepSeek-V4 checkpoint format on disk: loader, synthetic writer, random init.

Its layout (names, shapes, rank slices) is dsv4.layout; its number formats dsv4.formats."""

from .init import random_weights
from .load import CheckpointError, load_weights
from .memory import NotEnoughMemoryError, check_fits
from .synth import synth

__all__ = ["CheckpointError", "NotEnoughMemoryError", "check_fits", "load_weights", "random_weights", "synth"]
