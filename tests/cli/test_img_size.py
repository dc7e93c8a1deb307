"""``--img-size``: a timm ViT resized before anything runs, its side in the run's identity and in
what the report says it was measured on (issue 63, item 4)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import timm
import torch

from vitbench.cli.main import main
from vitbench.errors import ParamError
from vitbench.tasks.cls.options import check_img_size
from vitbench.tasks.models import resize_input

FAST = ["--task", "cls", "--model", "test_vit", "--metrics", "gmacs", "--methods", "tome", "--param", "tome.r=2"]


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]


def test_a_larger_side_means_more_tokens_and_gmacs_each_side_its_own_run_and_table(tmp_path):
    out = tmp_path / "out"
    assert main(["run", *FAST, "--img-size", "64", "--out", str(out)]) == 0
    assert main(["run", *FAST, "--img-size", "128", "--out", str(out), "--resume"]) == 0
    base64, tome64, base128, tome128 = _records(out)
    assert (base64["img_size"], base64["input_size"], base128["input_size"]) == (64, [3, 64, 64], [3, 128, 128])
    assert base64["measured_on"]["img_size"] == 64 and tome128["measured_on"]["img_size"] == 128
    assert len({r["spec_id"] for r in (base64, tome64, base128, tome128)}) == 4
    # test_vit's patch 16: 16 patches at 64 pixels, 64 at 128; the linear layers scale with the tokens
    assert base128["gmacs"] > 3 * base64["gmacs"] and tome128["gmacs"] < base128["gmacs"]
    report = (out / "report.md").read_text()
    assert report.count("input resized to 64x64 (--img-size)") == 1
    assert report.count("input resized to 128x128 (--img-size)") == 1


def test_resizing_resamples_the_position_embedding_and_keeps_the_model_running():
    model = timm.create_model("test_vit", pretrained=False).eval()
    resize_input(model, 96)
    assert model.patch_embed.img_size == (96, 96)
    assert model.pos_embed.shape[1] == (96 // 16) ** 2 + model.num_prefix_tokens
    with torch.inference_mode():
        assert model(torch.randn(1, 3, 96, 96)).shape == (1, model.num_classes)


def test_a_side_off_the_patch_grid_names_the_valid_ones():
    model = timm.create_model("test_vit", pretrained=False)
    with pytest.raises(ParamError, match=r"--img-size 100 is not a multiple of the model's patch size 16; "
                                         r"valid near it: 96, 112"):
        resize_input(model, 100)


def test_a_model_without_set_input_size_is_refused():
    model = timm.create_model("resnet10t", pretrained=False)
    with pytest.raises(ParamError, match=r"--img-size 96: ResNet cannot change its input size here; it works "
                                         r"with timm ViT/DeiT models"):
        resize_input(model, 96)


@pytest.mark.parametrize("size", [0, 4, -16, True, 64.0])
def test_an_out_of_range_side_is_refused(size):
    with pytest.raises(ParamError, match="--img-size .* is out of range; give the input side in pixels"):
        check_img_size(size)


@pytest.mark.parametrize("argv, message", [
    (["--img-size", "4"], "vitbench: error: --img-size 4 is out of range"),
    (["--img-size", "100"], "vitbench: error: --img-size 100 is not a multiple of the model's patch size 16"),
])
def test_bad_sides_exit_2_with_one_line(tmp_path, capsys, argv, message):
    assert main(["run", *FAST, *argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("vitbench: error:") == 1
    assert not (tmp_path / "out" / "runs.jsonl").exists()


def test_another_task_refuses_the_option(tmp_path, capsys):
    assert main(["run", "--task", "det", "--img-size", "224", "--methods", "tome", "--out", str(tmp_path)]) == 2
    assert "--img-size is an option of --task cls; --task is 'det'" in capsys.readouterr().err
