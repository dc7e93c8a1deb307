"""The table of kept reports that docs/results.md holds: each report under reports/, the code
revision, machine and dates its header names (tests/docs/test_kept_reports.py checks that the page
and the reports agree).

    python benchmarks/kept_reports.py            # print the table
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the header lines a report's table row quotes
FIELDS = (("Git revision", "revision"), ("Device", "machine"), ("Measured", "measured"))


def header(path: Path) -> dict[str, str]:
    """The quoted fields of one report's header (``- Git revision: ...`` lines)."""
    text = path.read_text(encoding="utf-8")
    out = {}
    for name, key in FIELDS:
        m = re.search(rf"^- {name}: (.+)$", text, flags=re.MULTILINE)
        if m:
            out[key] = m.group(1).strip()
    return out


def kept_reports(root: Path = ROOT) -> list[tuple[str, dict[str, str]]]:
    """Each report folder with a header (its report.md, else rows.md), by name."""
    out = []
    for folder in sorted(p for p in (root / "reports").iterdir() if p.is_dir()):
        for name in ("report.md", "rows.md"):
            fields = header(folder / name) if (folder / name).is_file() else {}
            if fields.get("revision"):
                out.append((f"reports/{folder.name}/{name}", fields))
                break
    return out


def table(root: Path = ROOT) -> str:
    """The markdown table of :func:`kept_reports`."""
    lines = ["| report | code revision | machine | measured (UTC) |", "| --- | --- | --- | --- |"]
    for name, f in kept_reports(root):
        measured = f.get("measured", "").replace("+00:00", "").replace("T", " ")
        lines.append(f"| `{name}` | {f['revision']} | {f.get('machine', '')} | {measured} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(table() + "\n")
