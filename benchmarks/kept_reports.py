"""The table of kept reports that docs/results.md holds: each report under reports/, the code
revision, machine and dates its header names; and the README's sweep table, each method's top-1 at
each budget in reports/sweep (tests/docs/test_kept_reports.py checks that the pages and the reports
agree).

    python benchmarks/kept_reports.py            # print the table of kept reports
    python benchmarks/kept_reports.py --sweep    # print the README's sweep table
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the header lines a report's table row quotes
FIELDS = (("Git revision", "revision"), ("Device", "machine"), ("Measured", "measured"))
#: the sweep's controls, listed after its methods
CONTROLS = ("random", "downsample")


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


def sweep_table(root: Path = ROOT) -> str:
    """Top-1 (%) of each method (in the sweep command's order, controls last) at each matched
    budget of reports/sweep, the newest successful record of each, as the README quotes it."""
    records = [json.loads(line) for line in (root / "reports" / "sweep" / "runs.jsonl").read_text().splitlines()
               if line.strip()]
    top1 = {(r["method"], r["match_gmacs"]): r["top1_pct"] for r in records
            if r.get("status") == "ok" and r.get("match_gmacs") and r.get("top1_pct") is not None}
    budgets = sorted({b for _, b in top1}, reverse=True)
    named = re.search(r"--methods (\S+)", (root / "reports" / "sweep" / "report.md").read_text())
    order = named.group(1).split(",") if named else []  # the command's order, then any other method
    methods = [m for m in dict.fromkeys([*order, *(m for m, _ in top1)]) if any(m == n for n, _ in top1)]
    methods = [m for m in methods if m not in CONTROLS] + [m for m in CONTROLS if m in methods]
    lines = ["| Method | " + " | ".join([f"F = {budgets[0]:g}", *(f"{b:g}" for b in budgets[1:])]) + " |",
             "| --- |" + " ---: |" * len(budgets)]
    for m in methods:
        label = f"{m} (control)" if m in CONTROLS else m
        cells = [f"{top1[m, b]:.2f}" if (m, b) in top1 else "n/a" for b in budgets]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write((sweep_table() if "--sweep" in sys.argv[1:] else table()) + "\n")
