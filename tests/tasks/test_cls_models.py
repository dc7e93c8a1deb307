"""load_model: timm names, suggestions for unknown names, checkpoints and their errors."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vitbench.errors import CheckpointError, ParamError, UnknownNameError
from vitbench.tasks.models import (
    load_model,
    read_state_dict,
)
from vitbench.tasks.model_names import suggest_models


def test_timm_model_with_num_classes() -> None:
    model = load_model("vit_tiny_patch16_224", num_classes=7)
    assert model.num_classes == 7 and not model.training


def test_unknown_name_lists_close_timm_models() -> None:
    with pytest.raises(UnknownNameError) as err:
        load_model("deit_tiny_patch16")
    msg = str(err.value)
    assert "unknown model 'deit_tiny_patch16'" in msg
    assert "deit_tiny_patch16_224" in msg and "vitbench-fmnist-vit" in msg
    assert "\n" not in msg


def test_suggestions_for_typos() -> None:
    assert "vit_small_patch16_224" in suggest_models("vit_smal_patch16_224")
    assert suggest_models("zzzzqqq") == []


def test_bad_num_classes() -> None:
    with pytest.raises(ParamError, match="num_classes must be a positive integer, got 0"):
        load_model("vit_tiny_patch16_224", num_classes=0)


def _save(tmp_path: Path, obj: object, name: str = "ckpt.pth") -> Path:
    path = tmp_path / name
    torch.save(obj, path)
    return path


def test_checkpoint_plain_and_mmengine_style(tmp_path: Path, make_model) -> None:
    src = make_model(num_classes=5)
    state = src.state_dict()
    mm_style = {"meta": {"epoch": 3}, "state_dict": {
        **{f"backbone.model.{k}": v for k, v in state.items()},
        "data_preprocessor.mean": torch.zeros(3, 1, 1)}}
    for obj in (state, mm_style, {"model": state}):
        loaded = read_state_dict(_save(tmp_path, obj))
        assert loaded.keys() == state.keys()
        assert all(torch.equal(loaded[k], state[k]) for k in state)


def test_load_model_with_checkpoint(tmp_path: Path) -> None:
    src = load_model("vit_tiny_patch16_224", num_classes=3)
    path = _save(tmp_path, {"state_dict": {f"backbone.model.{k}": v for k, v in src.state_dict().items()}})
    model = load_model("vit_tiny_patch16_224", num_classes=3, checkpoint=path)
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert torch.equal(model(x), src(x))


def test_corrupt_checkpoint_names_path_and_reason(tmp_path: Path) -> None:
    bad = tmp_path / "corrupt.pth"
    bad.write_bytes(b"\x00garbage that is no checkpoint")
    with pytest.raises(CheckpointError, match=rf"cannot read checkpoint {bad}: \w+"):
        load_model("vit_tiny_patch16_224", checkpoint=bad)
    good = _save(tmp_path, {"w": torch.ones(3)}, "trunc.pth")
    good.write_bytes(good.read_bytes()[:40])
    with pytest.raises(CheckpointError, match=rf"cannot read checkpoint {good}"):
        read_state_dict(good)


def test_missing_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=rf"checkpoint {tmp_path / 'none.pth'} not found"):
        read_state_dict(tmp_path / "none.pth")


def test_unsafe_checkpoint_is_refused(tmp_path: Path) -> None:
    path = _save(tmp_path, {"state_dict": {"w": torch.ones(1)}, "evil": Path("x")})
    with pytest.raises(CheckpointError, match=rf"cannot read checkpoint {path}: UnpicklingError"):
        read_state_dict(path)


def test_mismatched_checkpoint_hints_num_classes(tmp_path: Path, make_model) -> None:
    path = _save(tmp_path, make_model(num_classes=4).state_dict())
    with pytest.raises(CheckpointError, match=r"only the classifier head differs \(head.weight is \[4, 32\].*"
                                              r"the checkpoint is for 4 classes, the model predicts 6; pass --num-classes 4$"):
        from vitbench.tasks.models import load_checkpoint

        load_checkpoint(make_model(num_classes=6), path)


def test_a_checkpoint_of_another_architecture_says_what_differs(tmp_path: Path, make_model) -> None:
    from vitbench.tasks.models import load_checkpoint

    deeper = _save(tmp_path, make_model(num_classes=6).state_dict(), "deeper.pth")
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(load_model("test_vit"), deeper, name="test_vit")
    message = str(caught.value)
    assert message.startswith(f"checkpoint {deeper} does not fit test_vit: this checkpoint is for another "
                              f"architecture: ")
    assert "keys of the model are missing (blocks.2." in message
    assert "the checkpoint is a 2-block model of width 32, test_vit a 6-block model of width 64" in message
    assert message.endswith("pass the --model it was saved from (`vitbench list models`)")
    assert "num_classes" not in message and "\n" not in message


def test_a_new_head_is_marked_for_fitting(tmp_path: Path) -> None:
    """--num-classes gives a new (random) head unless the checkpoint holds one of that size; a
    checkpoint with another head still gives its backbone."""
    assert not hasattr(load_model("test_vit"), "vitbench_new_head")
    assert load_model("test_vit", num_classes=3).vitbench_new_head is True
    three = load_model("test_vit", num_classes=3)
    same = load_model("test_vit", num_classes=3, checkpoint=_save(tmp_path, three.state_dict(), "three.pth"))
    assert not hasattr(same, "vitbench_new_head") and torch.equal(same.head.weight, three.head.weight)
    wide = load_model("test_vit")  # a 1000-way checkpoint under a 3-way head: its backbone only
    rehead = load_model("test_vit", num_classes=3, checkpoint=_save(tmp_path, wide.state_dict(), "wide.pth"))
    assert rehead.vitbench_new_head is True and rehead.head.weight.shape == (3, wide.head.in_features)
    assert torch.equal(rehead.blocks[0].attn.qkv.weight, wide.blocks[0].attn.qkv.weight)
    own = load_model("test_vit", checkpoint=tmp_path / "three.pth")  # no --num-classes: the checkpoint's head
    assert own.num_classes == 3 and not hasattr(own, "vitbench_new_head")
    assert torch.equal(own.head.weight, three.head.weight)


def test_random_init_is_seeded() -> None:
    """The same command builds the same random model (a number must not change between two
    runs of one command); another seed draws other weights; the caller's RNG is untouched."""
    torch.manual_seed(123)
    a, b = (load_model("test_vit") for _ in range(2))
    c = load_model("test_vit", seed=1)
    after = torch.rand(1)
    torch.manual_seed(123)
    assert torch.equal(torch.rand(1), after)  # building the models drew nothing from the caller's RNG
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa if sa[k].is_floating_point())
