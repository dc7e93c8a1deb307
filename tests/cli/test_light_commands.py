"""The commands that only list or explain import none of the heavy stack: plugins register light
specs and name their code by reference (vitbench.catalog), imported when a run asks for it."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import pytest

from vitbench.catalog import FamilySpec, MethodSpec
from vitbench.errors import PluginError, UnsupportedError
from vitbench.hookspecs import hookimpl
from vitbench.host import PluginHost, get_host

HEAVY = ("torch", "timm", "mmengine", "mmcv", "mmdet", "mmpretrain", "pandas", "matplotlib")
LIGHT_COMMANDS = (["--help"], ["list", "methods"], ["list", "scorers"], ["list", "families"], ["list", "tasks"],
                  ["plugins"], ["plugins", "--json"], ["run", "--help"], ["sweep", "--help"], ["describe", "tome"])

_PROBE = textwrap.dedent("""
    import contextlib, io, json, sys
    from vitbench.cli.main import main

    heavy = {}
    for argv in json.loads(sys.argv[1]):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                code = main(argv)
            except SystemExit as exc:  # --help
                code = exc.code
        assert code == 0 and out.getvalue(), (argv, code)
        heavy[" ".join(argv)] = sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(sys.argv[2])))
    print(json.dumps(heavy))
""")


def test_listing_and_help_commands_import_no_heavy_module():
    done = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(LIGHT_COMMANDS), json.dumps(HEAVY)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    heavy = json.loads(done.stdout)
    assert heavy == {" ".join(argv): [] for argv in LIGHT_COMMANDS}


def test_every_builtin_reference_resolves_on_lookup():
    host = get_host()
    for name in host.names("methods"):
        assert callable(host.method(name).build), name
    for name in host.names("scorers"):
        assert callable(host.scorer(name).score), name
    for name in host.names("families"):
        family = host.family(name)
        for field in FamilySpec._references:
            value = getattr(family, field)
            assert value is None or callable(value), (name, field)
    assert isinstance(host.specs("methods")["tome"].build, str)  # a listing imports nothing


@dataclass(frozen=True)
class _Params:
    keep: float = 0.5


class _BrokenReference:
    @hookimpl
    def vitbench_register_methods(self, register):  # type: ignore[no-untyped-def]
        register(MethodSpec(name="broken-ref", params=_Params, build="no_such_module_xyz.code:build"))


def test_a_reference_that_does_not_import_is_an_error_naming_the_plugin_when_asked_for():
    host = PluginHost()
    host.add_plugin(_BrokenReference(), "broken_plugin", "broken-dist", "1.0")
    assert host.names("methods") == ["broken-ref"]  # listed without importing it
    with pytest.raises(PluginError, match=r"method 'broken-ref' of plugin 'broken_plugin' \(broken-dist\) cannot "
                                          r"be loaded: ModuleNotFoundError: .*no_such_module_xyz"):
        host.method("broken-ref")


def test_a_malformed_reference_is_a_failure_of_its_plugin(capsys):
    class Malformed:
        @hookimpl
        def vitbench_register_methods(self, register):  # type: ignore[no-untyped-def]
            register(MethodSpec(name="malformed", params=_Params, build="not a reference"))

    host = PluginHost()
    host.add_plugin(Malformed(), "malformed_plugin", "m-dist", "1.0")
    assert host.names("methods") == []
    assert "MethodSpec.build of 'malformed' is 'not a reference'" in host.failures[0].error
    assert "plugin 'malformed_plugin' (m-dist) failed to load" in capsys.readouterr().err


def test_a_family_whose_code_does_not_import_is_a_warning_and_the_others_still_recognise_models(capsys):
    import torch

    from vitbench.testing import tiny_vit

    class BrokenFamily:
        @hookimpl
        def vitbench_register_families(self, register):  # type: ignore[no-untyped-def]
            register(FamilySpec(name="broken-family", matches="no_such_module_xyz:matches",
                                describe="no_such_module_xyz:describe", patch="no_such_module_xyz:patch"))

    host = PluginHost()
    host.load_entry_points()
    host.add_plugin(BrokenFamily(), "broken_family_plugin", "b-dist", "1.0")
    assert host.family_of(tiny_vit()).name == "vit"  # a built-in recognises it first
    with pytest.raises(UnsupportedError, match="no model-family adapter recognises Linear"):
        host.family_of(torch.nn.Linear(2, 2))  # every family asked, the broken one skipped
    assert "family 'broken-family' of plugin 'broken_family_plugin' (b-dist) cannot be loaded" in capsys.readouterr().err


def test_an_unknown_default_model_in_the_environment_is_one_warning(tmp_path) -> None:
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "vitbench", "list", "methods"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "VITBENCH_DEFAULT_MODEL": "nonexistent"}, cwd=tmp_path)
    assert done.returncode == 0 and "tome" in done.stdout and "Traceback" not in done.stderr
    assert done.stderr.strip() == ("vitbench: warning: $VITBENCH_DEFAULT_MODEL='nonexistent' is not an embedded model "
                                   "(valid: vitbench-fmnist-deit, vitbench-fmnist-vit, "
                                   "vitbench-fmnist-mobilevit-xs, vitbench-fmnist-efficientvit-b1); using vitbench-fmnist-deit")
