"""The conformance check every method plugin should pass (docs/architecture.md, method contract).

It checks what the suite relies on: parameters have defaults and reject unknown keys; the
reduced model keeps the output shape; tokens end fewer than they started (for a token
method); the forward is deterministic on CPU in eval mode; every reducer is a
:class:`vitbench.engine.Reducer` and only asks the attention for what it can hand over; and
every reduction step keeps the token rules (:mod:`vitbench.engine.token_rules`, the check the
benchmark runs before measuring): the prefix tokens (class, distillation, register) leave it
first, in order and unchanged (docs/token-state.md, "Prefix tokens"), the sequence never
grows, the token state counts the tokens it holds -- on the model under test and on tiny
models with several prefix tokens (a distilled DeiT: cls + dist; a ViT with two registers);
and the default parameters build on a 6-block and a 12-block ViT (a default block index
scales with the depth: :func:`vitbench.kit.chosen_layers`).
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn

from vitbench.engine import Reducer, reduction_context
from vitbench.host.apply import apply
from vitbench.engine.token_rules import token_rules_traced
from vitbench.engine.token_state import PrefixTokenError
from vitbench.errors import ParamError, TokenRuleError, UnsupportedError
from vitbench.catalog import missing_capabilities
from vitbench.core.params import make_params
from vitbench.host import get_host


#: the tiny models' timm kwargs (32x32 input, patch 4: 64 patches, 12 blocks of width 48)
TINY_KWARGS: dict[str, Any] = dict(img_size=32, patch_size=4, in_chans=3, num_classes=10,
                                   embed_dim=48, depth=12, num_heads=3, mlp_ratio=2.0)


def _tiny(cls: type, seed: int, overrides: dict[str, Any]) -> nn.Module:
    torch.manual_seed(seed)
    return cls(**{**TINY_KWARGS, **overrides}).eval()


def tiny_vit(seed: int = 0, **overrides: Any) -> nn.Module:
    """A tiny random timm ViT (32x32 input, patch 4: 64 patches + cls, 12 blocks) in eval mode.

    Twelve blocks so that methods' default block choices such as (3, 6, 9) exist.
    """
    from timm.models.vision_transformer import VisionTransformer

    return _tiny(VisionTransformer, seed, overrides)


def tiny_deit_distilled(seed: int = 0, **overrides: Any) -> nn.Module:
    """:func:`tiny_vit` as a distilled DeiT: two prefix tokens, class then distillation."""
    from timm.models.deit import VisionTransformerDistilled

    return _tiny(VisionTransformerDistilled, seed, overrides)


def tiny_vit_registers(seed: int = 0, **overrides: Any) -> nn.Module:
    """:func:`tiny_vit` with two register tokens: three prefix tokens, class then registers."""
    return tiny_vit(seed, **{"reg_tokens": 2, **overrides})


#: the models :func:`check_method` also traces the prefix tokens through (several prefix tokens)
PREFIX_MODELS: tuple[Callable[[], nn.Module], ...] = (tiny_deit_distilled, tiny_vit_registers)


@dataclass
class ConformanceReport:
    """What the check saw: tokens after each block, and the output shape."""

    method: str
    token_counts: list[int]
    output_shape: tuple[int, ...]


def check_method(name: str, params: Optional[dict[str, Any]] = None,
                 model_factory: Callable[[], nn.Module] = tiny_vit,
                 reduces_tokens: bool = True,
                 prefix_models: Sequence[Callable[[], nn.Module]] = PREFIX_MODELS) -> ConformanceReport:
    """Assert that method ``name`` conforms; raise ``AssertionError`` saying what does not.

    Besides the module's list, every reducer the method builds must be a
    :class:`~vitbench.engine.Reducer` (or ``None``).

    ``prefix_models``: further models on which the prefix rule alone is checked (skipped when
    the method does not support their family); the default has two and three prefix tokens.
    """
    spec = get_host().method(name)
    params = dict(params or {})
    try:
        make_params(spec.name, spec.params, {})  # every parameter has a valid default
    except ParamError as exc:
        raise AssertionError(f"{name}: the default parameters are not valid: {exc}") from exc
    try:
        make_params(spec.name, spec.params, {"no_such_parameter": 1})
    except ParamError:
        pass
    else:
        raise AssertionError(f"{name}: an unknown parameter was accepted")

    base = model_factory()
    _check_reducer_types(name, params, base)
    x = torch.randn(2, *_input_size(base), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        expected = base(x)
    try:
        reduced = apply(copy.deepcopy(base), name, **params)
    except UnsupportedError as exc:  # its reducers ask for what a ViT does not provide
        raise AssertionError(f"{name}: {exc}") from exc
    context = reduction_context(reduced)
    assert context is not None, f"{name}: apply() did not patch the model"
    with torch.inference_mode():
        first = check_prefix_tokens(reduced, x, name)
    with torch.inference_mode():
        second = _forward(name, reduced, x)
    assert first.shape == expected.shape, f"{name}: output shape {tuple(first.shape)} != {tuple(expected.shape)}"
    assert torch.equal(first, second), f"{name}: two eval forwards on CPU differ"
    counts = list(context.token_counts)  # that they never grow, the token rules checked above
    n0 = base.patch_embed.num_patches + base.num_prefix_tokens
    if reduces_tokens:  # the least count: a method with last-layer fusion ends on every token again
        assert min(counts) < n0, f"{name}: tokens did not shrink ({n0} -> {counts})"
    for factory in prefix_models:
        _check_prefix_rule(name, params, factory)
    if "vit" in get_host().families_for(spec):
        _check_defaults_fit_depths(name)
    return ConformanceReport(spec.name, counts, tuple(first.shape))


#: the depths a method's defaults must fit: a small ViT and the usual 12 blocks
DEFAULT_DEPTHS = (6, 12)


def _check_defaults_fit_depths(name: str) -> None:
    """Method ``name`` with every parameter at its default builds on a ViT of each of
    :data:`DEFAULT_DEPTHS` blocks: a default block index must scale with the depth."""
    for depth in DEFAULT_DEPTHS:
        try:
            apply(tiny_vit(depth=depth), name)
        except ParamError as exc:
            raise AssertionError(f"{name}: the default parameters do not fit a {depth}-block ViT: {exc}") from exc


def _check_reducer_types(name: str, params: dict[str, Any], model: nn.Module) -> None:
    """Every reducer ``name`` builds for ``model`` is ``None`` or a :class:`~vitbench.engine.Reducer`
    (built aside, with the random state restored, so the checked model is built as usual)."""
    host = get_host()
    spec, family = host.method(name), host.family_of(model)
    if missing_capabilities(spec, family):
        return  # apply() says so
    with torch.random.fork_rng(devices=[]):
        reduction = spec.build(make_params(spec.name, spec.params, params), family.describe(model))
    for i, reducer in enumerate(reduction.reducers):
        assert reducer is None or isinstance(reducer, Reducer), (
            f"{name}: block {i}'s reducer {type(reducer).__name__!r} is not a vitbench.engine.Reducer; subclass it "
            f"(docs/token-state.md, \"The reducer contract\")")


def _forward(name: str, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``model(x)``, a prefix violation caught by :meth:`TokenState.keep`/``merge`` turned into
    the check's ``AssertionError``."""
    try:
        return model(x)
    except PrefixTokenError as exc:
        raise AssertionError(f"{name}: {exc}") from exc


def _check_prefix_rule(name: str, params: dict[str, Any], factory: Callable[[], nn.Module]) -> None:
    """Trace the prefix tokens of ``factory()`` through every reduction step of ``name``."""
    base = factory()
    host = get_host()
    if missing_capabilities(host.method(name), host.family_of(base)):
        return
    x = torch.randn(2, *_input_size(base), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        check_prefix_tokens(apply(base, name, **params), x, name)


def check_prefix_tokens(model: nn.Module, x: torch.Tensor, name: Optional[str] = None) -> torch.Tensor:
    """``model(x)`` for a reduced ``model``, asserting that every reduction step keeps the token
    rules (:mod:`vitbench.engine.token_rules`): the prefix tokens (class, distillation,
    register) leave it first, in order and unchanged (docs/token-state.md); the sequence never
    grows; the token state counts the tokens the step returns.

    :func:`check_method` runs it on freshly applied models; call it yourself on a model whose
    method only reduces once trained (e.g. LTMP with trained thresholds). Raises
    ``AssertionError`` naming the block and the broken rule (what happened to which prefix token).
    """
    context = reduction_context(model)
    assert context is not None, "check_prefix_tokens: the model is not reduced (apply a method first)"
    try:
        with token_rules_traced(model, name or context.method):
            return model(x)
    except TokenRuleError as exc:
        raise AssertionError(str(exc)) from exc


def _input_size(model: nn.Module) -> tuple[int, int, int]:
    img = model.patch_embed.img_size
    return (model.patch_embed.proj.in_channels, int(img[0]), int(img[1]))
