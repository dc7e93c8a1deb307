"""The pluggy hook specifications of vitbench (docs/architecture.md, "Plugins").

Every hook takes keyword arguments only. The ``register_*`` hooks follow the register-callback
pattern: the host passes a ``register`` function and the plugin calls it once per thing it
adds, so the specs can grow new optional arguments without breaking plugins.

Every command (``vitbench --help`` too) imports every plugin and runs its register hooks, so a
plugin's module imports no torch: it names its heavy code by reference,
``build="my_plugin.reduction:build"`` (likewise a scorer's ``score``, a family's functions),
imported when a run first asks for it (:mod:`vitbench.catalog`); a task's module imports torch
inside the methods that run.
"""
from __future__ import annotations

from typing import Any, Callable

import pluggy

PROJECT = "vitbench"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def vitbench_register_methods(register: Callable[..., None]) -> None:
    """Register reduction methods: call ``register(MethodSpec(...))`` once per method."""


@hookspec
def vitbench_register_scorers(register: Callable[..., None]) -> None:
    """Register token significance scorers: ``register(ScorerSpec(...))`` (docs/methods.md, "Token scorers")."""


@hookspec
def vitbench_register_families(register: Callable[..., None]) -> None:
    """Register model-family adapters: ``register(FamilySpec(...))``."""


@hookspec
def vitbench_register_tasks(register: Callable[..., None]) -> None:
    """Register tasks: ``register(MyTask())`` once per :class:`vitbench.Task` subclass (``--task NAME``)."""


@hookspec
def vitbench_run_started(spec: Any) -> None:
    """Called when a run of the plan starts; ``spec`` is the frozen :class:`RunSpec`."""


@hookspec
def vitbench_run_finished(spec: Any, result: dict) -> None:
    """Called when a run ends, with the record that was written to the store."""
