"""The plugin host: discovers plugins through the ``vitbench`` entry-point group and holds
the catalogs of methods, scorers, model families and tasks (docs/architecture.md, "Plugins").

Built-in plugins are ordinary entry points of the ``vitbench`` distribution; nothing here
imports one by name. Every command loads every plugin, so plugins register light specs and name
their heavy code by reference (:mod:`vitbench.catalog`): a lookup by name resolves them, a
listing (:meth:`PluginHost.specs`) does not. Loading is safe: a plugin that fails to import or to register is recorded
(distribution, name, error) and reported once on stderr; it is fatal only when it was asked
for by name, or with ``VITBENCH_STRICT_PLUGINS=1``. Two plugins registering one name is a
clash, warned about the same way (see :class:`PluginHost`).

Environment: ``VITBENCH_PLUGINS`` (comma-separated allow-list of entry-point names),
``VITBENCH_DISABLE_PLUGINS`` (block-list), ``VITBENCH_STRICT_PLUGINS``.
"""
from __future__ import annotations

import copy
import os
import sys
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable, Iterable

import pluggy

from vitbench import hookspecs
from vitbench.catalog import FamilySpec, MethodSpec, ScorerSpec, missing_capabilities, resolved
from vitbench.errors import PLUGIN_FAILURES, PluginError, UnsupportedError, choices_error, failure_text
from vitbench.core.interrupts import is_ctrl_c
from vitbench.core.metrics import METRICS
from vitbench.host.plugin_guard import Snapshot, import_survives, package_of, patched_by
from vitbench.task import REFERENCES, Task, TaskInfo, TaskReport, option_flags

ENTRY_POINT_GROUP = "vitbench"
_KINDS = {"methods": MethodSpec, "scorers": ScorerSpec, "families": FamilySpec, "tasks": Task}
#: each kind in the singular, for messages ("family", not "familie")
SINGULAR = {"methods": "method", "scorers": "scorer", "families": "family", "tasks": "task"}


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


@dataclass(frozen=True)
class PluginClash:
    """A ``kind`` name (or alias) registered by two plugins: ``kept_by`` keeps it, the
    registration of ``refused_from`` is left out."""

    kind: str
    name: str
    kept_by: str
    refused_from: str


def _strict() -> bool:
    return os.environ.get("VITBENCH_STRICT_PLUGINS", "") not in ("", "0")


def _env_list(var: str) -> set[str] | None:
    raw = os.environ.get(var)
    if raw is None:
        return None
    return {item.strip() for item in raw.split(",") if item.strip()}


class PluginHost:
    """Owns the pluggy ``PluginManager`` and the catalogs built from its register hooks.

    Name clashes: the register hooks run built-in plugins (distribution ``vitbench``) first,
    then the others by plugin (entry-point) name, and the first to register a name keeps it.
    A later registration of a taken name or alias is left out, recorded in :attr:`clashes`
    and warned about once on stderr (an error under ``VITBENCH_STRICT_PLUGINS``), so the
    commands that do not ask for it go on. Asking for a clashed name (:meth:`method`,
    :meth:`task`, ... with that name, or with an alias of the left-out registration) raises
    :class:`~vitbench.errors.PluginError` naming both plugins, rather than quietly answering
    with the one that kept it; :meth:`specs` lists every kept registration without asking.
    """

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginInfo] = {}
        self.failures: list[PluginFailure] = []
        self.skipped: list[str] = []
        self._clashes: list[PluginClash] = []
        self._catalogs: dict[str, dict[str, Any]] | None = None
        self._aliases: dict[str, str] = {}
        self._owner: dict[tuple[str, str], str] = {}
        self._left_out: dict[tuple[str, str], PluginClash] = {}  # aliases of a left-out spec
        self._warned: set[PluginClash] = set()
        self._refused: set[str] = set()  # warnings about unusable names, given once
        self._resolved: dict[tuple[str, str], Any] = {}  # lookups: references imported
        self._packages: list[str] = []  # the packages of the other distributions' plugins loaded
        #: (plugin, dotted name) of each change a refused plugin made that could not be undone
        self.tainted: list[tuple[str, str]] = []

    # -- discovery ---------------------------------------------------------------------
    def load_entry_points(self) -> None:
        """Load every plugin of the ``vitbench`` entry-point group, honouring the env lists."""
        allow = _env_list("VITBENCH_PLUGINS")
        block = _env_list("VITBENCH_DISABLE_PLUGINS") or set()
        described: dict[Any, tuple[str | None, str | None]] = {}  # a distribution's metadata, parsed once
        for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            if (allow is not None and ep.name not in allow) or ep.name in block:
                self.skipped.append(ep.name)
                continue
            if ep.dist is not None and ep.dist not in described:
                meta = ep.dist.metadata
                described[ep.dist] = (meta["Name"], meta["Version"])
            dist, version = described.get(ep.dist, (None, None)) if ep.dist is not None else (None, None)
            guarded = dist != "vitbench"  # another distribution's code: tried first, watched while it loads
            if guarded:
                why = import_survives(ep.load)
                if why is not None:
                    self._fail(ep.name, dist, why)
                    continue
                before = Snapshot(self._packages)
            try:
                obj = ep.load()
            except PLUGIN_FAILURES as exc:  # a broken plugin must not take the host down
                if is_ctrl_c(exc):
                    raise
                self._fail(ep.name, dist, failure_text(exc))
                continue
            if guarded and not self._untouched(ep.name, dist, package_of(ep.module), before):
                continue
            self.add_plugin(obj, ep.name, dist, version)

    def _untouched(self, name: str, dist: str | None, package: str, before: Snapshot) -> bool:
        """Whether loading plugin ``name`` (code in ``package``) left vitbench's functions and the
        other plugins' as they were; else it is refused, its changes undone where ``before`` knew
        them, and the rest kept in :attr:`tainted` (a run then refuses to start)."""
        changed = patched_by(package, self._packages)
        if not changed:
            self._packages.append(package)
            return True
        left = before.undo(changed)
        self.tainted += [(name, where) for where in left]
        first = ".".join(p for p in changed[0] if p)
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        fate = "undone" if not left else f"{len(left)} cannot be undone, so no run starts in this process"
        self._fail(name, dist, f"it changed {first}{more} at import, code it does not own: refused ({fate})")
        return False

    def check_untouched(self) -> None:
        """Raise :class:`PluginError` when a refused plugin left a change that could not be undone."""
        if self.tainted:
            plugin, where = self.tainted[0]
            raise PluginError(f"plugin {plugin!r} replaced {where} at import and it could not be put back: "
                              f"nothing is measured with it changed; disable the plugin "
                              f"(VITBENCH_DISABLE_PLUGINS={plugin})")

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
        if _strict():
            raise PluginError(f"plugin {name!r} ({distribution}) failed to load: {error}")
        if not known:
            print(f"vitbench: warning: plugin {name!r} ({distribution}) failed to load: {error}",
                  file=sys.stderr)

    # -- catalogs ----------------------------------------------------------------------
    def _build(self) -> dict[str, dict[str, Any]]:
        catalogs: dict[str, dict[str, Any]] = {kind: {} for kind in _KINDS}
        self._aliases, self._owner, self._left_out, self._clashes = {}, {}, {}, []
        for kind, spec_type in _KINDS.items():
            caller = getattr(self.pm.hook, f"vitbench_register_{kind}")
            for impl in sorted(caller.get_hookimpls(), key=lambda impl: self._rank(impl.plugin_name)):
                plugin = impl.plugin_name
                register = self._register_fn(kind, spec_type, plugin, catalogs[kind])
                try:
                    impl.function(register=register)
                except PluginError:
                    raise
                except PLUGIN_FAILURES as exc:  # recorded as this plugin's failure
                    if is_ctrl_c(exc):
                        raise
                    info = self.plugins.get(plugin)
                    self._fail(plugin, info.distribution if info else None,
                               f"vitbench_register_{kind} raised {failure_text(exc)}")
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
            names = [name for name in dict.fromkeys([spec.name, *getattr(spec, "aliases", ())])
                     if self._name_ok(kind, name, plugin)]
            if spec.name not in names:
                return
            free = [name for name in names if not self._clash(kind, name, plugin)]
            if spec.name not in free:  # its name is taken: its aliases lead to the clash
                primary = next(c for c in reversed(self._clashes) if (c.kind, c.name) == (kind, spec.name))
                for alias in free:
                    self._left_out[(kind, alias)] = primary
                return
            for name in free:
                self._owner[(kind, name)] = plugin
            for alias in free[1:]:
                self._aliases[f"{kind}:{alias}"] = spec.name
            catalog[spec.name] = spec
            if plugin in self.plugins:
                self.plugins[plugin].registered[kind].append(spec.name)
        return register

    def _name_ok(self, kind: str, name: object, plugin: str) -> bool:
        """Whether ``name`` can be registered; a refused one is warned about (an error under
        ``VITBENCH_STRICT_PLUGINS``) and left out, the plugin's other names are kept."""
        why = unusable_name(kind, name)
        if why is None:
            return True
        what = f"plugin {self._label(plugin)} registers the {SINGULAR[kind]} name {name!r}, which {why}"
        if _strict():
            raise PluginError(what)
        if what not in self._refused:  # the catalogs are rebuilt when a plugin is added
            self._refused.add(what)
            print(f"vitbench: warning: {what}; it is left out", file=sys.stderr)
        return False

    def _rank(self, plugin: str) -> tuple[bool, str]:
        """Built-in plugins first, then by name: who keeps a name two plugins register."""
        info = self.plugins.get(plugin)
        return (info is None or info.distribution != "vitbench", plugin)

    def _label(self, plugin: str) -> str:
        info = self.plugins.get(plugin)
        return f"{plugin!r} ({info.distribution})" if info and info.distribution else repr(plugin)

    def _clash(self, kind: str, name: str, plugin: str) -> bool:
        """Whether ``name`` is taken; if so record, and warn once about, the clash."""
        kept_by = self._owner.get((kind, name))
        if kept_by is None:
            return False
        clash = PluginClash(kind, name, kept_by, plugin)
        self._clashes.append(clash)
        what = (f"plugins {self._label(kept_by)} and {self._label(plugin)} both register the "
                f"{SINGULAR[kind]} {name!r}" if kept_by != plugin else
                f"plugin {self._label(plugin)} registers the {SINGULAR[kind]} {name!r} twice")
        if _strict():
            raise PluginError(f"{what}; choose one: {_choose(clash)}")
        if clash not in self._warned:
            self._warned.add(clash)
            print(f"vitbench: warning: {what}; {kept_by!r} keeps it, and asking for it is an error until "
                  f"you choose one: {_choose(clash)}", file=sys.stderr)
        return True

    def _clash_error(self, kind: str, name: str, clash: PluginClash) -> PluginError:
        plugins = list(dict.fromkeys([clash.kept_by] + [c.refused_from for c in self._clashes
                                                        if (c.kind, c.name) == (clash.kind, clash.name)]))
        both = ", ".join(map(self._label, plugins))
        if name == clash.name:
            what = f"{SINGULAR[kind]} {name!r} is registered by more than one plugin: {both}"
        else:
            what = (f"{SINGULAR[kind]} {name!r} is an alias of the {SINGULAR[kind]} {clash.name!r} of plugin "
                    f"{clash.refused_from!r}, a name registered by more than one plugin: {both}")
        return PluginError(f"{what}; choose one: {_choose(clash)}")

    @property
    def catalogs(self) -> dict[str, dict[str, Any]]:
        if self._catalogs is None:
            for info in self.plugins.values():
                info.registered = {k: [] for k in _KINDS}
            self._catalogs = self._build()
        return self._catalogs

    @property
    def clashes(self) -> list[PluginClash]:
        """The names two plugins registered (the catalogs are built first)."""
        self.catalogs  # noqa: B018
        return list(self._clashes)

    def _lookup(self, kind: str, name: str) -> Any:
        catalog = self.catalogs[kind]
        for clash in self._clashes:
            if (clash.kind, clash.name) == (kind, name):
                raise self._clash_error(kind, name, clash)
        canonical = self._aliases.get(f"{kind}:{name}", name)
        if canonical in catalog:
            return self._resolve(kind, catalog[canonical])
        if (kind, name) in self._left_out:
            raise self._clash_error(kind, name, self._left_out[(kind, name)])
        for failure in self.failures:
            if failure.name == name:
                raise PluginError(f"{SINGULAR[kind]} {name!r} comes from plugin {failure.name!r} "
                                  f"({failure.distribution}), which failed to load: {failure.error}")
        valid = list(catalog) + [a.split(":", 1)[1] for a in self._aliases if a.startswith(kind + ":")]
        raise choices_error(SINGULAR[kind], name, valid)

    def _resolve(self, kind: str, spec: Any) -> Any:
        """``spec`` with its references imported (once); a reference that does not import is an
        error naming the plugin."""
        key = (kind, spec.name)
        if self._resolved.get(key, (None,))[0] is not spec:
            try:
                self._resolved[key] = (spec, resolved(spec))
            except Exception as exc:  # noqa: BLE001 - the plugin's code is broken, not the host
                plugin = self._owner.get(key)
                info = self.plugins.get(plugin) if plugin else None
                raise PluginError(f"{SINGULAR[kind]} {spec.name!r} of plugin {plugin!r} "
                                  f"({info.distribution if info else None}) cannot be loaded: "
                                  f"{type(exc).__name__}: {exc}") from exc
        return self._resolved[key][1]

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
        for listed in self.catalogs["families"].values():
            try:
                spec = self._resolve("families", listed)
            except PluginError as exc:  # a broken family: a warning, the others still recognise models
                self.plugin_failed(self._owner.get(("families", listed.name)) or listed.name, str(exc))
                continue
            if spec.matches(model):
                return spec
        families = ", ".join(sorted(self.catalogs["families"])) or "(none registered)"
        raise UnsupportedError(f"no model-family adapter recognises {type(model).__name__}; "
                               f"supported families: {families}")

    def families_for(self, method: MethodSpec) -> list[str]:
        """The registered families that provide all ``method`` needs, sorted."""
        return [name for name, family in sorted(self.catalogs["families"].items())
                if not missing_capabilities(method, family)]

    def specs(self, kind: str) -> dict[str, Any]:
        """Every kept registration of ``kind`` by name, clashed names included (listings, not
        lookups: a lookup of a clashed name is an error; references stay unresolved)."""
        return dict(self.catalogs[kind])

    def names(self, kind: str) -> list[str]:
        """The registered names of ``kind`` (methods, scorers, families, tasks), sorted."""
        return sorted(self.catalogs[kind])

    def owner(self, kind: str, name: str) -> str | None:
        self.catalogs  # noqa: B018 - make sure the catalogs are built
        return self._owner.get((kind, name))

    def is_builtin(self, kind: str, name: str) -> bool:
        """Whether ``name`` of ``kind`` is registered by a plugin of vitbench's own distribution."""
        info = self.plugins.get(self.owner(kind, name) or "")
        return info is not None and info.distribution == "vitbench"

    # -- lifecycle hooks ---------------------------------------------------------------
    def run_started(self, spec: Any) -> None:
        """Tell every plugin a run starts; one whose hook raises is warned about, the plan goes on."""
        self._notify("vitbench_run_started", spec=spec)

    def run_finished(self, spec: Any, result: dict) -> None:
        """Tell every plugin a run ended, each with its own copy of the record (an edit to it
        changes neither the store nor what the others see)."""
        self._notify("vitbench_run_finished", spec=spec, result=result)

    def _notify(self, hook: str, **kwargs: Any) -> None:
        for impl in getattr(self.pm.hook, hook).get_hookimpls():
            given = {k: copy.deepcopy(v) if isinstance(v, dict) else v for k, v in kwargs.items()}
            try:
                impl.function(**{k: given[k] for k in impl.argnames})
            except PluginError:
                raise
            except PLUGIN_FAILURES as exc:
                if is_ctrl_c(exc):
                    raise
                self.plugin_failed(impl.plugin_name, f"{hook} raised {failure_text(exc)}")

    def describe(self) -> dict[str, Any]:
        """A JSON-friendly description: every plugin with what it registered, the tasks (and the
        plugin of each), failures and name clashes."""
        tasks = self.specs("tasks")
        return {
            "plugins": [vars(info) | {"registered": dict(info.registered)} for info in self.plugins.values()],
            "tasks": [{"name": name, "plugin": self.owner("tasks", name), "description": tasks[name].info.description,
                       "options": list(option_flags(tasks[name]))} for name in sorted(tasks)],
            "failures": [vars(f) for f in self.failures],
            "clashes": [vars(c) for c in self.clashes],
            "skipped": list(self.skipped),
        }


def _choose(clash: PluginClash) -> str:
    return f"uninstall one of them, or set VITBENCH_DISABLE_PLUGINS={clash.refused_from} or ={clash.kept_by}"


def unusable_name(kind: str, name: object) -> str | None:
    """Why ``name`` cannot be a registered ``kind`` name (``None``: it can): it must be a
    non-empty string a command line can reach (no comma, blank or control character), and a
    method may not take a reference row's name (``baseline``, ``baseline+ft``)."""
    if not isinstance(name, str):
        return f"is a {type(name).__name__}, not a string"
    if not name:
        return "is empty"
    if any(c == "," or c.isspace() or not c.isprintable() for c in name):
        return "holds a comma, a blank or a control character and cannot be named on a command line"
    if kind == "methods" and name in REFERENCES:
        return f"is reserved for the reference rows ({', '.join(REFERENCES)})"
    return None


def _check_knob(spec: MethodSpec) -> None:
    """A method's budget knob must name one of its parameters (a plugin failure otherwise)."""
    import dataclasses

    if spec.budget is None:
        return
    fields = [f.name for f in dataclasses.fields(spec.params)]
    if spec.budget.param not in fields:
        raise ValueError(f"method {spec.name!r} declares the budget knob {spec.budget.param!r}, which is "
                         f"not one of its parameters ({', '.join(fields)})")


#: members of the task contract before :class:`~vitbench.task.TaskInfo` and the executor's apply, and where each went
_OLD_TASK_MEMBERS = {**{name: f"TaskInfo({name.lower()}=...)" for name in
                        ("description", "metrics", "accuracy", "counts", "distributed", "control", "Options")},
                     "spec_fields": "TaskInfo(fields=...)", "parse_options": "vitbench.task.parse_options",
                     "gmacs_counter": "the workspace's gmacs_of", "shared_fields": "the workspace's record_fields",
                     "control_fields": "TaskField(no_control=...)", "label_notes": "TaskField(note=...)"}


def _check_task(spec: Task) -> None:
    """A task declares a :class:`~vitbench.task.TaskInfo`, no member of the contract it replaced
    (silently ignored otherwise), and measures only metrics vitbench knows (a plugin failure otherwise)."""
    if not isinstance(spec.info, TaskInfo) or not spec.info.metrics:
        raise ValueError(f"task {spec.name!r} declares no info = TaskInfo(description, metrics, ...)")
    old = [name for name in _OLD_TASK_MEMBERS if any(name in vars(k) for k in type(spec).__mro__[:-1]
                                                     if k not in (Task, TaskReport))]
    if old:
        raise ValueError(f"task {spec.name!r} defines {old[0]}, which vitbench no longer reads; it is now "
                         f"{_OLD_TASK_MEMBERS[old[0]]} (docs/guide/task-plugins.md)")
    unknown = [m for m in spec.info.metrics if m not in METRICS]
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
