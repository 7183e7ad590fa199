"""Model sources: a Hugging Face repo id resolved through a hub cache the test builds itself (offline,
no network), and the precedence of presets, directories and repo ids (dsv4.hub)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dsv4.checkpoint.synth import synth
from dsv4.config import preset
from dsv4.hub import resolve

REPO = "dsv4-test/tiny-ckpt"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(root: Path) -> Path:
    """HF's cache layout: models--owner--name/{refs/main, snapshots/<commit>/<files>}."""
    repo = root / ("models--" + REPO.replace("/", "--"))
    synth(preset("tiny"), repo / "snapshots" / COMMIT, seed=3)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return repo / "snapshots" / COMMIT


def test_repo_id_loads_from_the_offline_cache(tmp_path):
    snapshot = hub_cache(tmp_path / "hub")
    script = textwrap.dedent(f"""
        import contextlib, io, sys
        import dsv4
        from dsv4.cli import main
        from dsv4.hub import resolve
        assert str(resolve({REPO!r})) == {str(snapshot)!r}, resolve({REPO!r})
        assert str(resolve({REPO + "@main"!r})) == {str(snapshot)!r}
        outs = []
        for source in ({REPO!r}, {str(snapshot)!r}):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                assert main(["generate", "--model", source, "--device", "cpu", "--max-tokens", "4",
                             "--prompt", "hi", "--seed", "1"]) == 0
            outs.append(out.getvalue())
        assert outs[0] == outs[1], outs
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            assert main(["generate", "--model", "dsv4-test/absent", "--device", "cpu"]) == 2
        assert "'dsv4-test/absent': not in the Hugging Face cache" in err.getvalue(), err.getvalue()
        print("ok")
    """)
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr


def test_precedence(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve("tiny") == "tiny"
    (tmp_path / "tiny").mkdir()
    with pytest.warns(UserWarning, match="'tiny' is the preset; the directory ./tiny is not read"):
        assert resolve("tiny") == "tiny"
    assert resolve(Path("tiny")) == tmp_path / "tiny"
    assert resolve("./tiny") == tmp_path / "tiny"
    (tmp_path / "owner" / "name").mkdir(parents=True)
    assert resolve("owner/name") == tmp_path / "owner" / "name"  # a directory before a repo id
    with pytest.raises(FileNotFoundError, match="neither a checkpoint directory, a preset"):
        resolve("no such thing")
    with pytest.raises(FileNotFoundError, match="neither"):
        resolve(Path("owner/absent"))  # a Path is never a repo id
