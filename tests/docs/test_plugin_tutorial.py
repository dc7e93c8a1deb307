"""The plugin tutorial (docs/plugin-tutorial.md) works: every shell step of the page runs here,
and so does its notebook registration (the ```python block of "Register it in a notebook").

The page shows the files of examples/vitbench-norm-drop as they are (checked here); ``pip install -e .`` is run as a
plain install into a folder of the test (``--target``, on ``PYTHONPATH``) so that nothing is
left in the environment, as tests/test_plugins.py does with its fake distributions.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tutorial_steps import run_steps, shown_file

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "plugin-tutorial.md"
EXAMPLE = ROOT / "examples" / "vitbench-norm-drop"
FILES = ("vitbench_norm_drop.py", "pyproject.toml", "test_norm_drop.py")


def test_the_page_shows_every_file_of_the_example_as_it_is() -> None:
    """Each file is written out in the page (which a code host renders too), equal to the example's."""
    page = PAGE.read_text()
    for name in FILES:
        assert shown_file(page, name) == (EXAMPLE / name).read_text(), f"{name}: the page's copy differs from {EXAMPLE / name}"


def test_every_step_of_the_tutorial_runs(tmp_path: Path) -> None:
    # a test's timing is no measurement: no wait for a quiet machine; the default model is tiny:
    # threads only add overhead
    outputs = run_steps(PAGE.read_text(), EXAMPLE, FILES, tmp_path,
                        {"VITBENCH_NO_WAIT": "1", "OMP_NUM_THREADS": "1"})
    cwd = Path(outputs.pop("cwd"))
    ran = list(outputs.items())
    assert [s for s, _ in ran] == [
        "pip install -e .", "vitbench plugins", "vitbench describe norm-drop",
        "vitbench run --task cls --methods norm-drop --limit 100 --metrics accuracy,gmacs --out runs/norm-drop",
        "python -m pytest -q test_norm_drop.py"]
    [listed] = [line for line in outputs["vitbench plugins"].splitlines() if line.startswith("norm_drop ")]
    assert "vitbench-norm-drop 0.1.0" in listed and "norm-drop" in listed.split(")", 1)[1]
    assert f"```text\n{listed}\n```" in PAGE.read_text(), "the page shows what `vitbench plugins` prints"
    card = outputs["vitbench describe norm-drop"]  # each field's meaning, from its metadata[HELP]
    assert "    keep: float = 0.7\n        fraction of patch tokens kept at each listed block\n" in card
    assert "(no description)" not in card
    report = (cwd / "runs" / "norm-drop" / "report.md").read_text()
    assert re.search(r"^\| norm-drop\b", report, flags=re.MULTILINE), report
    assert "1 passed" in outputs["python -m pytest -q test_norm_drop.py"]


def test_the_notebook_registration_runs(tmp_path: Path) -> None:
    """The page's in-process registration (its ```python block), with the plugin not installed."""
    page = PAGE.read_text()
    section = page.split("## Register it in a notebook", 1)[1].split("\n## ", 1)[0]
    [code] = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert "get_host().add_plugin(vitbench_norm_drop, \"norm_drop\")" in code
    shutil.copy(EXAMPLE / "vitbench_norm_drop.py", tmp_path / "vitbench_norm_drop.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VITBENCH_")}
    env["VITBENCH_NO_WAIT"] = "1"  # a test's timing is no measurement: no wait for a quiet machine
    env["OMP_NUM_THREADS"] = "1"
    script = code + "\nprint(len(results.records), results.ok, list(results.table()['Method']))\n"
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == "2 True ['baseline', 'norm-drop (keep=0.7)']"
    report = (tmp_path / "runs" / "notebook" / "report.md").read_text()
    assert re.search(r"^\| norm-drop\b", report, flags=re.MULTILINE), report
