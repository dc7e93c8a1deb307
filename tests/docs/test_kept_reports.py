"""docs/results.md names each kept report's code revision, machine and dates as the report's own
header says them, and the README quotes reports/sweep's top-1s: both tables are
benchmarks/kept_reports.py's output, so a report re-made without the page (or the page edited
without the report) fails here."""
from __future__ import annotations

from pathlib import Path

from scripts_support import load_script  # tests/scripts_support.py

ROOT = Path(__file__).resolve().parents[2]


def _script():
    return load_script("kept_reports")


def test_the_results_page_names_each_kept_reports_revision():
    kept = _script()
    page = (ROOT / "docs" / "results.md").read_text()
    assert kept.table() in page, "re-make the table: python benchmarks/kept_reports.py (docs/results.md, 'The kept reports')"
    assert {name.split("/")[1] for name, _ in kept.kept_reports()} >= {"flagship", "demo", "learnable", "sweep"}


def test_a_report_header_is_read_field_by_field(tmp_path):
    kept = _script()
    (tmp_path / "reports" / "x").mkdir(parents=True)
    (tmp_path / "reports" / "x" / "report.md").write_text(
        "# vitbench report\n\n- Device: cpu (AMD EPYC, 2 cores)\n- Git revision: abc1234\n"
        "- Measured: 2026-12-06T03:07:04+00:00 to 2026-12-06T03:11:16+00:00\n")
    assert kept.table(tmp_path).splitlines()[-1] == (
        "| `reports/x/report.md` | abc1234 | cpu (AMD EPYC, 2 cores) | 2026-12-06 03:07:04 to 2026-12-06 03:11:16 |")


def test_the_readmes_sweep_table_is_the_kept_sweeps():
    readme = (ROOT / "README.md").read_text()
    assert _script().sweep_table() in readme, "re-make it: python benchmarks/kept_reports.py --sweep (README, 'A sweep')"
