"""The report's warnings reach the terminal: ``vitbench run`` prints each one last, on stderr."""
from __future__ import annotations

from vitbench.cli.main import main
from vitbench.report.warnings_of import report_warnings


def test_rows_at_different_compute_are_warned_about_at_the_end(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "--model", "test_vit", "--methods", "tome,topk", "--param", "tome.r=2",
                 "--metrics", "gmacs", "--out", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    said = [line for line in err if line.startswith("vitbench: warning: ")]
    assert said and "these methods ran at different compute" in said[-1] and "--match-gmacs F" in said[-1]
    assert err[-1] == said[-1]  # last: nothing buries it
    assert said == [f"vitbench: warning: {text}" for text in report_warnings(out / "report.md")]


def test_a_report_without_warnings_says_none(tmp_path):
    (tmp_path / "report.md").write_text("# vitbench report\n\n> a quote, not a warning\n")
    assert report_warnings(tmp_path / "report.md") == [] and report_warnings(tmp_path / "missing.md") == []
