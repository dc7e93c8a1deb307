"""The dependency graph stays in sight (issue 60): a module imports vitbench's own modules at its
top, and the few imports inside functions -- each keeping a light path light (the command line's
start, a plugin's registration, a task's listing) or breaking a cycle -- say why in a comment."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the most in-function imports of vitbench modules (244 before issue 60's step 4)
MOST = 60


def in_function_imports() -> list[tuple[Path, int, bool]]:
    """Each in-function ``from vitbench... import`` of vitbench/ and plugins/: file, line, and
    whether a comment gives its reason (on its line, or on the line above its block)."""
    found = []
    for path in sorted([*ROOT.joinpath("vitbench").rglob("*.py"), *ROOT.joinpath("plugins").rglob("*.py")]):
        lines = path.read_text().split("\n")
        seen: set[int] = set()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if (isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("vitbench")
                        and node.lineno not in seen):
                    seen.add(node.lineno)
                    first = node.lineno - 1
                    while first > 0 and lines[first - 1].strip().startswith("from vitbench"):
                        first -= 1  # the block this import belongs to
                    reasoned = "#" in lines[node.end_lineno - 1] or lines[first - 1].strip().startswith("#")
                    found.append((path.relative_to(ROOT), node.lineno, reasoned))
    return found


def test_at_most_60_imports_of_vitbench_modules_sit_inside_functions():
    found = in_function_imports()
    assert len(found) <= MOST, f"{len(found)} in-function imports (at most {MOST}): import at the module's top"


def test_each_in_function_import_says_why():
    unexplained = [f"{path}:{line}" for path, line, reasoned in in_function_imports() if not reasoned]
    assert not unexplained, "say why each import waits (a comment above it): " + ", ".join(unexplained)
