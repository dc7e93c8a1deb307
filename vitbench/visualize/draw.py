"""Drawing group maps over the image (matplotlib's object API on the Agg canvas, no display).

:func:`paint` colours one map in numpy: each group of two or more patches one colour over the
image, a patch still on its own left plain, a pruned patch greyed, and a line (dark over bright
pixels, light over dark ones) wherever neighbouring pixels belong to different groups.
:func:`draw_figure` lays out one row per method (the image, then one panel per chosen block) and
writes a PNG whole or not at all.
"""
from __future__ import annotations

import colorsys
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vitbench.core.cache import atomic_write
from vitbench.visualize.groups import DROPPED, BlockGroups

__all__ = ["Row", "draw_figure", "paint"]

#: the shortest side of a drawn panel, in pixels (small images are enlarged by whole steps)
MIN_SIDE = 192
#: how much of a merged group's colour covers the image
TINT = 0.5
GREY = np.array([0.55, 0.55, 0.55])
#: group boundaries: dark over bright pixels, light over dark ones
DARK_EDGE, LIGHT_EDGE = np.array([0.05, 0.05, 0.05]), np.array([0.85, 0.85, 0.85])


@dataclass(frozen=True)
class Row:
    """One method's row: its label and the group maps after the chosen blocks."""

    label: str
    maps: list[BlockGroups]


def _colour(first_patch: int) -> np.ndarray:
    """A group's colour from its first patch: golden-ratio hues, so neighbours differ."""
    return np.array(colorsys.hsv_to_rgb((first_patch * 0.6180339887) % 1.0, 0.8, 0.95))


def scale_of(picture: np.ndarray) -> int:
    """The whole enlargement that brings the picture's short side to :data:`MIN_SIDE` or more."""
    return max(1, -(-MIN_SIDE // min(picture.shape[:2])))


def paint(picture: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """``picture [H, W, 3]`` (0..1) with ``groups [gh, gw]`` painted over it, enlarged by
    :func:`scale_of`; returns ``[H*s, W*s, 3]``."""
    s = scale_of(picture)
    h, w = picture.shape[:2]
    gh, gw = groups.shape
    if h % gh or w % gw:
        raise ValueError(f"paint: a {h}x{w} picture does not split into a {gh}x{gw} patch grid")
    big = picture.repeat(s, axis=0).repeat(s, axis=1)
    labels = groups.repeat(h // gh * s, axis=0).repeat(w // gw * s, axis=1)
    out = big.copy()
    flat = groups.ravel()
    for g in np.unique(flat):
        where = labels == g
        if g == DROPPED:
            out[where] = 0.3 * big[where] + 0.7 * GREY
        elif (flat == g).sum() > 1:
            out[where] = (1 - TINT) * big[where] + TINT * _colour(int(np.argmax(flat == g)))
    edge = np.zeros(labels.shape, dtype=bool)
    edge[:, :-1] |= labels[:, :-1] != labels[:, 1:]
    edge[:-1, :] |= labels[:-1, :] != labels[1:, :]
    bright = out.mean(axis=2) > 0.45
    out[edge & bright] = DARK_EDGE
    out[edge & ~bright] = LIGHT_EDGE
    return np.clip(out, 0.0, 1.0)


def _title(m: BlockGroups) -> str:
    patches = m.tokens - m.prefix
    dropped = f", {m.num_dropped} dropped" if m.num_dropped else ""
    return f"after block {m.block}\n{patches} patch tokens{dropped}"


def draw_figure(rows: list[Row], picture: np.ndarray, caption: str, out: Path) -> Path:
    """One row per method (the image, then a panel per block) as a PNG at ``out``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = 1 + max(len(row.maps) for row in rows)
    fig = Figure(figsize=(2.3 * cols, 2.6 * len(rows)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(rows), cols, squeeze=False)
    big = picture.repeat(scale_of(picture), axis=0).repeat(scale_of(picture), axis=1)
    for r, row in enumerate(rows):
        axes[r, 0].imshow(big)
        axes[r, 0].set_title(caption if r == 0 else "input", fontsize=8)
        axes[r, 0].set_ylabel(row.label, fontsize=9)
        for c, m in enumerate(row.maps, start=1):
            axes[r, c].imshow(paint(picture, m.groups.numpy()))
            axes[r, c].set_title(_title(m), fontsize=8)
        for ax in axes[r]:
            ax.set_xticks([])
            ax.set_yticks([])
            if not ax.images:
                ax.set_axis_off()
    fig.suptitle("colour: patches merged into one token; plain: a patch on its own; grey: pruned", fontsize=9)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    atomic_write(out, lambda tmp: tmp.write_bytes(buf.getvalue()))
    return out
