"""Files vitbench writes atomically get the mode a plain ``open()`` gives (0666 less the umask),
not ``mkstemp``'s 0600: a colleague can reload the checkpoints of a shared ``--out``."""
from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

import vitbench
from vitbench.core.cache import atomic_write
from vitbench.report._atomic import atomic_write_bytes
from vitbench.testing import tiny_vit
from vitbench.train import load_trained, save_trained


@contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path) -> int:  # type: ignore[no-untyped-def]
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_a_saved_checkpoint_has_the_mode_of_a_plain_open(tmp_path, mask: int, mode: int) -> None:
    model = vitbench.apply(tiny_vit(), "tome", r=4)
    with _umask(mask):
        path = save_trained(model, tmp_path / "checkpoints" / "run.pth")
        plain = tmp_path / "plain.txt"
        plain.write_text("x")
    assert _mode(path) == _mode(plain) == mode
    assert [p.name for p in path.parent.iterdir()] == ["run.pth"]  # no temporary file left
    load_trained(vitbench.apply(tiny_vit(), "tome", r=4), path)  # and it loads


def test_reports_and_cache_files_too(tmp_path) -> None:
    with _umask(0o022):
        report = atomic_write_bytes(tmp_path / "report.md", b"# report\n")
        weights = atomic_write(tmp_path / "cache" / "w.pth", lambda p: torch.save({"w": torch.ones(1)}, p))
    assert _mode(report) == _mode(weights) == 0o644
    assert report.read_bytes() == b"# report\n" and torch.load(weights)["w"].item() == 1.0


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path) -> None:
    path = atomic_write_bytes(tmp_path / "report.md", b"old")

    def fails(tmp) -> None:  # type: ignore[no-untyped-def]
        tmp.write_bytes(b"half")
        raise OSError("No space left on device")

    with pytest.raises(OSError, match="No space left"):
        atomic_write(path, fails)
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["report.md"]
