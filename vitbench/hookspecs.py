"""The pluggy hook specifications of vitbench (docs/architecture.md, "Plugins").

Every hook takes keyword arguments only. The ``register_*`` hooks follow the register-callback
pattern: the host passes a ``register`` function and the plugin calls it once per thing it
adds, so the specs can grow new optional arguments without breaking plugins.
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
    """Register token significance scorers: ``register(ScorerSpec(...))`` (docs/methods.md §4)."""


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
