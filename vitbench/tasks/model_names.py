"""timm model names: the closest matches to a misspelt one, and the error that lists them.

Suggestions come from the models the registered families accept (``vitbench list models``: each
family's patterns, timm modules and exclusions, :func:`family_models`),
or from every timm name when no family is registered: names whose start is close to the
misspelt name (``deit_tinyy`` -> ``deit_tiny_patch16_224``), then names close as a whole.
"""
from __future__ import annotations

import difflib
import re

import timm

from vitbench.catalog import FamilySpec
from vitbench.errors import UnknownNameError
from vitbench.host import get_host

__all__ = ["accepted_models", "family_models", "suggest_models", "supported_models", "unknown_model"]

#: how close (difflib ratio) a name's start of the same length must be to count as a match
_PREFIX_CUTOFF = 0.8
#: how close a whole name must be
_WHOLE_CUTOFF = 0.6


def family_models(family: FamilySpec) -> list[str]:
    """The timm names ``family`` declares it accepts: those its ``model_patterns`` match, from its
    ``model_modules`` (any module when empty), less its ``model_excludes``."""
    if not family.model_patterns:
        return []
    modules = family.model_modules or ("",)
    return sorted({name for module in modules for name in timm.list_models(
        list(family.model_patterns), module=module, exclude_filters=list(family.model_excludes))})


def accepted_models() -> dict[str, str]:
    """Each timm name a registered family accepts (:func:`family_models`), mapped to that family."""
    host = get_host()
    found: dict[str, str] = {}
    for family in sorted(host.names("families")):
        for name in family_models(host.specs("families")[family]):
            found.setdefault(name, family)
    return dict(sorted(found.items()))


def supported_models() -> list[str]:
    """The timm names the registered model families accept (every timm name if none declares any)."""
    return list(accepted_models()) or timm.list_models()


def suggest_models(name: str, limit: int = 8) -> list[str]:
    """Supported model names close to ``name``: wildcard matches of its parts and names whose
    start or whole is close (difflib ratio), closest first."""
    candidates = supported_models()
    query = name.lower().strip()
    if not query:
        return []
    parts = [p for p in re.split(r"[_\-.\s]+", query) if p]
    wildcard = set(timm.list_models("*" + "*".join(parts) + "*")) if parts else set()
    scored = []
    matcher = difflib.SequenceMatcher(b=query)
    for candidate in candidates:
        matcher.set_seq1(candidate)
        whole = matcher.ratio()
        matcher.set_seq1(candidate[:len(query)])
        start = matcher.ratio() if len(candidate) > len(query) else 0.0
        if candidate in wildcard or start >= _PREFIX_CUTOFF or whole >= _WHOLE_CUTOFF:
            scored.append((-max(start, whole), -whole, candidate))
    found = [candidate for *_, candidate in sorted(scored)]
    return list(dict.fromkeys(found))[:limit]


def unknown_model(name: str, default: str | None = None) -> UnknownNameError:
    """The error for a model name timm does not know, with the closest names; ``default``: the
    task's embedded default model, named as the other choice."""
    close = suggest_models(name)
    hint = f"close timm models: {', '.join(close)}" if close else "no timm model name is close"
    other = f"or {default!r}, the embedded default; " if default else ""
    return UnknownNameError(f"unknown model {name!r}; {hint} ({other}all names: `vitbench list models`, "
                            f"timm.list_models())")
