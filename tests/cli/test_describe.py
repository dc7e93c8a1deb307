"""``vitbench describe METHOD``: a method's card, its parameters' meanings from the params dataclass."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from vitbench.catalog import HELP, MethodSpec, param_docs
from vitbench.cli.describe_cmd import card
from vitbench.cli.main import main
from vitbench.host import get_host


def test_describe_tome_shows_r_with_its_type_default_and_meaning(capsys):
    assert main(["describe", "tome"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tome\n")
    assert "    r: int | list[int] | (int, float) = 16\n" in out
    assert "tokens merged per block" in out
    for fact in ("kind:      merging", "training-free", "budget:    r", "runs on:   mobilevit, swin, vit (needs token_steps)",
                 "Bolya et al."):
        assert fact in out, fact
    assert all(len(line) <= 100 for line in out.splitlines())


def test_describe_by_alias_and_a_method_without_help_texts(capsys):
    assert main(["describe", "ibtm"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ltm\n") and "learnable: fine-tuned before measuring" in out

    @dataclass(frozen=True)
    class Bare:
        keep: float = 0.5

    lines = card(MethodSpec(name="bare", params=Bare, build="no_such_module:build"))
    assert lines[lines.index("    keep: float = 0.5") + 1] == "        (no description)"


@pytest.mark.parametrize("method", get_host().names("methods"))
def test_every_parameter_of_every_method_has_a_meaning_that_describe_prints(method, capsys):
    spec = get_host().specs("methods")[method]
    docs = param_docs(spec.params)
    assert [d.name for d in docs if not d.help] == []
    assert main(["describe", method]) == 0
    out = capsys.readouterr().out
    assert "(no description)" not in out and all(len(line) <= 100 for line in out.splitlines())
    for doc in docs:
        assert f"    {doc.name}: {doc.type} = " in out
        assert " ".join(doc.help.split()[:4]) in " ".join(out.split())


def test_describe_an_unknown_method_is_one_line_naming_it_and_the_valid_ones(capsys):
    assert main(["describe", "nosuch"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "'nosuch'" in err[0] and "tome" in err[0] and "topk" in err[0] and "ibtm" in err[0]


def test_param_docs_reads_help_metadata_and_inherits_it():
    @dataclass(frozen=True)
    class Base:
        k: tuple[int, ...] = field(default=(1,), metadata={HELP: "blocks"})
        x: float = 0.5

    @dataclass(frozen=True)
    class Child(Base):
        k: tuple[int, ...] = (2,)

    docs = {d.name: d for d in param_docs(Child)}
    assert (docs["k"].type, docs["k"].default, docs["k"].help) == ("tuple[int, ...]", (2,), "blocks")
    assert (docs["x"].type, docs["x"].help) == ("float", "")


def test_evit_is_the_topk_preset_with_fuse_on(capsys):
    assert main(["describe", "evit"]) == 0
    out = capsys.readouterr().out
    assert "    fuse: bool = True\n" in out and "    keep: float = 0.7\n" in out
    assert "in (0, 1]\n        valid: in (0, 1]\n    layers" in out  # the declared limits, under the help


def test_describe_shows_declared_choices(capsys):
    assert main(["describe", "atc"]) == 0
    assert "        valid: one of: average, complete, single\n" in capsys.readouterr().out


def test_run_help_is_grouped_and_states_the_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    titles = ["what to run:", "data and weights:", "measurement:", "fine-tuning (learnable methods):",
              "distributed and sharded runs:", "options of --task"]
    positions = [out.index(title) for title in titles]
    assert positions == sorted(positions)
    assert "--device cpu|cuda" in out and "(default cpu)" in out
    assert (out.index("\n  --methods") < out.index("data and weights:") < out.index("\n  --model")
            < out.index("measurement:"))
