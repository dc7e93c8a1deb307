"""One figure of merged and pruned patches: methods x blocks for one image (``vitbench visualize``).

Every input is checked first (methods and their parameters, the image, the model's name and
family, the output folder), then the model loads, the blocks are checked against its depth, and
each method is applied to its own copy, traced (:mod:`vitbench.visualize.groups`) and drawn
(:mod:`vitbench.visualize.draw`). Random initialisations inside methods draw from ``seed``.
"""
from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from vitbench.errors import UnsupportedError
from vitbench.tasks.embedded import DEFAULT_MODEL
from vitbench.visualize.inputs import (
    check_blocks, check_image_source, check_out, check_vit_name, default_blocks, load_image, load_vit,
)
from vitbench.host import get_host
from vitbench.host.apply import apply
from vitbench.host.values import values_of
from vitbench.visualize.draw import Row, draw_figure
from vitbench.visualize.groups import trace_groups

__all__ = ["Choice", "check_choices", "figure_name", "visualize"]


@dataclass(frozen=True)
class Choice:
    """One row: a registered method, its parameter overrides and (optionally) its label."""

    method: str
    params: Mapping[str, Any] = field(default_factory=dict)
    label: Optional[str] = None

    def title(self) -> str:
        if self.label:
            return self.label
        given = ", ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.method} ({given})" if given else self.method


def check_choices(choices: Sequence[Choice]) -> list[Any]:
    """Unknown methods, methods without the ViT family and bad parameters fail here, model-free;
    each choice's parameters parsed into its method's dataclass, in order."""
    if not choices:
        raise UnsupportedError("--method names no method; give one or more, e.g. tome,topk "
                               "(see `vitbench list methods`)")
    host = get_host()
    for choice in choices:
        spec = host.method(choice.method)
        if "vit" not in host.families_for(spec):
            raise UnsupportedError(f"method {spec.name!r} does not support ViT/DeiT models; "
                                   f"{spec.name} runs on: {', '.join(host.families_for(spec))}")
    return [values_of(c.method, c.params) for c in choices]


def _same_grid(method: str, base: torch.nn.Module, reduced: torch.nn.Module) -> None:
    """A method that changes the patch grid (``downsample``: a smaller image) has no patches of
    the original to draw."""
    before, after = (tuple(int(g) for g in m.patch_embed.grid_size) for m in (base, reduced))  # type: ignore[union-attr]
    if before != after:
        raise UnsupportedError(f"method {method!r} changes the patch grid ({before[0]}x{before[1]} to "
                               f"{after[0]}x{after[1]}): visualize draws which patches of the image a method "
                               f"merged or pruned, and it keeps none of them; leave it out of --method")


def figure_name(choices: Sequence[Choice]) -> str:
    """``visualize-tome-topk.png``: the file name of a figure of ``choices`` (``visualize-7-methods.png``
    past four methods)."""
    names = dict.fromkeys(re.sub(r"[^A-Za-z0-9_.-]+", "_", c.method) for c in choices)
    return f"visualize-{'-'.join(names)}.png" if len(names) <= 4 else f"visualize-{len(names)}-methods.png"


def visualize(choices: Sequence[Choice], out: str | Path, *, model: str = DEFAULT_MODEL,
              image: Optional[str] = None, index: int = 0, blocks: Optional[list[int]] = None,
              checkpoint: Optional[str] = None, pretrained: bool = False, seed: int = 0,
              filename: Optional[str] = None) -> Path:
    """Draw ``choices`` on ``model`` for one image into ``out``; returns the PNG's path."""
    values = check_choices(choices)
    check_image_source(image, index)
    check_vit_name(model)
    folder = check_out(str(out))
    base = load_vit(model, checkpoint=checkpoint, seed=seed, pretrained=pretrained)
    depth = len(base.blocks)  # type: ignore[arg-type]
    chosen = default_blocks(depth) if blocks is None else list(blocks)
    check_blocks(chosen, depth, model)
    x, picture, caption = load_image(base, image, index)
    rows = []
    for choice, chosen_values in zip(choices, values):
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            reduced = apply(copy.deepcopy(base), choice.method, chosen_values).eval()
            _same_grid(choice.method, base, reduced)
            rows.append(Row(choice.title(), trace_groups(reduced, x, chosen)))
    return draw_figure(rows, picture, f"{model}\n{caption}", folder / (filename or figure_name(choices)))
