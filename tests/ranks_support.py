"""Two (or more) processes of one process group, started by hand (a free rendezvous port, each
rank's own environment), for the launcher tests that cannot go through ``torchrun``."""
from __future__ import annotations

import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional


def free_port() -> int:
    """A free local TCP port (the rendezvous; parallel runs must not collide on 29500)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(argv: Sequence[str], envs: Sequence[Mapping[str, str]], *, cwd: Optional[Path] = None,
              timeout: float = 240) -> list[tuple[int, str, str]]:
    """Start ``argv`` once per environment in ``envs`` (one per rank), wait for all, and return
    each one's (return code, stdout, stderr); a process still running at ``timeout`` is killed."""
    procs = [subprocess.Popen(list(argv), cwd=cwd, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for env in envs]
    try:
        outputs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs)]
