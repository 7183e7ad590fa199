"""What a model offers, whether it runs on one rank (dsv4.engine.Model) or several (dsv4.launch).

`DecodeModel` names the calls; `RANK_CALLS` says how a driver over several ranks runs each of the
rank-level ones, so the driver forwards them from this one table instead of restating them:

  "all"    every rank runs it (the collectives pair up); the answer is rank 0's
  "agree"  every rank runs it and must return the same (a sampled token); the answer is that value
  "local"  a read of rank 0's own copy (each of these is per rank: `each(name, ...)` asks every rank)

Adding a call: the method on Model, its line in DecodeModel and, if it runs per rank, in RANK_CALLS.
"""

from __future__ import annotations

from typing import Iterator, Protocol, Sequence, runtime_checkable

import torch

from .config import ModelConfig
from .sampler import Drawn, Processing, SamplingParams, Scored
from .state import DecodeState
from .tokenizer import Tokenizer

RANK_CALLS = {
    "prefill": "all", "prefill_scored": "all", "prefill_batch": "all", "prefill_drafted": "all", "prefill_batch_drafted": "all", "decode": "all", "check_capturable": "all", "enable_replay": "all",
    "arm_refusal": "all", "reset_refusals": "all", "synchronize": "all",
    "step": "agree", "draw": "agree", "step_batch": "agree", "step_batch_processed": "agree", "verify": "agree",
    "verify_draft": "agree",
    "step_batch_launch": "all", "step_batch_settle": "agree", "drop_batch": "all",
    "batch_captures": "local",
    "replay_counts": "local", "captures": "local", "graph_census": "local", "digests": "local",
    "logits_sha": "local", "census": "local", "memory_allocated": "local",
}


@runtime_checkable
class DecodeModel(Protocol):
    cfg: ModelConfig
    tokenizer: Tokenizer
    device: torch.device
    dtype: torch.dtype

    @property
    def rank(self) -> int: ...

    @property
    def world(self) -> int: ...

    # ---- states and steps --------------------------------------------------
    def new_state(self, capacity: int) -> DecodeState: ...

    def prefill_chunk(self, capacity: int) -> int: ...

    def prefill(self, state: DecodeState, ids: Sequence[int], chunk_size: int | None = None) -> torch.Tensor: ...

    def prefill_batch(self, states: Sequence[DecodeState], chunks: Sequence[Sequence[int]]) -> torch.Tensor: ...

    def prefill_drafted(self, state: DecodeState, ids: Sequence[int], token: int, chunk_size: int | None = None,
                        sampling: SamplingParams | None = None, k: int = 0) -> tuple[int, ...]: ...

    def prefill_batch_drafted(self, states: Sequence[DecodeState], chunks: Sequence[Sequence[int]],
                              nexts: Sequence[int]) -> torch.Tensor: ...

    def prefill_scored(self, state: DecodeState, ids: Sequence[int], targets: Sequence[int],
                       top: int = 0) -> list[Scored]: ...

    def decode(self, state: DecodeState, token: int) -> torch.Tensor: ...

    def step(self, state: DecodeState, token: int, sampling: SamplingParams | None = None) -> int: ...

    def draw(self, state: DecodeState, sampling: SamplingParams) -> int: ...

    def verify(self, state: DecodeState, token: int, drafts: Sequence[int], sampling: SamplingParams | None = None,
               stops: Sequence[int] = (), graph: bool = False) -> tuple[int, ...]: ...

    def verify_draft(self, state: DecodeState, token: int, drafts: Sequence[int],
                     sampling: SamplingParams | None = None, stops: Sequence[int] = (),
                     k: int = 1, graph: bool = False) -> tuple[tuple[int, ...], tuple[int, ...]]: ...

    def step_batch(self, states: Sequence[DecodeState], tokens: Sequence[int],
                   samplings: Sequence[SamplingParams | None], active: Sequence[bool] | None = None,
                   graph: bool = False) -> tuple[int, ...]: ...

    def step_batch_processed(self, states: Sequence[DecodeState], tokens: Sequence[int],
                             samplings: Sequence[SamplingParams | None], processing: Sequence[Processing | None],
                             active: Sequence[bool] | None = None, graph: bool = False) -> tuple[Drawn, ...]: ...

    def step_batch_launch(self, states: Sequence[DecodeState], tokens: Sequence[int | None],
                          samplings: Sequence[SamplingParams | None], active: Sequence[bool] | None = None,
                          feed: Sequence[bool] | None = None, graph: bool = False) -> None: ...

    def step_batch_settle(self) -> tuple[int, ...]: ...

    def drop_batch(self, states: Sequence[DecodeState]) -> None: ...

    def batch_captures(self) -> int: ...

    def check_capturable(self, state: DecodeState, ids: Sequence[int],
                         sampling: SamplingParams | None = None) -> int | None: ...

    def generate(self, prompt: str | Sequence[int], max_tokens: int = 64, sampling: SamplingParams | None = None,
                 capacity: int | None = None, stop_at_eos: bool = True) -> Iterator[str]: ...

    def sample_tokens(self, ids: Sequence[int], max_tokens: int, sampling: SamplingParams | None = None,
                      capacity: int | None = None, progress: bool = False) -> Iterator[int]: ...

    # ---- full-token replay --------------------------------------------------
    def enable_replay(self, state: DecodeState, sampling: SamplingParams | None = None): ...

    def replay_counts(self, state: DecodeState) -> list[int]: ...

    def captures(self, state: DecodeState) -> int: ...

    def graph_census(self, state: DecodeState) -> dict: ...

    # ---- gates and tests ---------------------------------------------------
    def digests(self, state: DecodeState) -> tuple[str, str, int]: ...

    def logits_sha(self, state: DecodeState) -> str: ...

    def arm_refusal(self, layer: int, rank: int, code: int, site: str = "attention") -> None: ...

    def refusal_words(self) -> list[int]: ...

    def reset_refusals(self) -> None: ...

    def census(self) -> torch.Tensor: ...

    def memory_allocated(self) -> int: ...

    def synchronize(self) -> None: ...

    def each(self, name: str, *args) -> list:
        """Every rank's answer to `name(*args)`, one entry per rank."""
