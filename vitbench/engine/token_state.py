"""The per-forward token state that travels through the blocks (docs/methods.md, "The hook point").

One small object, created fresh by the first block of every forward: ``size`` (patches per
token; ``None`` keeps timm's code path), ``source`` and ``fill`` (only when tracing, for
:func:`vitbench.engine.unmerge.unmerge`), ``prefix`` (protected leading tokens), ``key_bias``
(an additive attention-logit bias per key), ``private`` (method-private state) and, for
last-layer fusion, the tokens pruned aside (``keep(..., stash=True)``, :meth:`TokenState.restore`).
Every reduction goes through :meth:`TokenState.merge` or :meth:`TokenState.keep`, which change
``x`` and the state together and enforce the prefix rule (docs/token-state.md), raising
:class:`PrefixTokenError`."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from vitbench.engine.host_sync import host_reads_allowed
from vitbench.engine.matching import Matching
from vitbench.engine.rows import take_rows
from vitbench.errors import VitbenchError


class PrefixTokenError(VitbenchError, ValueError):
    """A reduction that would drop, reorder or merge a prefix token (class, distillation,
    register): a bug in the method that asked for it (docs/token-state.md, "Prefix tokens")."""


@dataclass
class TokenState:
    """Token bookkeeping of one forward pass (docs/methods.md, "The hook point")."""

    prefix: int
    size: Optional[torch.Tensor] = None
    source: Optional[torch.Tensor] = None
    fill: Optional[torch.Tensor] = None
    private: dict[str, Any] = field(default_factory=dict)
    key_bias: Optional[torch.Tensor] = None
    #: tokens the forward started with (what :meth:`restore` may bring the sequence back to)
    tokens: int = 0
    #: while tokens are pruned aside: each current token's position at the start ``[B, N]``
    origin: Optional[torch.Tensor] = None
    #: the tokens pruned aside, one ``_Stashed`` per :meth:`keep` with ``stash=True``
    stashed: list["_Stashed"] = field(default_factory=list)

    @classmethod
    def start(cls, x: torch.Tensor, prefix: int, trace_source: bool = False) -> "TokenState":
        """A fresh state for tokens ``x [B, N, C]`` entering the first block."""
        state = cls(prefix=prefix, tokens=x.shape[1])
        if trace_source:
            b, n, c = x.shape
            state.source = torch.eye(n, device=x.device, dtype=x.dtype).expand(b, n, n).clone()
            state.fill = torch.zeros(b, n, c, device=x.device, dtype=x.dtype)
        return state

    def sizes(self, x: torch.Tensor) -> torch.Tensor:
        """``size`` as a tensor ``[B, N, 1]`` (ones when nothing was merged yet)."""
        if self.size is not None:
            return self.size
        return torch.ones(x.shape[0], x.shape[1], 1, device=x.device, dtype=x.dtype)

    def attn_bias(self, dtype: torch.dtype) -> Optional[torch.Tensor]:
        """Proportional attention: ``log(size)`` of each key as a float bias ``[B, 1, 1, N]``.

        ``None`` while every token stands for one patch, so the fused kernel runs unmasked.
        A method's :attr:`key_bias` is added (alone when ``prop_attn`` is off: see
        :meth:`bias`).
        """
        if self.size is None:
            return self.key_bias.to(dtype) if self.key_bias is not None else None
        b, n = self.size.shape[:2]
        bias = self.size.log().reshape(b, 1, 1, n)
        bias = bias if bias.dtype == dtype else bias.to(dtype)
        return bias if self.key_bias is None else bias + self.key_bias.to(dtype)

    def bias(self, dtype: torch.dtype, prop_attn: bool) -> Optional[torch.Tensor]:
        """The attention bias a block uses: :meth:`attn_bias` with proportional attention,
        else only the method's :attr:`key_bias`."""
        if prop_attn:
            return self.attn_bias(dtype)
        return self.key_bias.to(dtype) if self.key_bias is not None else None

    # -- reductions ----------------------------------------------------------------------
    def merge(self, x: torch.Tensor, m: Matching) -> torch.Tensor:
        """Size-weighted merge of ``x`` by matching ``m`` (ToMe's weighted average, docs/methods.md, "ToMe").

        ``m`` must protect at least the state's prefix tokens (``m.prefix >= prefix``): a
        matching made with a smaller prefix could merge the class token into a patch.
        """
        self._refuse_merge_while_stashed()
        protected = getattr(m, "prefix", self.prefix)
        if protected < self.prefix:
            raise PrefixTokenError(
                f"TokenState.merge: the matching protects only the first {protected} token(s) but "
                f"the model has {self.prefix} prefix token(s) (class/distillation/register), which "
                f"must never be merged; build it with bipartite_soft_matching(metric, r, state.prefix)")
        size = self.sizes(x)
        if self.source is not None:
            self.source = m.merge(self.source, mode="sum")
        if hasattr(m, "weighted_merge") and not torch.compiler.is_compiling():
            x_new, self.size = m.weighted_merge(x, size)  # ToMe's Matching: the few-pass merge
            return x_new
        # (compiled, the textbook form: inductor fuses it into fewer loops than the few-pass one)
        merged = m.merge(torch.cat([x * size, size], dim=-1), mode="sum")
        x_new, size_new = merged[..., :-1], merged[..., -1:]
        self.size = size_new
        return x_new / size_new

    def merge_or_keep(self, x: torch.Tensor, m: Matching, index: torch.Tensor,
                      merge_rows: torch.Tensor) -> torch.Tensor:
        """Per image: the size-weighted merge by ``m`` where ``merge_rows [B]`` holds, else keep
        the tokens at ``index [B, N - r]`` (PPT, docs/methods.md, "PPT": pooling or pruning per
        image, ``r`` tokens fewer either way). Equal to :meth:`merge` on a copy, :meth:`keep` on
        another and :meth:`select`, in one pass over ``x``
        (:meth:`~vitbench.engine.matching.Matching.weighted_merge` with ``keep``); while tracing
        sources it is done that longer way (sources and fills need both branches)."""
        if self.source is not None or m.prefix < self.prefix or not hasattr(m, "weighted_merge"):
            merged, kept = self.copy(), self.copy()
            x_merge, x_keep = merged.merge(x, m), kept.keep(x, index)
            self.select(merge_rows, merged, kept)
            return torch.where(merge_rows[:, None, None], x_merge, x_keep)
        _check_prefix_first(index, self.prefix)
        x_new, self.size = m.weighted_merge(x, self.sizes(x), keep=(merge_rows, index))
        return x_new

    def keep(self, x: torch.Tensor, index: torch.Tensor, stash: bool = False) -> torch.Tensor:
        """Keep the tokens at ``index [B, N']`` (in that order); the others are pruned.

        Every row of ``index`` must start with the prefix tokens ``0 .. prefix-1`` in order
        (docs/token-state.md); the patches after them may come in any order (PPT keeps them
        sorted by score). Anything else raises :class:`PrefixTokenError` naming the bad rows.
        The check is one comparison and one ``.all()`` (a single host sync), nothing per token.

        With source tracing, the pruned tokens' current values go to ``fill`` for every patch
        they cover, so unmerge can restore a pruned patch's last value (docs/methods.md, "Unmerge").
        With ``stash``, the pruned tokens are set aside (with their gradients) for :meth:`restore`.
        """
        _check_prefix_first(index, self.prefix)
        if stash:
            self._stash(x, index)
        if self.source is not None and self.fill is not None:
            dropped = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
            dropped.scatter_(1, index, False)
            covers = (self.source > 0).to(x.dtype) * dropped[..., None].to(x.dtype)
            values = torch.einsum("btp,btc->bpc", covers, x.detach())
            covered = covers.sum(1)[..., None] > 0
            self.fill = torch.where(covered, values, self.fill)
            self.source = take_rows(self.source, index)
        if self.size is not None:
            self.size = take_rows(self.size, index)
        return take_rows(x, index)

    def cluster(self, x: torch.Tensor, assign: torch.Tensor, clusters: int) -> torch.Tensor:
        """Merge the patch tokens into ``clusters`` tokens by ``assign [B, N - prefix]`` (each
        patch's cluster, ``0 .. clusters-1``): the size-weighted average of each cluster, sizes
        and sources added (clustering merges: DPC-KNN, K-Medoids). The prefix tokens stay
        first, untouched; cluster ``k`` becomes token ``prefix + k``. Every cluster must hold
        at least one patch (an empty one would stand for no patch: an error)."""
        self._refuse_merge_while_stashed()
        p = self.prefix
        if assign.shape != (x.shape[0], x.shape[1] - p):
            raise ValueError(f"TokenState.cluster: assign must be [B, N - prefix] = "
                             f"{[x.shape[0], x.shape[1] - p]}, got {list(assign.shape)}")
        size = self.sizes(x)

        def pool(t: torch.Tensor) -> torch.Tensor:
            out = t.new_zeros(t.shape[0], clusters, t.shape[-1])
            return out.scatter_add(1, assign[..., None].expand(-1, -1, t.shape[-1]), t[:, p:])

        size_new = pool(size)
        if bool((size_new <= 0).any()):
            raise ValueError("TokenState.cluster: a cluster holds no patch token (every cluster needs one)")
        x_new = pool(x * size) / size_new
        if self.source is not None:
            self.source = torch.cat([self.source[:, :p], pool(self.source)], dim=1)
        self.size = torch.cat([size[:, :p], size_new], dim=1)
        return torch.cat([x[:, :p], x_new], dim=1)

    def restore(self, x: torch.Tensor) -> torch.Tensor:
        """Last-layer fusion (Cropr, Sec. 3.3): the tokens set aside by ``keep(..., stash=True)``
        rejoin ``x``, every token back at its position at the start of the forward; their sizes
        and sources come back with them. Without stashed tokens ``x`` is returned as it is."""
        if self.origin is None:
            return x
        parts = [(x, self.size, self.source, self.origin)] + [(s.x, s.size, s.source, s.origin) for s in self.stashed]
        order = torch.cat([origin for *_, origin in parts], dim=1).argsort(dim=1)
        x_all = take_rows(torch.cat([part[0] for part in parts], dim=1), order)
        if self.size is not None:
            self.size = take_rows(torch.cat([part[1] for part in parts], dim=1), order)
        if self.source is not None:
            self.source = take_rows(torch.cat([part[2] for part in parts], dim=1), order)
        self.origin, self.stashed = None, []
        return x_all

    def _stash(self, x: torch.Tensor, index: torch.Tensor) -> None:
        """Set aside the rows of ``x`` that ``index`` does not keep (and their state rows)."""
        if self.origin is None:
            if x.shape[1] != self.tokens:
                raise ValueError(f"TokenState.keep(stash=True): {x.shape[1]} tokens, not the {self.tokens} the "
                                 f"forward started with; tokens are set aside from the first reduction on")
            self.origin = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
        kept = torch.zeros(x.shape[:2], dtype=torch.int8, device=x.device)
        kept.scatter_(1, index, 1)
        dropped = kept.argsort(dim=1, stable=True)[:, :x.shape[1] - index.shape[1]]  # the zeros come first
        self.stashed.append(_Stashed(
            take_rows(x, dropped), None if self.size is None else take_rows(self.size, dropped),
            None if self.source is None else take_rows(self.source, dropped), take_rows(self.origin, dropped)))
        self.origin = take_rows(self.origin, index)

    def _refuse_merge_while_stashed(self) -> None:
        if self.origin is not None:
            raise ValueError("TokenState: tokens set aside for last-layer fusion (keep(stash=True)) rejoin by "
                             "position; a forward that stashes tokens cannot also merge them")

    def append(self, x: torch.Tensor, token: torch.Tensor, size: torch.Tensor,
               source: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Append one token ``[B, 1, C]`` standing for ``size [B, 1, 1]`` patches (EViT's fusion).

        The token goes last, so the prefix tokens stay first (nothing to check).
        """
        self._refuse_merge_while_stashed()
        self.size = torch.cat([self.sizes(x), size], dim=1)
        if self.source is not None:
            if source is None:
                raise ValueError("append() needs the new token's source while tracing sources")
            self.source = torch.cat([self.source, source], dim=1)
        return torch.cat([x, token], dim=1)

    # -- per-image branches (PPT) --------------------------------------------------------
    def copy(self) -> "TokenState":
        return TokenState(self.prefix, self.size, self.source, self.fill, copy.copy(self.private),
                          self.key_bias, self.tokens, self.origin, list(self.stashed))

    def select(self, choose_first: torch.Tensor, first: "TokenState", second: "TokenState") -> None:
        """Take ``first``'s tensors for images where ``choose_first [B]`` holds, else ``second``'s."""
        def pick(a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            if a is None and b is None:
                return None
            a = torch.ones_like(b) if a is None else a  # only ``size`` may be None on one side
            b = torch.ones_like(a) if b is None else b
            return torch.where(choose_first.view(-1, *([1] * (a.dim() - 1))), a, b)  # type: ignore[union-attr]
        self.size = pick(first.size, second.size)
        self.source = pick(first.source, second.source)
        self.fill = pick(first.fill, second.fill)


@dataclass(frozen=True)
class _Stashed:
    """Tokens pruned aside by one :meth:`TokenState.keep` with ``stash=True``, with their rows."""

    x: torch.Tensor
    size: Optional[torch.Tensor]
    source: Optional[torch.Tensor]
    origin: torch.Tensor


def _check_prefix_first(index: torch.Tensor, prefix: int) -> None:
    """Raise :class:`PrefixTokenError` unless every row of ``index [B, N']`` starts ``0 .. prefix-1``.

    Skipped where the forward may not read the device (:func:`~vitbench.engine.host_sync.device_only`,
    CUDA graph capture); the same forward ran, checked, before the capture."""
    if prefix == 0 or not host_reads_allowed():
        return
    if index.dim() != 2 or index.shape[1] < prefix:
        raise PrefixTokenError(
            f"TokenState.keep: index of shape {tuple(index.shape)} cannot hold the {prefix} prefix "
            f"token(s); it must be [B, N'] with N' >= {prefix}, each row starting "
            f"{list(range(prefix))} (class/distillation/register tokens are never pruned)")
    expected = torch.arange(prefix, device=index.device)
    head = index[:, :prefix]
    if bool((head == expected).all()):
        return
    bad = int((head != expected).any(dim=1).nonzero()[0, 0])
    row = index[bad].tolist()
    missing = [j for j in range(prefix) if j not in row]
    what = (f"drops prefix token(s) {missing}" if missing
            else f"reorders the prefix tokens (its row starts {row[:prefix]})")
    raise PrefixTokenError(
        f"TokenState.keep: the index {what} for image {bad}; every row must start with the "
        f"{prefix} prefix token(s) {expected.tolist()} in that order (class/distillation/register "
        f"tokens are never pruned or moved), then the kept patches")

