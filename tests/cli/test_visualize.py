"""``vitbench visualize`` and ``vitbench run --visualize``: a PNG per call, bad input one line, exit 2."""
from __future__ import annotations

from pathlib import Path

import pytest

from vitbench.cli.main import main
from vitbench.cli.visualize_cmd import link_in_report

PNG = b"\x89PNG\r\n\x1a\n"


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vitbench: error: "), err
    return err[0]


def test_tome_on_deit_tiny_writes_a_png(tmp_path, capsys):
    out = tmp_path / "figs"
    rc = main(["visualize", "--method", "tome", "--param", "tome.r=13", "--model", "deit_tiny_patch16_224",
               "--blocks", "3,11", "--out", str(out)])
    assert rc == 0
    png = out / "visualize-tome.png"
    assert png.read_bytes()[:8] == PNG
    assert f"wrote {png}" in capsys.readouterr().out


def test_topk_and_tome_side_by_side_on_the_default_model(tmp_path):
    rc = main(["visualize", "--method", "tome,topk", "--index", "7", "--out", str(tmp_path)])
    assert rc == 0
    assert (tmp_path / "visualize-tome-topk.png").read_bytes()[:8] == PNG


def test_an_image_file_is_resized_to_the_model(tmp_path):
    from PIL import Image

    Image.new("RGB", (50, 30), (200, 10, 10)).save(tmp_path / "red.png")
    rc = main(["visualize", "--method", "topk", "--image", str(tmp_path / "red.png"), "--out", str(tmp_path)])
    assert rc == 0 and (tmp_path / "visualize-topk.png").is_file()


@pytest.mark.parametrize("argv, message", [
    (["--method", "nope"], "unknown method 'nope'; valid methods: "),
    (["--method", "tome", "--blocks", "99"], "--blocks 99 is out of range; vitbench-fmnist-vit has 12 blocks: "
                                             "valid blocks are 0 .. 11"),
    (["--method", "tome", "--blocks", "3,x"], "--blocks '3,x': 'x' is not a block index"),
    (["--method", "tome", "--image", "/no/such.png"], "--image '/no/such.png' does not exist"),
    (["--method", "tome", "--index", "10000"], "--index 10000 is out of range; Fashion-MNIST has 10000 test "
                                               "images: 0 .. 9999"),
    (["--method", "tome", "--index", "-1"], "--index -1 is out of range"),
    (["--method", "tome", "--model", "swin_tiny_patch4_window7_224"],
     "visualize supports ViT/DeiT models; got swin_tiny_patch4_window7_224 (a SwinTransformer"),
    (["--method", "tome", "--model", "deit_tinyy"], "deit_tiny_patch16_224"),
    (["--method", "tome", "--param", "tome.r=-1"], "tome.r=-1 is out of range"),
    (["--method", "tome", "--param", "topk.keep=0.5"], "--param names method 'topk', which --method does not list"),
    (["--method", "tome", "--model", ""], "--model '' is empty"),
    (["--method", "tome", "--seed", "x"], "--seed 'x' is not an integer"),
    (["--method", ""], "--method names no method"),
    (["--method", "random,downsample"], "method 'downsample' changes the patch grid ("),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    assert main(["visualize", *argv, "--out", str(out)]) == 2
    assert message in _one_error_line(capsys)
    assert not out.exists()


def test_run_visualize_writes_the_figure_and_links_it(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["run", "--methods", "tome,topk", "--param", "tome.r=4", "--param", "topk.layers=(1,3)",
               "--model", "test_vit", "--metrics", "params", "--out", str(out), "--visualize"])
    assert rc == 0
    png = out / "visualize-tome-topk.png"
    assert png.read_bytes()[:8] == PNG
    assert f"figure: {png}" in capsys.readouterr().out
    assert f"]({png.name})" in (out / "report.md").read_text()


def test_run_visualize_refuses_a_swin_before_running(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["run", "--methods", "tome", "--model", "swin_tiny_patch4_window7_224", "--metrics", "params",
               "--out", str(out), "--visualize"])
    assert rc == 2
    assert "visualize supports ViT/DeiT models" in _one_error_line(capsys)
    assert not (out / "runs.jsonl").exists()


@pytest.mark.parametrize("report, expected", [
    ("# R\n\n## Plot\n\n![a](report.png)\n\n## Notes\n\nx\n",
     "# R\n\n## Plot\n\n![a](report.png)\n\nLINK\n\n## Notes\n\nx\n"),
    ("# R\n\ntext\n", "# R\n\ntext\n\n## Plot\n\nLINK\n"),
])
def test_link_in_report_adds_one_line_under_plot(tmp_path, report, expected):
    md = tmp_path / "report.md"
    md.write_text(report)
    link_in_report(md, tmp_path / "visualize-tome.png")
    link_in_report(md, tmp_path / "visualize-tome.png")  # twice: still one line
    line = "![Patches merged (colour) and pruned (grey) after each block](visualize-tome.png)"
    assert md.read_text() == expected.replace("LINK", line)
