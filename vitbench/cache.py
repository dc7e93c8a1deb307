"""Where vitbench keeps what it makes once and reuses: the default model, the embedded data sets,
trained detectors (``$VITBENCH_CACHE``, else ``~/.cache/vitbench``)."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ENV_CACHE", "cache_dir"]

#: the environment variable that moves the cache
ENV_CACHE = "VITBENCH_CACHE"


def cache_dir(path: str | Path | None = None) -> Path:
    """Where cached models live: ``path``, else ``$VITBENCH_CACHE``, else ``~/.cache/vitbench``."""
    if path is not None:
        return Path(path).expanduser()
    env = os.environ.get(ENV_CACHE)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "vitbench"
