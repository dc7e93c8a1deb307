"""A data folder's fingerprint follows its files' names and bytes, not their times."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from vitbench.data.fingerprint import folder_files, folder_fingerprint
from vitbench.errors import DataError


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VITBENCH_CACHE", str(tmp_path / "cache"))


def test_the_fingerprint_follows_names_and_bytes_not_times(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "a").mkdir(parents=True)
    (data / "a" / "x.jpg").write_bytes(b"12345")
    (data / "b.jpg").write_bytes(b"abc")
    first = folder_fingerprint(data)
    assert first.startswith("files=2,sha256=") and folder_fingerprint(data) == first
    assert folder_fingerprint(str(data) + "/.") == first  # the same folder however it is named
    stat = (data / "b.jpg").stat()
    os.utime(data / "b.jpg", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert folder_fingerprint(data) == first  # the same bytes: the same data
    (data / "b.jpg").rename(data / "c.jpg")
    assert folder_fingerprint(data) != first


def test_bytes_swapped_under_the_old_size_and_time_are_seen(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    one, two = data / "cat.png", data / "dog.png"
    one.write_bytes(b"aaaa")
    two.write_bytes(b"bbbb")
    before = folder_fingerprint(data)
    times = [(p.stat().st_atime_ns, p.stat().st_mtime_ns) for p in (one, two)]
    one.write_bytes(b"bbbb")
    two.write_bytes(b"aaaa")
    for path, ns in zip((one, two), times):  # `touch -r`: the old times back
        os.utime(path, ns=ns)
    assert folder_fingerprint(data) != before


def test_a_link_loop_and_a_pipe_end_the_scan(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "sub" / "x.jpg").write_bytes(b"x")
    (data / "sub" / "up").symlink_to(data)
    os.mkfifo(data / "pipe.jpg")
    assert [p.name for p in folder_files(data)] == ["x.jpg"]
    assert folder_fingerprint(data).startswith("files=1,")


def test_a_name_no_encoding_decodes_is_hashed(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (Path(os.fsdecode(bytes(data) + b"/caf\xe9.jpg"))).write_bytes(b"x")
    assert folder_fingerprint(data).startswith("files=1,")
    assert folder_fingerprint(data) == folder_fingerprint(data)  # read back from the kept digests


def test_an_unreadable_file_is_a_data_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "x.jpg").write_bytes(b"x")
    real_open = Path.open

    def refuse(self: Path, *args, **kwargs):
        if self.name == "x.jpg":
            raise PermissionError(13, "Permission denied")
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", refuse)  # what chmod 0 does to anyone but root
    with pytest.raises(DataError, match="cannot read .*x.jpg .*: Permission denied"):
        folder_fingerprint(data)
