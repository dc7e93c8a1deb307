"""Records name the processor, not just its architecture, and the commit their code came from."""
from __future__ import annotations

import subprocess
from pathlib import Path

from vitbench.host import environment


def test_the_cpu_is_named_by_its_model_and_cores(tmp_path, monkeypatch):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6148\n")
    monkeypatch.setattr(environment, "CPUINFO", info)
    monkeypatch.setattr(environment.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert environment.device_name("cpu") == "Intel(R) Xeon(R) Gold 6148, 2 cores"


def test_without_cpuinfo_the_architecture_is_the_fallback(tmp_path, monkeypatch):
    monkeypatch.setattr(environment, "CPUINFO", tmp_path / "missing")
    monkeypatch.setattr(environment.sys, "platform", "linux")
    monkeypatch.setattr(environment.platform, "processor", lambda: "x86_64")
    assert environment.cpu_model() == "x86_64"


def _checkout(root: Path) -> Path:
    """A git checkout laid out like vitbench's: ``vitbench/host/environment.py`` and a README."""
    here = root / "vitbench" / "host"
    here.mkdir(parents=True)
    (here / "environment.py").write_text("x = 1\n")
    (root / "README.md").write_text("readme\n")
    for args in (["init", "-q"], ["add", "-A"],
                 ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first"]):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)
    return here / "environment.py"


def test_the_revision_is_marked_dirty_only_when_the_code_changed(tmp_path, monkeypatch):
    module = _checkout(tmp_path)
    monkeypatch.setattr(environment, "__file__", str(module))
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert environment.git_revision() == rev
    (tmp_path / "README.md").write_text("edited: not code\n")
    (tmp_path / "vitbench" / "new_untracked.py").write_text("y = 2\n")
    assert environment.git_revision() == rev
    module.write_text("x = 2\n")
    assert environment.git_revision() == rev + "-dirty"


def test_outside_a_checkout_there_is_no_revision(tmp_path, monkeypatch):
    module = tmp_path / "vitbench" / "host" / "environment.py"
    module.parent.mkdir(parents=True)
    module.write_text("x = 1\n")
    monkeypatch.setattr(environment, "__file__", str(module))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert environment.git_revision() is None
