"""Where vitbench caches what it makes once: an explicit path, ``$VITBENCH_CACHE``, or the home cache."""
from __future__ import annotations

from pathlib import Path

from vitbench.core.cache import ENV_CACHE, cache_dir


def test_an_explicit_path_wins_then_the_environment_then_home(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_CACHE, str(tmp_path / "env"))
    assert cache_dir(tmp_path / "given") == tmp_path / "given"
    assert cache_dir() == tmp_path / "env"
    monkeypatch.delenv(ENV_CACHE)
    assert cache_dir() == Path.home() / ".cache" / "vitbench"
