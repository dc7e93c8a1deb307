"""Docstrings and comments summarise: short module docstrings, one-line parameter comments, and
no issue numbers, machine descriptions or measurement logs in code (those live in docs/)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for d in ("vitbench", "plugins") for p in (ROOT / d).rglob("*.py"))

#: the longest module docstring allowed, in lines (docs/ holds the rest)
MAX_MODULE_DOC_LINES = 15

#: text that belongs in docs/, CHANGELOG.md or a commit body, not in code
FORBIDDEN = {
    "an issue number": re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE),
    "a machine description": re.compile(
        r"\b\d+[- ](?:cpu[- ])?cores?\b|\b[AH]100\b|\bH200\b|\bvCPUs?\b|\bour (?:machine|CPU|GPU)\b",
        re.IGNORECASE),
    "a measurement log": re.compile(
        r"\bmeasured (?:on|with) (?:the default|our|an? [A-Z0-9])|\bover seeds \d", re.IGNORECASE),
}


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def module_doc_lines(path: Path) -> int:
    """The number of lines of ``path``'s module docstring (0 when it has none)."""
    doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
    return len(doc.splitlines()) if doc else 0


def long_param_comments(path: Path) -> list[int]:
    """Line numbers that continue a ``#:`` parameter comment from the line above."""
    continued, previous = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        current = line.lstrip().startswith("#:")
        if current and previous:
            continued.append(number)
        previous = current
    return continued


def forbidden_mentions(path: Path) -> list[str]:
    """``line: what`` for each line of ``path`` that holds text :data:`FORBIDDEN` names."""
    found = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        found += [f"{_rel(path)}:{number}: {what}" for what, pattern in FORBIDDEN.items()
                  if pattern.search(line)]
    return found


def test_sources_are_found():
    names = {_rel(p) for p in SOURCES}
    assert "vitbench/run/plan.py" in names and "plugins/tome/__init__.py" in names


def test_module_docstrings_are_short():
    long = {_rel(p): n for p in SOURCES if (n := module_doc_lines(p)) > MAX_MODULE_DOC_LINES}
    assert not long, f"module docstrings over {MAX_MODULE_DOC_LINES} lines (move the detail to docs/): {long}"


def test_parameter_comments_are_one_line():
    long = {_rel(p): lines for p in SOURCES if (lines := long_param_comments(p))}
    assert not long, f"'#:' comments continued on the next line (keep one line; detail to docs/): {long}"


def test_no_issue_numbers_machines_or_measurements_in_code():
    found = [hit for p in SOURCES for hit in forbidden_mentions(p)]
    assert not found, "move these to docs/ (measurements with their command and machine) or CHANGELOG.md:\n" + "\n".join(found)


@pytest.mark.parametrize(("text", "what"), [
    ("see issue 11, item 1", "an issue number"),
    ("(issue #2)", "an issue number"),
    ("~2 min on 2 CPU cores", "a machine description"),
    ("a 2-core CPU", "a machine description"),
    ("13.1 ms on an H100", "a machine description"),
    ("Measured on the default model, 78.6 %", "a measurement log"),
    ("78.6-79.2 % over seeds 0-2", "a measurement log"),
])
def test_the_patterns_catch_what_they_name(text, what):
    assert FORBIDDEN[what].search(text)


@pytest.mark.parametrize("text", [
    "github.com/mlvlab/MCTF/issues/3",
    "peak memory is measured on 'cpu' or 'cuda' only",
    "the 2 scores of each head",
    "when accuracy is measured",
])
def test_the_patterns_pass_ordinary_text(text):
    assert not any(pattern.search(text) for pattern in FORBIDDEN.values())


def test_long_param_comments_flags_continuations(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("#: one line\nA = 1\n#: two\n#: lines\nB = 2\n")
    assert long_param_comments(source) == [4]
    assert module_doc_lines(source) == 0
    source.write_text('"""One.\n\nTwo.\n"""\n')
    assert module_doc_lines(source) == 3
