"""Quiet, deterministic mmengine ``Runner``s for vitbench's tasks, and their clean-up.

Every task builds its runner here so the choices are made once: log level WARNING (the CLI
prints its own progress), no checkpoints, no visualisation files, ``default_scope``
``"mmpretrain"`` (see :mod:`vitbench.mm.registry` for why not ``"vitbench"``), a unique
experiment name (mmengine keys its global logger/message hub/visualiser instances by it, and
two runners started in the same second would otherwise share them), and a fixed seed.
"""
from __future__ import annotations

import contextlib
import logging
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mmengine.runner import Runner

from vitbench.mm import registry as _registry  # noqa: F401 - the vitbench scope must exist
from vitbench.mm.compat import deterministic_cublas

#: Runner hooks every vitbench runner keeps (mmengine's defaults minus checkpoint saving).
QUIET_DEFAULT_HOOKS: dict[str, Any] = {
    "checkpoint": None,  # never write checkpoints; vitbench saves what it needs itself
}


def runner_kwargs(*, work_dir: str | Path, seed: int = 0, default_scope: str = "mmpretrain",
                  deterministic: bool = False, **kwargs: Any) -> dict[str, Any]:
    """Keyword arguments for ``Runner``: vitbench's quiet defaults, updated with ``kwargs``.

    ``deterministic=True`` turns on torch's deterministic algorithms (see
    :func:`vitbench.mm.compat.deterministic_cublas` for the CUDA part mmengine leaves out).
    """
    if deterministic:
        deterministic_cublas()
    base: dict[str, Any] = {
        "work_dir": str(work_dir),
        "default_scope": default_scope,
        "log_level": "WARNING",
        "default_hooks": dict(QUIET_DEFAULT_HOOKS),
        "visualizer": {"type": "Visualizer", "vis_backends": []},  # no scalars.json files
        "env_cfg": {"cudnn_benchmark": False, "dist_cfg": {"backend": "gloo"}},
        "randomness": {"seed": seed, "deterministic": deterministic},
        "experiment_name": f"vitbench-{uuid.uuid4().hex[:12]}",
    }
    base.update(kwargs)
    return base


def release(runner: Runner) -> None:
    """Close the log file the runner opened (mmengine keeps its logger alive globally)."""
    for handler in list(runner.logger.handlers):
        if isinstance(handler, logging.FileHandler):
            handler.close()
            runner.logger.removeHandler(handler)


@contextlib.contextmanager
def work_dir_or_temp(work_dir: str | Path | None) -> Iterator[Path]:
    """``work_dir`` (created) or a temporary folder removed afterwards."""
    if work_dir is not None:
        path = Path(work_dir).expanduser()
        path.mkdir(parents=True, exist_ok=True)
        yield path
    else:
        with tempfile.TemporaryDirectory(prefix="vitbench-mm-") as tmp:
            yield Path(tmp)
