"""What decides a run's numbers besides the options a plan already holds, as run-spec fields
(:class:`~vitbench.spec.RunSpec` ``limit``, ``weights``; docs/measuring.md, "What a run's identity
holds"): the evaluation images, the content of a ``--checkpoint`` file, the seed of a random
init. A task's :meth:`~vitbench.task.Task.setup` returns them in its plan keywords, so that
``--resume`` never reuses a run measured on something else.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from vitbench.errors import CheckpointError

if TYPE_CHECKING:  # pragma: no cover
    from vitbench.options import RunOptions

__all__ = ["file_digest", "first_seed", "identity_fields"]


def first_seed(options: "RunOptions") -> int:
    """The plan's first seed (``--seeds``' first, else ``--seed``, else 0): what a random init is
    drawn from, the same in every shard of a plan."""
    if options.seeds:
        return int(options.seeds[0])
    return 0 if options.seed is None else int(options.seed)


def file_digest(path: str | Path) -> str:
    """The SHA-256 of the file at ``path`` (hex); a missing file is a :class:`CheckpointError`."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} not found (pass the path of a .pth file)")
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def identity_fields(options: "RunOptions", *, evaluates_data: bool, random_init: bool,
                    head: Optional[str] = None) -> dict[str, Any]:
    """The plan keywords ``limit``, ``head`` and ``weights`` that are set: ``limit`` when the run
    evaluates on data (``--limit``), ``weights`` as ``sha256=...`` of a ``--checkpoint`` or
    ``init_seed=S`` of a random init (``random_init``: no pretrained or trained weights), and the
    task's own description of a new head."""
    out: dict[str, Any] = {}
    if evaluates_data and options.limit is not None:
        out["limit"] = options.limit
    if head is not None:
        out["head"] = head
    if options.checkpoint is not None:
        out["weights"] = f"sha256={file_digest(options.checkpoint)}"
    elif random_init:
        out["weights"] = f"init_seed={first_seed(options)}"
    return out
