"""What decides a run's numbers besides the options a plan already holds, as run-spec fields
(:class:`~vitbench.host.spec.RunSpec` ``limit``, ``weights``; docs/measuring.md, "What a run's identity
holds"): the evaluation images, the content of a ``--checkpoint`` file, the seed of a random
init. A task's :meth:`~vitbench.task.Task.setup` returns them in its plan keywords, so that
``--resume`` never reuses a run measured on something else. :func:`weights_from` says the same
in words for a record (``weights_from``: the report's provenance of a row's weights).
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from vitbench.errors import CheckpointError
from vitbench.data.fingerprint import folder_fingerprint

if TYPE_CHECKING:  # pragma: no cover
    from vitbench.core.options import RunOptions

__all__ = ["data_path", "file_digest", "first_seed", "identity_fields", "weights_from"]


def first_seed(options: "RunOptions") -> int:
    """The plan's first seed (``--seeds``' first, else ``--seed``, else 0): what a random init is
    drawn from, the same in every shard of a plan."""
    if options.seeds:
        return int(options.seeds[0])
    return 0 if options.seed is None else int(options.seed)


def data_path(arg: str) -> str:
    """``--data`` as the run identity holds it: a path that exists, absolute and resolved (the
    same relative path from two working directories names two folders); a name, as given."""
    try:
        path = Path(arg).expanduser()
        return str(path.resolve()) if path.exists() else arg
    except (OSError, ValueError, RuntimeError):  # a NUL byte, an unknown ~user, a symlink loop
        return arg


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
                    head: Optional[str] = None, data_folder: Optional[str] = None) -> dict[str, Any]:
    """The plan keywords ``limit``, ``head``, ``weights`` and ``data_id`` that are set: ``limit``
    when the run evaluates on data (``--limit``), ``weights`` as ``sha256=...`` of a
    ``--checkpoint`` or ``init_seed=S`` of a random init (``random_init``: no pretrained or trained
    weights), the task's own description of a new head, and ``data_id``, the fingerprint of the
    ``data_folder`` the runs read (:func:`~vitbench.data.fingerprint.folder_fingerprint`)."""
    out: dict[str, Any] = {}
    if evaluates_data and options.limit is not None:
        out["limit"] = options.limit
    if data_folder is not None:
        out["data_id"] = folder_fingerprint(data_folder)
    if head is not None:
        out["head"] = head
    if options.checkpoint is not None:
        out["weights"] = f"sha256={file_digest(options.checkpoint)}"
    elif random_init:
        out["weights"] = f"init_seed={first_seed(options)}"
    return out


def _timm_name(model: str) -> str:
    """``deit_tiny_patch16_224.fb_in1k``: the model with the tag of the weights timm loads for it."""
    try:
        from timm.models import get_pretrained_cfg

        cfg = get_pretrained_cfg(model)
    except Exception:  # noqa: BLE001 - an unknown name or another timm: the name as given
        return model
    tag = getattr(cfg, "tag", None)
    return f"{model}.{tag}" if tag and "." not in model else model


def weights_from(spec: Any, default: Optional[str] = None) -> str:
    """Where a run's weights came from, in words (a record's ``weights_from``): ``checkpoint
    NAME.pth (sha256 ...)``, ``random init (seed S)``, ``timm pretrained NAME.TAG``, else
    ``default`` (the task's own weights, e.g.
    :func:`~vitbench.tasks.cls.weights_from.default_model_weights`) or ``n/a``."""
    weights = str(spec.weights or "")
    if weights.startswith("sha256="):
        name = Path(spec.checkpoint).name if spec.checkpoint else "checkpoint"
        return f"checkpoint {name} (sha256 {weights.partition('=')[2][:12]})"
    if weights.startswith("init_seed="):
        return f"random init (seed {weights.partition('=')[2]})"
    if spec.pretrained:
        return f"timm pretrained {_timm_name(spec.model)}"
    return default or "n/a"
