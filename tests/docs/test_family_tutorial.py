"""The family tutorial (docs/guide/families.md) works: every shell step of the page runs here.

The page shows the files of examples/vitbench-cait-family as they are (checked here); ``pip install -e .``
is run as a plain install into a folder of the test (``--target``, on ``PYTHONPATH``), as the
plugin tutorial's test does, so that nothing is left in the environment.
"""
from __future__ import annotations

from pathlib import Path

from tutorial_steps import run_steps, shown_file

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "guide" / "families.md"
EXAMPLE = ROOT / "examples" / "vitbench-cait-family"
FILES = ("vitbench_cait.py", "pyproject.toml", "test_cait_family.py")


def test_the_page_shows_every_file_of_the_example_as_it_is() -> None:
    page = PAGE.read_text()
    for name in FILES:
        assert shown_file(page, name) == (EXAMPLE / name).read_text(), f"{name}: the page's copy differs from {EXAMPLE / name}"


def test_every_step_of_the_tutorial_runs(tmp_path: Path) -> None:
    outputs = run_steps(PAGE.read_text(), EXAMPLE, FILES, tmp_path)
    outputs.pop("cwd")
    assert list(outputs) == ["pip install -e .", "vitbench list families", "python -m pytest -q test_cait_family.py"]
    listed = outputs["vitbench list families"]
    shown = PAGE.read_text().split("provides:\n\n```text\n", 1)[1].split("```", 1)[0]
    assert shown in listed, "the page shows what `vitbench list families` prints for cait"
    assert "3 passed" in outputs["python -m pytest -q test_cait_family.py"]
