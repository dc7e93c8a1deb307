"""docs/getting-started.md's first-run table is what its command prints today (on the shipped
default model; only accuracy and GMACs, which do not depend on the machine's load)."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from vitbench.cli.main import main
from vitbench.tasks.embedded import DEIT_MODEL

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "getting-started.md"


@pytest.mark.slow
def test_the_first_run_table_is_what_its_command_prints(tmp_path, capsys):
    page = PAGE.read_text()
    section = page.split("## A first run of your own", 1)[1]
    command = next(line for line in re.search(r"```bash\n(.*?)```", section, re.DOTALL).group(1).splitlines()
                   if line.startswith("vitbench run "))
    shown = re.search(r"```text\n(.*?)```", section, re.DOTALL).group(1).strip()
    args = shlex.split(command)[1:]
    args[args.index("--out") + 1] = str(tmp_path / "first")
    assert main([*args, "--model", DEIT_MODEL]) == 0  # the suite's default model is the first one; the page's is DeiT's
    printed = capsys.readouterr().out
    table = "\n".join(line for line in printed.splitlines() if line.startswith("|"))
    assert table == shown
