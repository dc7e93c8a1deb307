"""``vitbench list`` and ``vitbench plugins``."""
from __future__ import annotations

import json

from vitbench.cli.main import main


def _unwrapped(out: str) -> str:
    """The listing with each entry's wrapped continuation lines (indented 4 more) joined back on."""
    lines: list[str] = []
    for line in out.splitlines():
        indent = len(line) - len(line.lstrip())
        if lines and indent >= 4 + len(lines[-1]) - len(lines[-1].lstrip()):
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    return "\n".join(lines)


def test_list_methods_and_scorers(capsys):
    assert main(["list", "methods"]) == 0
    out = _unwrapped(capsys.readouterr().out)
    for name in ("tome", "ppt", "topk", "entropy", "average"):
        assert any(line.startswith("  " + name + " ") for line in out.splitlines())
    # grouped by kind (issue 12, item 4), each saying whether it is fine-tuned
    groups, current = {}, None
    for line in out.splitlines():
        if not line.startswith(" "):
            current = line.rstrip(":")
        else:
            groups.setdefault(current, []).append(line.split()[0])
    assert list(groups) == ["merging", "pruning", "hybrid", "channel"]
    assert {"tome", "ltm"} <= set(groups["merging"]) and "topk" in groups["pruning"]
    assert {"ppt", "ltmp"} <= set(groups["hybrid"]) and groups["channel"] == ["dcs"]
    ltm = next(line for line in out.splitlines() if line.startswith("  ltm "))
    tome = next(line for line in out.splitlines() if line.startswith("  tome "))
    assert "learnable: fine-tuned before measuring" in ltm and "training-free" in tome
    assert main(["list", "scorers"]) == 0
    assert {line.split()[0] for line in _unwrapped(capsys.readouterr().out).splitlines()} >= {"cls-attn", "entropy",
                                                                                                "average"}


def test_every_listing_fits_100_columns(capsys):
    for kind in ("methods", "scorers", "families", "tasks"):
        assert main(["list", kind]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines and all(len(line) <= 100 for line in lines), (kind, max(lines, key=len))


def test_list_models_includes_the_default_and_timm_vits(capsys):
    assert main(["list", "models", "--filter", "deit_small*"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("vitbench-fmnist-vit")
    assert "deit_small_patch16_224" in out.splitlines()


def test_plugins_json_names_distribution_version_and_registrations(capsys):
    assert main(["plugins", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    tome = next(p for p in info["plugins"] if p["name"] == "tome")
    assert tome["distribution"] == "vitbench" and tome["version"] == "0.1.0"
    assert tome["registered"]["methods"] == ["tome"]
    assert info["failures"] == []


def test_a_method_kind_outside_the_list_is_a_clear_error():
    import pytest

    from vitbench.catalog import MethodSpec
    from vitbench.errors import UnknownNameError

    with pytest.raises(UnknownNameError, match="unknown method kind .of method 'x'. 'sparse'; valid .*channel, hybrid, merging, other, pruning"):
        MethodSpec(name="x", params=object, build=lambda p, i: None, kind="sparse")
