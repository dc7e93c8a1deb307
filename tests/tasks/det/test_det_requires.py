"""`--task det|seg` without the dense extra (mmdet, mmcv's compiled ops): one line, exit 2, nothing run."""
from __future__ import annotations

import sys

import pytest

from vitbench.cli.main import main

MESSAGE = ("vitbench: error: --task {task} needs mmdet and mmcv's compiled ops: run make install-dense "
           '(or pip install "vitbench[dense]")')


@pytest.mark.parametrize(("task", "missing"), [("det", "mmdet"), ("seg", "mmdet"), ("det", "mmcv._ext")])
def test_a_dense_task_without_its_packages_says_how_to_install_them(task, missing, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, missing, None)  # what an import of a module not installed finds
    out = tmp_path / "out"
    assert main(["run", "--task", task, "--methods", "tome", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.strip()] == [MESSAGE.format(task=task)]
    assert not out.exists()  # before anything runs
