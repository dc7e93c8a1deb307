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


def _contract_layers() -> list[str]:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    return next(c for c in config if c["id"] == "layers")["layers"]


def test_the_architecture_page_lists_the_contracts_layers_in_order() -> None:
    section = (ROOT / "docs" / "architecture.md").read_text().split("## The layers", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\d+\. `([^`]+)`", section, flags=re.MULTILINE)
    assert listed == _contract_layers()


def test_the_tower_is_short() -> None:
    """At most 10 layers, and at most 6 single-file modules at the package root."""
    root_modules = sorted(p.name for p in (ROOT / "vitbench").glob("*.py") if p.name not in {"__init__.py", "__main__.py"})
    assert len(_contract_layers()) <= 10
    assert len(root_modules) <= 6, root_modules
