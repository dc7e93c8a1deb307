"""What the dense tasks need beyond the cls install: mmdet and mmcv's compiled ops.

``make install`` installs the ops-free mmcv (``mmcv-lite``, pure Python) and no mmdet, which is
all the cls task uses; ``make install-dense`` (the ``dense`` extra) adds both. A det/seg run
without them stops before anything runs, with one line that says how to install them.
"""
from __future__ import annotations

import importlib.util

from vitbench.errors import VitbenchError

#: the modules a dense run imports that the cls install lacks (``mmcv._ext``: the compiled ops)
DENSE_MODULES = ("mmdet", "mmcv._ext")


class MissingDependencyError(VitbenchError):
    """A task whose packages are not installed."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a missing parent package, or a module set to None
        return False


def check_dense_stack(task: str) -> None:
    """Raise :class:`MissingDependencyError` unless mmdet and mmcv's compiled ops are installed."""
    if not all(_installed(m) for m in DENSE_MODULES):
        raise MissingDependencyError(
            f"--task {task} needs mmdet and mmcv's compiled ops: run make install-dense "
            '(or pip install "vitbench[dense]")')
