"""``--launcher none|pytorch|slurm``: one benchmark run spread over the processes ``torchrun``
(or ``srun``) starts (docs/architecture.md, "Distributed runs").

Every rank builds the same workspace and runs the same plan. mmengine shards the evaluation
(``DefaultSampler``, results gathered on rank 0) and wraps fine-tuning in DDP
(:func:`rank_batch_size` per rank); everything else is measured and written by rank 0 alone.
A rank that fails meets the others at an agreement point (:func:`collective_test`,
:func:`raise_if_any_rank_failed`, :func:`failure_on_any_rank`, :func:`all_ranks`), so every
rank raises the same error naming it instead of waiting until the process group's timeout
(``VITBENCH_DIST_TIMEOUT``, :func:`dist_timeout`). ``slurm`` reads the ranks and the master
from the ``SLURM_*`` variables."""
from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from vitbench.core.options import LAUNCHERS
from vitbench.errors import VitbenchError
from vitbench.host import get_host

if TYPE_CHECKING:  # mmengine and torch are imported when a run starts
    import torch
    from mmengine.evaluator import BaseMetric
    from mmengine.runner import Runner

__all__ = ["LAUNCHERS", "SLURM_VARIABLES", "TIMEOUT_VARIABLE", "TORCHRUN_VARIABLES", "all_ranks",
           "barrier", "check_launcher", "collect_in", "collective_test", "dist_timeout", "failure_on_any_rank",
           "finish_launcher", "first_slurm_host", "init_launcher", "is_distributed", "is_main", "launcher_rank",
           "one_rank_at_a_time", "raise_if_any_rank_failed", "rank_batch_size", "same_on_every_rank",
           "slurm_environment"]

#: what ``torchrun`` sets and ``--launcher pytorch`` needs
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
#: what ``srun`` sets and ``--launcher slurm`` needs (``SLURM_LOCALID`` is used when set)
SLURM_VARIABLES = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_NODELIST")
#: mmengine's default rendezvous port under slurm (``init_dist("slurm")``)
SLURM_DEFAULT_PORT = "29500"
#: how long (seconds) a rank waits in a collective (and at the rendezvous) before giving up
TIMEOUT_VARIABLE = "VITBENCH_DIST_TIMEOUT"


def check_launcher(launcher: str, task: str, methods: Sequence[str]) -> None:
    """Refuse what ``--launcher`` cannot do (before anything runs): an unknown launcher, a task
    that does not run distributed (``TaskInfo.distributed``), ``pytorch`` outside ``torchrun``
    (no ``RANK`` ...) or ``slurm`` outside ``srun`` (no ``SLURM_PROCID`` ...)."""
    if launcher not in LAUNCHERS:
        raise VitbenchError(f"--launcher {launcher!r} is unknown; valid launchers: {', '.join(LAUNCHERS)}")
    if launcher == "none":
        return

    host = get_host()
    able = [name for name, spec in sorted(host.specs("tasks").items()) if spec.info.distributed]
    if not host.task(task).info.distributed:
        raise VitbenchError(f"--launcher {launcher} supports the {', '.join(able) or 'no'} task(s) so far "
                            f"(TaskInfo.distributed); --task is {task!r} (run it with --launcher none)")
    for m in methods:
        host.method(m)  # an unknown method is named here, as without a launcher
    if launcher == "pytorch":
        missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
        if missing:
            raise VitbenchError(f"--launcher pytorch needs the environment torchrun sets ({', '.join(missing)} "
                                f"missing); start it as `torchrun --nproc-per-node N -m vitbench run ... "
                                f"--launcher pytorch`")
    else:
        missing = [name for name in SLURM_VARIABLES if not os.environ.get(name)]
        if missing:
            raise VitbenchError(f"--launcher slurm needs the environment srun sets ({', '.join(missing)} "
                                f"missing); start it as `srun --ntasks N vitbench run ... --launcher slurm` "
                                f"(inside an allocation: sbatch or salloc)")
        slurm_environment(os.environ)  # a malformed value is named before anything runs
    dist_timeout(os.environ)  # so is a malformed timeout


def dist_timeout(environ: Mapping[str, str]) -> Optional[float]:
    """``VITBENCH_DIST_TIMEOUT``: how many seconds a rank waits for the others in a collective
    (and at the rendezvous) before it fails, instead of torch's default of 30 minutes (the
    process group's ``timeout``). ``None`` when unset or empty (torch's default). It must exceed
    the longest stretch one rank works while the others wait: rank 0's timings of a run."""
    raw = environ.get(TIMEOUT_VARIABLE, "").strip()
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not (seconds > 0 and seconds != float("inf")):
        raise VitbenchError(f"{TIMEOUT_VARIABLE}={environ[TIMEOUT_VARIABLE]!r} is not a number of seconds > 0 "
                            f"(e.g. 600); it bounds how long a rank waits for the others (unset: torch's "
                            f"default, 1800)")
    return seconds


def first_slurm_host(nodelist: str) -> str:
    """The first host of a Slurm host list: ``node[03-05,09],gpu1`` -> ``node03``,
    ``rack[1-2]-n[7,9]`` -> ``rack1-n7``, ``localhost`` -> ``localhost`` (what ``scontrol show
    hostnames LIST | head -n1`` prints; written by hand so the CPU path needs no ``scontrol``)."""
    text = nodelist.strip()
    depth, end = 0, len(text)
    for i, ch in enumerate(text):  # the first entry: up to a comma outside brackets
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            end = i
            break
    first = text[:end].strip()
    host = re.sub(r"\[([^\]]*)\]", lambda m: m.group(1).split(",")[0].split("-")[0].strip(), first)
    if not host or "[" in host or "]" in host:
        raise VitbenchError(f"SLURM_NODELIST={nodelist!r} is not a Slurm host list (e.g. node[01-04],gpu7)")
    return host


def slurm_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """torch's rendezvous variables from srun's: ``RANK`` = ``SLURM_PROCID``, ``WORLD_SIZE`` =
    ``SLURM_NTASKS``, ``LOCAL_RANK`` = ``SLURM_LOCALID`` (else the rank), ``MASTER_ADDR`` = the
    first host of ``SLURM_NODELIST`` and ``MASTER_PORT`` = 29500, unless ``MASTER_ADDR`` /
    ``MASTER_PORT`` are set already (as mmengine's ``init_dist("slurm")``)."""
    missing = [name for name in SLURM_VARIABLES if not environ.get(name)]
    if missing:
        raise VitbenchError(f"--launcher slurm needs the environment srun sets ({', '.join(missing)} missing); "
                            f"start it as `srun --ntasks N vitbench run ... --launcher slurm`")
    values = {}
    for name in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"):
        raw = environ.get(name, environ["SLURM_PROCID"] if name == "SLURM_LOCALID" else None)
        if raw is None or not raw.strip().isdigit():
            raise VitbenchError(f"{name}={raw!r} is not a whole number; srun sets it to the task's "
                                f"{'rank' if name != 'SLURM_NTASKS' else 'count'}")
        values[name] = int(raw)
    if values["SLURM_NTASKS"] < 1 or values["SLURM_PROCID"] >= values["SLURM_NTASKS"]:
        raise VitbenchError(f"SLURM_PROCID={values['SLURM_PROCID']} is out of range for "
                            f"SLURM_NTASKS={values['SLURM_NTASKS']}; valid ranks: 0..{values['SLURM_NTASKS'] - 1}")
    return {"RANK": str(values["SLURM_PROCID"]), "WORLD_SIZE": str(values["SLURM_NTASKS"]),
            "LOCAL_RANK": str(values["SLURM_LOCALID"]),
            "MASTER_ADDR": environ.get("MASTER_ADDR") or first_slurm_host(environ["SLURM_NODELIST"]),
            "MASTER_PORT": environ.get("MASTER_PORT") or SLURM_DEFAULT_PORT}


def launcher_rank(launcher: str) -> int:
    """This process's rank from the launcher's environment, before the process group starts
    (0 without a launcher)."""
    if launcher == "pytorch":
        return int(os.environ.get("RANK", "0"))
    if launcher == "slurm":
        return int(os.environ.get("SLURM_PROCID", "0"))
    return 0


def init_launcher(launcher: str, device: str) -> None:
    """Start the process group once. On CUDA mmengine's ``init_dist`` (nccl, each rank on its
    local GPU; ``slurm`` asks ``scontrol`` for the master host). On the CPU torch's own
    ``init_process_group("gloo")`` from the rendezvous variables (``slurm``: set here from srun's,
    :func:`slurm_environment`), since mmengine's ``init_dist`` calls ``torch.cuda.set_device``
    unconditionally and fails on a machine without CUDA. mmengine's ``mmengine.dist`` helpers
    (the sampler's ranks, the evaluator's ``collect_results``, the Runner's DDP) work on either
    group. ``none`` (or a group already started) does nothing. ``VITBENCH_DIST_TIMEOUT``
    (:func:`dist_timeout`) is the group's timeout on either path (unset: torch's 30 minutes)."""
    import datetime

    import torch.distributed as torch_dist

    if launcher == "none" or torch_dist.is_initialized():
        return
    timeout = dist_timeout(os.environ)
    if device.startswith("cuda"):
        from mmengine.dist import init_dist

        # mmengine takes the timeout in seconds (and makes the timedelta)
        init_dist(launcher, backend="nccl", **({} if timeout is None else {"timeout": timeout}))
        return
    if launcher == "slurm":
        os.environ.update(slurm_environment(os.environ))
    torch_dist.init_process_group(backend="gloo", **({} if timeout is None else
                                                     {"timeout": datetime.timedelta(seconds=timeout)}))


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


def all_ranks(flag: bool) -> bool:
    """Whether ``flag`` holds on every rank (a collective: every rank must call it; ``flag``
    itself without a process group). For decisions the ranks must take together, such as
    reloading a checkpoint instead of training (a rank that trains alone would wait forever for
    the others' gradients). It is an agreement point too (:func:`raise_if_any_rank_failed`): a
    rank that failed earlier in the run waits in the end-of-run exchange, which this meets, and
    every rank raises its error here instead of pairing a different collective with it."""
    if not is_distributed():
        return flag
    return all(_check(None, bool(flag)))


# --- a rank that fails: exchanging the ranks' errors ------------------------------------------
#
# Every exchange is one ``all_gather_object`` of ``(kind, failures, ...)``: ``kind`` is "check"
# (an agreement point inside a run: :func:`raise_if_any_rank_failed`) or "outcome" (the end of a
# run: :func:`failure_on_any_rank`); ``failures`` maps ranks that failed to their message and, for
# a VitbenchError, its type. Since both are the same collective, a rank that failed early -- and
# went straight to the end of the run -- meets the others at their next agreement point: they see
# its "outcome", raise its error there and come to the end of the run too, where the exchange
# repeats until every rank is there.

_Failure = tuple[str, Optional[type]]  # (message as recorded, the VitbenchError subclass or None)

#: the failures this rank has seen in the current run (rank -> failure), for the outcome's message
_SEEN: dict[int, _Failure] = {}
#: the message of the last error an agreement point raised on this rank in the current run
_AGREED: list[str] = []


def _on_ranks(ranks: Sequence[int], world_size: int) -> str:
    return f"on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} of {world_size}"


def _describe_failures(errors: Sequence[Optional[str]]) -> Optional[str]:
    """One message for the ranks' errors (``None`` where a rank did fine): each distinct
    message once, followed by the ranks it came from (``... in batch 1 on rank 1 of 2``;
    ``A on ranks 0, 2 of 4; B on rank 3 of 4``). ``None`` when no rank failed."""
    by_message: dict[str, list[int]] = {}
    for rank, error in enumerate(errors):
        if error is not None:
            by_message.setdefault(error, []).append(rank)
    if not by_message:
        return None
    return "; ".join(f"{message} {_on_ranks(ranks, len(errors))}" for message, ranks in by_message.items())


def _error_text(error: BaseException) -> str:
    """An error as the executor records it: a VitbenchError's message, else ``Type: message``."""
    return str(error) if isinstance(error, VitbenchError) else f"{type(error).__name__}: {error}"


def _message(failures: Mapping[int, _Failure], world_size: int) -> str:
    return _describe_failures([failures[r][0] if r in failures else None for r in range(world_size)]) or ""


def raise_if_any_rank_failed(error: Optional[BaseException]) -> None:
    """An agreement point (a collective: every rank passes the error it met, ``None`` when it
    did fine). When any rank's is not ``None`` -- or a rank has already left the run after
    failing earlier (it waits in :func:`failure_on_any_rank`) -- every rank raises the same
    error, naming the rank(s) and their messages (:func:`_describe_failures`): of the first
    failing rank's type when that is a :class:`~vitbench.errors.VitbenchError` (a
    NonFiniteError stays one), else a VitbenchError whose message starts with the original
    type's name, as the executor records it. Place it before a collective that a failed rank
    would not reach. One ``all_gather_object``. Without a process group of more than one rank:
    ``error`` is raised as it is (nothing when ``None``)."""
    if not is_distributed():
        if error is not None:
            raise error
        return
    _check(error)


def _check(error: Optional[BaseException], value: Any = None) -> list[Any]:
    """The agreement point's exchange (one ``all_gather_object`` of ``("check", failures,
    value)``): raises the agreed error when any rank failed (or waits at the end of the run),
    else returns every rank's ``value``."""
    from mmengine.dist import all_gather_object, get_rank, get_world_size

    mine: dict[int, _Failure] = {}
    if error is not None:
        mine[get_rank()] = (_error_text(error), type(error) if isinstance(error, VitbenchError) else None)
    failures: dict[int, _Failure] = {}
    gathered = all_gather_object(("check", mine, value))
    for rank, (kind, theirs, *_) in enumerate(gathered):
        failures.update(theirs)
        if kind == "outcome" and not theirs:  # at the end of the run without an error: a bug, named all the same
            failures[rank] = ("it ended the run before an agreement point the others reached", None)
    if not failures:
        return [entry[2] for entry in gathered]
    _SEEN.update(failures)
    error_type = next(failures[r][1] for r in sorted(failures)) or VitbenchError
    message = _message(failures, get_world_size())
    try:
        agreed = error_type(message)
    except Exception:  # noqa: BLE001 - an error class that does not take one message
        agreed = VitbenchError(message)
    _AGREED[:] = [str(agreed)]
    raise agreed from error


def failure_on_any_rank(error: Optional[str]) -> Optional[str]:
    """The end of a run (a collective: every rank calls it, like a barrier): every rank passes
    its run's error message (``None`` when the run succeeded) and gets the run's outcome over
    all ranks: ``None`` when every rank succeeded, the message itself when every rank failed
    with the same one of its own, else the ranks' messages naming the rank(s) each came from
    (``RuntimeError: ... on rank 1 of 2``), so that rank 0's record says a run failed even
    where rank 0 did not. An error that an agreement point raised on every rank
    (:func:`raise_if_any_rank_failed`) reads as it was raised. A rank that failed early waits
    here for the others: they meet it at their next agreement point, raise its error and come
    here too. Without a process group of more than one rank: ``error`` as it is."""
    if not is_distributed():
        return error
    from mmengine.dist import all_gather_object, get_rank, get_world_size

    try:
        own = error if error is not None and error not in _AGREED else None  # not one an agreement raised
        if own is not None:
            _SEEN[get_rank()] = (own, None)
        while True:
            gathered = all_gather_object(("outcome", dict(_SEEN), error is not None, own))
            for _, theirs, *_ in gathered:
                _SEEN.update(theirs)
            if all(kind == "outcome" for kind, *_ in gathered):
                break  # else a rank is still in the run: it raises at its next agreement point and comes here
        if not any(failed for _, _, failed, _ in gathered):
            return None
        owns = [theirs for *_, theirs in gathered]
        if owns[0] is not None and all(o == owns[0] for o in owns):
            return owns[0]  # the same error on every rank, each its own (not one an agreement raised)
        return _message(_SEEN, get_world_size()) or error
    finally:
        _SEEN.clear()
        _AGREED.clear()


def collective_test(runner: "Runner") -> dict[str, Any]:
    """``runner.test()`` (mmengine's ``TestLoop``: the iterations over this rank's shard, then
    ``evaluator.evaluate``, which gathers every rank's results) such that a rank that fails
    does not leave the others waiting in the gathering. The iterations run no collective, so
    a rank whose iterations raise stops there and joins the others at the agreement point each
    rank reaches just before the evaluator gathers (:func:`raise_if_any_rank_failed`); every
    rank then raises the same error naming the failing rank(s). (A rank that failed before the
    evaluation is met by an agreement point before the ``Runner`` is built -- its constructor
    broadcasts a timestamp: ``raise_if_any_rank_failed(None)`` there.) Without a process group
    of more than one rank: ``runner.test()`` itself (an error raised where it happens)."""
    if not is_distributed():
        return runner.test()
    evaluator = runner.test_loop.evaluator  # builds the loop (runner.test() keeps a built one)
    evaluate = evaluator.evaluate
    exchanged = False

    def agreed_evaluate(size: int) -> dict:
        nonlocal exchanged
        exchanged = True
        raise_if_any_rank_failed(None)  # raises here when another rank failed
        return evaluate(size)

    evaluator.evaluate = agreed_evaluate
    try:
        return runner.test()
    except Exception as exc:
        if exchanged:  # raised by the exchange, or after it (the gathering itself)
            raise
        exchanged = True
        raise_if_any_rank_failed(exc)  # this rank failed in its iterations: always raises
        raise
    finally:
        del evaluator.evaluate  # the instance attribute: the method again


def same_on_every_rank(module: "torch.nn.Module", what: str) -> None:
    """Raise unless every rank holds the same ``module`` state (parameters and buffers, bit for
    bit; a collective: every rank calls it). What DDP training should leave -- the gradients are
    averaged, so every rank takes the same step -- checked with one ``all_gather_object`` of a
    digest per tensor. A difference means a parameter trained outside DDP (its gradient was not
    averaged) or buffers not broadcast; every rank raises the same error. Nothing without a
    process group of more than one rank."""
    if not is_distributed():
        return
    import hashlib

    import torch
    from mmengine.dist import all_gather_object, get_rank

    digests = {name: hashlib.sha1(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy()).hexdigest()
               for name, tensor in module.state_dict().items()}
    gathered = all_gather_object(digests)
    differ = sorted({name for other in gathered[1:] for name in set(other) | set(gathered[0])
                     if other.get(name) != gathered[0].get(name)})
    if differ:
        raise VitbenchError(f"{what}: the ranks hold different weights after training ({len(differ)} tensor(s) "
                            f"differ from rank 0's, e.g. {', '.join(differ[:3])}; on rank {get_rank()}); a "
                            f"parameter trained outside DDP or a buffer not broadcast")


def collect_in(metric: "BaseMetric", work_dir: Optional[Path]) -> "BaseMetric":
    """``metric`` (an mmengine ``BaseMetric`` collecting on the CPU, the default) set to gather
    the ranks' per-sample results in ``work_dir/collect`` under a launcher: mmengine's
    ``collect_results_cpu`` has each rank write its part there and rank 0 read them all, cut the
    sampler's padding off and remove the folder; without a ``collect_dir`` it uses
    ``./.dist_test`` in the current folder. ``work_dir`` must be the same folder on every rank
    (the spec's work folder, beside ``--out``; over several nodes on a shared file system, as the
    store). Without a process group of more than one rank, or without a ``work_dir`` (each rank's
    temporary folder would differ), ``metric`` is returned as it is."""
    if is_distributed() and work_dir is not None:
        if metric.collect_device != "cpu":
            raise VitbenchError(f"{type(metric).__name__} collects on {metric.collect_device!r}; a collect "
                                f"folder is for collect_device 'cpu'")
        metric.collect_dir = str(Path(work_dir) / "collect")
    return metric


def rank_batch_size(batch_size: int, world_size: int) -> int:
    """Each rank's share of a training batch: ``batch_size // world_size`` (at least 1), so that
    the ranks' batches together make the single process's batch. When ``world_size`` does not
    divide ``batch_size`` the effective batch is ``world_size * (batch_size // world_size)``,
    smaller than asked (64 over 3 ranks: 3 x 21 = 63), or ``world_size`` when there are more
    ranks than images in a batch; the learning rate is not rescaled."""
    if batch_size < 1 or world_size < 1:
        raise VitbenchError(f"batch size {batch_size} over {world_size} rank(s): both must be >= 1")
    return max(1, batch_size // world_size)


@contextlib.contextmanager
def one_rank_at_a_time(launcher: str, lock_dir: Path) -> Iterator[None]:
    """Let one rank at a time through (whichever reaches the lock first): the workspace is
    built before the process group starts (it trains and caches the default model or a new
    head on first use, single-process work), and a file lock keeps two ranks from training and
    writing the same cache at once; the later ranks then load it. Under ``slurm`` over several
    nodes the lock (beside ``--out``) needs a shared file system, as the store does."""
    if launcher == "none":
        yield
        return
    from filelock import FileLock

    lock_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock_dir / ".vitbench-launcher.lock")):
        yield


