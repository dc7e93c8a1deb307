"""Runner hooks of vitbench's own (registered in the ``vitbench`` HOOKS registry)."""
from __future__ import annotations

import sys
import time
from typing import Any

from mmengine.hooks import Hook

from vitbench.mm.registry import HOOKS


@HOOKS.register_module()
class ProgressHook(Hook):
    """Print training progress (epoch, iteration, loss, elapsed time) and keep the val metrics.

    The runners run at log level WARNING to stay quiet, which also hides mmengine's own
    ``LoggerHook`` lines; a user waiting minutes for the embedded default model to train needs
    to see it move. Lines go to stderr so stdout stays clean for results. ``interval`` is in
    iterations; ``verbose=False`` keeps the metrics without printing.
    """

    priority = "VERY_LOW"

    def __init__(self, interval: int = 100, verbose: bool = True, prefix: str = "") -> None:
        self.interval = max(1, int(interval))
        self.verbose = verbose
        self.prefix = prefix
        self.val_metrics: dict[str, float] = {}
        self._start = time.perf_counter()

    def _print(self, line: str) -> None:
        if self.verbose:
            print(f"{self.prefix}{line}", file=sys.stderr, flush=True)

    def before_train(self, runner: Any) -> None:
        self._start = time.perf_counter()

    def after_train_iter(self, runner: Any, batch_idx: int, data_batch: Any = None,
                         outputs: dict | None = None) -> None:
        n = len(runner.train_dataloader)
        if (batch_idx + 1) % self.interval and batch_idx + 1 != n:
            return
        loss = float(outputs["loss"].detach()) if outputs and "loss" in outputs else float("nan")
        self._print(f"epoch {runner.epoch + 1}/{runner.max_epochs}  iter {batch_idx + 1}/{n}  "
                    f"loss {loss:.4f}  {time.perf_counter() - self._start:.0f} s")

    def after_val_epoch(self, runner: Any, metrics: dict[str, float] | None = None) -> None:
        self.val_metrics = dict(metrics or {})
        shown = "  ".join(f"{k} {v:.2f}" for k, v in self.val_metrics.items())
        self._print(f"validation after epoch {runner.epoch}: {shown}  "
                    f"{time.perf_counter() - self._start:.0f} s")
