"""The one-way layers (docs/architecture.md, "The layers"): ``lint-imports`` keeps every contract
in pyproject.toml's ``[tool.importlinter]``: the layer order, no import cycle, methods import no
task, no plugin imports another."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_lint_imports_keeps_every_contract() -> None:
    run = subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()",
         "--no-cache"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, f"lint-imports failed (exit {run.returncode}):\n{run.stdout}\n{run.stderr}"
    assert re.search(r"Contracts: [1-9]\d* kept, 0 broken\.", run.stdout), run.stdout
