"""Run a tutorial page as a reader would: the files it shows, then its shell steps in order
(the plugin and family tutorials' tests)."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path


def shell_steps(page: str) -> list[str]:
    """The commands of the page's ```bash blocks, in order."""
    blocks = re.findall(r"```bash\n(.*?)```", page, flags=re.DOTALL)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def shown_file(page: str, name: str) -> str:
    """The code block that follows the page's "as `NAME`" (the file it tells the reader to save)."""
    after = page.split(f"as `{name}`", 1)[1]
    return re.search(r"```\w*\n(.*?)```", after, flags=re.DOTALL).group(1)


def run_steps(page: str, example: Path, files: tuple[str, ...], tmp_path: Path,
              env: dict[str, str] | None = None) -> dict[str, str]:
    """Each step's stdout by its command: ``mkdir``/``cd`` (the ``cd`` copies the example's
    ``files``, as the reader saved them), ``pip install -e .`` as an install into a folder of the
    test on ``PYTHONPATH`` (nothing left in the environment), ``vitbench`` and ``python -m pytest``
    in this interpreter; a step that fails fails the test with its output."""
    site = tmp_path / "site"
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("VITBENCH_")} | (env or {})
    run_env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [run_env.get("PYTHONPATH")])])
    cwd, ran = tmp_path, {}
    for step in shell_steps(page):
        args = shlex.split(step)
        if args[0] == "mkdir":
            (cwd / args[1]).mkdir()
            continue
        if args[0] == "cd":
            cwd = cwd / args[1]
            for name in files:
                shutil.copy(example / name, cwd / name)
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
        done = subprocess.run(args, cwd=cwd, env=run_env, capture_output=True, text=True, timeout=900, check=False)
        assert done.returncode == 0, f"{step}\n{done.stdout}\n{done.stderr}"
        ran[step] = done.stdout
    ran["cwd"] = str(cwd)
    return ran
