"""docs/measuring.md's compile table (benchmarks/compile_table.py's output) lists every built-in
method, each with its graphs and breaks or in words why it has none (a method that does not
apply, a compile that fell back)."""
from __future__ import annotations

from pathlib import Path

from scripts_support import load_script  # tests/scripts_support.py

ROOT = Path(__file__).resolve().parents[2]


def _script():
    return load_script("compile_table")


def test_the_page_lists_every_builtin_method():
    script = _script()
    page = (ROOT / "docs" / "measuring.md").read_text()
    written = page.split(script.BEGIN, 1)[1].split(script.END, 1)[0]
    listed = {line.split("|")[1].strip() for line in written.splitlines() if line.startswith("| ")} - {"method"}
    missing = sorted(set(script.builtin_methods()) - listed)
    assert not missing, f"re-make it: python benchmarks/compile_table.py --write (missing: {missing})"


def test_the_table_has_a_row_per_method_with_its_breaks_or_why_not():
    script = _script()
    text = script.table([{"method": "tome", "graphs": 1, "breaks": 0, "reason": "", "speedup": 1.234, "flag": None},
                         {"method": "ats", "graphs": 13, "breaks": 12, "reason": "data-dependent shape",
                          "speedup": 0.9, "flag": "spread"},
                         {"method": "x", "note": "does not apply: needs a Swin"}])
    lines = text.splitlines()
    assert lines[:2] == list(script.HEADER)
    assert lines[2] == "| tome | 1 | 0 | - | 1.23 |"
    assert lines[3] == "| ats | 13 | 12 | data-dependent shape | 0.90 † |"
    assert lines[4] == "| x | n/a | n/a | does not apply: needs a Swin | n/a |"


def test_rows_of_named_methods_join_the_pages_table_and_its_note():
    script = _script()
    written = "\n".join([*script.HEADER, "| baseline | 1 | 0 | - | 1.19 |", "| tome | 1 | 0 | - | 1.16 |",
                         "", "`python benchmarks/compile_table.py` (batch 32)"])
    text = "\n".join([*script.HEADER, "| baseline | 1 | 0 | - | 1.30 |", "| saint | 7 | 6 | item() | 1.05 |"])
    table, note = script.merged(written, text, ["saint"], "`... --methods saint` (batch 32)")
    assert table.splitlines()[2:] == ["| baseline | 1 | 0 | - | 1.19 |", "| saint | 7 | 6 | item() | 1.05 |",
                                      "| tome | 1 | 0 | - | 1.16 |"]
    assert note == "`python benchmarks/compile_table.py` (batch 32); saint: `... --methods saint` (batch 32)"
