"""The options of one benchmark (``vitbench run``/``sweep``, :func:`vitbench.benchmark`) as a typed record.

The CLI parses its flags into a :class:`RunOptions`; the Python API builds one from keywords.
The number options are checked here, once, whether they come as the command line's text or as
the API's values (:mod:`vitbench.core.option_values`); names (methods, metrics, the task's
options) are checked where they are known (the plan, the task), so bad input fails the same way
from both sides.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional, Union

from vitbench.core.option_values import (
    MAX_BATCH_SIZE, check_fraction, checked_budgets, checked_integer, checked_seconds, checked_seeds, checked_shard,
)
from vitbench.errors import VitbenchError, choices_error

__all__ = ["FLAG", "FLAG_GROUPS", "LAUNCHERS", "Flag", "RunOptions", "option_names", "parse_list"]


#: the ``--help`` groups of ``vitbench run``/``sweep``, in order: key and title
FLAG_GROUPS = (("run", "what to run"), ("data", "data and weights"), ("measure", "measurement"),
               ("train", "fine-tuning (learnable methods)"), ("dist", "distributed and sharded runs"))
#: the values ``--launcher`` takes
LAUNCHERS = ("none", "pytorch", "slurm")
#: the key of a :class:`RunOptions` field's :class:`Flag` in its metadata
FLAG = "flag"


@dataclass(frozen=True)
class Flag:
    """How a :class:`RunOptions` field is given on the command line: its ``--help`` text (where
    ``{tasks}``, ``{default_model}``, ``{metrics}`` and ``{train_limit}`` are filled in), group,
    metavar, flag name (``None``: ``--`` and the field's name with dashes), the commands that take
    it, an argparse ``action`` and ``choices``."""

    help: str
    group: str
    metavar: Optional[str] = None
    name: Optional[str] = None
    commands: tuple[str, ...] = ("run", "sweep")
    action: Optional[str] = None
    required: bool = False
    choices: Optional[tuple[str, ...]] = None

    def flag_of(self, field_name: str) -> str:
        """The option string: :attr:`name`, else ``--`` and ``field_name`` with dashes."""
        return self.name or "--" + field_name.replace("_", "-")


def _flag(default: Any = None, help: str = "", *, group: str, default_factory: Any = None, **how: Any) -> Any:
    """A :class:`RunOptions` field with its :class:`Flag`."""
    meta = {FLAG: Flag(help, group, **how)}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class RunOptions:
    """Every option of ``vitbench run`` and ``vitbench sweep``, by its argparse dest name, declared
    once: its type, default and flag (:class:`Flag`: the command line's flags are made from these
    fields, the Python API's keywords are their names)."""

    task: str = _flag("cls", "task: {tasks} (default cls; see `vitbench list tasks`; a plugin can add more)",
                      group="run")
    methods: tuple[str, ...] = _flag((), "comma-separated method names (see `vitbench list methods`); the "
                                         "baseline always runs too", group="run", required=True)
    params: Mapping[str, Any] = _flag(
        help="method parameter, e.g. tome.r=13 (repeatable; `vitbench describe METHOD` lists them)", group="run",
        default_factory=dict,
        name="--param", action="append", metavar="METHOD.KEY=VALUE")
    seed: Optional[int] = _flag(None, "the one seed of every run (default 0)", group="run")
    seeds: Optional[tuple[int, ...]] = _flag(
        None, "run every spec (the baseline too) once per seed, e.g. 0,1,2; the report shows mean ± std over the "
              "seeds (instead of --seed)", group="run", metavar="S1,S2,...")
    out: Union[str, Path, None] = _flag(None, "result directory (default: runs/<task>-<model>; runs/sweep-... for "
                                              "a sweep)", group="run")
    resume: bool = _flag(False, "skip finished runs of the store, retry failed ones", group="run",
                         action="store_true")
    match_gmacs: Optional[float] = _flag(
        None, "matched compute: set every method's budget knob so that its GMACs land within 2 %% of F x the "
              "baseline's (0 < F <= 1); the chosen values go into the labels", group="run", metavar="F",
        commands=("run",))
    budgets: Optional[tuple[float, ...]] = _flag(
        None, "fractions of the baseline's GMACs, each in (0, 1], e.g. 0.9,0.8,0.7,0.6,0.5", group="run",
        metavar="F1,F2,...", commands=("sweep",), required=True)
    controls: bool = _flag(
        True, "leave out the controls a sweep adds where they apply to the model: random (tokens dropped at "
              "random) and downsample (a smaller image), the simple things a method must beat", group="run",
        name="--no-controls", action="store_false", commands=("sweep",))
    isolate: bool = _flag(False, "run each spec in a process of its own: a crash, an exit or a hang in plugin "
                                 "code is that run's error record (costs a process start per run; "
                                 "docs/reliability.md)", group="run", action="store_true")
    run_timeout: Optional[float] = _flag(None, "with --isolate (implied): kill a run that takes longer and record "
                                               "it as an error", group="run", metavar="SECONDS")
    model: Optional[str] = _flag(None, "timm ViT/DeiT name; default: {default_model} (trained once on "
                                       "Fashion-MNIST)", group="data")
    data: Optional[str] = _flag(None, "ImageNet-style folder, or fashion-mnist (the default model's data)",
                                group="data")
    pretrained: bool = _flag(False, "load timm's pretrained weights (needs the hub)", group="data",
                             action="store_true")
    checkpoint: Optional[str] = _flag(None, "local weights file (.pth/.safetensors state dict)", group="data")
    num_classes: Optional[int] = _flag(
        None, "re-head the model for the data's N classes: the head of a --checkpoint with N classes, else a new "
              "head fitted once on the data's train/ split (linear probe)", group="data")
    limit: Optional[int] = _flag(None, "evaluate only the first N images (default: all); a cheap run, so a "
                                       "speed-up is paired over 10 rounds, not 30", group="data")
    workers: Optional[int] = _flag(
        None, "loader worker processes for images that are decoded (the folder's first decoding, fine-tuning; "
              "default: half the usable cores, at most 8; 0: in the main process)", group="data", metavar="N")
    metrics: Optional[tuple[str, ...]] = _flag(
        None, "comma-separated subset of {metrics} (default: all but train_throughput; accuracy needs data)", group="measure")
    batch_size: int = _flag(32, "throughput batch size (default 32)", group="measure")
    batch_sizes: Optional[tuple[int, ...]] = _flag(
        None, "also time throughput and latency at each batch size, e.g. 1,4,16,64: the report plots speed-up "
              "against batch size and names where each method starts to pay", group="measure",
        metavar="B1,B2,...")
    device: str = _flag("cpu", "where to run (default cpu)", group="measure", metavar="cpu|cuda")
    precision: str = _flag("fp32", "autocast dtype of the measured forward, evaluation and (bf16) fine-tuning; "
                                   "GMACs are counted the same (default fp32; bf16 works on the CPU too)",
                           group="measure", metavar="fp32|fp16|bf16")
    compile: bool = _flag(False, "time the torch.compile'd model (throughput, latency, memory; GMACs and accuracy "
                                 "on the eager one); a model that does not compile is timed eagerly, with the "
                                 "reason recorded", group="measure", action="store_true")
    cuda_graph: bool = _flag(False, "time throughput and latency on a CUDA graph of the forward (one launch per "
                                    "forward); a method whose shapes depend on the data, or a CPU run, is timed "
                                    "without one, with the reason recorded", group="measure", action="store_true")
    quick: bool = _flag(False, "a fast look: time throughput and latency with 3 repeats each (the report says so; "
                               "not for publication)", group="measure", action="store_true")
    wait: bool = _flag(True, "do not wait for a quiet machine before each timing (by default a timing waits, at most "
                             "60 s, until the load average is at most the cores + 0.5, and is taken again once "
                             "when its spread is too wide; VITBENCH_NO_WAIT=1 does the same)", group="measure",
                       name="--no-wait", action="store_false")
    repeats: Optional[int] = _flag(None, "repeats of each timing, throughput, latency and the paired speed-up "
                                         "(1 to 10000; default 10, 20 and 30 rounds)", group="measure", metavar="N")
    train_backbone: bool = _flag(False, "learnable methods: train the backbone too (default: only the method's "
                                        "parameters)", group="train", action="store_true")
    train_limit: Optional[int] = _flag(None, "learnable methods: fine-tune on the first N training images "
                                             "(default: all; {train_limit} with the default model, 1000 on the "
                                             "det/seg scenes)", group="train")
    shard: Union[str, tuple[int, int], None] = _flag(
        None, "run the I-th of N disjoint parts of the plan (a job array; I from 1), appending to "
              "OUT/runs-shard-I-of-N.jsonl; the report (and `vitbench report OUT`) merges every part",
        group="dist", metavar="I/N")
    launcher: str = _flag(
        "none", "none (one process, the default), pytorch (one of the processes `torchrun --nproc-per-node N -m "
                "vitbench run ...` starts) or slurm (one of the tasks `srun --ntasks N vitbench run ...` starts): "
                "evaluation is sharded over the ranks, learnable methods fine-tune and det/seg's baseline detector "
                "trains with DDP (det/seg: close to one process, not equal: BatchNorm keeps per-rank statistics), "
                "timing and the store/report are rank 0's; VITBENCH_DIST_TIMEOUT=SECONDS bounds how long a rank "
                "waits for the others (default 1800)", group="dist", choices=LAUNCHERS)
    #: the task's own options by dest name, e.g. ``{"detector_epochs": 4}`` (their flags are the task's)
    task_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Check (and type) the number options, given as values or as the command line's text;
        refuse what no later check would see: an empty name or path (``--model ""`` would mean
        the default model, ``--out ""`` the current folder) and an empty metric list."""
        for name, (low, high) in _INTEGERS.items():
            object.__setattr__(self, name, checked_integer(f"--{name.replace('_', '-')}", getattr(self, name),
                                                           low, high))
        if self.match_gmacs is not None:
            object.__setattr__(self, "match_gmacs", check_fraction(self.match_gmacs))
        if self.budgets is not None:
            object.__setattr__(self, "budgets", checked_budgets(self.budgets))
        object.__setattr__(self, "run_timeout", checked_seconds("--run-timeout", self.run_timeout))
        if self.shard is not None:
            object.__setattr__(self, "shard", checked_shard(self.shard))
        if self.seeds is not None:
            object.__setattr__(self, "seeds", checked_seeds(self.seeds))
            if self.seed is not None:
                raise VitbenchError(f"--seed {self.seed} and --seeds {','.join(map(str, self.seeds))} were both "
                                    f"given; use --seed S for one seed or --seeds S1,S2,... for several")
        elif self.seed is not None:
            checked_seeds((self.seed,))
        for name, (what, default) in _TEXT_OPTIONS.items():
            value = getattr(self, name)
            if isinstance(value, str) and not value.strip():
                raise VitbenchError(f"--{name} {value!r} is empty; give {what}, or leave the option out "
                                    f"({default})")
        if self.metrics is not None and not any(str(m).strip() for m in self.metrics):
            raise VitbenchError(f"--metrics {','.join(map(str, self.metrics))!r} names no metric; give "
                                f"comma-separated metric names (`vitbench list tasks` lists each task's), or "
                                f"leave --metrics out for all of them")

    @property
    def isolated(self) -> bool:
        """Each spec in a process of its own: ``--isolate``, or implied by ``--run-timeout``."""
        return self.isolate or self.run_timeout is not None

    @property
    def plan_seeds(self) -> tuple[int, ...]:
        """The seeds every spec runs with: ``seeds``, or ``(seed,)`` (default 0)."""
        return self.seeds if self.seeds is not None else (0 if self.seed is None else self.seed,)

    @property
    def matched_budgets(self) -> Optional[tuple[float, ...]]:
        """The matched budgets: a sweep's, or ``(F,)`` for ``match_gmacs=F``, or ``None`` (every
        method at its own defaults)."""
        if self.budgets is not None:
            return self.budgets
        return None if self.match_gmacs is None else (self.match_gmacs,)

    @property
    def is_sweep(self) -> bool:
        """A sweep (``budgets`` given): stored under ``runs/sweep-...``, always resumed, a sweep report."""
        return self.budgets is not None


#: the integer options and their ranges (``None``: no bound)
_INTEGERS: dict[str, tuple[Optional[int], Optional[int]]] = {
    "batch_size": (1, MAX_BATCH_SIZE), "seed": (None, None), "num_classes": (1, None), "limit": (1, None),
    "train_limit": (1, None), "workers": (0, None),
}

#: the text options an empty string is refused for, and what to give instead
_TEXT_OPTIONS = {"model": ("a model name (`vitbench list models`)", "the task's default model"),
                 "data": ("a data folder or an embedded set name", "the task's default data"),
                 "checkpoint": ("the path of a weights file", "no checkpoint"),
                 "out": ("a result folder", "runs/<task>-<model>")}


def option_names() -> tuple[str, ...]:
    """The names :class:`RunOptions` takes, in declaration order."""
    return tuple(f.name for f in fields(RunOptions))


def parse_list(kind: str, text: str, valid: Iterable[str]) -> tuple[str, ...]:
    """Split a comma list and check every item against ``valid``."""
    items = tuple(item.strip() for item in text.split(",") if item.strip())
    valid = tuple(valid)
    for item in items:
        if item not in valid:
            raise choices_error(kind, item, valid)
    return items
