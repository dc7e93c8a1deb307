"""Old module names still import (docs/architecture.md, "Moved modules"): each is the module it
moved to, with a warning naming the new one."""
from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from vitbench.core.moved import MOVED


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_an_old_name_is_the_module_it_moved_to_with_a_warning(old, new):
    code = (f"import warnings; warnings.filterwarnings('error', message='.* moved to ')\n"
            f"import importlib, vitbench\n"
            f"try:\n    importlib.import_module({old!r})\n"
            f"except DeprecationWarning as w:\n    print(w)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().startswith(f"{old} moved to {new};"), run.stdout
    with pytest.warns(DeprecationWarning):
        sys.modules.pop(old, None)
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert module.__spec__.name == new  # the module keeps its own identity


def test_patching_an_old_name_patches_the_new_module(monkeypatch):
    monkeypatch.delitem(sys.modules, "vitbench.plugins", raising=False)
    with pytest.warns(DeprecationWarning):
        old = importlib.import_module("vitbench.plugins")
    monkeypatch.setattr(old, "_HOST", "patched")
    import vitbench.host

    assert vitbench.host._HOST == "patched"


def test_apply_from_the_engine_is_the_host_apply_with_a_warning():
    code = ("import warnings, vitbench.host.apply as new\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    from vitbench.engine import apply\n"
            "print(apply is new.apply, [str(w.message) for w in caught])\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("True ['vitbench.engine.apply moved to vitbench.host.apply.apply;"), run.stdout


def test_new_code_imports_no_old_name():
    """vitbench's own modules import the new names: a command warns nothing."""
    run = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-m", "vitbench", "list", "tasks"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
