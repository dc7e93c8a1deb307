"""No built-in plugin imports another: what several share lives in :mod:`vitbench.kit`."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2] / "plugins"
#: every module of the built-in plugins: a plugin is a module, or a package (a light registering
#: ``__init__`` and the code it names by reference)
PLUGINS = sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


def _plugin(path: Path) -> str:
    """The plugin ``path`` belongs to: its module's name, or its package's."""
    return path.relative_to(ROOT).parts[0].removesuffix(".py")


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
    assert {"tome", "ppt", "ltmp", "scorers"} <= {_plugin(p) for p in PLUGINS}


@pytest.mark.parametrize("path", PLUGINS, ids=lambda p: str(p.relative_to(ROOT).with_suffix("")))
def test_imports_no_other_plugin(path):
    own = f"vitbench_plugins.{_plugin(path)}"
    others = [n for n in _imported(path) if n.startswith((".", "vitbench_plugins"))
              and n != own and not n.startswith(own + ".")]
    assert others == [], f"{path.relative_to(ROOT.parent)} imports {others}; move what it shares to vitbench.kit"
