"""The layers of the package hold (pyproject.toml [tool.importlinter], docs/DESIGN.md), and the check
bites: the same contracts fail on a copy of the package with one import added against them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter")

ROOT = Path(__file__).resolve().parents[1]


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """`lint-imports` on the dsv4 package and pyproject.toml under `root`."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run([sys.executable, "-c", code, "--no-cache"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_layers_hold():
    r = lint_imports(ROOT)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


@pytest.mark.parametrize("module,line,broken", [
    ("kernels/norm.py", "from ..engine import Model", "dsv4.kernels.norm -> dsv4.engine"),  # upward
    ("formats.py", "from .layout import Spec", "dsv4.formats -> dsv4.layout"),  # up inside the floor
    ("state.py", "from .sampler import sample", "dsv4.state -> dsv4.sampler"),  # across one layer
    ("model/step.py", "from . import forward", "No cycles are allowed in dsv4.model"),  # a loop inside model/
    ("gate/checks.py", "import dsv4", "dsv4.gate.checks -> dsv4"),  # the package face
])
def test_an_import_against_the_layers_fails(tmp_path, module, line, broken):
    shutil.copytree(ROOT / "dsv4", tmp_path / "dsv4", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    assert lint_imports(tmp_path).returncode == 0
    with open(tmp_path / "dsv4" / module, "a") as f:
        f.write(f"\n{line}\n")
    r = lint_imports(tmp_path)
    assert r.returncode != 0 and "BROKEN" in r.stdout, r.stdout[-4000:]
    assert broken in r.stdout, r.stdout[-4000:]
