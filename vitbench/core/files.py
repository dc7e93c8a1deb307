"""What a path is before vitbench reads or replaces it: a pipe or a device is never a file."""
from __future__ import annotations

import os
import stat

__all__ = ["special_file"]


def special_file(path: str | os.PathLike[str]) -> str | None:
    """What ``path`` is when it exists and is neither a regular file nor a folder (``"a FIFO"``,
    ``"a character device"``, ...), following links; ``None`` otherwise."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    for test, kind in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "no regular file"
