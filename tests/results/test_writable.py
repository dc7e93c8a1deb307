"""An ``--out`` that cannot be written is refused before anything runs; a store append that fails
at the end keeps the record in a rescue file the user is told about."""
from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from vitbench.cli.main import main
from vitbench.results import ResultStore
from vitbench.results.writable import OutputError, check_writable

QUICK = ["run", "--methods", "tome", "--model", "test_vit", "--metrics", "params"]


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("out", ["/sys/vitbench-out", "/sys"])
def test_an_unwritable_out_exits_2_before_anything_runs(out, capsys, monkeypatch):
    """``/sys`` refuses new files even to root: a real read-only folder on any Linux machine."""
    if not Path("/sys").is_dir():
        pytest.skip("no /sys on this platform")
    loaded = []
    monkeypatch.setattr("vitbench.tasks.cls.run.load_model", lambda *a, **k: loaded.append(1))
    assert main([*QUICK, "--out", out]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("vitbench: error: --out ") and out in line
    assert not loaded


def test_an_out_naming_a_file_exits_2(tmp_path, capsys):
    out = tmp_path / "report.txt"
    out.write_text("not a folder")
    assert main([*QUICK, "--out", str(out)]) == 2
    assert "is a file, not a folder" in _one_line(capsys.readouterr().err)
    assert out.read_text() == "not a folder"


def test_a_store_that_is_a_folder_exits_2(tmp_path, capsys):
    (tmp_path / "runs.jsonl").mkdir()
    assert main([*QUICK, "--out", str(tmp_path)]) == 2
    assert "'runs.jsonl' is not a file" in _one_line(capsys.readouterr().err)


def test_the_probe_leaves_nothing_behind(tmp_path):
    out = tmp_path / "new" / "deeper"
    check_writable(out, out / "runs.jsonl")
    assert list(tmp_path.iterdir()) == []  # the folders it made for the probe are gone
    out.mkdir(parents=True)
    check_writable(out, out / "runs.jsonl")
    assert out.is_dir() and list(out.iterdir()) == []


def test_ranks_that_share_a_folder_leave_it_for_each_other(tmp_path):
    """Under a launcher every rank checks the same ``--out`` at once: the folder stays, so one
    rank's check never removes it while another rank takes the launcher's lock in it."""
    from filelock import FileLock

    out = tmp_path / "new" / "deeper"
    check_writable(out, out / "runs.jsonl", shared=True)
    assert out.is_dir() and list(out.iterdir()) == []  # kept, the probe gone
    with FileLock(str(out / ".vitbench-launcher.lock")):
        check_writable(out, out / "runs.jsonl", shared=True)  # a second rank, while the first holds the lock
    assert out.is_dir()


def test_an_out_under_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(OutputError, match="cannot be created"):
        check_writable(tmp_path / "f" / "out", tmp_path / "f" / "out" / "runs.jsonl")


def test_a_full_disk_at_the_end_keeps_the_record_in_a_rescue_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR

    def full(self, record):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ResultStore, "append", full)
    out = tmp_path / "out"
    assert main([*QUICK, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "No space left on device" in err and "is kept in" in err and "Traceback" not in err
    rescued = list((tmp_path / "tmp").glob("vitbench-rescued-*.jsonl"))
    assert len(rescued) == 1
    records = [json.loads(line) for line in rescued[0].read_text().splitlines()]
    assert [r["method"] for r in records] == ["baseline", "tome"]
    assert all(r["status"] == "ok" and r["params_m"] > 0 for r in records)
    # the rescued lines are store lines: appended back, the store reads them
    (out / "runs.jsonl").write_text(rescued[0].read_text())
    assert [r["method"] for r in ResultStore(out).records()] == ["baseline", "tome"]
