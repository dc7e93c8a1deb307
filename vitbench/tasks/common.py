"""What every task measures the same way: the input size of a timm model, which attention
kernel its blocks run, and the model the timing loops run (eager, ``--compile``'s, ``--cuda-graph``'s).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from torch import nn

from vitbench.engine import reduction_context
from vitbench import measure
from vitbench.engine.block import ReducingBlock
from vitbench.measure.compiled import CompiledForTiming, compile_for_timing
from vitbench.measure.cuda_graph import graph_for_timing
from vitbench.measure.paired import measure_paired_speedup
from vitbench.measure.train_speed import measure_train_throughput
from vitbench.core.interrupts import is_ctrl_c
from vitbench.errors import PLUGIN_FAILURES, failure_text

Progress = Callable[[str], None]

__all__ = ["Progress", "TimedModels", "attention_kernel", "input_size_of", "measure_timings", "timed_model"]


def input_size_of(model: nn.Module) -> tuple[int, int, int]:
    """``(channels, height, width)`` a timm model takes: a ViT's patch embedding, else (hybrids)
    the size the family adapter describes it at (``vitbench_input_size``) or timm's config."""
    embed = getattr(model, "patch_embed", None)
    if embed is not None and getattr(embed, "img_size", None) is not None:
        return (int(embed.proj.in_channels), int(embed.img_size[0]), int(embed.img_size[1]))
    cfg = getattr(model, "pretrained_cfg", None) or {}
    c, h, w = cfg.get("input_size", (3, 224, 224))
    h, w = getattr(model, "vitbench_input_size", None) or (h, w)
    return (int(c), int(h), int(w))


def attention_kernel(model: nn.Module) -> str:
    """Which attention kernel each block ran (docs/measuring.md: baseline and method must match)."""
    if not hasattr(model, "blocks"):  # hybrids: conv stages around their attention blocks

        reducing = [m for m in model.modules() if isinstance(m, ReducingBlock)]
        if not reducing:
            return "timm default"
        unfused = [blk.index for blk in reducing if not blk.fused]
        return "fused (SDPA)" if not unfused else "unfused in blocks " + ",".join(map(str, unfused))
    if reduction_context(model) is not None:
        unfused = [blk.index for blk in model.blocks if not blk.fused]
    else:
        unfused = [i for i, blk in enumerate(model.blocks) if not getattr(blk.attn, "fused_attn", False)]
    if not unfused:
        return "fused (SDPA)"
    if len(unfused) == len(model.blocks):
        return "unfused (explicit softmax)"
    return "fused (SDPA); unfused in blocks " + ",".join(str(i) for i in unfused)


@dataclass
class TimedModels:
    """What the timing loops run: ``module`` for throughput and latency (eager, compiled, or a
    CUDA graph's replay), ``memory_module`` for peak memory (never the graph: a replay allocates
    nothing), and what the record says about both."""

    module: Any
    memory_module: Any
    facts: dict[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        return dict(self.facts)


#: the metrics that time the forward (the ones :func:`measure_timings` measures, the training step's too)
TIMING_METRICS = ("throughput", "latency", "memory", "train_throughput")


def timed_model(spec: Any, model: nn.Module, input_size: tuple[int, int, int], progress: Progress) -> TimedModels:
    """What the timing loops run: ``model``, or with ``--compile`` the ``torch.compile``d model
    (compiled here for the loops' batch sizes; a model that does not compile is timed eagerly,
    the reason recorded: :mod:`vitbench.measure.compiled`), and with ``--cuda-graph`` that
    model's forward captured as a CUDA graph for throughput and latency (a forward whose shapes
    depend on the data, or a CPU run, is timed without one, the reason recorded:
    :mod:`vitbench.measure.cuda_graph`)."""
    timings = [m for m in TIMING_METRICS if m in spec.metrics]
    curve = tuple(getattr(spec, "batch_sizes", None) or ())
    batches = tuple(1 if m == "latency" else spec.batch_size for m in timings) + curve
    if spec.compile and timings:
        progress("compiling the model for the timings (torch.compile)")
        timed = compile_for_timing(model, input_size, batches, spec.device, spec.precision_name)
        if timed.fallback:
            progress(timed.fallback)
    else:
        timed = CompiledForTiming(model, False)
    out = TimedModels(timed.module, timed.module, timed.record())
    graph_batches = tuple(1 if m == "latency" else spec.batch_size for m in timings if m != "memory") + curve
    if getattr(spec, "cuda_graph", False) and graph_batches:
        progress("capturing the forward as a CUDA graph for the timings")
        graphed = graph_for_timing(timed.module, input_size, graph_batches, spec.device, spec.precision_name)
        if graphed.fallback:
            progress(graphed.fallback)
        out.module = graphed.module
        out.facts.update(graphed.record())
    return out


def measure_timings(spec: Any, model: Any, input_size: tuple[int, int, int], progress: Progress, *,
                    throughput_repeats: int, latency_repeats: int, baseline: Any = None,
                    images: Any = None, paired_rounds: Optional[int] = None) -> dict[str, Any]:
    """The timing metrics ``spec`` asks for -- throughput at its batch size, batch-1 latency, peak
    memory, and with ``--batch-sizes`` throughput and latency at each of them (``batch_curve``,
    with ``throughput_repeats`` each; the throughput at the batch size is that curve's point where
    the curve has it) -- of ``model``'s forward, the same way for every task: on :func:`timed_model`'s
    module (eager, ``--compile``d or a CUDA graph; memory never on the graph), in the spec's
    precision; the record fields of each, and how the model was timed. A spec's ``repeats``
    (``--repeats N``, ``--quick``) replaces both repeat counts, and the record says so
    (``timing_repeats``). Given the ``baseline`` model and timed eagerly, the speed-up at the batch
    size is also timed in turn with it (:mod:`vitbench.measure.paired`, ``paired_rounds`` rounds; None,
    or a spec evaluated with ``--limit``, a cheap run: ``throughput_repeats``).
    Every timing runs on ``images`` ``[m, C, H, W]`` taken in turn when given (the first evaluation
    images, so that an input-dependent method chooses as it does on data), else on seeded noise;
    ``timed_on`` says which."""
    device, precision = spec.device, spec.precision_name
    asked = getattr(spec, "repeats", None)  # --repeats N / --quick: every timing with N repeats
    if asked is not None:
        throughput_repeats = latency_repeats = paired_rounds = asked
    elif getattr(spec, "limit", None) is not None:
        paired_rounds = throughput_repeats
    timed = timed_model(spec, model, input_size, progress)
    out = timed.record()
    if asked is not None and ("throughput" in spec.metrics or "latency" in spec.metrics):
        out["timing_repeats"] = asked
    if any(m in spec.metrics for m in TIMING_METRICS):
        out["timed_on"] = "evaluation images" if images is not None else "random images"
    curve: dict[int, Any] = {}
    for batch in getattr(spec, "batch_sizes", None) or ():
        progress(f"timing the forward at batch {batch} (--batch-sizes)")
        curve[batch] = measure.measure_throughput(timed.module, batch, input_size, device=device,
                                                  repeats=throughput_repeats, precision=precision, images=images)
    if curve:
        out["batch_curve"] = [tp.curve_point() for tp in curve.values()]
    if "throughput" in spec.metrics:
        tp = curve.get(spec.batch_size)
        if tp is None:
            progress(f"timing throughput (batch {spec.batch_size})")
            tp = measure.measure_throughput(timed.module, spec.batch_size, input_size, device=device,
                                            repeats=throughput_repeats, precision=precision, images=images)
        out.update(tp.fields())  # median, spread and the load/cores/threads it ran under
        if baseline is not None and timed.module is model:  # --compile/--cuda-graph: the throughputs' ratio

            progress(f"timing the forward in turn with the baseline's (batch {spec.batch_size})")
            paired = measure_paired_speedup(model, baseline, spec.batch_size, input_size, device=device,
                                            rounds=paired_rounds or throughput_repeats, precision=precision,
                                            images=images)
            out.update(paired.fields())
    if "latency" in spec.metrics:
        progress("timing latency (batch 1)")
        lat = measure.measure_latency(timed.module, input_size, device=device, repeats=latency_repeats,
                                      precision=precision, images=images)
        out.update(lat.fields())
    if "memory" in spec.metrics:
        progress("measuring peak memory")
        out["peak_mem_mb"] = measure.measure_peak_memory(timed.memory_module, spec.batch_size, input_size,
                                                         device=device, precision=precision, images=images)
    if "train_throughput" in spec.metrics:
        progress(f"timing the training step (batch {spec.batch_size})")
        out.update(train_throughput_fields(model, spec.batch_size, input_size, device=device,
                                           repeats=throughput_repeats, precision=precision, images=images))
    return out


def train_throughput_fields(model: nn.Module, batch_size: int, input_size: tuple[int, int, int], *,
                            device: Any, repeats: int, precision: str, images: Any) -> dict[str, Any]:
    """The record fields of the training step's throughput (``train_throughput_*``), eager;
    a method whose training forward fails keeps the reason (``train_throughput_error``), not a number."""
    try:
        tp = measure_train_throughput(model, batch_size, input_size, device=device, repeats=repeats,
                                      precision=precision, images=images)
    except PLUGIN_FAILURES as exc:
        if is_ctrl_c(exc):
            raise
        return {"train_throughput_error": failure_text(exc)}
    return {"train_throughput_img_s": tp.median_img_s, "train_throughput_spread_img_s": tp.spread_img_s,
            "train_throughput_repeats": tp.repeats, **tp.record_fields("train_throughput")}
