"""The plugin host: entry-point discovery, catalogs, failures and the env lists (docs/architecture.md).

Discovery is real: each test writes fake installed distributions (a ``NAME-0.1.dist-info`` with
``METADATA`` and ``entry_points.txt`` beside the plugin modules) into ``tmp_path`` and puts it on
``sys.path``, so ``importlib.metadata`` finds them next to the installed ones. Every test builds
its own :class:`PluginHost`; only ``check_method`` (which asks ``get_host()``) is handed one, by
monkeypatching ``vitbench.host._HOST`` for the test.
"""
from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import torch

import vitbench
import vitbench.host
from vitbench.errors import PluginError, UnknownNameError
from vitbench.cli.main import main
from vitbench.host import PluginClash, PluginFailure, PluginHost
from vitbench.testing import check_method

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "vitbench-example-plugin"
BUILTIN_PLUGINS = {"vit_family", "mobilevit_family", "efficientvit_family", "swin_family", "tome", "ppt", "topk",
                   "scorers", "ltmp", "ltm", "dcs", "dpc_knn", "kmedoids", "tofu", "ats", "mctf", "pitome",
                   "zero_tprune", "diffrate", "dynamicvit", "cls_task", "dense_tasks",
                   "dtem", "patchmerger", "atc", "sinkhorn", "controls", "gtp", "algm", "cropr", "saint"}
BUILTIN_METHODS = {"tome", "ppt", "entropy", "average", "topk", "ltmp", "ltm", "dcs", "dpc-knn", "kmedoids", "tofu",
                   "ats", "mctf", "pitome", "zero-tprune", "diffrate", "diffrate-search",
                   "dynamicvit", "dtem", "patchmerger", "atc", "sinkhorn", "random", "downsample", "gtp", "algm", "cropr",
                   "saint"}
BUILTIN_SCORERS = {"cls-attn", "entropy", "average"}

# A plugin module that registers one method; {name} and {aliases} are filled in per plugin.
METHOD_PLUGIN = """
from dataclasses import dataclass

from vitbench.catalog import MethodSpec, Reduction
from vitbench.hookspecs import hookimpl


@dataclass(frozen=True)
class Params:
    pass


@hookimpl
def vitbench_register_methods(register):
    register(MethodSpec(name={name!r}, params=Params, aliases={aliases!r},
                        build=lambda params, info: Reduction([None] * info.depth)))
"""


class FakeDistributions:
    """Writes fake installed distributions into one ``sys.path`` folder of a test."""

    def __init__(self, site: Path, prefix: str) -> None:
        self.site = site
        self.prefix = prefix  # module names are unique to the test, so no sys.modules leftovers

    def add(self, dist: str, plugins: dict[str, str], version: str = "0.1") -> dict[str, str]:
        """Install ``dist`` with one entry point per ``plugins`` item (name -> module source).

        Returns the module name of each entry point.
        """
        modules = {name: f"{self.prefix}_{dist.replace('-', '_')}_{name}" for name in plugins}
        info = self.site / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        lines = "".join(f"{name} = {modules[name]}\n" for name in plugins)
        (info / "entry_points.txt").write_text(f"[vitbench]\n{lines}")
        for name, source in plugins.items():
            (self.site / f"{modules[name]}.py").write_text(textwrap.dedent(source))
        importlib.invalidate_caches()
        return modules

    def method_plugin(self, name: str, aliases: tuple[str, ...] = ()) -> str:
        return METHOD_PLUGIN.format(name=name, aliases=aliases)


@pytest.fixture
def fake_dists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    site = tmp_path / "site"
    site.mkdir()
    prefix = f"vbfake_{tmp_path.name}"
    monkeypatch.syspath_prepend(str(site))
    yield FakeDistributions(site, prefix)
    for module in [m for m in sys.modules if m.startswith(prefix)]:
        del sys.modules[module]


@pytest.fixture(autouse=True)
def _no_plugin_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("VITBENCH_PLUGINS", "VITBENCH_DISABLE_PLUGINS", "VITBENCH_STRICT_PLUGINS"):
        monkeypatch.delenv(var, raising=False)


def fresh_host() -> PluginHost:
    host = PluginHost()
    host.load_entry_points()
    return host


def warnings_in(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("vitbench: warning: plugin")]


# -- built-ins -------------------------------------------------------------------------------
def test_builtins_are_entry_points_of_the_vitbench_distribution() -> None:
    eps = [ep for ep in metadata.entry_points(group="vitbench") if ep.dist.metadata["Name"] == "vitbench"]
    assert {ep.name for ep in eps} == BUILTIN_PLUGINS
    assert all(ep.value.startswith("vitbench_plugins.") for ep in eps)


def test_builtins_are_discovered_with_their_distribution(capsys: pytest.CaptureFixture[str]) -> None:
    host = fresh_host()
    assert host.failures == [] and host.skipped == []
    for name in BUILTIN_PLUGINS:
        assert (host.plugins[name].distribution, host.plugins[name].version) == ("vitbench", vitbench.__version__)
    assert BUILTIN_METHODS <= set(host.names("methods"))
    assert BUILTIN_SCORERS <= set(host.names("scorers"))
    assert "vit" in host.names("families")
    assert host.plugins["ppt"].registered["methods"] == ["ppt", "entropy", "average"]
    assert host.plugins["scorers"].registered["scorers"] == ["cls-attn", "entropy", "average"]
    assert host.plugins["vit_family"].registered["families"] == ["vit"]
    assert host.plugins["cls_task"].registered["tasks"] == ["cls"]
    assert host.plugins["dense_tasks"].registered["tasks"] == ["det", "seg"]
    assert host.owner("methods", "tome") == "tome" and host.owner("scorers", "entropy") == "scorers"
    assert host.method("tome").name == "tome" and host.scorer("cls-attn").name == "cls-attn"
    assert warnings_in(capsys.readouterr().err) == []


def test_describe_is_json_with_distributions_versions_and_failures(fake_dists: FakeDistributions) -> None:
    fake_dists.add("broken-plugin", {"broken": "raise RuntimeError('boom')\n"})
    described = json.loads(json.dumps(fresh_host().describe()))
    tome = next(p for p in described["plugins"] if p["name"] == "tome")
    assert tome == {"name": "tome", "distribution": "vitbench", "version": vitbench.__version__,
                    "registered": {"methods": ["tome"], "scorers": [], "families": [], "tasks": []}}
    assert described["failures"] == [
        {"name": "broken", "distribution": "broken-plugin", "error": "RuntimeError: boom"}]


# -- failures --------------------------------------------------------------------------------
def test_a_plugin_that_fails_to_import_is_recorded_and_the_others_load(
        fake_dists: FakeDistributions, capsys: pytest.CaptureFixture[str]) -> None:
    fake_dists.add("broken-plugin", {"broken": "raise RuntimeError('boom at import')\n"})
    fake_dists.add("good-plugin", {"good": fake_dists.method_plugin("good-method")})
    host = fresh_host()
    assert host.failures == [PluginFailure("broken", "broken-plugin", "RuntimeError: boom at import")]
    assert "broken" not in host.plugins
    assert (host.plugins["good"].distribution, host.plugins["good"].version) == ("good-plugin", "0.1")
    assert {"good-method", *BUILTIN_METHODS} <= set(host.names("methods"))
    assert warnings_in(capsys.readouterr().err) == [
        "vitbench: warning: plugin 'broken' (broken-plugin) failed to load: RuntimeError: boom at import"]


def test_strict_plugins_makes_a_failed_import_fatal(fake_dists: FakeDistributions,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dists.add("broken-plugin", {"broken": "import no_such_module_for_vitbench\n"})
    monkeypatch.setenv("VITBENCH_STRICT_PLUGINS", "1")
    with pytest.raises(PluginError, match=r"'broken' \(broken-plugin\) failed to load: "
                                          r"ModuleNotFoundError: .*no_such_module_for_vitbench"):
        fresh_host()


def test_strict_plugins_0_is_off(fake_dists: FakeDistributions, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dists.add("broken-plugin", {"broken": "raise RuntimeError('boom')\n"})
    monkeypatch.setenv("VITBENCH_STRICT_PLUGINS", "0")
    assert [f.name for f in fresh_host().failures] == ["broken"]


def test_asking_for_a_method_of_a_failed_plugin_names_the_plugin(fake_dists: FakeDistributions) -> None:
    fake_dists.add("shiny-plugin", {"shiny": "raise ImportError('needs a GPU library')\n"})
    host = fresh_host()
    with pytest.raises(PluginError, match=r"method 'shiny' comes from plugin 'shiny' \(shiny-plugin\), "
                                          r"which failed to load: ImportError: needs a GPU library"):
        host.method("shiny")
    assert host.method("tome").name == "tome"  # the rest of the catalog still answers


def test_a_register_hook_that_raises_is_recorded(fake_dists: FakeDistributions,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    fake_dists.add("raising-plugin", {"raising": """
        from vitbench.hookspecs import hookimpl

        @hookimpl
        def vitbench_register_methods(register):
            raise ValueError('cannot register')
    """})
    host = fresh_host()
    assert BUILTIN_METHODS <= set(host.names("methods"))
    expected = PluginFailure("raising", "raising-plugin",
                             "vitbench_register_methods raised ValueError: cannot register")
    assert host.failures == [expected]
    host.add_plugin(object(), "late")  # a rebuild of the catalogs must not report it again
    assert BUILTIN_METHODS <= set(host.names("methods"))
    assert host.failures == [expected]
    assert len(warnings_in(capsys.readouterr().err)) == 1


def test_a_register_hook_that_raises_is_fatal_when_strict(fake_dists: FakeDistributions,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dists.add("raising-plugin", {"raising": """
        from vitbench.hookspecs import hookimpl

        @hookimpl
        def vitbench_register_scorers(register):
            register("not a ScorerSpec")
    """})
    monkeypatch.setenv("VITBENCH_STRICT_PLUGINS", "1")
    host = fresh_host()  # importing succeeds; registering does not
    with pytest.raises(PluginError, match=r"'raising' \(raising-plugin\).*TypeError: register\(\) "
                                          r"for scorers takes a ScorerSpec, got str"):
        host.names("scorers")


# -- allow-list and block-list ---------------------------------------------------------------
def test_allow_list_loads_only_the_listed_plugins(fake_dists: FakeDistributions,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dists.add("broken-plugin", {"broken": "raise RuntimeError('boom')\n"})
    monkeypatch.setenv("VITBENCH_PLUGINS", " tome , scorers ")
    host = fresh_host()
    assert set(host.plugins) == {"tome", "scorers"}
    assert {"broken", "ppt", "topk", "vit_family"} <= set(host.skipped)
    assert host.failures == []
    assert host.names("methods") == ["tome"]
    assert host.describe()["skipped"] == host.skipped


def test_block_list_skips_the_listed_plugins(fake_dists: FakeDistributions,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dists.add("broken-plugin", {"broken": "raise RuntimeError('boom')\n"})
    monkeypatch.setenv("VITBENCH_DISABLE_PLUGINS", "broken,topk")
    host = fresh_host()
    assert sorted(host.skipped) == ["broken", "topk"]
    assert host.failures == []
    assert "topk" not in host.names("methods") and "tome" in host.names("methods")
    with pytest.raises(UnknownNameError, match="unknown method 'topk'"):
        host.method("topk")


# -- names -----------------------------------------------------------------------------------
def test_a_plugin_registering_a_builtin_name_clashes_and_the_builtin_keeps_it(
        fake_dists: FakeDistributions, capsys: pytest.CaptureFixture[str]) -> None:
    # 'aaa_copy' sorts before the built-in 'tome': a built-in keeps its name all the same
    fake_dists.add("copycat-plugin", {"aaa_copy": fake_dists.method_plugin("tome", ("copy-alias",))})
    host = fresh_host()
    assert BUILTIN_METHODS <= set(host.names("methods"))
    assert host.owner("methods", "tome") == "tome" and host.specs("methods")["tome"].budget is not None
    assert host.clashes == [PluginClash("methods", "tome", "tome", "aaa_copy")]
    assert host.plugins["aaa_copy"].registered["methods"] == []
    warned = warnings_in(capsys.readouterr().err)
    assert len(warned) == 1
    assert ("plugins 'tome' (vitbench) and 'aaa_copy' (copycat-plugin) both register the method 'tome'"
            in warned[0]) and "VITBENCH_DISABLE_PLUGINS=aaa_copy" in warned[0]
    host.add_plugin(object(), "late")  # a rebuild of the catalogs warns no second time
    assert host.clashes == [PluginClash("methods", "tome", "tome", "aaa_copy")]
    assert warnings_in(capsys.readouterr().err) == []
    both = r"'tome' \(vitbench\), 'aaa_copy' \(copycat-plugin\); choose one: uninstall one of them, or set " \
           r"VITBENCH_DISABLE_PLUGINS=aaa_copy or =tome"
    with pytest.raises(PluginError, match=r"^method 'tome' is registered by more than one plugin: " + both + "$"):
        host.method("tome")
    with pytest.raises(PluginError, match=r"^method 'copy-alias' is an alias of the method 'tome' of plugin "
                                          r"'aaa_copy', a name registered by more than one plugin: " + both):
        host.method("copy-alias")
    assert host.method("topk").name == "topk"  # the rest of the catalog still answers
    assert host.describe()["clashes"] == [
        {"kind": "methods", "name": "tome", "kept_by": "tome", "refused_from": "aaa_copy"}]


def test_disabling_one_side_of_a_clash_resolves_it(fake_dists: FakeDistributions,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dists.add("copycat-plugin", {"copycat": fake_dists.method_plugin("tome")})
    monkeypatch.setenv("VITBENCH_DISABLE_PLUGINS", "tome")
    host = fresh_host()
    assert host.clashes == [] and host.owner("methods", "tome") == "copycat"
    assert host.method("tome").budget is None


@pytest.mark.parametrize("first, second, clash", [
    (("fast-a", ("fast",)), ("fast-b", ("fast",)), "fast"),  # alias vs alias
    (("fast-a", ()), ("fast-b", ("fast-a",)), "fast-a"),  # alias vs name
    (("fast-a", ("fast-b",)), ("fast-b", ()), "fast-b"),  # name vs alias: fast-b is left out
])
def test_a_clash_between_two_third_party_plugins_goes_to_the_first_by_name(
        fake_dists: FakeDistributions, capsys: pytest.CaptureFixture[str], first, second, clash) -> None:
    # the distributions sort the other way round: the entry-point name decides
    fake_dists.add("z-plugin", {"first": fake_dists.method_plugin(*first)})
    fake_dists.add("a-plugin", {"second": fake_dists.method_plugin(*second)})
    host = fresh_host()
    assert host.clashes == [PluginClash("methods", clash, "first", "second")]
    assert host.owner("methods", clash) == "first"
    for name in {first[0], second[0]} - {clash}:  # the names that did not clash still answer
        assert host.method(name).name == name
    with pytest.raises(PluginError, match=rf"^method '{clash}' is registered by more than one plugin: "
                                          r"'first' \(z-plugin\), 'second' \(a-plugin\); choose one: "):
        host.method(clash)
    [warned] = warnings_in(capsys.readouterr().err)
    assert f"plugins 'first' (z-plugin) and 'second' (a-plugin) both register the method '{clash}'" in warned


def test_a_clash_is_fatal_when_strict(fake_dists: FakeDistributions, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dists.add("copycat-plugin", {"copycat": fake_dists.method_plugin("tome")})
    monkeypatch.setenv("VITBENCH_STRICT_PLUGINS", "1")
    with pytest.raises(PluginError, match=r"plugins 'tome' \(vitbench\) and 'copycat' \(copycat-plugin\) both "
                                          r"register the method 'tome'; choose one: "):
        fresh_host().names("methods")


SCORER_AND_TASK_PLUGIN = """
from vitbench.catalog import ScorerSpec, TaskSetup
from vitbench.hookspecs import hookimpl
from vitbench.task import Task, TaskInfo


class Cls(Task):
    name = "cls"
    info = TaskInfo(description="a clash", metrics=("gmacs",))

    def setup(self, options):
        return TaskSetup(model="m", data=None, metrics=("gmacs",))

    def workspace(self, request):
        return None

    def run(self, *args):
        return {}


@hookimpl
def vitbench_register_scorers(register):
    register(ScorerSpec(name="entropy", score=lambda info, prefix: None))


@hookimpl
def vitbench_register_tasks(register):
    register(Cls())
"""


def test_a_scorer_and_a_task_clash_break_only_what_asks_for_them(
        fake_dists: FakeDistributions, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    fake_dists.add("twin-plugin", {"twin": SCORER_AND_TASK_PLUGIN})
    vitbench.host.reset_host()
    host = vitbench.host.get_host()
    assert {(c.kind, c.name, c.kept_by) for c in host.clashes} == {("scorers", "entropy", "scorers"),
                                                                   ("tasks", "cls", "cls_task")}
    with pytest.raises(PluginError, match=r"^scorer 'entropy' is registered by more than one plugin: "
                                          r"'scorers' \(vitbench\), 'twin' \(twin-plugin\)"):
        host.scorer("entropy")
    assert len(warnings_in(capsys.readouterr().err)) == 2
    with pytest.raises(SystemExit) as done:  # building the task options does not ask for 'cls'
        main(["--help"])
    assert done.value.code == 0
    for args in (["list", "tasks"], ["list", "scorers"], ["plugins", "--json"]):
        assert main(args) == 0
    out = tmp_path / "out"
    assert main(["run", "--task", "cls", "--methods", "topk", "--limit", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "error" in line] == [
        "vitbench: error: task 'cls' is registered by more than one plugin: 'cls_task' (vitbench), 'twin' "
        "(twin-plugin); choose one: uninstall one of them, or set VITBENCH_DISABLE_PLUGINS=twin or =cls_task"]
    assert not out.exists()


def _vitbench(site: Path, cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``python -m vitbench ARGS`` with the fake distributions of ``site`` installed."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VITBENCH_")}
    environ["VITBENCH_NO_WAIT"] = "1"  # a test's timing is no measurement: no wait for a quiet machine
    environ["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [environ.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-m", "vitbench", *args], cwd=cwd, env=environ | env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_a_plugin_registering_tome_breaks_only_asking_for_tome(
        fake_dists: FakeDistributions, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 22, item 1: every command runs, and ``run --methods tome`` is one line naming both."""
    fake_dists.add("rel-dup", {"rel_dup": fake_dists.method_plugin("tome")})
    both = "'tome' (vitbench), 'rel_dup' (rel-dup)"
    listed = _vitbench(fake_dists.site, tmp_path, "list", "methods")
    assert listed.returncode == 0, listed.stderr
    assert any(line.startswith("  tome ") and "plugin: tome;" in line for line in listed.stdout.splitlines())
    [warned] = warnings_in(listed.stderr)
    assert "plugins 'tome' (vitbench) and 'rel_dup' (rel-dup) both register the method 'tome'" in warned
    out = tmp_path / "out"
    ran = _vitbench(fake_dists.site, tmp_path, "run", "--task", "cls", "--methods", "tome", "--limit", "8",
                    "--metrics", "accuracy,gmacs", "--out", str(out))
    assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr
    assert [line for line in ran.stderr.splitlines() if not line.startswith("vitbench: warning:")] == [
        f"vitbench: error: method 'tome' is registered by more than one plugin: {both}; choose one: "
        "uninstall one of them, or set VITBENCH_DISABLE_PLUGINS=rel_dup or =tome"]
    assert not out.exists()

    vitbench.host.reset_host()  # the same installation, in this process
    assert main(["plugins"]) == 0
    assert ("CLASH method 'tome'  kept by plugin 'tome', left out of plugin 'rel_dup' (asking for it is an error)"
            in capsys.readouterr().out.splitlines())
    assert main(["plugins", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["clashes"] == [
        {"kind": "methods", "name": "tome", "kept_by": "tome", "refused_from": "rel_dup"}]
    for args in (["--help"], ["--version"]):
        with pytest.raises(SystemExit) as done:
            main(args)
        assert done.value.code == 0


@pytest.mark.parametrize("args", [["list", "methods"], ["--help"]])
def test_strict_plugins_with_a_broken_plugin_is_one_line_for_every_command(
        fake_dists: FakeDistributions, tmp_path: Path, args: list[str]) -> None:
    fake_dists.add("broken-plugin", {"broken": "raise RuntimeError('boom')\n"})
    done = _vitbench(fake_dists.site, tmp_path, *args, VITBENCH_STRICT_PLUGINS="1")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines() == [
        "vitbench: error: plugin 'broken' (broken-plugin) failed to load: RuntimeError: boom"]


def test_strict_plugins_is_one_line_also_for_version_and_plugins(
        fake_dists: FakeDistributions, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    fake_dists.add("broken-plugin", {"broken": "raise RuntimeError('boom')\n"})
    monkeypatch.setenv("VITBENCH_STRICT_PLUGINS", "1")
    for args in (["--version"], ["plugins"], ["list", "scorers"]):
        vitbench.host.reset_host()
        assert main(args) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err == (
            "vitbench: error: plugin 'broken' (broken-plugin) failed to load: RuntimeError: boom\n")


def test_an_alias_finds_its_method(fake_dists: FakeDistributions) -> None:
    fake_dists.add("alias-plugin", {"alias": fake_dists.method_plugin("long-method-name", ("lmn",))})
    host = fresh_host()
    assert host.method("lmn") is host.method("long-method-name")
    assert host.owner("methods", "lmn") == "alias"


def test_an_unknown_method_lists_the_valid_names(fake_dists: FakeDistributions) -> None:
    fake_dists.add("alias-plugin", {"alias": fake_dists.method_plugin("long-method-name", ("lmn",))})
    host = fresh_host()
    with pytest.raises(UnknownNameError, match=r"unknown method 'tomee'; valid methods: ") as caught:
        host.method("tomee")
    listed = str(caught.value).split("valid methods: ", 1)[1].split(", ")
    assert {"long-method-name", "lmn", *BUILTIN_METHODS} <= set(listed)
    assert listed == sorted(listed)
    with pytest.raises(UnknownNameError, match=r"unknown scorer 'nope'; valid scorers: average, cls-attn, entropy"):
        host.scorer("nope")


# -- the example third-party plugin ----------------------------------------------------------
@pytest.fixture
def one_thread():
    """The tiny model's tensors are too small for threads; on a busy CPU they only cost time."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
def test_the_example_plugin_is_discovered_through_its_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        metadata.distribution("vitbench-example-plugin")
    except metadata.PackageNotFoundError:
        pytest.fail("the example plugin is not installed: "
                    "pip install --no-deps --no-build-isolation -e examples/vitbench-example-plugin")
    declared = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    assert declared["entry-points"]["vitbench"] == {"example_random_drop": "vitbench_example_plugin"}
    host = fresh_host()
    assert host.owner("methods", "random-drop") == "example_random_drop"
    info = host.plugins["example_random_drop"]
    assert (info.distribution, info.version) == ("vitbench-example-plugin", "0.1.0") == (
        declared["name"], declared["version"])
    assert info.registered["methods"] == ["random-drop"]

    monkeypatch.setattr(vitbench.host, "_HOST", host)
    report = check_method("random-drop", {"keep": 0.5})
    assert report.token_counts == [65] * 3 + [33] * 3 + [17] * 3 + [9] * 3


def test_the_example_plugin_tests_itself() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VITBENCH_")}
    env["OMP_NUM_THREADS"] = "1"  # tiny tensors: threads only add overhead
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                          cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=300, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert re.search(r"\b\d+ passed\b", output) and "failed" not in output, output


# -- plugin code that exits or raises (issue 37, item 4) ---------------------------------------
EXITING_METHOD = """
import sys
from dataclasses import dataclass

from vitbench.catalog import MethodSpec
from vitbench.hookspecs import hookimpl


@dataclass(frozen=True)
class Params:
    pass


def build(params, info):
    sys.exit(0)


@hookimpl
def vitbench_register_methods(register):
    register(MethodSpec(name="exiter", params=Params, build=build))
"""

HOSTILE_HOOKS = """
import sys
from vitbench.hookspecs import hookimpl


@hookimpl
def vitbench_run_started(spec):
    raise RuntimeError("boom in run_started")


@hookimpl
def vitbench_run_finished(spec, result):
    result["status"] = "edited by a plugin"
    sys.exit(0)
"""


def test_a_plugin_that_exits_at_import_fails_alone_and_help_still_works(
        fake_dists: FakeDistributions, tmp_path: Path) -> None:
    fake_dists.add("exiting-plugin", {"exiting": "import sys\nsys.exit(3)\n"})
    fake_dists.add("good-plugin", {"good": fake_dists.method_plugin("good-method")})
    host = fresh_host()
    assert host.failures == [PluginFailure("exiting", "exiting-plugin", "SystemExit: plugin code called sys.exit(3)")]
    assert "good-method" in host.names("methods")
    done = _vitbench(fake_dists.site, tmp_path, "--help")
    assert done.returncode == 0 and "usage:" in done.stdout
    assert "plugin 'exiting' (exiting-plugin) failed to load: SystemExit" in done.stderr


def test_run_hooks_that_raise_or_exit_are_warnings_and_get_a_copy_of_the_record(
        fake_dists: FakeDistributions, capsys: pytest.CaptureFixture[str]) -> None:
    fake_dists.add("hostile-hooks", {"hostile": HOSTILE_HOOKS})
    host = fresh_host()
    record = {"status": "ok", "nested": {"top1_pct": 80.0}}
    host.run_started(spec=None)
    host.run_finished(spec=None, result=record)
    assert record == {"status": "ok", "nested": {"top1_pct": 80.0}}  # the plugin edited its own copy
    assert [f.error for f in host.failures] == [
        "vitbench_run_started raised RuntimeError: boom in run_started",
        "vitbench_run_finished raised SystemExit: plugin code called sys.exit(0)"]
    assert len(warnings_in(capsys.readouterr().err)) == 2


def test_a_method_that_exits_in_its_build_is_an_error_record_and_the_plan_goes_on(
        fake_dists: FakeDistributions, tmp_path: Path) -> None:
    code, by_method = _run_exiter(fake_dists, tmp_path, "sys.exit(0)\n")
    assert code == 1 and (tmp_path / "out" / "report.md").is_file()
    assert by_method["exiter"]["status"] == "error"
    assert by_method["exiter"]["error"] == "SystemExit: plugin code called sys.exit(0)"
    assert by_method["tome"]["status"] == by_method["baseline"]["status"] == "ok", by_method["tome"]["error"]


@pytest.mark.parametrize("name, why", [
    ("", "is empty"),
    ("a,b", "holds a comma, a blank or a control character"),
    (" padded", "holds a comma, a blank or a control character"),
    ("tab\there", "holds a comma, a blank or a control character"),
    ("bell\x07", "holds a comma, a blank or a control character"),
    ("baseline", "is reserved for the reference rows (baseline, baseline+ft)"),
    ("baseline+ft", "is reserved for the reference rows"),
])
def test_a_name_no_command_can_reach_is_refused_with_a_warning(
        fake_dists: FakeDistributions, capsys: pytest.CaptureFixture[str], name: str, why: str) -> None:
    fake_dists.add("odd-plugin", {"odd": fake_dists.method_plugin(name, ("odd-alias",))})
    host = fresh_host()
    assert name not in host.names("methods") and "odd-alias" not in host.names("methods")
    assert host.plugins["odd"].registered["methods"] == []
    [warned] = warnings_in(capsys.readouterr().err)
    assert f"plugin 'odd' (odd-plugin) registers the method name {name!r}, which {why}" in warned
    assert warned.endswith("it is left out")
    host.add_plugin(object(), "late")  # a rebuild of the catalogs warns no second time
    assert host.names("methods") and warnings_in(capsys.readouterr().err) == []
    assert "tome" in host.names("methods")  # the other plugins are untouched


def test_an_unusable_alias_is_left_out_and_the_name_kept(
        fake_dists: FakeDistributions, capsys: pytest.CaptureFixture[str]) -> None:
    fake_dists.add("odd-plugin", {"odd": fake_dists.method_plugin("fine", ("", "also,fine", "fine-too"))})
    host = fresh_host()
    assert host.method("fine").name == "fine" and host.method("fine-too").name == "fine"
    assert len(warnings_in(capsys.readouterr().err)) == 2


def test_an_unusable_name_is_fatal_when_strict(fake_dists: FakeDistributions,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dists.add("odd-plugin", {"odd": fake_dists.method_plugin("baseline")})
    monkeypatch.setenv("VITBENCH_STRICT_PLUGINS", "1")
    with pytest.raises(PluginError, match=r"registers the method name 'baseline', which is reserved"):
        fresh_host().names("methods")


# -- KeyboardInterrupt: plugin code's own fails alone, a real Ctrl-C stops the plan --------------
def _method_whose_build(body: str) -> str:
    return EXITING_METHOD.replace("    sys.exit(0)", textwrap.indent(textwrap.dedent(body), "    "))


def _run_exiter(fake_dists: FakeDistributions, tmp_path: Path, build_body: str) -> tuple[int, dict]:
    fake_dists.add("exiting-method", {"exiter_plugin": _method_whose_build(build_body)})
    vitbench.host.reset_host()
    out = tmp_path / "out"
    try:
        code = main(["run", "--task", "agreement", "--methods", "exiter,tome", "--model", "test_vit",
                     "--param", "tome.r=4", "--batch-size", "2", "--out", str(out)])
    finally:
        vitbench.host.reset_host()
    store = out / "runs.jsonl"
    records = [json.loads(line) for line in store.read_text().splitlines()] if store.exists() else []
    return code, {r["method"]: r for r in records}


def test_a_keyboard_interrupt_raised_by_plugin_code_fails_its_run_only(
        fake_dists: FakeDistributions, tmp_path: Path) -> None:
    code, by_method = _run_exiter(fake_dists, tmp_path, "raise KeyboardInterrupt\n")
    assert code == 1 and (tmp_path / "out" / "report.md").is_file()
    assert by_method["exiter"]["error"] == "KeyboardInterrupt: raised by plugin code, not by Ctrl-C"
    assert by_method["tome"]["status"] == by_method["baseline"]["status"] == "ok", by_method["tome"]["error"]


def test_a_real_ctrl_c_inside_plugin_code_still_stops_the_plan(
        fake_dists: FakeDistributions, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import signal

    before = signal.getsignal(signal.SIGINT)
    code, by_method = _run_exiter(fake_dists, tmp_path, """
        import os, signal, time
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        """)
    assert code == 130 and "exiter" not in by_method and "tome" not in by_method
    assert "vitbench: interrupted; finished runs are in the store" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is before  # main() gave the caller its handler back


def test_a_plugin_raising_keyboard_interrupt_at_import_or_in_a_hook_fails_alone(
        fake_dists: FakeDistributions, tmp_path: Path) -> None:
    import signal

    from vitbench.core.interrupts import watch_ctrl_c

    fake_dists.add("interrupting-plugin", {"interrupting": "raise KeyboardInterrupt\n"})
    fake_dists.add("hostile-hooks", {"hostile": HOSTILE_HOOKS.replace("sys.exit(0)", "raise KeyboardInterrupt")})
    previous = watch_ctrl_c()
    try:
        host = fresh_host()
        host.run_finished(spec=None, result={"status": "ok"})
    finally:
        signal.signal(signal.SIGINT, previous)
    assert [(f.name, f.error) for f in host.failures if f.name == "interrupting"] == [
        ("interrupting", "KeyboardInterrupt: raised by plugin code, not by Ctrl-C")]
    assert ("hostile", "vitbench_run_finished raised KeyboardInterrupt: raised by plugin code, not by Ctrl-C") in [
        (f.name, f.error) for f in host.failures]
    done = _vitbench(fake_dists.site, tmp_path, "--help")
    assert done.returncode == 0 and "usage:" in done.stdout


def test_without_the_cli_watcher_every_keyboard_interrupt_stops(fake_dists: FakeDistributions) -> None:
    fake_dists.add("interrupting-plugin", {"interrupting": "raise KeyboardInterrupt\n"})
    with pytest.raises(KeyboardInterrupt):  # the Python API cannot tell a Ctrl-C from the plugin's own
        fresh_host()


# -- a plugin that ends the process or changes vitbench while it loads (issue 59, item 5) ------
@pytest.mark.parametrize("source, why", [
    ("import os\nos._exit(5)\n", "its import ended the process (os._exit(5))"),
    ("import ctypes\nctypes.string_at(0)\n", "its import killed the process (SIGSEGV)"),
    ("import threading, os\nthreading.Thread(target=lambda: os._exit(7)).start()\nimport time\ntime.sleep(5)\n",
     "its import ended the process (os._exit(7))"),
])
def test_a_plugin_that_ends_the_process_at_import_is_a_failed_plugin(
        fake_dists: FakeDistributions, tmp_path: Path, source: str, why: str) -> None:
    fake_dists.add("killer-plugin", {"killer": source})
    fake_dists.add("good-plugin", {"good": fake_dists.method_plugin("good-method")})
    host = fresh_host()
    assert host.failures == [PluginFailure("killer", "killer-plugin", why)]
    assert "good-method" in host.names("methods")
    done = _vitbench(fake_dists.site, tmp_path, "plugins")
    assert done.returncode == 0 and "Traceback" not in done.stderr and "killer" in done.stdout
    assert f"plugin 'killer' (killer-plugin) failed to load: {why}" in done.stderr


def test_a_plugin_whose_import_hangs_fails_after_the_timeout(fake_dists: FakeDistributions,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from vitbench.host import plugin_guard

    fake_dists.add("hanging-plugin", {"hanging": "import time\ntime.sleep(600)\n"})
    monkeypatch.setattr(plugin_guard, "IMPORT_TIMEOUT_S", 0.5)
    monkeypatch.setattr(plugin_guard.import_survives, "__defaults__", (0.5,))
    host = fresh_host()
    assert host.failures == [PluginFailure("hanging", "hanging-plugin", "its import did not finish within 0.5 s")]


PATCHER = """
import functools
import vitbench.tasks.cls.evaluate as ev
from vitbench.results.store import ResultStore

@functools.wraps(ev.evaluate_cls)
def evaluate_cls(*args, **kwargs):
    return {"top1_pct": 99.9}

ev.evaluate_cls = evaluate_cls
ResultStore.append = lambda self, record: None
"""


def test_a_plugin_that_changes_vitbench_at_import_is_refused_and_undone(fake_dists: FakeDistributions) -> None:
    import vitbench.tasks.cls.evaluate as ev
    from vitbench.results.store import ResultStore

    evaluate, append = ev.evaluate_cls, ResultStore.append
    fake_dists.add("patching-plugin", {"patcher": PATCHER + fake_dists.method_plugin("patched-method")})
    host = fresh_host()
    assert [f.name for f in host.failures] == ["patcher"]
    error = host.failures[0].error
    assert error.startswith("it changed vitbench.") and "(and 1 more) at import, code it does not own: refused (undone)" in error
    assert ev.evaluate_cls is evaluate and ResultStore.append is append  # put back
    assert "patched-method" not in host.names("methods") and host.tainted == []
    host.check_untouched()


def test_a_change_that_cannot_be_undone_stops_every_run_in_one_line(fake_dists: FakeDistributions,
                                                                    tmp_path: Path) -> None:
    """In a fresh process the plugin imports the evaluator itself: what it held before is unknown."""
    fake_dists.add("patching-plugin", {"patcher": PATCHER})
    done = _vitbench(fake_dists.site, tmp_path, "run", "--model", "test_vit", "--methods", "tome",
                     "--metrics", "gmacs", "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "plugin 'patcher' (patching-plugin) failed to load: it changed vitbench." in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(
        "vitbench: error: plugin 'patcher' replaced vitbench.") and "VITBENCH_DISABLE_PLUGINS=patcher" in done.stderr
    assert not (tmp_path / "out" / "runs.jsonl").exists()


HOSTILE_BUILDS = """
import ctypes
import os
import threading
import time
from dataclasses import dataclass

from vitbench.catalog import MethodSpec, Reduction
from vitbench.hookspecs import hookimpl


@dataclass(frozen=True)
class Params:
    pass


def crash(params, info):
    ctypes.string_at(0)


def exit_from_a_thread(params, info):
    threading.Thread(target=lambda: os._exit(9)).start()
    time.sleep(30)


def hang(params, info):
    time.sleep(600)


@hookimpl
def vitbench_register_methods(register):
    for name, build in (("crashes", crash), ("exits", exit_from_a_thread), ("hangs", hang)):
        register(MethodSpec(name=name, params=Params, build=build))
"""


@pytest.mark.slow
def test_isolated_runs_turn_a_crash_an_exit_and_a_hang_into_error_records(
        fake_dists: FakeDistributions, tmp_path: Path) -> None:
    fake_dists.add("hostile-builds", {"hostile_builds": HOSTILE_BUILDS})
    out = tmp_path / "out"
    done = _vitbench(fake_dists.site, tmp_path, "run", "--model", "test_vit", "--methods", "crashes,exits,hangs,tome",
                     "--metrics", "gmacs", "--run-timeout", "20", "--out", str(out))
    assert done.returncode == 1 and (out / "report.md").is_file(), done.stderr[-2000:]
    by_method = {r["method"]: r for r in map(json.loads, (out / "runs.jsonl").read_text().splitlines())}
    assert by_method["crashes"]["error"] == "the run failed outside Python: its process was killed by SIGSEGV"
    assert by_method["exits"]["error"] == ("the run failed outside Python: its process ended with exit code 9 "
                                           "before it wrote the record")
    assert by_method["hangs"]["error"] == "the run did not finish within --run-timeout 20 s; its process was killed"
    assert by_method["tome"]["status"] == by_method["baseline"]["status"] == "ok", by_method["tome"]["error"]
    assert by_method["tome"]["gmacs"] < by_method["baseline"]["gmacs"]


@pytest.mark.parametrize("argv, said", [
    (["--run-timeout", "0"], "--run-timeout '0' is not a number of seconds > 0"),
    (["--run-timeout", "soon"], "--run-timeout 'soon' is not a number of seconds > 0"),
    (["--isolate", "--launcher", "pytorch"], "--isolate runs each spec in a process of its own"),
])
def test_bad_isolation_options_are_one_line(argv: list[str], said: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--model", "test_vit", "--methods", "tome", "--metrics", "gmacs", *argv,
                 "--out", str(tmp_path / "out")]) == 2
    assert said in capsys.readouterr().err.strip().splitlines()[-1]
    assert not (tmp_path / "out" / "runs.jsonl").exists()
