"""``--isolate``: each run of a plan in a process of its own (docs/reliability.md, "Isolated runs").

The parent writes the run's job (options, spec, its seed's baseline record, the environment) to
a file and starts ``python -m vitbench.run.isolated_child JOB RECORD``
(:mod:`vitbench.run.isolated_child`), which builds the workspace again from the caches the parent
filled, runs the spec as :func:`~vitbench.run.execute.run_spec` does and writes the record. A child that crashes (a segfault), ends itself (``os._exit``) or
outlives ``--run-timeout`` is killed with its process group, and its run is an ``error`` record
saying which; the plan goes on. A fork of the parent would be cheaper, but a process that has
run OpenMP kernels cannot fork one that runs them again (the child waits forever).
"""
from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

__all__ = ["Isolation", "failed_record", "run_isolated"]


@dataclass(frozen=True)
class Isolation:
    """How a plan's runs are isolated: the options the child rebuilds the workspace from, the
    plan's result folder, and the most seconds a run may take (None: no limit)."""

    options: Any
    out: Path
    timeout: Optional[float] = None


def failed_record(spec: Any, why: str, wall_s: float, env: dict[str, Any]) -> dict[str, Any]:
    """The ``error`` record of a run whose process ended without writing one."""
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return {"spec_id": spec.spec_id, "task": spec.task, "model": spec.model, "data": spec.data,
            "method": spec.method, "label": spec.label, "params": spec.params, "seed": spec.seed,
            "status": "error", "error": why, "started_at": now, "finished_at": now,
            "precision": spec.precision_name, "wall_s": round(wall_s, 3), "env": env}


def _ended(code: int) -> str:
    if code < 0:
        try:
            return f"its process was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"its process was killed by signal {-code}"
    return f"its process ended with exit code {code} before it wrote the record"


def run_isolated(spec: Any, baseline: Optional[dict], env: dict[str, Any], isolation: Isolation,
                 step: tuple[int, int]) -> dict[str, Any]:
    """The record of ``spec`` run in a child process (``step``: its place in the plan, for the
    progress lines); never raises for what the child does."""
    import time

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vitbench-run-") as tmp:
        job, out = Path(tmp) / "job.pkl", Path(tmp) / "record.json"
        with job.open("wb") as f:
            pickle.dump({"options": isolation.options, "out": str(isolation.out), "spec": spec,
                         "baseline": baseline, "env": env, "step": step}, f)
        child = subprocess.Popen([sys.executable, "-m", "vitbench.run.isolated_child", str(job), str(out)],
                                 start_new_session=True)
        try:
            code = child.wait(timeout=isolation.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)  # its loader workers too
            child.wait()
            return failed_record(spec, f"the run did not finish within --run-timeout {isolation.timeout:g} s; its "
                                 f"process was killed", time.perf_counter() - started, env)
        except BaseException:  # Ctrl-C: the child's group goes too
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            raise
        if out.is_file():
            return json.loads(out.read_text())
        return failed_record(spec, f"the run failed outside Python: {_ended(code)}", time.perf_counter() - started, env)
