"""timm model names: the closest matches to a misspelt one, and the error that lists them."""
from __future__ import annotations

import difflib
import re
from typing import Optional

import timm

from vitbench.errors import UnknownNameError

__all__ = ["suggest_models", "unknown_model"]


def suggest_models(name: str, limit: int = 8) -> list[str]:
    """timm model names close to ``name``: wildcard matches of its parts, then difflib's."""
    all_names = timm.list_models()
    parts = [p for p in re.split(r"[_\-.\s]+", name.lower()) if p]
    found: list[str] = []
    if parts:
        found += timm.list_models("*" + "*".join(parts) + "*")[:limit]
    found += difflib.get_close_matches(name.lower(), all_names, n=limit, cutoff=0.6)
    return list(dict.fromkeys(found))[:limit]


def unknown_model(name: str, default: Optional[str] = None) -> UnknownNameError:
    """The error for a model name timm does not know, with the closest names; ``default``: the
    task's embedded default model, named as the other choice."""
    close = suggest_models(name)
    hint = f"close timm models: {', '.join(close)}" if close else "no timm model name is close"
    other = f"or {default!r}, the embedded default; " if default else ""
    return UnknownNameError(f"unknown model {name!r}; {hint} ({other}all names: timm.list_models())")
