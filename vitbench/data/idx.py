"""Reader for the IDX format (the MNIST family's file format), gzipped or not.

Kept apart from the Fashion-MNIST data set so the parser has no OpenMMLab import and can be
tested on bytes alone. Format: a big-endian magic ``0x0000TTNN`` (``TT`` the element type,
``NN`` the number of dimensions), one big-endian uint32 per dimension, then the raw elements.
"""
from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

from vitbench.errors import DataError

# Element type byte -> numpy big-endian dtype (only unsigned bytes occur in (Fashion-)MNIST,
# the others are here so a valid file is never rejected for its type).
_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def parse_idx(raw: bytes, *, source: str = "<bytes>") -> np.ndarray:
    """Parse IDX ``raw`` bytes into an array; a malformed header raises :class:`DataError`.

    ``source`` names the file in the error message.
    """
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataError(f"malformed IDX file {source}: bad magic number (expected 0x0000TTNN)")
    type_code, ndim = raw[2], raw[3]
    if type_code not in _DTYPES or ndim == 0:
        raise DataError(f"malformed IDX file {source}: unknown element type {type_code:#x} "
                        f"or {ndim} dimensions")
    header_len = 4 + 4 * ndim
    if len(raw) < header_len:
        raise DataError(f"malformed IDX file {source}: truncated header")
    shape = struct.unpack(f">{ndim}I", raw[4:header_len])
    dtype = np.dtype(_DTYPES[type_code])
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(raw) - header_len != expected:
        raise DataError(f"malformed IDX file {source}: header says shape {shape} "
                        f"({expected} bytes) but {len(raw) - header_len} bytes follow")
    data = np.frombuffer(raw, dtype=dtype, offset=header_len).reshape(shape)
    return data.astype(dtype.newbyteorder("="), copy=True)  # native order, writable


def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file (``.gz`` is decompressed); unreadable or corrupt -> :class:`DataError`."""
    path = Path(path)
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                raw = f.read()
        else:
            raw = path.read_bytes()
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
        raise DataError(f"cannot read IDX file {path}: {exc}") from exc
    return parse_idx(raw, source=str(path))
