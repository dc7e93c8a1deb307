"""What every record says about where it ran (docs/measuring.md, "Reproducibility")."""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from vitbench.host import get_host

CPUINFO = Path("/proc/cpuinfo")
PACKAGES = ("torch", "torchvision", "timm", "mmengine", "mmcv", "mmdet", "mmpretrain", "vitbench")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:  # the cls install's mmcv is the ops-free ``mmcv-lite``
        return _version("mmcv-lite") if dist == "mmcv" else None


#: the checkout's folders whose uncommitted changes can change a number (reports/ is rewritten by runs)
CODE_PATHS = ("vitbench", "plugins", "configs")
#: appended to the commit when the code differs from it, as ``git describe --dirty`` marks it
DIRTY = "-dirty"


def _git(*args: str, cwd: Path) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=cwd, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None


def git_revision() -> str | None:
    """The vitbench checkout's commit, ``-dirty`` when its code has uncommitted changes (``None``
    outside a git checkout)."""
    here = Path(__file__).resolve().parent
    head = _git("rev-parse", "--short", "HEAD", cwd=here)
    rev = head.stdout.strip() if head is not None and head.returncode == 0 else ""
    if not rev:
        return None
    diff = _git("diff", "--quiet", "HEAD", "--", *(f":(top){path}" for path in CODE_PATHS), cwd=here)
    return rev + DIRTY if diff is not None and diff.returncode == 1 else rev


def device_name(device: str) -> str:
    """The GPU's name, or the processor's model name and the cores this process may use."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cpu_model()}, {cores} core{'s' if cores != 1 else ''}" if cores else cpu_model()


def cpu_model() -> str:
    """The processor's model name (Linux ``/proc/cpuinfo``, macOS ``sysctl``), else its architecture."""
    try:
        for line in CPUINFO.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Hardware", "Processor") and value.strip():
                return value.strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                 timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        if out:
            return out
    return platform.processor() or platform.machine() or "cpu"


def environment(device: str, command: list[str] | None = None, precision: str = "fp32",
                compiled: bool = False, cuda_graph: bool = False) -> dict[str, Any]:
    """Versions, device, threads, precision (``--precision``), whether timings ran the
    ``torch.compile``d model (``--compile``) and a CUDA graph (``--cuda-graph``), git revision,
    loaded plugins and the command."""
    host = get_host()
    return {
        "versions": {name: _version(name) for name in PACKAGES},
        "python": platform.python_version(),
        "device": f"{device} ({device_name(device)})",
        "threads": torch.get_num_threads(),
        "precision": precision,
        "compiled": "torch.compile (timings)" if compiled else "no (eager)",
        "cuda_graph": ("CUDA graph where the shapes are static (throughput, latency; see each record's "
                       "cuda_graph)" if cuda_graph else "no"),
        "git_rev": git_revision(),
        "plugins": [{"name": p.name, "distribution": p.distribution, "version": p.version}
                    for p in host.plugins.values()],
        "command": " ".join(command if command is not None else ["vitbench", *sys.argv[1:]]),
    }
