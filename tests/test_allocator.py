"""The allocator setting (vitbench/host/allocator.py): with it a forward's large blocks are reused,
not faulted in again; ``VITBENCH_MALLOPT=0`` leaves malloc alone; runs record which applied.
Each case runs in a fresh interpreter, since the setting is per process."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

#: what a forward does to memory, 20 times: eight 16 MiB activations alive at once, then all freed;
#: prints the minor page faults of the loop
FAULTS = """
import json, resource, sys, torch
from vitbench.host.allocator import describe, keep_freed_memory
said = keep_freed_memory() if sys.argv[1] == "on" else describe()
def forward():
    return [torch.ones(4 * 2**20) for _ in range(8)]
for _ in range(3):
    forward()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    forward()
print(json.dumps({"faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, "said": said}))
"""


#: glibc's default threshold held fixed (its dynamic raise after the first free decides by history
#: whether a 16 MiB block is mapped afresh, which made the case without the setting flaky)
FIXED_DEFAULT = {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=131072"}


def _faults(mode: str, **env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, check=True,
                         env={**os.environ, **env})
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_freed_blocks_are_reused_instead_of_faulted_in_again():
    off, on = _faults("off", **FIXED_DEFAULT), _faults("on", **FIXED_DEFAULT)
    pages = 20 * 8 * 16 * 2**20 // 4096  # what faulting every block in again costs
    assert off["said"] == "system default"
    assert off["faults"] > pages // 2, off
    assert on["faults"] < pages // 50, on
    assert on["said"].startswith("glibc malloc, freed memory kept (mmap threshold 32 MiB, trim threshold 1 GiB")


def test_switched_off_by_the_environment_variable():
    result = _faults("on", VITBENCH_MALLOPT="0", **FIXED_DEFAULT)
    assert result["said"] == "system default (VITBENCH_MALLOPT=0)"
    if GLIBC:
        assert result["faults"] > 20 * 8 * 16 * 2**20 // 4096 // 2


def test_a_report_names_the_allocator(tmp_path):
    from vitbench.report.markdown import header_lines

    record = {"task": "cls", "model": "m", "method": "baseline", "label": "baseline", "status": "ok",
              "env": {"allocator": "glibc malloc, freed memory kept (mmap threshold 32 MiB, trim threshold 1 GiB)"}}
    text = "\n".join(header_lines([record]))
    assert "- Allocator: glibc malloc, freed memory kept (mmap threshold 32 MiB, trim threshold 1 GiB)" in text
