"""What other commands attach to report.md (``run --visualize``'s figure, ``reproduce``'s
"Published" section) is written again by ``vitbench report DIR`` from the files in DIR."""
from __future__ import annotations

import json

import pytest

from vitbench.cli.main import main
from vitbench.errors import DataError
from vitbench.report.attached import attach, with_figure
from vitbench.reproduce import Recipe
from vitbench.reproduce.run import recipe_options, run_recipe

LINK = "![Patches merged (colour) and pruned (grey) after each block](visualize-tome.png)"


def _body(report: str) -> str:
    """The report without its command block (the re-render's command is ``vitbench report``)."""
    head, _, rest = report.partition("## Command")
    return head + rest.split("## Methodology", 1)[1]


def test_run_visualize_link_survives_a_re_render(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--methods", "tome", "--param", "tome.r=4", "--model", "test_vit", "--metrics", "params",
                 "--out", str(out), "--visualize"]) == 0
    first = (out / "report.md").read_text()
    assert LINK in first.splitlines()
    assert main(["report", str(out)]) == 0
    again = (out / "report.md").read_text()
    assert again.splitlines().count(LINK) == 1
    assert _body(again) == _body(first)


def test_reproduce_published_section_survives_a_re_render(tmp_path, folder_writer, capsys):
    data, out = tmp_path / "data", tmp_path / "out"
    for split, seed in (("val", 0), ("train", 1)):
        folder_writer(data / split, {"cat": 3, "dog": 3}, seed=seed)
    tiny = Recipe("tiny", "tome", "test_vit", source="a test source", params={"r": 2}, paper_gflops=0.5,
                  paper_top1=50.0, paper_baseline_top1=60.0, num_classes=2, note="a test note")
    assert run_recipe(tiny, recipe_options(tiny, str(data), out=str(out), train_limit=4)).ok
    first = (out / "report.md").read_text()
    assert json.loads((out / "published.json").read_text())["id"] == "tiny"
    assert main(["report", str(out)]) == 0
    again = (out / "report.md").read_text()
    assert again.count("## Published") == 1
    published = again.split("## Published", 1)[1]
    assert "| baseline | 60.00 |" in published and "| tome | 50.00 |" in published
    assert "Source: a test source." in published and "Note: a test note" in published
    assert _body(again) == _body(first)


def test_a_re_render_elsewhere_links_the_figure_from_there(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "visualize-tome.png").write_bytes(b"")
    text = attach("# R\n", run, [], md_folder=tmp_path / "elsewhere")
    assert "](../run/visualize-tome.png)" in text and "## Plot" in text


def test_a_figure_goes_under_the_plot_section_once():
    text = "# R\n\n## Plot\n\n![a](report.png)\n\n## Notes\n\nx\n"
    once = with_figure(text, "visualize-tome.png")
    assert once == f"# R\n\n## Plot\n\n![a](report.png)\n\n{LINK}\n\n## Notes\n\nx\n"
    assert with_figure(once, "visualize-tome.png") == once


def test_a_broken_published_file_is_one_error_naming_it(tmp_path):
    (tmp_path / "published.json").write_text("{not json")
    with pytest.raises(DataError, match=r"published\.json.*is no published row"):
        attach("# R\n", tmp_path, [])
