"""``--cuda-graph``: time a captured CUDA graph of the forward (docs/measuring.md, "Throughput and latency").

A graph replays the forward's kernels with one launch, which removes the host's launch time
from a small-batch timing, but it is only sound when shapes and control flow do not depend on
the data. So :func:`graph_for_timing` checks before it trusts a graph, per batch size: an eager
reference forward; the same forward under
:func:`~vitbench.engine.host_sync.device_only` with CUDA's sync debug mode set to error (a
method that reads the device from the host is timed eagerly); capture after warm-up on a side
stream; one replay that must equal the reference. Each fallback records why. Peak memory, GMACs
and accuracy never run through the graph; on a CPU the model is timed eagerly."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from vitbench.engine.host_sync import device_only
from vitbench.measure._common import random_images
from vitbench.measure.precision import check_precision, dtype_of

__all__ = ["GraphedForTiming", "GraphedForward", "graph_for_timing"]

#: how far a replay may stray from the eager forward, relative to the output's largest value
REPLAY_TOLERANCE = {"fp32": 1e-3, "fp16": 2e-2, "bf16": 2e-2}
#: a replay may differ from the eager forward by this many times two eager forwards' own difference
EAGER_SPREAD_FACTOR = 2.0


class _Graph:
    """One captured forward: its static input, graph and static output."""

    def __init__(self, static_in: torch.Tensor, graph: Any, static_out: Any) -> None:
        self.static_in = static_in
        self.graph = graph
        self.static_out = static_out


class GraphedForward(nn.Module):
    """Replays the captured forward of ``model`` for an input of a captured shape.

    ``model`` stays a submodule, so the timing loops' device and dtype checks see its
    parameters. The returned output is the graph's static output: overwritten by the next call.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self._graphs: dict[tuple[int, ...], _Graph] = {}

    def forward(self, x: torch.Tensor) -> Any:
        graph = self._graphs.get(tuple(x.shape))
        if graph is None:
            raise ValueError(f"no CUDA graph was captured for an input of shape {tuple(x.shape)}; "
                             f"captured: {sorted(self._graphs)}")
        graph.static_in.copy_(x)
        graph.graph.replay()
        return graph.static_out


@dataclass
class GraphedForTiming:
    """The module the throughput and latency loops run, and what to record about it."""

    module: nn.Module
    graphed: bool
    fallback: Optional[str] = None  # why the model is timed without a graph

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cuda_graph": self.graphed}
        if self.fallback:
            out["cuda_graph_fallback"] = self.fallback
        return out


def _capture_autocast(precision: str, device: torch.device) -> Any:
    """Autocast for capture: the half dtype, weight cache off (capture cannot hold the cache)."""
    return torch.autocast(device_type=device.type, dtype=dtype_of(precision), enabled=precision != "fp32",
                          cache_enabled=False)


def _tensors(out: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]


def _replay_error(reference: Any, replayed: Any) -> float:
    """Largest difference between two outputs, relative to the reference's largest value."""
    ref, rep = _tensors(reference), _tensors(replayed)
    if len(ref) != len(rep) or any(a.shape != b.shape for a, b in zip(ref, rep)):
        return float("inf")
    worst = 0.0
    for a, b in zip(ref, rep):
        if a.numel() == 0:
            continue
        scale = max(float(a.float().abs().max()), 1e-6)
        worst = max(worst, float((a.float() - b.float()).abs().max()) / scale)
    return worst


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}"


def _capture_one(model: nn.Module, graphed: GraphedForward, batch: int, input_size: tuple[int, int, int],
                 device: torch.device, precision: str, pool: Any) -> Optional[str]:
    """Capture ``model`` for ``batch`` into ``graphed``; the reason it cannot be, or None."""
    x = random_images(batch, input_size, dtype=torch.float32, device=device)
    with torch.inference_mode():
        try:
            torch.cuda.set_sync_debug_mode("error")
            with device_only(), _capture_autocast(precision, device):
                reference = model(x)  # the replay is checked against the same code path, run eagerly
        except RuntimeError as exc:
            if "synchroniz" not in str(exc):  # not the sync check: the device-only forward itself failed
                return (f"the forward failed inside device_only() at batch {batch} ({_first_line(exc)}); "
                        f"timed without a CUDA graph")
            return (f"the forward reads a device value on the host at batch {batch} ({_first_line(exc)}), so its "
                    f"shapes or control flow depend on the data; timed without a CUDA graph")
        finally:
            torch.cuda.set_sync_debug_mode("default")
        static_in = x.clone()
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        try:
            with torch.cuda.stream(side), device_only(), _capture_autocast(precision, device):
                for _ in range(3):
                    model(static_in)
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool), device_only(), _capture_autocast(precision, device):
                static_out = model(static_in)
        except Exception as exc:  # noqa: BLE001 - any capture failure: time eagerly, say why
            torch.cuda.synchronize(device)
            return f"CUDA graph capture failed at batch {batch} ({_first_line(exc)}); timed without a CUDA graph"
        graph.replay()
        torch.cuda.synchronize(device)
        error = _replay_error(reference, static_out)
        if not error <= REPLAY_TOLERANCE[precision]:
            # a method whose own eager forwards differ (atomic scatters in half precision, where one
            # flipped merge moves the logits) is held to that spread, not to a tighter one
            with device_only(), _capture_autocast(precision, device):
                spread = _replay_error(reference, model(x))
            if not error <= max(REPLAY_TOLERANCE[precision], EAGER_SPREAD_FACTOR * spread):
                return (f"the CUDA graph's replay differs from the eager forward at batch {batch} (by {error:.2g} "
                        f"of the output's scale; tolerance {REPLAY_TOLERANCE[precision]:g}, two eager forwards "
                        f"differ by {spread:.2g}); timed without a CUDA graph")
    graphed._graphs[tuple(x.shape)] = _Graph(static_in, graph, static_out)
    return None


def graph_for_timing(model: nn.Module, input_size: tuple[int, int, int], batch_sizes: tuple[int, ...],
                     device: str | torch.device, precision: str = "fp32") -> GraphedForTiming:
    """``model``'s forward captured as a CUDA graph for each of ``batch_sizes`` (the module
    docstring's four steps), or ``model`` itself with the reason it is timed without one."""
    check_precision(precision)
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return GraphedForTiming(model, False, f"CUDA graphs need a CUDA device (the run is on {dev.type}); "
                                              f"timed without a CUDA graph")
    was_training = model.training
    model.eval()
    graphed = GraphedForward(model)
    pool = torch.cuda.graph_pool_handle()
    try:
        for batch in dict.fromkeys(batch_sizes):
            reason = _capture_one(model, graphed, batch, input_size, dev, precision, pool)
            if reason is not None:
                return GraphedForTiming(model, False, reason)
    finally:
        model.train(was_training)
    return GraphedForTiming(graphed, True)
