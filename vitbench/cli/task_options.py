"""A task's own ``vitbench run``/``sweep`` options (:meth:`vitbench.task.Task.add_options`).

argparse builds the parser before ``--task`` is known, so every registered task's options are
added, each task's in an argument group titled with its name (tasks that share their options,
as ``det`` and ``seg`` do, share one group), and ``vitbench run --help`` lists them
all. What a task did not declare is refused when it is given with that task
(:func:`check_task_options`: ``--detector-epochs is an option of det, seg; --task is 'cls'``),
so an option never silently does nothing. A plugin whose options clash with another's, or whose
``add_options`` raises, is reported as a broken plugin and its options are left out; the other
tasks' options and the rest of the command line still work.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Any

from vitbench.errors import VitbenchError
from vitbench.host import get_host
from vitbench.task import Task, add_options

__all__ = ["OwnedOption", "add_task_options", "check_task_options"]


@dataclass(frozen=True)
class OwnedOption:
    """One option a task added: its flag, default and the tasks that accept it."""

    flag: str
    default: object
    tasks: tuple[str, ...]


def add_task_options(parser: argparse.ArgumentParser) -> None:
    """Add every registered task's own options (one argument group per set of options) and
    remember which tasks own which (``args.task_options``, read by :func:`check_task_options`)."""
    host = get_host()
    shared: dict[Any, list[Task]] = {}
    for _, task in sorted(host.specs("tasks").items()):  # listing, not asking: a clashed name is no error
        adder = getattr(type(task), "add_options", None)  # a task that adds its flags itself
        if adder is None and not fields(task.info.options):
            continue  # no options of its own
        shared.setdefault((adder, task.info.options), []).append(task)
    owned: dict[str, OwnedOption] = {}
    for same in shared.values():
        tasks = [task.name for task in same]
        group = parser.add_argument_group(f"options of --task {', '.join(tasks)}")
        try:
            add_options(same[0], group)
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not take the command line down
            for action in list(group._group_actions):  # what it added before failing goes too
                parser._remove_action(action)
                group._group_actions.remove(action)
                for flag in action.option_strings:
                    parser._option_string_actions.pop(flag, None)
            plugins = sorted({host.owner("tasks", t) or t for t in tasks})
            for plugin in plugins:
                host.plugin_failed(plugin, f"the options of task(s) {', '.join(tasks)} could not be added "
                                           f"({type(exc).__name__}: {exc}); they are left out")
            continue
        for action in group._group_actions:
            owned[action.dest] = OwnedOption(action.option_strings[0] if action.option_strings else action.dest,
                                             action.default, tuple(tasks))
    parser.set_defaults(task_options=owned)


def check_task_options(args: argparse.Namespace, task: str) -> None:
    """Refuse an option of other tasks given with ``--task task`` (one that differs from its
    default), naming the option and the tasks it belongs to."""
    owned: dict[str, OwnedOption] = getattr(args, "task_options", {}) or {}
    for dest, option in owned.items():
        if task not in option.tasks and getattr(args, dest, option.default) != option.default:
            raise VitbenchError(f"{option.flag} is an option of --task {', '.join(option.tasks)}; --task is "
                                f"{task!r} (see `vitbench run --help`)")
