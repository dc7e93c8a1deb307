"""SIGTERM ends a command with one line and exit 143, like Ctrl-C's 130."""
from __future__ import annotations

import os
import signal
import time

from vitbench.cli import run_cmd
from vitbench.cli.main import main


def test_sigterm_exits_143_with_one_line(monkeypatch, capsys):
    def killed(args):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
        raise AssertionError("SIGTERM was not turned into an exit")

    monkeypatch.setattr(run_cmd, "run", killed)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        assert main(["run", "--methods", "tome"]) == 143
    finally:
        signal.signal(signal.SIGTERM, previous)
    err = capsys.readouterr().err
    assert err.strip() == "vitbench: terminated (SIGTERM); finished runs are in the store (use --resume)"


def test_a_stopped_run_writes_the_report_of_what_finished(monkeypatch, tmp_path, capsys):
    from vitbench.run import execute

    real = execute.run_spec

    def stopped_at_topk(spec, *args, **kwargs):
        if spec.method == "topk":
            raise KeyboardInterrupt
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(execute, "run_spec", stopped_at_topk)
    out = tmp_path / "out"
    assert main(["run", "--model", "test_vit", "--methods", "tome,topk", "--metrics", "gmacs",
                 "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert f"vitbench: stopped; the report of the finished runs: {out / 'report.md'}" in err
    report = (out / "report.md").read_text()
    assert "| tome (r=" in report and "| topk (" not in report and "Runs: 2 (2 ok)" in report
