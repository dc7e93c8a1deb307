"""What a plugin from another distribution may not do while it loads: end the process or change
vitbench's functions (docs/reliability.md, "Plugins fail alone").

:func:`import_survives` first imports the plugin in a forked child, so an ``os._exit``, a crash or
a hang at import fails that plugin instead of every command. :class:`Snapshot` and
:func:`patched_by` find what its import changed: every function or class held by a module of
vitbench, of its built-in plugins or of a plugin loaded before, and every method of the classes
those modules define, whose code lives in the new plugin's package. What was there before is put
back; what the plugin imported and changed itself cannot be, and is refused when a run starts.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

__all__ = ["IMPORT_TIMEOUT_S", "Snapshot", "guarded_modules", "import_survives", "package_of", "patched_by"]

#: how long a plugin's import may take in the trial child before it counts as hung
IMPORT_TIMEOUT_S = 60.0
#: the packages whose modules a plugin may not change
OWN_PACKAGES = ("vitbench", "vitbench_plugins")


def package_of(module: str) -> str:
    """The package a plugin's code lives in: its entry point's top-level package, or the module
    itself when that package is vitbench's own."""
    top = module.split(".")[0]
    return module if top in OWN_PACKAGES else top


def import_survives(load: Callable[[], Any], timeout: float = IMPORT_TIMEOUT_S) -> Optional[str]:
    """Run ``load`` in a forked child with its output discarded; why it ended the process (an exit
    code, a signal, no end within ``timeout`` seconds), or None when it returned or raised (a
    raise is the parent's to report). Without ``os.fork`` nothing is tried."""
    if not hasattr(os, "fork"):
        return None
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child, measured by its exit status
        try:
            import faulthandler

            faulthandler.disable()  # a crash is the parent's to report, in one line
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            load()
        except BaseException:  # noqa: BLE001 - a raise is reported by the parent's own import
            pass
        os._exit(0)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return f"its import did not finish within {timeout:g} s"
        time.sleep(0.002)
    if os.WIFSIGNALED(status):
        return f"its import killed the process ({signal.Signals(os.WTERMSIG(status)).name})"
    if os.WEXITSTATUS(status) != 0:
        return f"its import ended the process (os._exit({os.WEXITSTATUS(status)}))"
    return None


def guarded_modules(packages: Iterable[str]) -> Iterator[tuple[str, ModuleType]]:
    """The imported modules of vitbench, its built-in plugins and ``packages`` (plugins loaded before)."""
    roots = tuple(OWN_PACKAGES) + tuple(packages)
    for name, module in list(sys.modules.items()):
        if isinstance(module, ModuleType) and any(name == r or name.startswith(r + ".") for r in roots):
            yield name, module


def _code_of(value: Any) -> Any:
    value = getattr(value, "__func__", value)  # a bound, static or class method
    return getattr(value, "func", value)  # a functools.partial


def _lives_in(value: Any, package: str, folder: Optional[str]) -> bool:
    """Whether ``value`` is a function or class whose code is ``package``'s (by its module, or by its
    file, which ``functools.wraps`` cannot hide)."""
    target = _code_of(value)
    if not (isinstance(target, type) or callable(target)):
        return False
    module = getattr(target, "__module__", None)
    if isinstance(module, str) and (module == package or module.startswith(package + ".")):
        return True
    code = getattr(target, "__code__", None)
    return folder is not None and code is not None and str(code.co_filename).startswith(folder)


def _where(package: str) -> Optional[str]:
    """The file or folder of ``package`` (as its functions' ``co_filename`` start), when imported."""
    module = sys.modules.get(package)
    file = getattr(module, "__file__", None)
    if not file:
        return None
    path = Path(file)
    return str(path.parent) + os.sep if path.name == "__init__.py" else str(path.with_suffix(""))


class Snapshot:
    """The attributes of the guarded modules, and of the classes they define, before a load."""

    def __init__(self, packages: Iterable[str]) -> None:
        self.modules: dict[str, dict[str, Any]] = {}
        self.classes: dict[tuple[str, str], dict[str, Any]] = {}
        for name, module in guarded_modules(packages):
            own = dict(vars(module))
            self.modules[name] = own
            for attr, value in own.items():
                if isinstance(value, type) and value.__module__ == name:
                    self.classes[(name, attr)] = dict(vars(value))

    def undo(self, changed: list[tuple[str, str, Optional[str]]]) -> list[str]:
        """Put back each changed attribute known before; the dotted names of those it cannot."""
        left = []
        for module, attr, member in changed:
            target = sys.modules[module] if member is None else getattr(sys.modules[module], attr)
            before = self.modules.get(module) if member is None else self.classes.get((module, attr))
            key = attr if member is None else member
            if before is None:  # a module the plugin imported itself: what it held is not known
                left.append(".".join(p for p in (module, attr, member) if p))
                continue
            try:
                if key in before:
                    setattr(target, key, before[key])
                else:  # added by the plugin
                    delattr(target, key)
            except (AttributeError, TypeError):
                left.append(".".join(p for p in (module, attr, member) if p))
        return left


def patched_by(package: str, packages: Iterable[str]) -> list[tuple[str, str, Optional[str]]]:
    """``(module, attribute, member)`` of every guarded module attribute (``member`` None) or
    method of a class such a module defines whose code is ``package``'s."""
    folder = _where(package)
    found = []
    for name, module in guarded_modules(packages):
        if name == package or name.startswith(package + "."):
            continue
        for attr, value in list(vars(module).items()):
            if _lives_in(value, package, folder):
                found.append((name, attr, None))
            elif isinstance(value, type) and value.__module__ == name:
                for member, inner in list(vars(value).items()):
                    if _lives_in(inner, package, folder):
                        found.append((name, attr, member))
    return found
