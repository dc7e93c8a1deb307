"""No built-in plugin imports another: what several share lives in :mod:`vitbench.kit`."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PLUGINS = sorted((Path(__file__).parents[2] / "plugins").glob("*.py"))


def _imported(path: Path) -> list[str]:
    """The modules ``path`` imports (relative imports as ``.name``), function-level ones included."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append("." * node.level + (node.module or ""))
    return names


def test_the_plugins_are_found():
    assert {"tome.py", "ppt.py", "ltmp.py"} <= {p.name for p in PLUGINS}


@pytest.mark.parametrize("path", PLUGINS, ids=lambda p: p.stem)
def test_imports_no_other_plugin(path):
    others = [n for n in _imported(path) if n.startswith((".", "vitbench_plugins"))]
    assert others == [], f"plugins/{path.name} imports {others}; move what it shares to vitbench.kit"
