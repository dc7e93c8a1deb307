"""A data folder's fingerprint changes with any file's path, size, modification time (or bytes)."""
from __future__ import annotations

import os

from vitbench.data.fingerprint import folder_fingerprint


def test_the_fingerprint_follows_paths_sizes_and_times(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.jpg").write_bytes(b"12345")
    (tmp_path / "b.jpg").write_bytes(b"abc")
    first = folder_fingerprint(tmp_path)
    assert first.startswith("files=2,sha256=") and folder_fingerprint(tmp_path) == first
    assert folder_fingerprint(str(tmp_path) + "/.") == first  # the same folder however it is named
    stat = (tmp_path / "b.jpg").stat()
    os.utime(tmp_path / "b.jpg", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    touched = folder_fingerprint(tmp_path)
    assert touched != first
    (tmp_path / "b.jpg").rename(tmp_path / "c.jpg")
    assert folder_fingerprint(tmp_path) not in (first, touched)


def test_content_sees_what_the_times_hide(tmp_path):
    path = tmp_path / "x.jpg"
    path.write_bytes(b"aaaa")
    stat = path.stat()
    before, with_bytes = folder_fingerprint(tmp_path), folder_fingerprint(tmp_path, content=True)
    path.write_bytes(b"bbbb")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same time, other bytes
    assert folder_fingerprint(tmp_path) == before
    assert folder_fingerprint(tmp_path, content=True) != with_bytes
