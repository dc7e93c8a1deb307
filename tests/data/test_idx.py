"""The IDX parser on hand-made bytes (no data files needed)."""
from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from vitbench.data.idx import parse_idx, read_idx
from vitbench.errors import DataError


def _idx(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(np.uint8).tobytes()


def test_parse_roundtrip() -> None:
    a = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    out = parse_idx(_idx(a))
    np.testing.assert_array_equal(out, a)
    assert out.flags.writeable


@pytest.mark.parametrize("raw", [b"", b"\x01\x00\x08\x01", b"\x00\x00\x08\x02\x00\x00\x00\x02"])
def test_bad_headers(raw: bytes) -> None:
    with pytest.raises(DataError, match="malformed IDX file"):
        parse_idx(raw)


def test_size_mismatch_names_source() -> None:
    raw = _idx(np.zeros((2, 2), dtype=np.uint8))[:-1]
    with pytest.raises(DataError, match=r"some/file.*header says shape \(2, 2\)"):
        parse_idx(raw, source="some/file")


def test_read_gz_and_corrupt_gz(tmp_path) -> None:
    a = np.arange(6, dtype=np.uint8)
    (tmp_path / "x.gz").write_bytes(gzip.compress(_idx(a)))
    np.testing.assert_array_equal(read_idx(tmp_path / "x.gz"), a)
    (tmp_path / "bad.gz").write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match="bad.gz"):
        read_idx(tmp_path / "bad.gz")
