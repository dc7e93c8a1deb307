"""``--launcher none|pytorch``: one benchmark run spread over the processes ``torchrun`` starts.

Under ``torchrun --nproc-per-node N vitbench run ... --launcher pytorch`` every rank builds the
same workspace and runs the same plan; mmengine does the distributed part: its
``DefaultSampler`` gives each rank a disjoint part of the evaluation data (padded to equal
parts) and its ``Evaluator`` collects the per-sample results on rank 0, cuts the padding off
(``collect_results`` truncates to the data set's size) and broadcasts the metrics, so every rank
sees the top-1 a single process would. Everything else is rank 0's alone: GMACs, parameters,
throughput, latency, memory and IB are measured there (the other ranks wait at a barrier, so
they do not load the machine while it times), and only rank 0 appends records to the store and
writes the report. A task says it can run this way (``TaskSpec.distributed``); so far only
the built-in ``cls`` task does, and only its training-free
methods (a learnable method would need DDP fine-tuning; it is refused with a clear error).
"""
from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from vitbench.errors import VitbenchError

__all__ = ["LAUNCHERS", "add_launcher_option", "barrier", "check_launcher", "finish_launcher", "init_launcher",
           "is_distributed", "is_main", "one_rank_at_a_time"]

#: the values ``--launcher`` takes
LAUNCHERS = ("none", "pytorch")


def check_launcher(launcher: str, task: str, methods: Sequence[str]) -> None:
    """Refuse what ``--launcher`` cannot do (before anything runs): an unknown launcher, a task
    other than cls, a learnable method, or ``pytorch`` outside ``torchrun`` (no ``RANK``)."""
    if launcher not in LAUNCHERS:
        raise VitbenchError(f"--launcher {launcher!r} is unknown; valid launchers: {', '.join(LAUNCHERS)}")
    if launcher == "none":
        return
    from vitbench.plugins import get_host

    host = get_host()
    able = [name for name in host.names("tasks") if host.task(name).distributed]
    if not host.task(task).distributed:
        raise VitbenchError(f"--launcher pytorch supports the {', '.join(able) or 'no'} task(s) so far "
                            f"(TaskSpec.distributed); --task is {task!r} (run it with --launcher none)")
    learnable = [host.method(m).name for m in methods if host.method(m).needs_training]
    if learnable:
        raise VitbenchError(f"--launcher pytorch does not fine-tune learnable methods yet ({', '.join(learnable)}); "
                            f"run them with --launcher none, or leave them out of --methods")
    missing = [name for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
               if name not in os.environ]
    if missing:
        raise VitbenchError(f"--launcher pytorch needs the environment torchrun sets ({', '.join(missing)} "
                            f"missing); start it as `torchrun --nproc-per-node N -m vitbench run ... "
                            f"--launcher pytorch`")


def init_launcher(launcher: str, device: str) -> None:
    """Start the process group once: on CUDA mmengine's ``init_dist`` (nccl, each rank on
    ``cuda:LOCAL_RANK``); on the CPU torch's own ``init_process_group("gloo")`` from torchrun's
    environment (mmengine's ``init_dist`` calls ``torch.cuda.set_device`` unconditionally and
    fails on a machine without CUDA). mmengine's ``mmengine.dist`` helpers (the sampler's
    ranks, the evaluator's ``collect_results``) work on either group. ``none`` (or a group
    already started) does nothing."""
    import torch.distributed as torch_dist

    if launcher == "none" or torch_dist.is_initialized():
        return
    if device.startswith("cuda"):
        from mmengine.dist import init_dist

        init_dist(launcher, backend="nccl")
    else:
        torch_dist.init_process_group(backend="gloo")


def finish_launcher() -> None:
    """Wait for every rank, then end the process group (nothing without one)."""
    import torch.distributed as torch_dist

    if torch_dist.is_available() and torch_dist.is_initialized():
        torch_dist.barrier()
        torch_dist.destroy_process_group()


def is_distributed() -> bool:
    """Whether a process group with more than one rank is running."""
    from mmengine.dist import get_world_size

    return get_world_size() > 1


def is_main() -> bool:
    """Rank 0, or the one process of a run without a launcher."""
    from mmengine.dist import get_rank

    return get_rank() == 0


def barrier() -> None:
    """Wait for every rank (nothing without a process group)."""
    from mmengine.dist import barrier as mm_barrier

    mm_barrier()


@contextlib.contextmanager
def one_rank_at_a_time(launcher: str, lock_dir: Path) -> Iterator[None]:
    """Let one rank at a time through (whichever reaches the lock first): the workspace is
    built before the process group starts (it trains and caches the default model or a new
    head on first use, single-process work), and a file lock keeps two ranks from training and
    writing the same cache at once; the later ranks then load it."""
    if launcher == "none":
        yield
        return
    from filelock import FileLock

    lock_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock_dir / ".vitbench-launcher.lock")):
        yield


def add_launcher_option(p: argparse.ArgumentParser) -> None:
    """``--launcher none|pytorch`` (``vitbench run`` and ``vitbench sweep``)."""
    p.add_argument("--launcher", default="none", choices=LAUNCHERS,
                   help="none (one process, the default) or pytorch: one of the processes `torchrun "
                        "--nproc-per-node N -m vitbench run ...` starts; evaluation is sharded over the "
                        "ranks, timing and the store/report are rank 0's (cls, training-free methods)")
