"""The warnings a written report holds (``> **Warning:** ...`` lines: a baseline near chance, rows at
different compute), as plain sentences for the end of a run's terminal output."""
from __future__ import annotations

import re
from pathlib import Path

__all__ = ["report_warnings"]

_WARNING = re.compile(r"^> \*\*Warning:\*\* (.+)$")


def report_warnings(report: Path) -> list[str]:
    """Each warning of the markdown report at ``report``, once, in order, without its markdown
    (``**`` and backticks); none when the file is missing."""
    if not report.is_file():
        return []
    found = (m.group(1) for line in report.read_text(encoding="utf-8").splitlines() if (m := _WARNING.match(line)))
    return list(dict.fromkeys(text.replace("**", "").replace("`", "") for text in found))
