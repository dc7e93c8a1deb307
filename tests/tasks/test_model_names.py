"""The error for a model name timm does not know: the closest names, and the task's default."""
from __future__ import annotations

from vitbench.errors import UnknownNameError
from vitbench.tasks.model_names import unknown_model


def test_the_error_names_close_models_and_the_default_when_given() -> None:
    err = unknown_model("deit_tiny_patch16", default="vitbench-fmnist-vit")
    assert isinstance(err, UnknownNameError)
    msg = str(err)
    assert msg.startswith("unknown model 'deit_tiny_patch16'; close timm models: ")
    assert "deit_tiny_patch16_224" in msg
    assert msg.endswith("(or 'vitbench-fmnist-vit', the embedded default; all names: `vitbench list models`, "
                        "timm.list_models())")


def test_without_a_default_only_timm_names_are_offered() -> None:
    msg = str(unknown_model("zzzzqqq"))
    assert msg == ("unknown model 'zzzzqqq'; no timm model name is close (all names: `vitbench list models`, "
                   "timm.list_models())")


def test_a_misspelt_start_suggests_the_supported_names_that_start_alike() -> None:
    from vitbench.tasks.model_names import suggest_models

    assert suggest_models("deit_tinyy")[:2] == ["deit_tiny_patch16_224", "deit_tiny_distilled_patch16_224"]
    assert suggest_models("DeiT_Tiny")[0] == "deit_tiny_patch16_224"
    assert suggest_models("vit_smal_patch16_224")[0] == "vit_small_patch16_224"
    assert suggest_models("") == []
