"""The token rules every reduction step keeps (docs/token-state.md), checked on one forward.

A reducer's token step may keep, merge or drop patch tokens, nothing else. Per step:
``prefix``: the prefix tokens (class, distillation, register) leave it first, in their order,
unchanged (told apart by value: a step moves tokens, never recomputes one), and
``TokenState.keep``/``merge`` are not asked to move them (``PrefixTokenError``);
``growth``: the sequence never grows (a step with ``Reducer.restores``, last-layer fusion, may bring
it back to the tokens the forward started with); ``state``: the token state counts the tokens the step
returns (one ``size``/``source`` row per token), as ``keep``/``merge``/``cluster`` leave it;
``batch``: every image stays; ``finite``: a step given finite tokens returns finite ones. The prefix is compared with a
copy taken before the step, so a step that edits its input in place cannot hide a change.

:func:`check_token_rules` runs a reduced model once with every reducer traced, leaves it as it was,
and raises :class:`~vitbench.errors.TokenRuleError` naming the method, the block and the rule;
the tasks run it before measuring, :func:`vitbench.testing.check_method` in its check.
"""
from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable, Optional

import torch
from torch import nn

from vitbench.engine.attention import AttnInfo
from vitbench.engine.block import reduction_context
from vitbench.engine.reducer import FAMILY_HOOKS, FamilyHooks, Reducer, hook_names
from vitbench.engine.step_shapes import check_step_shapes, rule_error
from vitbench.engine.token_state import PrefixTokenError, TokenState
from vitbench.errors import TokenRuleError

__all__ = ["check_token_rules", "prefix_names", "token_rules_traced"]

#: how many of the given images :func:`check_token_rules` runs the model on
CHECK_IMAGES = 4


def check_token_rules(model: nn.Module, images: torch.Tensor, method: Optional[str] = None) -> None:
    """Run the reduced ``model`` once on the first :data:`CHECK_IMAGES` of ``images`` with every
    reduction step checked (module doc); raise :class:`~vitbench.errors.TokenRuleError` on the
    first broken rule. In eval mode, without gradients, on ``model``'s device; ``model`` is left
    as it was (:func:`_state_kept`: its modules' and reducers' attributes, buffers and training
    modes, the reduction context, the random state). An unreduced model passes."""
    context = reduction_context(model)
    if context is None:
        return
    first = next(iter(model.parameters()), None)
    x = images[:CHECK_IMAGES]
    if first is not None:
        x = x.to(first.device, first.dtype if first.is_floating_point() else x.dtype)
    devices = [x.device.index or 0] if x.device.type == "cuda" else []
    with _state_kept(model), torch.random.fork_rng(devices=devices), torch.no_grad():
        with token_rules_traced(model.eval(), method):
            model(x)


@contextmanager
def _state_kept(model: nn.Module) -> Iterator[None]:
    """Put back, on leaving, what a forward may change: the attributes (training modes, a
    reducer's observed shapes, registered tensors) of every module, plain reducer and the
    reduction context, and the values of the buffers."""
    objects: list[Any] = [reduction_context(model), *model.modules()]
    objects += [m.reducer for m in _reducing_modules(model) if not isinstance(m.reducer, nn.Module)]
    saved = [(vars(obj), dict(vars(obj))) for obj in objects]
    saved += [(d, dict(d)) for m in model.modules() for d in (m._parameters, m._buffers, m._modules)]
    values = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        yield
    finally:
        for attrs, before in saved:
            attrs.clear()
            attrs.update(before)
        with torch.no_grad():
            for buffer, value in values:
                buffer.copy_(value)


@contextmanager
def token_rules_traced(model: nn.Module, method: Optional[str] = None) -> Iterator[None]:
    """While active, every reduction step of the reduced ``model`` is checked as it runs (in
    place: call the model yourself); a broken rule raises :class:`~vitbench.errors.TokenRuleError`."""
    context = reduction_context(model)
    if context is None:
        raise ValueError("token_rules_traced: the model is not reduced (apply a method first)")
    trace = _RuleTrace(method or context.method, model, prefix_names(model))
    with trace:
        try:
            yield
        except PrefixTokenError as exc:  # TokenState.keep/merge refused the step
            raise trace.error(trace.current, "prefix", str(exc)) from exc


def prefix_names(model: nn.Module) -> list[str]:
    """What the prefix tokens of a timm ViT are, in their order: ``cls``, ``dist``, ``reg0``..."""
    names = ["cls"] if getattr(model, "cls_token", None) is not None else []
    if getattr(model, "dist_token", None) is not None:
        names.append("dist")
    names += [f"reg{i}" for i in range(getattr(model, "num_reg_tokens", 0) or 0)]
    n = getattr(model, "num_prefix_tokens", 0) or 0
    return names if len(names) == n else [f"prefix{i}" for i in range(n)]


def _reducing_modules(model: nn.Module) -> list[nn.Module]:
    """The modules that run a reducer: a family's reducing blocks (``index`` and ``reducer``)."""
    return [m for m in model.modules() if isinstance(getattr(m, "reducer", None), Reducer) and hasattr(m, "index")]


class _RuleTrace:
    """Checks every reducer of ``model`` as it runs (an ``nn.Module`` reducer through a forward
    hook, a plain one wrapped in :class:`_Traced`); :attr:`current` is the block running."""

    def __init__(self, method: str, model: nn.Module, names: list[str]) -> None:
        self.method, self.names = method, names
        self.blocks = _reducing_modules(model)
        self.current: Any = None
        self._prefix: Optional[torch.Tensor] = None  # the running step's prefix tokens, copied before it
        self._undo: list[Callable[[], None]] = []

    def __enter__(self) -> "_RuleTrace":
        for block in self.blocks:
            hook = block.register_forward_pre_hook(lambda mod, args, b=block: setattr(self, "current", b.index))
            self._undo.append(hook.remove)
            reducer = block.reducer
            if isinstance(reducer, nn.Module):
                before = reducer.register_forward_pre_hook(lambda mod, args: self.remember(args[0], args[1]))
                hook = reducer.register_forward_hook(
                    lambda mod, args, out, b=block: self.check(b.index, args[0], args[1], out, mod.restores))
                self._undo += [before.remove, hook.remove]
            else:
                block.reducer = traced(reducer, self, block.index)
                self._undo.append(lambda b=block, r=reducer: setattr(b, "reducer", r))
        return self

    def __exit__(self, *exc: object) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo = []

    def error(self, block: Any, rule: str, what: str) -> TokenRuleError:
        return rule_error(self.method, block, rule, what)

    def remember(self, x_in: torch.Tensor, state: TokenState) -> None:
        """Copy the prefix tokens before the step runs: a step that changes them in place changes
        ``x_in`` too, so the check compares with this copy."""
        self._prefix = x_in[:, :state.prefix].clone() if isinstance(x_in, torch.Tensor) and x_in.dim() == 3 else None

    def check(self, block: int, x_in: torch.Tensor, state: TokenState, x_out: torch.Tensor,
              restores: bool = False) -> None:
        """Raise :class:`TokenRuleError` if the step ``x_in -> x_out`` of ``block`` breaks a rule
        (``restores``: the step may grow the sequence back to the forward's first count)."""
        before, self._prefix = self._prefix, None
        if not isinstance(x_out, torch.Tensor) or x_out.dim() != 3 or x_in.dim() != 3:
            return
        check_step_shapes(self.method, block, x_in, x_out, state, restores)
        if x_out.shape[2] != x_in.shape[2]:
            return  # channels changed: a channel selection, not a token step
        if not bool(torch.isfinite(x_out).all()) and bool(torch.isfinite(x_in).all()):
            raise self.error(block, "finite", "the step turns finite tokens into NaN or inf")  # passed on: the NaN guards
        n_out = x_out.shape[1]
        self._check_prefix(block, x_in if before is None else before, state.prefix, x_out)
        for name in ("size", "source"):
            rows = getattr(state, name)
            if rows is not None and tuple(rows.shape[:2]) != tuple(x_out.shape[:2]):
                raise self.error(block, "state", f"the step returns {n_out} tokens but the token state's "
                                                 f"{name} has {rows.shape[1]} rows; reduce through "
                                                 f"TokenState.keep/merge/cluster, which change both together "
                                                 f"(docs/token-state.md)")

    def _check_prefix(self, block: int, x_in: torch.Tensor, prefix: int, x_out: torch.Tensor) -> None:
        if prefix == 0:
            return
        p_out = min(prefix, x_out.shape[1])
        same = torch.isclose(x_out[:, :p_out, None], x_in[:, None, :prefix], rtol=1e-5, atol=1e-6, equal_nan=True).all(-1)
        if p_out == prefix and bool(same.diagonal(dim1=1, dim2=2).all()):
            return
        raise self.error(block, "prefix", f"it drops or reorders the prefix tokens "
                                          f"({self._describe(x_in, x_out, prefix)}); the {prefix} prefix token(s) "
                                          f"{self.names} must stay first, in order, unchanged (docs/token-state.md)")

    def _describe(self, x_in: torch.Tensor, x_out: torch.Tensor, prefix: int) -> str:
        """What happened to each prefix token in the first image where the rule breaks."""
        found = torch.isclose(x_out[:, :, None], x_in[:, None, :prefix], rtol=1e-5, atol=1e-6, equal_nan=True).all(-1)
        for b in range(x_in.shape[0]):
            details = []
            for j, token in enumerate(self.names[:prefix]):
                where = found[b, :, j].nonzero().flatten().tolist()
                if not where:
                    details.append(f"{token} dropped or changed")
                elif j not in where:
                    details.append(f"{token} moved to position {where[0]}")
            if details:
                return f"image {b}: " + ", ".join(details)
        return "the output has fewer tokens than the prefix"


class _Traced(Reducer):
    """A plain reducer with :class:`_RuleTrace`'s check around its token step; every other
    member is the reducer's own."""

    def __init__(self, reducer: Reducer, trace: _RuleTrace, block: int) -> None:
        self._reducer, self._trace, self._block = reducer, trace, block
        self.needs = reducer.needs
        self.selects_channels = reducer.selects_channels
        self.records_grid_merge = reducer.records_grid_merge
        self.before_attention = reducer.before_attention
        self.restores = reducer.restores

    def __call__(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        self._trace.remember(x, state)
        out = self._reducer(x, state, info)
        self._trace.check(self._block, x, state, out, self.restores)
        return out

    def __getattr__(self, name: str) -> Any:  # a family reading more than the contract
        reducer = self.__dict__.get("_reducer")
        if reducer is None:
            raise AttributeError(name)
        return getattr(reducer, name)

    def qk(self, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._reducer.qk(q, k, x)

    def mlp_forward(self, mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return self._reducer.mlp_forward(mlp, x)

    def observe(self, module: nn.Module, x: torch.Tensor) -> None:
        self._reducer.observe(module, x)


def _forwarding(hooks: type[FamilyHooks]) -> dict[str, Any]:
    """Methods that hand each of ``hooks``' methods to the traced reducer's own."""
    def forward_to(name: str) -> Any:
        return lambda self, *args, **kwargs: getattr(self._reducer, name)(*args, **kwargs)

    return {name: forward_to(name) for name in hook_names(hooks)}


@functools.lru_cache(maxsize=None)
def _traced_class(hooks: tuple[type[FamilyHooks], ...]) -> type[_Traced]:
    """:class:`_Traced` that is also each of ``hooks``, each hook forwarded to the reducer."""
    members: dict[str, Any] = {}
    for mixin in hooks:
        members.update(_forwarding(mixin))
    return type("_Traced", (_Traced, *hooks), members)


def traced(reducer: Reducer, trace: _RuleTrace, block: int) -> _Traced:
    """``reducer`` wrapped in the rule check, keeping the family hooks it inherits."""
    hooks = tuple(mixin for mixin in FAMILY_HOOKS if isinstance(reducer, mixin))
    return _traced_class(hooks)(reducer, trace, block)
