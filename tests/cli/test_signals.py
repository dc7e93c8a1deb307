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
