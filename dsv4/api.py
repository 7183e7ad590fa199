"""`dsv4.load`: one rank builds here through dsv4.engine, several through dsv4.launch.

    model = dsv4.load("tiny")                          # preset: random weights, no download
    model = dsv4.load("/path/to/checkpoint")           # official format (FP8/FP4 or plain)
    model = dsv4.load("flash", device="cuda", ranks=2) # TP/EP over two spawned ranks

Either way the model offers the DecodeModel calls (dsv4.interface).
"""

from __future__ import annotations

from pathlib import Path

from .engine import build, placement
from .hub import resolve
from .interface import DecodeModel
from .launch import load_spawned


def load(path_or_preset: str | Path, device=None, dtype=None, ranks: int = 1, *, init: str | None = None,
         seed: int = 0, rank: int = 0, group=None, tokenizer: str | None = None, mtp: bool = False) -> DecodeModel:
    """Load a checkpoint directory, a Hugging Face repo id, or build a preset (dsv4.hub.resolve's rules).

    A preset name (tiny, mini, flash) gets random weights (`init="random"`, `seed`), built
    directly on `device`; a directory (or a repo's snapshot in the Hugging Face cache, downloaded
    when not there) is read in the official format. `ranks > 1` splits the
    model over that many spawned ranks (a dsv4.launch.DistributedModel); `rank`/`group` are for a
    process that is already one rank of a torchrun group (see dsv4.launch.from_torchrun).
    A checkpoint without tokenizer.json is an error naming it; `tokenizer="stand-in"` opts into a
    byte-level stand-in with a random vocabulary (said on stderr). `mtp`: also the checkpoint's MTP layer (a preset's
    random one), the drafter of speculative decoding (dsv4.speculative's MtpDrafter); a layer's memory more.
    """
    source = resolve(path_or_preset)  # before spawning: every rank reads one resolved directory
    device, dtype = placement(device, dtype)
    if ranks != 1 and group is None:
        return load_spawned(source, device=device, dtype=dtype, ranks=ranks, init=init, seed=seed,
                            tokenizer=tokenizer, mtp=mtp)
    return build(source, device, dtype, rank=rank, world=ranks, group=group, init=init, seed=seed,
                 tokenizer=tokenizer, mtp=mtp)
