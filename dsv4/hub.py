"""What a model source names: a preset, a local checkpoint directory, or a Hugging Face repo id.

The rules, in this order (none is a silent fallback):
  1. a preset name given as a str ("tiny", "mini", "flash") is the preset, even where a directory
     of that name exists (a warning then names the directory: pass `Path("tiny")` or "./tiny");
  2. an existing directory is a checkpoint directory (a `pathlib.Path` is only ever that);
  3. "owner/name" or "owner/name@revision" is a Hugging Face repo id, resolved through
     huggingface_hub's cache: downloaded when online (config, tokenizer and safetensors files
     only), read from the cache alone under HF_HUB_OFFLINE=1. HF_HUB_CACHE / HF_HOME choose the cache.
Anything else is a FileNotFoundError naming what was tried.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

from .config import PRESETS

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")
ALLOW = ["*.json", "*.safetensors", "*.jinja"]  # a checkpoint's config, tokenizer, weights and template


def resolve(source: str | Path) -> str | Path:
    """A preset name (str) or an absolute checkpoint directory (Path), by the rules above."""
    if isinstance(source, str) and source in PRESETS:
        if Path(source).is_dir():
            warnings.warn(f"{source!r} is the preset; the directory ./{source} is not read (pass "
                          f"'./{source}' or Path({source!r}) to load it)", stacklevel=3)
        return source
    path = Path(source)
    if path.is_dir():
        return path.resolve()
    if isinstance(source, str) and REPO_ID.match(source):
        return download(source)
    raise FileNotFoundError(f"{str(source)!r} is neither a checkpoint directory, a preset (allowed "
                            f"{sorted(PRESETS)}) nor a Hugging Face repo id (owner/name)")


def download(repo: str) -> Path:
    """The local snapshot of `repo` ("owner/name[@revision]") in the Hugging Face cache."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    repo_id, _, revision = repo.partition("@")
    try:
        return Path(snapshot_download(repo_id, revision=revision or None, allow_patterns=ALLOW))
    except LocalEntryNotFoundError as e:
        raise FileNotFoundError(f"{repo!r}: not in the Hugging Face cache and not downloadable here "
                                f"({_first_line(e)})") from None
    except HfHubHTTPError as e:
        raise FileNotFoundError(f"{repo!r}: the Hugging Face Hub refused it ({_first_line(e)})") from None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
