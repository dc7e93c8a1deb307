"""The child side of ``--isolate`` (:mod:`vitbench.run.isolate`): ``python -m
vitbench.run.isolated_child JOB RECORD`` rebuilds the workspace from the caches the parent filled,
runs the one spec of JOB and writes its record to RECORD whole."""
from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path

from vitbench.run.isolate import failed_record
from vitbench.catalog import WorkspaceRequest
from vitbench.core.cache import atomic_write
from vitbench.host import get_host
from vitbench.host.allocator import keep_freed_memory
from vitbench.results import to_jsonable
from vitbench.measure.load import waiting
from vitbench.run.execute import run_spec

__all__ = ["main"]


def main(job_path: str, out_path: str) -> None:
    """The child's side: rebuild the workspace, run the spec, write its record whole."""
    with open(job_path, "rb") as f:
        job = pickle.load(f)  # noqa: S301 - written by the parent process a moment ago
    options, spec, (i, n) = job["options"], job["spec"], job["step"]

    def note(text: str) -> None:
        print(f"vitbench: {text}", file=sys.stderr, flush=True)

    def progress(what: str) -> None:
        print(f"[{i}/{n}] {spec.label}: {what}", file=sys.stderr, flush=True)

    keep_freed_memory()  # the allocator the parent's runs have
    try:
        task = get_host().task(spec.task)
        ws = task.workspace(WorkspaceRequest(options=options, setup=task.setup(options), plan=[spec],
                                             out=Path(job["out"]), resume=True, note=note))
    except Exception as exc:  # noqa: BLE001 - the parent built the same workspace; say what differed
        record = failed_record(spec, f"the run's process could not rebuild the workspace: {type(exc).__name__}: {exc}",
                         0.0, job["env"])
    else:
        with waiting(options.wait and not os.environ.get("VITBENCH_NO_WAIT")):  # as the parent's runs do
            record = run_spec(spec, ws, job["baseline"], job["env"], progress)
    text = json.dumps(to_jsonable(record), ensure_ascii=True, allow_nan=False)
    atomic_write(out_path, lambda tmp: tmp.write_text(text))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
