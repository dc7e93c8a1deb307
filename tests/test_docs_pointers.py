"""Code points into the docs by page and heading, never by a section number that moves."""
from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted([*(ROOT / "vitbench").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")])
#: ``docs/<page>.md, "<heading>"`` (or in single quotes inside a string; the heading may wrap onto the
#: next line of a docstring or comment)
POINTER = re.compile(r"""docs/([a-z0-9/_-]+\.md),?\s+(?:#:?\s*)?(?:"([^"]+)"|'([^']+)')""")
HEADING = re.compile(r"^#+\s+(?:\d+\.\s+)?(.+?)\s*$", re.M)
#: a bold run-in label opening a paragraph or list item: ``**Unmerge (dense tasks).** ...``
LABEL = re.compile(r"^(?:\s*(?:[-*]|\d+\.)\s+)?\*\*(.+?)\*\*", re.M)


def _words(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("`", "")).strip().rstrip(".:").lower()


@cache
def _anchors(page: str) -> tuple[str, ...]:
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    return tuple(_words(m.group(1)) for pattern in (HEADING, LABEL) for m in pattern.finditer(text))


def _pointers() -> list[tuple[str, str, str]]:
    out = []
    for path in SOURCES:
        text = path.read_text(encoding="utf-8")
        for match in POINTER.finditer(text):
            heading = match.group(2) or match.group(3)
            out.append((str(path.relative_to(ROOT)), match.group(1), re.sub(r"\s*#:?\s*", " ", heading)))
    return out


def test_no_section_numbers_in_code():
    """A ``§`` number breaks silently when the docs move; code names the page and its heading."""
    found = [f"{p.relative_to(ROOT)}:{i}" for p in SOURCES
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if "§" in line]
    assert found == []


def test_there_are_pointers_to_check():
    assert len(_pointers()) > 100


@pytest.mark.parametrize("source, page, heading", sorted(set(_pointers())))
def test_every_docs_pointer_names_a_heading_of_its_page(source, page, heading):
    """The quoted words begin a heading (its number left out) or a bold run-in label of the page."""
    assert (ROOT / "docs" / page).is_file(), f"{source}: docs/{page} does not exist"
    wanted = _words(heading)
    assert any(anchor.startswith(wanted) for anchor in _anchors(page)), (
        f"{source}: docs/{page} has no heading or label beginning {heading!r}")
