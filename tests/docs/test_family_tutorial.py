"""The family tutorial (docs/guide/families.md) works: every shell step of the page runs here.

The page shows the files of examples/vitbench-cait-family as they are (checked here); ``pip install -e .``
is run as a plain install into a folder of the test (``--target``, on ``PYTHONPATH``), as the
plugin tutorial's test does, so that nothing is left in the environment.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "guide" / "families.md"
EXAMPLE = ROOT / "examples" / "vitbench-cait-family"
FILES = ("vitbench_cait.py", "pyproject.toml", "test_cait_family.py")


def shell_steps(page: str) -> list[str]:
    """The commands of the page's ```bash blocks, in order."""
    blocks = re.findall(r"```bash\n(.*?)```", page, flags=re.DOTALL)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_the_page_shows_every_file_of_the_example_as_it_is() -> None:
    page = PAGE.read_text()
    for name in FILES:
        after = page.split(f"as `{name}`", 1)[1]
        shown = re.search(r"```\w*\n(.*?)```", after, flags=re.DOTALL).group(1)
        assert shown == (EXAMPLE / name).read_text(), f"{name}: the page's copy differs from {EXAMPLE / name}"


def test_every_step_of_the_tutorial_runs(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {k: v for k, v in os.environ.items() if not k.startswith("VITBENCH_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    cwd, ran = tmp_path, []
    for step in shell_steps(PAGE.read_text()):
        args = shlex.split(step)
        if args[0] == "mkdir":
            (cwd / args[1]).mkdir()
            continue
        if args[0] == "cd":
            cwd = cwd / args[1]
            for name in FILES:  # the files the page says to save
                shutil.copy(EXAMPLE / name, cwd / name)
            continue
        if args == ["pip", "install", "-e", "."]:
            args = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), "."]
        elif args[0] == "vitbench":
            args = [sys.executable, "-m", "vitbench", *args[1:]]
        elif args[:3] == ["python", "-m", "pytest"]:
            args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args[3:]]
        else:
            raise AssertionError(f"the tutorial has a step this test does not know: {step!r}")
        done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, f"{step}\n{done.stdout}\n{done.stderr}"
        ran.append((step, done.stdout))
    outputs = dict(ran)
    assert [s for s, _ in ran] == ["pip install -e .", "vitbench list families", "python -m pytest -q test_cait_family.py"]
    listed = outputs["vitbench list families"]
    shown = PAGE.read_text().split("provides:\n\n```text\n", 1)[1].split("```", 1)[0]
    assert shown in listed, "the page shows what `vitbench list families` prints for cait"
    assert "3 passed" in outputs["python -m pytest -q test_cait_family.py"]
