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
    assert list(groups) == ["merging", "pruning", "hybrid", "channel", "control"]
    assert {"tome", "ltm"} <= set(groups["merging"]) and "topk" in groups["pruning"]
    assert {"ppt", "ltmp"} <= set(groups["hybrid"]) and groups["channel"] == ["dcs"]
    assert groups["control"] == ["downsample", "random"]
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
    header, *names = _unwrapped(capsys.readouterr().out).splitlines()
    assert header.startswith("# 2 timm models matching 'deit_small*' `run` accepts") and "--filter" in header
    assert names == ["deit_small_distilled_patch16_224", "deit_small_patch16_224"]
    assert main(["list", "models", "--filter", "vitbench-*"]) == 0  # the embedded ones, when the wildcard matches
    assert _unwrapped(capsys.readouterr().out).splitlines()[1:] == [
        "vitbench-fmnist-deit  (embedded: a ViT of DeiT's layout, 197 tokens, trained 19 epochs on Fashion-MNIST)",
        "vitbench-fmnist-vit  (embedded, the default: a ViT of 65 tokens at width 64, trained one epoch on "
        "Fashion-MNIST (the first default))",  # the suite's default (tests/conftest.py)
        "vitbench-fmnist-mobilevit-xs  (embedded: timm's mobilevit_xs trained one epoch on Fashion-MNIST at 128 "
        "pixels (the dense backbone))",
        "vitbench-fmnist-efficientvit-b1  (embedded: timm's efficientvit_b1 trained one epoch on Fashion-MNIST at "
        "128 pixels (the dense backbone))"]


def _listed_models(capsys) -> list[str]:
    assert main(["list", "models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 100 for line in lines)
    header, deit, legacy, mobilevit, efficientvit, *names = _unwrapped("\n".join(lines)).splitlines()
    assert header == f"# {len(names)} timm models `run` accepts (families' patterns less what they refuse); " \
                     "filter: --filter 'deit*'"
    assert [line.split()[0] for line in (deit, legacy, mobilevit, efficientvit)] == [
        "vitbench-fmnist-deit", "vitbench-fmnist-vit", "vitbench-fmnist-mobilevit-xs", "vitbench-fmnist-efficientvit-b1"]
    return names


# run refuses these (its family check, on the built model): Eva and RelPos are other classes; the
# ViT adapter refuses attention pooling and blocks other than timm's Block
REFUSED = ("vit_small_patch16_rope_224", "vit_pe_core_base_patch16_224", "vit_relpos_small_patch16_224",
           "vit_srelpos_small_patch16_224", "vit_base_patch16_siglip_224", "vit_so150m_patch16_reg4_map_256",
           "vit_base_patch16_xp_224", "vit_small_patch16_18x2_224", "vit_base_patch16_rpn_224",
           "vit_pwee_patch16_reg1_gap_256")
ACCEPTED = ("deit_tiny_patch16_224", "deit_tiny_distilled_patch16_224", "vit_tiny_r_s16_p8_224",
            "vit_base_patch16_siglip_gap_224", "swin_tiny_patch4_window7_224", "swinv2_tiny_window8_256",
            "mobilevit_xxs", "efficientvit_b0")


def test_list_models_names_only_what_the_families_accept_and_no_refused_variant(capsys):
    import timm

    from vitbench.host import get_host
    from vitbench.tasks.model_names import accepted_models, family_models

    names = _listed_models(capsys)
    accepted = accepted_models()
    assert names == list(accepted) and len(names) > 150
    families = get_host().specs("families")
    for name in names:  # each through its family's own check: patterns, timm modules, exclusions
        assert name in family_models(families[accepted[name]]), name
    assert not set(names) & set(REFUSED)
    assert not set(names) & set(timm.list_models(module="eva") + timm.list_models(module="vision_transformer_relpos"))
    assert set(ACCEPTED) <= set(names)


def test_the_listed_and_refused_names_agree_with_runs_check_on_the_built_model():
    """run's own refusal (host.family_of + describe on the model) agrees with the listing, for one
    model of each accepted timm module and each refused variant (built on the meta device: no weights)."""
    import timm
    import torch

    from vitbench.errors import UnsupportedError
    from vitbench.host import get_host

    host = get_host()

    def accepted_by_run(name: str) -> bool:
        with torch.device("meta"):
            model = timm.create_model(name, pretrained=False)
        try:
            host.family_of(model).describe(model)
        except UnsupportedError:
            return False
        return True

    assert [n for n in ACCEPTED if not accepted_by_run(n)] == []
    assert [n for n in REFUSED if accepted_by_run(n)] == []


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

    with pytest.raises(UnknownNameError, match="unknown method kind .of method 'x'. 'sparse'; valid .*channel, control, hybrid, merging, other, pruning"):
        MethodSpec(name="x", params=object, build=lambda p, i: None, kind="sparse")
