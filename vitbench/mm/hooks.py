"""Runner hooks of vitbench's own (registered in the ``vitbench`` HOOKS registry)."""
from __future__ import annotations

import sys
import time
from typing import Any, Optional

from mmengine.hooks import Hook

from vitbench.core import progress
from vitbench.mm.registry import HOOKS


@HOOKS.register_module()
class ProgressHook(Hook):
    """Print training progress (epoch, iteration, loss, elapsed time) and keep the val metrics.

    The runners run at log level WARNING to stay quiet, which also hides mmengine's own
    ``LoggerHook`` lines; a user waiting minutes for the embedded default model to train needs
    to see it move. Lines go to stderr so stdout stays clean for results. ``interval`` is in
    iterations; ``verbose=False`` keeps the metrics without printing. The iterations are a
    :mod:`vitbench.core.progress` step (``what``, default: the prefix's words); where it draws bars,
    the loss goes beside the bar instead of into a line.
    """

    priority = "VERY_LOW"

    def __init__(self, interval: int = 100, verbose: bool = True, prefix: str = "", what: str = "") -> None:
        self.interval = max(1, int(interval))
        self.verbose = verbose
        self.prefix = prefix
        self.what = what or prefix.removeprefix("vitbench:").strip().rstrip(":").strip() or "training"
        self.val_metrics: dict[str, float] = {}
        self._start = time.perf_counter()
        self._step: Optional[progress.Step] = None

    def _print(self, line: str) -> None:
        if self.verbose:
            print(f"{self.prefix}{line}", file=sys.stderr, flush=True)

    def before_train(self, runner: Any) -> None:
        self._start = time.perf_counter()
        done = runner.iter  # a resumed training starts after its checkpoint: count what is left
        what = f"{self.what} (resumed after {done} of {runner.max_iters} iterations)" if done else self.what
        self._step = progress.start(what, runner.max_iters - done, "iterations")

    def after_train_iter(self, runner: Any, batch_idx: int, data_batch: Any = None,
                         outputs: dict | None = None) -> None:
        n = len(runner.train_dataloader)
        shown = (batch_idx + 1) % self.interval == 0 or batch_idx + 1 == n
        loss = float(outputs["loss"].detach()) if shown and outputs and "loss" in outputs else float("nan")
        if self._step is not None:
            if shown:
                self._step.note(f"epoch {runner.epoch + 1}/{runner.max_epochs}  loss {loss:.4f}")
            self._step.advance()
        if not shown or progress.shows_bars():
            return
        self._print(f"epoch {runner.epoch + 1}/{runner.max_epochs}  iter {batch_idx + 1}/{n}  "
                    f"loss {loss:.4f}  {time.perf_counter() - self._start:.0f} s")

    def after_train(self, runner: Any) -> None:
        if self._step is not None:
            self._step.close()

    def after_val_epoch(self, runner: Any, metrics: dict[str, float] | None = None) -> None:
        self.val_metrics = dict(metrics or {})
        shown = "  ".join(f"{k} {v:.2f}" for k, v in self.val_metrics.items())
        self._print(f"validation after epoch {runner.epoch}: {shown}  "
                    f"{time.perf_counter() - self._start:.0f} s")


class TestProgressHook(Hook):
    """Advances a :mod:`vitbench.core.progress` step after each test batch (its total: the loader's
    length), counts the predictions the batches returned (:attr:`scored`) and notes when the first
    batch ended (:attr:`first_batch_end`, :attr:`first_batch_scored`)."""

    priority = "VERY_LOW"

    def __init__(self, step: progress.Step) -> None:
        self.step = step
        self.scored = 0
        self.first_batch_scored = 0
        self.first_batch_end: float | None = None

    def before_test_epoch(self, runner: Any) -> None:
        self.step.set_total(len(runner.test_dataloader))

    def after_test_iter(self, runner: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        self.scored += len(outputs) if outputs is not None else 0
        if self.first_batch_end is None:
            self.first_batch_end, self.first_batch_scored = time.perf_counter(), self.scored
        self.step.advance()


def steady_rate(counted: TestProgressHook, num_images: int, end: float) -> Optional[float]:
    """Images per second of a test loop from the end of its first batch to ``end``, scaled from
    this process's predictions to ``num_images`` (every rank's); None with a single batch.

    The first batch carries one-time costs the other batches do not (the loader's workers
    starting, a GPU's lazily loaded kernels), and they fell on whichever row a process evaluated
    first.
    """
    first_end, first_scored = counted.first_batch_end, counted.first_batch_scored
    if first_end is None or counted.scored <= first_scored or end <= first_end:
        return None
    rate = (counted.scored - first_scored) / (end - first_end)
    return rate * num_images / counted.scored


@HOOKS.register_module()
class PatchDropSchedule(Hook):
    """Set the backbone's patch dropout rate per epoch: ``rates[e]`` in epoch ``e`` (PatchDropout,
    Liu et al., WACV 2023, Sec. 3: training on a random subset of the patch tokens).

    The backbone is a timm ``VisionTransformer`` built with a non-zero ``patch_drop_rate`` (so it
    holds a ``PatchDropout`` module, which evaluation never applies); a rate of 0 trains on every
    token.
    """

    priority = "NORMAL"

    def __init__(self, rates: list[float]) -> None:
        if not rates or any(not 0.0 <= r < 1.0 for r in rates):
            raise ValueError(f"patch dropout rates must lie in [0, 1), got {rates!r}")
        self.rates = [float(r) for r in rates]

    def before_train_epoch(self, runner: Any) -> None:
        model = runner.model.module if hasattr(runner.model, "module") else runner.model
        patch_drop = model.backbone.model.patch_drop
        if not hasattr(patch_drop, "prob"):
            raise ValueError("PatchDropSchedule needs a backbone built with patch_drop_rate > 0")
        patch_drop.prob = self.rates[min(runner.epoch, len(self.rates) - 1)]


@HOOKS.register_module()
class StartFromWeights(Hook):
    """Load a state dict shipped inside the vitbench package into the backbone before the first
    iteration, so training continues a shipped model (a resumed training keeps its checkpoint).

    ``file`` is relative to the installed ``vitbench`` package; ``sha256`` must match its bytes.
    """

    priority = "VERY_HIGH"

    def __init__(self, file: str, sha256: str) -> None:
        self.file, self.sha256 = file, sha256

    def before_train(self, runner: Any) -> None:
        if runner.iter > 0:
            return
        import hashlib
        from importlib.resources import files

        import torch

        path = files("vitbench").joinpath(self.file)
        blob = path.read_bytes()
        if hashlib.sha256(blob).hexdigest() != self.sha256:
            raise ValueError(f"{self.file}: its sha256 is not {self.sha256}; the weights to start from changed")
        model = runner.model.module if hasattr(runner.model, "module") else runner.model
        with path.open("rb") as f:
            model.backbone.model.load_state_dict(torch.load(f, map_location="cpu", weights_only=True), strict=True)
