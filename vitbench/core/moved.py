"""Old module names that still import: each is the module it moved to, with a
``DeprecationWarning`` (docs/architecture.md, "Moved modules"). Third-party plugins written
against an older layout keep loading; vitbench's own code uses the new names."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import Any, Optional, Sequence

__all__ = ["MOVED", "MovedModuleFinder", "install", "moved_attribute"]

#: old module name -> the module that holds its code now
MOVED = {
    "vitbench.plugins": "vitbench.host",
    "vitbench.spec": "vitbench.host.spec",
    "vitbench.distributed": "vitbench.host.distributed",
    "vitbench.environment": "vitbench.host.environment",
    "vitbench.engine.apply": "vitbench.host.apply",
    "vitbench.plan": "vitbench.run.plan",
    "vitbench.execute": "vitbench.run.execute",
    "vitbench.calibrate": "vitbench.measure.calibrate",
    "vitbench.tasks.cls.models": "vitbench.tasks.models",
    "vitbench.train.finetune": "vitbench.tasks.cls.finetune",
    **{f"vitbench.{name}": f"vitbench.core.{name}"
       for name in ("files", "cache", "params", "guards", "options", "metrics", "progress", "interrupts")},
    **{f"vitbench.tasks.det.{name}": f"vitbench.tasks.dense.{name}"
       for name in ("backbone", "data", "detectors", "evaluate", "options", "protocol", "report", "requires",
                    "run", "train")},
}


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; import it from there (the old name goes in a later release)",
                  DeprecationWarning, stacklevel=3)


class _AliasLoader(importlib.abc.Loader):
    """Loads an old name as the very module it moved to (one object: patching either patches both)."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.new)
        self.own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.own_spec  # the import system stamped the old name's spec on it
        _warn(self.old, self.new)


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds each name of :data:`MOVED` and loads the module it moved to."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        new = MOVED.get(fullname)
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(fullname, new)) if new else None


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (``import vitbench`` does)."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())


def moved_attribute(package: str, name: str, module: str) -> Any:
    """``package.name`` that now lives in ``module``, with the warning."""
    _warn(f"{package}.{name}", f"{module}.{name}")
    return getattr(importlib.import_module(module), name)
