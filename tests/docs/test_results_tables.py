"""docs/results.md quotes its kept reports: every number of a table in a section named after a
kept report (``## ... (`reports/X`)``, before its first ``###``) is a number of that report, so a
report re-made without the page, or a table edited by hand, fails here."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NUMBER = re.compile(r"-?\d+\.\d+")


def quoted_tables() -> dict[str, list[str]]:
    """Each kept report a section names -> the data rows of that section's own tables."""
    out = {}
    for section in re.split(r"\n(?=## )", (ROOT / "docs" / "results.md").read_text()):
        named = re.match(r"## .*?\(`(reports/[\w-]+)`\)", section)
        if named:
            rows = [line for line in section.split("\n### ")[0].splitlines()
                    if line.startswith("|") and not set(line) <= set("|-: ")]
            out[named.group(1)] = rows[1:]  # the header row names columns (bs=32, F = 0.9)
    return out


def test_every_number_of_a_quoted_table_is_in_its_report():
    tables = quoted_tables()
    assert {"reports/flagship", "reports/demo", "reports/sweep"} <= set(tables)
    for report, rows in tables.items():
        text = "".join(p.read_text() for p in (ROOT / report / "report.md", ROOT / report / "rows.md") if p.exists())
        missing = [(row.split("|")[1].strip(), n) for row in rows for n in NUMBER.findall(row) if n not in text]
        assert not missing, f"docs/results.md quotes numbers {report} does not hold: {missing[:5]}"
