"""`vitbench report DIR --format csv|latex`: the report's tables as one file; -o defaults into DIR,
and a sweep's store is found to be one."""
from __future__ import annotations

import csv
import io

from vitbench.cli.main import main
from vitbench.report.export import is_sweep, report_table
from vitbench.report.tables import comparison_table, groups
from vitbench.results import ResultStore


def _store(tmp_path, recs):
    store = ResultStore(tmp_path)
    for r in recs:
        store.append(r)
    return tmp_path


def test_csv_holds_every_row_of_the_comparison_table(records, tmp_path, capsys):
    folder = _store(tmp_path, records)
    assert main(["report", str(folder), "--format", "csv"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {folder / 'report.csv'}"
    rows = list(csv.DictReader(io.StringIO((folder / "report.csv").read_text())))
    expected = [m for task, model in groups(records) for m in comparison_table(records, task, model)["Method"]]
    assert [r["Method"] for r in rows] == expected  # every section's rows, as report.md shows them
    tome = rows[[r["Method"] for r in rows].index("tome (r=13)")]
    assert (tome["Task"], tome["Top-1 (%)"], tome["ΔTop-1 (pp)"]) == ("cls", "80.68", "-0.52")


def test_latex_is_a_booktabs_table_with_special_characters_escaped(records, tmp_path):
    folder = _store(tmp_path, records)
    assert main(["report", str(folder), "-o", str(tmp_path / "t.tex")]) == 0  # the suffix names the format
    tex = (tmp_path / "t.tex").read_text()
    assert tex.startswith("\\begin{tabular}") and "\\toprule" in tex and "Top-1 (\\%)" in tex
    assert "tome (r=13)" in tex


def test_markdown_goes_into_the_store_folder_by_default(records, tmp_path):
    folder = _store(tmp_path, records)
    assert main(["report", str(folder / "runs.jsonl")]) == 0
    assert (folder / "report.md").is_file() and (folder / "report.png").is_file()


def test_a_sweep_is_found_by_its_budgets_or_its_command(make_record):
    base = make_record("base", "baseline")
    at = [make_record(f"b{f}", "tome", {"r": 3}, match_gmacs=f) for f in (0.9, 0.6)]
    assert not is_sweep([base, at[0]])  # one budget: a matched-compute run
    assert is_sweep([base, *at])
    assert list(report_table([base, *at], sweep=True)["Budget"].unique()) == ["0.9", "0.6"]
    assert is_sweep([{**base, "env": {"command": ["vitbench", "sweep", "--methods", "tome"]}}])
    assert is_sweep([{**base, "env": {"command": "vitbench.sweep(task='cls', budgets=[0.9])"}}])
