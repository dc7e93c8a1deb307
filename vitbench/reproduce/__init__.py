"""``vitbench reproduce``: the built-in methods' published rows as runnable recipes.

:mod:`~vitbench.reproduce.recipes` holds the rows (model, parameters, the paper's GFLOPs and
top-1, the source); :mod:`~vitbench.reproduce.check` counts a row's GMACs on random weights
against the paper's; :mod:`~vitbench.reproduce.run` runs a row through :func:`vitbench.api.run`
and adds the published numbers under the report (docs/reproduce.md).
"""
from __future__ import annotations

from vitbench.reproduce.recipes import RECIPES, Recipe, recipe

__all__ = ["RECIPES", "Recipe", "recipe"]
