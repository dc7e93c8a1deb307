"""End to end on the default model: a report's rows say their settings, images, interval and
weights; unequal compute is warned about; a run with nothing to plot writes no plot."""
from __future__ import annotations

import json
from pathlib import Path

from vitbench.cli.main import main


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]


def test_a_cls_report_says_what_each_row_is(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "--task", "cls", "--methods", "tome,ppt", "--limit", "16", "--metrics", "accuracy,gmacs",
                 "--batch-size", "2", "--out", str(out)]) == 0
    base, tome, ppt = _records(out)
    assert (tome["label"], ppt["label"]) == ("tome (r=16)", "ppt (r=50)")
    assert tome["num_images"] == 16 and tome["weights_from"] == base["weights_from"]
    assert base["weights_from"].startswith(("embedded default vitbench-fmnist-vit (sha256 ",
                                            "default vitbench-fmnist-vit retrained here"))
    report = (out / "report.md").read_text()
    header = next(line for line in report.splitlines() if line.startswith("| Method"))
    assert "Images" in header and "Top-5" not in header  # 10 classes: no top-5
    assert "| tome (r=16) " in report and "different compute" in report and "--match-gmacs F" in report
    assert f"Weights of every row: {base['weights_from']}." in report
    methodology = report.split("## Methodology")[1].split("\n## ")[0]
    assert "Wilson" in methodology and "IB loss" not in methodology and "Throughput**" not in methodology
    assert (out / "report.png").is_file() and "## Plot" in report
    assert "plot:" in capsys.readouterr().out


def test_a_gmacs_only_run_writes_no_plot(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "--task", "cls", "--methods", "tome", "--metrics", "gmacs", "--out", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert not (out / "report.png").exists() and "## Plot" not in report
    printed = capsys.readouterr().out
    assert "report:" in printed and "plot:" not in printed
