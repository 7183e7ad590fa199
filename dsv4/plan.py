"""`dsv4 plan`: what a model needs in memory on N ranks, from its config alone (nothing downloaded but config.json,
nothing loaded), so a user knows which GPUs run it before fetching ~150 GB of weights.

A rank holds its weights (as the model holds them: FP8 and FP4 packed with their scales; dsv4.checkpoint.memory,
the figure a load checks before reading a byte) and, serving, `max_num_seqs` slots and `prefix_cache` prefix states,
each a whole decode state of `max_model_len` tokens (dsv4.state.state_bytes; what the server allocates at start).
On top come activations, captured graphs and the CUDA context: on Flash over 2 x H200 a rank's peak was 8.3 GiB above
its weights and states (benchmarks/RESULTS.md: a 4,096-token prefill chunk, 82.1 GiB peak beside 73.9 GiB of
weights), the margin a verdict keeps free.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .checkpoint.memory import weight_bytes
from .config import ModelConfig, PRESETS, preset
from .layout import check_split
from .state import state_bytes

PEAK_MARGIN = int(8.3 * 2**30)  # bytes a rank needed beyond weights and states (Flash, 2 x H200; above)
WORLDS = (1, 2, 4, 8)  # the world sizes a plan lists when not told


@dataclass(frozen=True)
class Plan:
    ranks: int
    weights: int  # bytes of the largest rank's weights
    state: int  # bytes of one decode state of max_model_len tokens, a rank's copy
    states: int  # slots + prefix states

    @property
    def total(self) -> int:
        return self.weights + self.states * self.state

    def fits(self, gpu_bytes: int) -> bool:
        return self.total + PEAK_MARGIN <= gpu_bytes


def config_of(source: str | Path) -> ModelConfig:
    """The config a source names (dsv4.hub's rules): a preset's (a str), a checkpoint directory's config.json, or a
    Hugging Face repo id's config.json alone (downloaded, or from the cache under HF_HUB_OFFLINE=1)."""
    from .hub import REPO_ID, _first_line

    if isinstance(source, str) and source in PRESETS:
        return preset(source)
    path = Path(source)
    if path.is_dir():
        return ModelConfig.from_json(path / "config.json")
    if isinstance(source, str) and REPO_ID.match(source):
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

        repo_id, _, revision = source.partition("@")
        try:
            return ModelConfig.from_json(hf_hub_download(repo_id, "config.json", revision=revision or None))
        except (LocalEntryNotFoundError, HfHubHTTPError) as e:
            raise FileNotFoundError(f"{source!r}: its config.json is neither in the Hugging Face cache nor "
                                    f"downloadable here ({_first_line(e)})") from None
    raise FileNotFoundError(f"{source!r} is neither a checkpoint directory, a preset (allowed {sorted(PRESETS)}) "
                            "nor a Hugging Face repo id (owner/name)")


def worlds(cfg: ModelConfig) -> list[int]:
    """Those of WORLDS that split the model (heads, output groups, experts, shared intermediate, vocab)."""
    out = []
    for world in WORLDS:
        try:
            check_split(cfg, world)
        except ValueError:
            continue
        out.append(world)
    return out


def plan(cfg: ModelConfig, ranks: int, max_model_len: int, max_num_seqs: int, prefix_cache: int,
         dtype: torch.dtype = torch.bfloat16, mtp: bool = False) -> Plan:
    if ranks > 1:
        check_split(cfg, ranks)  # a world that does not divide the model: its ValueError names the field
    if not 0 < max_model_len <= cfg.max_position_embeddings:
        raise ValueError(f"max_model_len {max_model_len}: in [1, {cfg.max_position_embeddings}] "
                         "(the model's max_position_embeddings)")
    if max_num_seqs < 0 or prefix_cache < 0:
        raise ValueError(f"max_num_seqs {max_num_seqs} and prefix_cache {prefix_cache}: integers >= 0")
    weights = max(weight_bytes(cfg, rank, ranks, dtype, mtp) for rank in range(ranks))
    return Plan(ranks, weights, state_bytes(cfg, max_model_len, dtype), max_num_seqs + prefix_cache)


def gib(n: int) -> str:
    return f"{n / 2**30:,.1f}"


def table(plans: list[Plan], gpu_bytes: int | None) -> list[str]:
    """The plans as lines of text: a rank's GiB of weights, states and both; with a GPU's memory, what is left and
    whether it fits (PEAK_MARGIN left for activations, graphs and the context)."""
    head = f"{'ranks':>5}  {'weights':>9}  {'states':>9}  {'total':>9}" + \
        (f"  {'left':>9}  fits (with {gib(PEAK_MARGIN)} GiB for activations and graphs)" if gpu_bytes else "")
    lines = [head + "   (GiB a rank)"]
    for p in plans:
        line = f"{p.ranks:>5}  {gib(p.weights):>9}  {gib(p.states * p.state):>9}  {gib(p.total):>9}"
        if gpu_bytes:
            line += f"  {gib(gpu_bytes - p.total):>9}  {'yes' if p.fits(gpu_bytes) else 'no'}"
        lines.append(line)
    return lines
