"""The plugin host: discovers plugins through the ``vitbench`` entry-point group and holds
the catalogs of methods, scorers, model families and tasks (docs/architecture.md, "Plugins").

Built-in plugins are ordinary entry points of the ``vitbench`` distribution; nothing here
imports one by name. Loading is safe: a plugin that fails to import or to register is recorded
(distribution, name, error) and reported once on stderr; it is fatal only when it was asked
for by name, or with ``VITBENCH_STRICT_PLUGINS=1``.

Environment: ``VITBENCH_PLUGINS`` (comma-separated allow-list of entry-point names),
``VITBENCH_DISABLE_PLUGINS`` (block-list), ``VITBENCH_STRICT_PLUGINS``.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable, Iterable

import pluggy

from vitbench import hookspecs
from vitbench.catalog import FamilySpec, MethodSpec, ScorerSpec
from vitbench.errors import PluginError, choices_error
from vitbench.metrics import METRICS
from vitbench.task import Task

ENTRY_POINT_GROUP = "vitbench"
_KINDS = {"methods": MethodSpec, "scorers": ScorerSpec, "families": FamilySpec, "tasks": Task}


@dataclass
class PluginInfo:
    """One loaded plugin and what it registered."""

    name: str
    distribution: str | None
    version: str | None
    registered: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in _KINDS})


@dataclass
class PluginFailure:
    """A plugin that could not be loaded or could not register."""

    name: str
    distribution: str | None
    error: str


def _env_list(var: str) -> set[str] | None:
    raw = os.environ.get(var)
    if raw is None:
        return None
    return {item.strip() for item in raw.split(",") if item.strip()}


class PluginHost:
    """Owns the pluggy ``PluginManager`` and the catalogs built from its register hooks."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginInfo] = {}
        self.failures: list[PluginFailure] = []
        self.skipped: list[str] = []
        self._catalogs: dict[str, dict[str, Any]] | None = None
        self._aliases: dict[str, str] = {}
        self._owner: dict[tuple[str, str], str] = {}

    # -- discovery ---------------------------------------------------------------------
    def load_entry_points(self) -> None:
        """Load every plugin of the ``vitbench`` entry-point group, honouring the env lists."""
        allow = _env_list("VITBENCH_PLUGINS")
        block = _env_list("VITBENCH_DISABLE_PLUGINS") or set()
        for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            if (allow is not None and ep.name not in allow) or ep.name in block:
                self.skipped.append(ep.name)
                continue
            dist = ep.dist.metadata["Name"] if ep.dist is not None else None
            version = ep.dist.version if ep.dist is not None else None
            try:
                obj = ep.load()
            except Exception as exc:  # noqa: BLE001 - a broken plugin must not take the host down
                self._fail(ep.name, dist, f"{type(exc).__name__}: {exc}")
                continue
            self.add_plugin(obj, ep.name, dist, version)

    def add_plugin(self, obj: Any, name: str, distribution: str | None = None,
                   version: str | None = None) -> None:
        """Register a plugin object (a module or an instance with hookimpls) under ``name``."""
        if name in self.plugins:
            raise PluginError(f"plugin name {name!r} is registered twice")
        try:
            self.pm.register(obj, name=name)
        except Exception as exc:  # noqa: BLE001 - pluggy validation errors of a bad plugin
            self._fail(name, distribution, f"{type(exc).__name__}: {exc}")
            return
        self.plugins[name] = PluginInfo(name, distribution, version)
        self._catalogs = None

    def plugin_failed(self, plugin: str, error: str) -> None:
        """Record that ``plugin`` broke after loading (e.g. its task's ``options`` raised): a
        warning naming it, or :class:`~vitbench.errors.PluginError` under ``VITBENCH_STRICT_PLUGINS``."""
        info = self.plugins.get(plugin)
        self._fail(plugin, info.distribution if info else None, error)

    def _fail(self, name: str, distribution: str | None, error: str) -> None:
        failure = PluginFailure(name, distribution, error)
        known = failure in self.failures  # a register hook fails again on every catalog rebuild
        if not known:
            self.failures.append(failure)
        if os.environ.get("VITBENCH_STRICT_PLUGINS", "") not in ("", "0"):
            raise PluginError(f"plugin {name!r} ({distribution}) failed to load: {error}")
        if not known:
            print(f"vitbench: warning: plugin {name!r} ({distribution}) failed to load: {error}",
                  file=sys.stderr)

    # -- catalogs ----------------------------------------------------------------------
    def _build(self) -> dict[str, dict[str, Any]]:
        catalogs: dict[str, dict[str, Any]] = {kind: {} for kind in _KINDS}
        self._aliases, self._owner = {}, {}
        for kind, spec_type in _KINDS.items():
            caller = getattr(self.pm.hook, f"vitbench_register_{kind}")
            for impl in caller.get_hookimpls():
                plugin = impl.plugin_name
                register = self._register_fn(kind, spec_type, plugin, catalogs[kind])
                try:
                    impl.function(register=register)
                except PluginError:
                    raise
                except Exception as exc:  # noqa: BLE001 - recorded as this plugin's failure
                    info = self.plugins.get(plugin)
                    self._fail(plugin, info.distribution if info else None,
                               f"vitbench_register_{kind} raised {type(exc).__name__}: {exc}")
        return catalogs

    def _register_fn(self, kind: str, spec_type: type, plugin: str,
                     catalog: dict[str, Any]) -> Callable[[Any], None]:
        def register(spec: Any) -> None:
            if not isinstance(spec, spec_type):
                raise TypeError(f"register() for {kind} takes a {spec_type.__name__}, got {type(spec).__name__}")
            if kind == "methods":
                _check_knob(spec)
            if kind == "tasks":
                _check_task(spec)
            names = [spec.name, *getattr(spec, "aliases", ())]
            for name in names:
                other = self._owner.get((kind, name))
                if other is not None:
                    raise PluginError(
                        f"duplicate {kind[:-1]} name {name!r}: registered by plugin {other!r} "
                        f"and by plugin {plugin!r}")
                self._owner[(kind, name)] = plugin
            for alias in names[1:]:
                self._aliases[f"{kind}:{alias}"] = spec.name
            catalog[spec.name] = spec
            if plugin in self.plugins:
                self.plugins[plugin].registered[kind].append(spec.name)
        return register

    @property
    def catalogs(self) -> dict[str, dict[str, Any]]:
        if self._catalogs is None:
            for info in self.plugins.values():
                info.registered = {k: [] for k in _KINDS}
            self._catalogs = self._build()
        return self._catalogs

    def _lookup(self, kind: str, name: str) -> Any:
        catalog = self.catalogs[kind]
        canonical = self._aliases.get(f"{kind}:{name}", name)
        if canonical in catalog:
            return catalog[canonical]
        for failure in self.failures:
            if failure.name == name:
                raise PluginError(f"{kind[:-1]} {name!r} comes from plugin {failure.name!r} "
                                  f"({failure.distribution}), which failed to load: {failure.error}")
        valid = list(catalog) + [a.split(":", 1)[1] for a in self._aliases if a.startswith(kind + ":")]
        raise choices_error(kind[:-1], name, valid)

    def method(self, name: str) -> MethodSpec:
        """The method registered as ``name`` (or under that alias)."""
        return self._lookup("methods", name)

    def scorer(self, name: str) -> ScorerSpec:
        return self._lookup("scorers", name)

    def family(self, name: str) -> FamilySpec:
        return self._lookup("families", name)

    def task(self, name: str) -> Task:
        """The task registered as ``name`` (``vitbench run --task NAME``)."""
        return self._lookup("tasks", name)

    def family_of(self, model: Any) -> FamilySpec:
        """The family adapter that recognises ``model``."""
        for spec in self.catalogs["families"].values():
            if spec.matches(model):
                return spec
        from vitbench.errors import UnsupportedError
        families = ", ".join(sorted(self.catalogs["families"])) or "(none registered)"
        raise UnsupportedError(f"no model-family adapter recognises {type(model).__name__}; "
                               f"supported families: {families}")

    def names(self, kind: str) -> list[str]:
        """The registered names of ``kind`` (methods, scorers, families, tasks), sorted."""
        return sorted(self.catalogs[kind])

    def owner(self, kind: str, name: str) -> str | None:
        self.catalogs  # noqa: B018 - make sure the catalogs are built
        return self._owner.get((kind, name))

    # -- lifecycle hooks ---------------------------------------------------------------
    def run_started(self, spec: Any) -> None:
        self.pm.hook.vitbench_run_started(spec=spec)

    def run_finished(self, spec: Any, result: dict) -> None:
        self.pm.hook.vitbench_run_finished(spec=spec, result=result)

    def describe(self) -> dict[str, Any]:
        """A JSON-friendly description: every plugin with what it registered, the tasks (and the
        plugin of each), and failures."""
        self.catalogs  # noqa: B018
        return {
            "plugins": [vars(info) | {"registered": dict(info.registered)} for info in self.plugins.values()],
            "tasks": [{"name": name, "plugin": self.owner("tasks", name), "description": self.task(name).description,
                       "options": list(self.task(name).option_flags())} for name in self.names("tasks")],
            "failures": [vars(f) for f in self.failures],
            "skipped": list(self.skipped),
        }


def _check_knob(spec: MethodSpec) -> None:
    """A method's budget knob must name one of its parameters (a plugin failure otherwise)."""
    import dataclasses

    if spec.budget is None:
        return
    fields = [f.name for f in dataclasses.fields(spec.params)]
    if spec.budget.param not in fields:
        raise ValueError(f"method {spec.name!r} declares the budget knob {spec.budget.param!r}, which is "
                         f"not one of its parameters ({', '.join(fields)})")


def _check_task(spec: Task) -> None:
    """A task measures only metrics vitbench knows (a plugin failure otherwise)."""
    unknown = [m for m in spec.metrics if m not in METRICS]
    if unknown:
        raise ValueError(f"task {spec.name!r} declares the metrics {', '.join(map(repr, unknown))}; "
                         f"valid metrics: {', '.join(METRICS)}")


_HOST: PluginHost | None = None


def get_host() -> PluginHost:
    """The process-wide host, loading entry points on first use."""
    global _HOST
    if _HOST is None:
        host = PluginHost()
        host.load_entry_points()
        _HOST = host
    return _HOST


def reset_host() -> None:
    """Forget the process-wide host (tests, or after changing the plugin env vars)."""
    global _HOST
    _HOST = None


def iter_specs(kind: str) -> Iterable[Any]:
    return get_host().catalogs[kind].values()
