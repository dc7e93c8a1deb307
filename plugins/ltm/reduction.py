"""The ``ltm`` plugin's reduction code (its reducers and ``build``), imported when a run asks for
the method; its parameters and registration are :mod:`vitbench_plugins.ltm`, which every
command imports and which therefore imports no torch.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterator
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from vitbench.errors import UnsupportedError
from vitbench.kit import (
    AttnInfo, FamilySpec, MergeGrid, ModelInfo, Reducer, Reduction, TileUnmerge, TokenState, TrainStage, get_host,
    record_grid_merge, reduction_context, stage_epochs, straight_through_mask,
)
from vitbench.kit.ib import (
    KMEANS_SAMPLES, ClassSums, feature_source, ib_terms, input_vectors, kmeans_centroids, module_features,
    pooled_features, run_seed, soft_assign,
)
from vitbench_plugins.ltm import LTMParams


__all__ = [
    "FirstMerge",
    "LTMParams",
    "ReMerge",
    "TileMerge",
    "block_assign",
    "feature_module",
    "ib_mask_step",
    "ib_weight_at",
    "pooling_cells",
    "pooling_logits",
    "refresh_statistics",
    "soft_merge",
]
#: what trains when the IB step's MLPs are frozen (``mlp_lr=0``): ``M1``, the ``M_l`` logits, ``s_l``
TRAINED_WITHOUT_MLPS = (".reducer.logits", ".reducer.mask_logits", ".reducer.scale")
FEATURES_KEY = "ltm_features"  # ctx.extras: the final block's features for the IB bound
_OUTSIDE_LOGIT = -12.0  # M1 / tau outside the pooling window (e^-12: a 6e-6 leak per patch)
_KEEP_LOGIT = 3.0  # initial M_l logits: keep (95% kept under training noise at tau = 1)
_EPS = 1e-12


# -- the pooling initialisation ------------------------------------------------------------
def pooling_cells(num_cells: int, p: int) -> torch.Tensor:
    """The ``p`` grid cells (raster indices) the merged tokens start from, spread evenly."""
    return torch.floor(torch.linspace(0, num_cells - 1, p, dtype=torch.float64) + 0.5).long()


def _windows(n: int, m: int) -> torch.Tensor:
    """``[m, n]``: which of ``n`` inputs adaptive average pooling to ``m`` outputs averages."""
    i, r = torch.arange(m), torch.arange(n)
    start, end = (i * n) // m, -((-(i + 1) * n) // m)
    return (r[None] >= start[:, None]) & (r[None] < end[:, None])


def pooling_logits(grid: tuple[int, int], cells: tuple[int, int], p: int, outside: float) -> torch.Tensor:
    """``M1 [H*W, p]``: 0 inside each merged token's pooling window, ``outside`` elsewhere."""
    (h, w), (gh, gw) = grid, cells
    rows, cols = _windows(h, gh), _windows(w, gw)
    inside = (rows[:, None, :, None] & cols[None, :, None, :]).reshape(gh * gw, h * w)
    inside = inside[pooling_cells(gh * gw, p)].t()
    return torch.where(inside, torch.tensor(0.0), torch.tensor(outside))


def snake_order(grid: tuple[int, int]) -> torch.Tensor:
    """The raster indices of an ``H x W`` grid along a boustrophedon path (row 0 left to right,
    row 1 right to left, ...): consecutive entries are always spatial neighbours."""
    h, w = grid
    rows = [torch.arange(r * w, (r + 1) * w) for r in range(h)]
    return torch.cat([row if r % 2 == 0 else row.flip(0) for r, row in enumerate(rows)])


def run_logits(grid: tuple[int, int], cells: tuple[int, int], p: int, outside: float) -> torch.Tensor:
    """``M1 [H*W, p]`` for the least pooling that reaches ``p`` tokens: the path of
    :func:`snake_order` is cut into ``p`` contiguous runs of ``floor(N/p)`` or ``ceil(N/p)``
    patches (cut points ``floor(linspace(0, N, p + 1) + 0.5)``, so the longer runs are spread
    evenly), merged token ``q`` averages run ``q`` (0 inside, ``outside`` elsewhere), and the
    tokens are ordered by the first patch (raster order) of their run, so ``p = N`` is the
    identity. ``cells`` is unused (the signature of :func:`pooling_logits`)."""
    n = grid[0] * grid[1]
    path = snake_order(grid)
    cuts = torch.floor(torch.linspace(0, n, p + 1, dtype=torch.float64) + 0.5).long()
    runs = sorted((path[cuts[q]:cuts[q + 1]] for q in range(p)), key=lambda run: int(run.min()))
    logits = torch.full((n, p), float(outside))
    for q, run in enumerate(runs):
        logits[run, q] = 0.0
    return logits


# -- the merge -------------------------------------------------------------------------------
def merge_shares(g: torch.Tensor) -> torch.Tensor:
    """``[B or 1, P, N_in]``: the share of input ``i`` that merged token ``q`` takes, ``G``'s rows
    normalised, without gradient: d(share)/dG ~ 1/row-sum, and a token every merged token has
    learned to ignore has a row sum near 0, whose gradient overflows AdamW (docs/methods.md, "LTM / IBTM")."""
    g_rows = g.detach()
    return (g_rows / g_rows.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(g.dtype).tiny)).mT


def soft_merge(x: torch.Tensor, state: TokenState, g: torch.Tensor,
               share_t: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x [B, prefix + N_in, C]`` -> ``[B, prefix + P, C]`` with ``G [B or 1, N_in, P]``: merged
    token ``q`` is ``sum_i G_iq x_i``; sizes and sources follow the row shares
    (:func:`merge_shares`, computed here unless given; docs/methods.md, "LTM / IBTM")."""
    prefix = state.prefix
    merged = g.mT @ x[:, prefix:]  # [B or 1, P, N_in] @ [B, N_in, C]
    if share_t is None:
        share_t = merge_shares(g)
    size = state.sizes(x)
    state.size = torch.cat([size[:, :prefix], share_t @ size[:, prefix:]], dim=1)
    if state.source is not None:
        source = state.source
        state.source = torch.cat([source[:, :prefix], share_t @ source[:, prefix:]], dim=1)
    return torch.cat([x[:, :prefix], merged], dim=1)


class _Constants:
    """Values an eval-mode forward without gradient computes from a module's parameters and
    buffers alone (``G1``, a later block's ``G_l`` without the IB step, ``log Q`` under the prior),
    computed once and reused while those tensors are the same objects holding the same values
    (checked by comparison on every use: a write through ``.data`` is seen too). A plain object:
    not in the state dict."""

    def __init__(self) -> None:
        self._values: dict[str, tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], Any]] = {}

    def get(self, name: str, tensors: tuple[torch.Tensor, ...], compute: Callable[[], Any]) -> Any:
        """``compute()``, or its value of an earlier call whose ``tensors`` are unchanged;
        computed afresh (and not kept) while gradients are recorded."""
        if torch.is_grad_enabled():
            return compute()
        kept = self._values.get(name)
        if kept is not None and all(a is b for a, b in zip(kept[0], tensors)) and all(
                a.device == b.device and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
                for a, b in zip(kept[1], tensors)):  # ``.to()`` keeps a parameter object, moves its data
            return kept[2]
        value = compute()
        self._values[name] = (tensors, tuple(t.clone() for t in tensors), value)
        return value


class _Shared:
    """What all LTM modules of one model share (a plain object: not in the state dict): the
    reduction context (bound by the callbacks and ``prepare_load``; the labels in training) and,
    during a statistics pass, the ``X~`` each block records."""

    def __init__(self) -> None:
        self.ctx: Any = None
        self.recording: dict[nn.Module, torch.Tensor] | None = None
        self.hook: Any = None
        #: whether the training IB step uses the true label (``step_labels="true"``), not the prior
        self.true_labels = False
        #: ``clusters=kmeans`` and ``num_clusters`` (``None``: the class count) of the IB step and bound
        self.kmeans = False
        self.num_clusters: int | None = None
        #: the fine-tuning epoch under way (from 0), for the IB term's warm-up
        self.epoch = 0


class FirstMerge(nn.Module, Reducer):
    """Block 1: ``N_p`` patch tokens -> ``P`` by ``G1 = column-softmax(M1)`` (docs/methods.md, "LTM / IBTM").

    Also holds the statistics of the IB bound used as the training loss: the final features'
    class centroids, their ``log Q(a|y)`` and the input clusters' centroids.
    """

    needs: frozenset[str] = frozenset()

    def __init__(self, grid: tuple[int, int], cells: tuple[int, int], p: int, dim: int, tau: float,
                 shared: _Shared, fold_grid: bool = False, init: str = "grid") -> None:
        super().__init__()
        self.num_patches, self.p, self.tau = grid[0] * grid[1], p, tau
        #: conv hybrids: the merge is a grid merge, folded to its grid by the adapter (docs/methods.md, "Conv hybrids")
        self.records_grid_merge = fold_grid
        self.cells = tuple(cells)
        start = run_logits if init == "runs" else pooling_logits
        self.logits = nn.Parameter(start(grid, cells, p, _OUTSIDE_LOGIT * tau))
        self._shared = shared
        self.register_buffer("feature_centroids", torch.zeros(0, dim))
        self.register_buffer("feature_log_q", torch.zeros(0, 0))
        self.register_buffer("input_centroids", torch.zeros(0, 0))
        self._constants = _Constants()

    def weights(self, batch: int) -> torch.Tensor:
        """``G1 [B, N_p, P]`` in training (Gumbel noise per image), ``[1, N_p, P]`` at inference."""
        return _first_weights(self.logits, self.tau, self.training, batch)

    def forward(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        if x.shape[1] - state.prefix != self.num_patches:
            raise ValueError(f"ltm: block 1 expects {self.num_patches} patch tokens, got "
                             f"{x.shape[1] - state.prefix} (the merge is sized for the model's grid)")
        if self.training:
            g, share_t = self.weights(x.shape[0]), None
        else:  # no noise: one matrix for every image
            g, share_t = self._constants.get("g1", (self.logits,), lambda: _with_shares(self.weights(1)))
        if self.records_grid_merge:
            record_grid_merge(state, g, self.cells)  # type: ignore[arg-type]
        return soft_merge(x, state, g, share_t)


def _with_shares(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return g, merge_shares(g)


def _first_weights(logits: torch.Tensor, tau: float, training: bool, batch: int) -> torch.Tensor:
    """``column-softmax((M1 + g) / tau)`` ``[B, N, P]`` with Gumbel noise ``g`` per sequence in
    training; ``[1, N, P]`` without noise at inference."""
    logits = logits[None]
    if training:
        logits = logits + _gumbel((batch, *logits.shape[1:]), logits)
    return (logits / tau).softmax(dim=-2)


def block_assign(xt: torch.Tensor, centroids: torch.Tensor,
                 centroid_sq: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``tau(X~, a) = softmax_a(-dist(X~, C_a))`` ``[B, K]``, ``dist`` the mean squared
    distance of ``X~ [B, P, C]`` to each ``C_a [P, C]`` (``centroid_sq``: the ``||C_a||^2``, when known)."""
    n = xt.shape[1] * xt.shape[2]
    cross = torch.einsum("bpc,kpc->bk", xt, centroids)
    if centroid_sq is None:
        centroid_sq = centroids.pow(2).sum(dim=(1, 2))
    dist = (xt.pow(2).sum(dim=(1, 2))[:, None] - 2 * cross + centroid_sq[None]) / n
    return (-dist).softmax(dim=1)


def ib_mask_step(xt: torch.Tensor, centroids: torch.Tensor, log_q_rows: torch.Tensor, eta: float,
                 centroid_sq: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``G~ = I - 2 eta sum_a X~ (S_a/gamma^2)(gamma C_a - zeta)^T psi_a`` ``[B, P, P]``.

    ``xt [B, P, C]`` is ``X~``, ``centroids [K, P, C]``, ``log_q_rows [B or 1, K]`` the
    ``log Q(a|y)`` row of each image's label (or its expectation). With ``tau_a = S_a/gamma``,
    ``(S_a/gamma^2)(gamma C_a - zeta) = tau_a (C_a - sum_b tau_b C_b)``, so the sum is
    ``X~ V^T`` with ``V = sum_a tau_a (psi_a - sum_b tau_b psi_b) C_a``; an ``a``-independent
    part of ``psi`` (the input term) cancels, hence ``psi_a = -log Q(a|y)`` (docs/methods.md, "LTM / IBTM").
    """
    tau = block_assign(xt, centroids, centroid_sq)
    w = tau * -log_q_rows
    v = torch.einsum("bk,kpc->bpc", w - tau * w.sum(dim=1, keepdim=True), centroids)
    eye = torch.eye(xt.shape[1], dtype=xt.dtype, device=xt.device)
    return eye - 2.0 * eta * torch.einsum("bpc,bqc->bpq", xt, v)


class ReMerge(nn.Module, Reducer):
    """A later block: ``P`` tokens -> ``P`` by one IB gradient step from the identity; at
    inference with ``step_at_inference=False`` (``ib_step=train``) by the learned mask alone,
    ``G~ = I`` (docs/methods.md, "LTM / IBTM" "Readings")."""

    needs: frozenset[str] = frozenset()

    def __init__(self, p: int, dim: int, hidden: int, eta: float, tau: float, shared: _Shared,
                 fold_grid: bool = False, step_at_inference: bool = True) -> None:
        super().__init__()
        self.p, self.eta, self.tau = p, eta, tau
        self.step_at_inference = step_at_inference
        self._constants = _Constants()
        self.records_grid_merge = fold_grid  # conv hybrids: appended to the sequence's grid merge
        self.mask_logits = nn.Parameter(torch.full((p, p), _KEEP_LOGIT))
        self.scale = nn.Parameter(torch.tensor(math.log(99.0 * max(p - 1, 1))))
        self.mlp = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self._shared = shared
        self.register_buffer("centroids", torch.zeros(0, p, dim))
        self.register_buffer("log_q", torch.zeros(0, 0))
        self.register_buffer("class_prior", torch.zeros(0))

    def log_q_rows(self) -> torch.Tensor | None:
        """``log Q(a|y)`` per image (training, labels known) or its prior expectation ``[1, K]``;
        ``None`` before the first statistics pass."""
        if self.log_q.shape[0] == 0:
            return None
        ctx = self._shared.ctx
        labels = ctx.labels if self.training and self._shared.true_labels and ctx is not None else None
        if labels is not None:
            return self.log_q[labels.long()]
        return self._constants.get("prior_log_q", (self.class_prior, self.log_q),
                                   lambda: (self.class_prior @ self.log_q)[None])

    def keep_mask(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The binary mask ``M_l``: ``(hard, straight-through)`` ``[B or 1, P, P]``, diagonal kept."""
        logits = self.mask_logits[None]
        if self.training:  # noise drawn per image
            logits = logits.expand(batch, -1, -1)
        st = straight_through_mask(logits, self.tau, noisy=self.training)
        eye = torch.eye(self.p, dtype=torch.bool, device=logits.device)
        return st.detach().masked_fill(eye, 1.0), st.masked_fill(eye, 1.0)

    @property
    def steps(self) -> bool:
        """Whether this forward takes the IB step: in training and in the statistics pass (which
        sees the forward training sees), and at inference with ``step_at_inference``; never at
        ``eta = 0`` (a zero step is the identity)."""
        return self.eta > 0 and (self.training or self.step_at_inference or self._shared.recording is not None)

    def mixing(self, z: torch.Tensor) -> torch.Tensor:
        """``G_l [B, P, P]`` for the patch tokens ``z [B, P, C]`` entering the merge (``[1, P, P]``
        at inference without the step: the same for every image)."""
        return self._mixing(z)[0]

    def _mixing(self, z: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """:meth:`mixing` and, where it is a constant, its :func:`merge_shares` (else ``None``)."""
        b = z.shape[0]
        rows = None
        if self.steps or self._shared.recording is not None:
            xt = self.mlp(z)
            if self._shared.recording is not None:
                self._shared.recording[self] = xt.detach()
            rows = self.log_q_rows() if self.steps else None
        if rows is None:  # G~ = I: the mask and the scale alone
            if self.training:
                return self._masked_softmax(self._eye(z)[None], b), None
            return self._constants.get("g", (self.mask_logits, self.scale),
                                       lambda: _with_shares(self._masked_softmax(self._eye(z)[None], 1)))
        if rows.shape[0] not in (1, b):  # hybrids: an image's labels for each of its sequences
            rows = rows.repeat_interleave(b // rows.shape[0], dim=0)
        centroid_sq = self._constants.get("centroid_sq", (self.centroids,),
                                          lambda: self.centroids.pow(2).sum(dim=(1, 2)))
        return self._masked_softmax(ib_mask_step(xt, self.centroids, rows, self.eta, centroid_sq), b), None

    def _eye(self, z: torch.Tensor) -> torch.Tensor:
        return torch.eye(self.p, dtype=z.dtype, device=z.device)

    def _masked_softmax(self, g_tilde: torch.Tensor, batch: int) -> torch.Tensor:
        """``G_l = column-softmax(s_l G~)`` over the entries the mask ``M_l`` keeps."""
        hard, st = self.keep_mask(batch)
        logits = self.scale * g_tilde
        ref = logits.masked_fill(hard == 0, float("-inf")).amax(dim=-2, keepdim=True).detach()
        e = torch.exp((logits - ref).clamp_max(0.0)) * st  # a dropped entry may exceed ref: clamp
        return e / e.sum(dim=-2, keepdim=True)

    def forward(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        g, share_t = self._mixing(x[:, state.prefix:])
        if self.records_grid_merge:
            record_grid_merge(state, g)
        return soft_merge(x, state, g, share_t)


class TileMerge(ReMerge, TileUnmerge):
    """Swin (docs/methods.md, "LTM / IBTM" "On Swin"): one block's merge of each ``t``-token tile of its map
    into ``P`` tokens for the MLP, both steps of LTM in one block.

    1. the learned first mask of the block (:class:`FirstMerge`'s ``G1 = column-softmax((M1 + g)
       / tau)``, ``M1 [t, P]`` shared by all tiles of the block, initialised by ``init`` on the
       tile's grid): ``Z = G1^T x``;
    2. the IB step of :class:`ReMerge` on ``Z`` (``X~ = MLP_l(Z)``, the block's class centroids
       of ``X~`` -- every tile a sample of its image's class --, the binary mask ``M_l`` and the
       scale ``s_l``): ``G_l^T Z``.

    Sizes and sources follow both soft merges (:func:`soft_merge`); :meth:`unmerge` sends each
    token of the tile the share-weighted mix of the MLP outputs of the merged tokens it went
    into. Also holds the IB bound's buffers (filled in the first block's module only), as
    :class:`FirstMerge`.
    """

    def __init__(self, grid: tuple[int, int], cells: tuple[int, int], p: int, dim: int, hidden: int,
                 eta: float, tau: float, shared: _Shared, init: str = "runs", step_at_inference: bool = True) -> None:
        super().__init__(p, dim, hidden, eta, tau, shared, step_at_inference=step_at_inference)
        self.num_patches = grid[0] * grid[1]
        start = run_logits if init == "runs" else pooling_logits
        self.logits = nn.Parameter(start(grid, cells, p, _OUTSIDE_LOGIT * tau))
        self.register_buffer("feature_centroids", torch.zeros(0, dim))
        self.register_buffer("feature_log_q", torch.zeros(0, 0))
        self.register_buffer("input_centroids", torch.zeros(0, 0))

    def forward(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        if x.shape[1] != self.num_patches or state.prefix:
            raise ValueError(f"ltm: this Swin block merges tiles of {self.num_patches} tokens without "
                             f"prefix, got {x.shape[1]} tokens and {state.prefix} prefix (the merge is "
                             f"sized for the model's input size)")
        z = soft_merge(x, state, _first_weights(self.logits, self.tau, self.training, x.shape[0]))
        return soft_merge(z, state, self.mixing(z))

    def unmerge(self, y: torch.Tensor, state: TokenState) -> torch.Tensor:
        """``[B*nT, P, C]`` MLP outputs -> ``[B*nT, t, C]``: token ``i`` takes ``sum_q
        source_qi y_q``, its shares of the merged tokens (each column of the traced sources sums
        to 1; a hard merge gives ToMe for SD's copy). The shares carry no gradient, as in
        :func:`soft_merge`."""
        assert state.source is not None, "the swin adapter traces sources"
        return state.source.mT.to(y.dtype) @ y


def _gumbel(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    u = torch.rand(shape, device=like.device, dtype=like.dtype).clamp(_EPS, 1 - _EPS)
    return -torch.log(-torch.log(u))


# -- statistics (Algorithm 1) ----------------------------------------------------------------
def _reducing_blocks(model: nn.Module) -> list[nn.Module]:
    """The block wrappers that hold an LTM module, in forward order (every block the family
    adapter wrapped: a ViT's blocks, a hybrid's transformer blocks, every Swin block)."""
    return [m for m in model.modules() if isinstance(getattr(m, "reducer", None), (FirstMerge, ReMerge))]


def _family(model: nn.Module) -> FamilySpec:
    return get_host().family_of(model)


def _modules(model: nn.Module) -> tuple[FirstMerge | TileMerge, list[ReMerge]]:
    """The first block's :class:`FirstMerge` or :class:`TileMerge` (it holds the IB bound's
    statistics) and every module with an IB step, :class:`ReMerge` (a hybrid has one
    :class:`FirstMerge` per token sequence; on Swin every block's :class:`TileMerge` has one)."""
    reducers = [blk.reducer for blk in _reducing_blocks(model)]
    if not reducers or not isinstance(reducers[0], (FirstMerge, TileMerge)):
        raise ValueError("this model is not reduced with ltm (vitbench.apply(model, 'ltm'))")
    return reducers[0], [r for r in reducers if isinstance(r, ReMerge)]


def _image_rows(onehot: torch.Tensor, rows: int) -> torch.Tensor:
    """Per-image rows repeated for each token sequence of the image (hybrids run ``B*k``
    sequences, image-major: MobileViT's ``k = 4``); unchanged for a plain ViT."""
    return onehot if rows == onehot.shape[0] else onehot.repeat_interleave(rows // onehot.shape[0], dim=0)


def feature_module(model: nn.Module) -> tuple[nn.Module, bool]:
    """The module whose pooled output the IB bound trains on, and whether its map is
    channels-last: :func:`vitbench.measure.ib.feature_source`, the very tensor the ``ib`` metric
    reads (a ViT's last block, a hybrid's or Swin's last stage)."""
    source = feature_source(model)
    if source is None:
        raise UnsupportedError(f"ltm: the {_family(model).name!r} family adapter names no feature module "
                               f"(FamilySpec.feature_module) for the IB bound")
    return source


def final_features(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """``[B, C]``: the feature module's output pooled per image
    (:func:`vitbench.measure.ib.module_features`: the size-weighted mean of a ViT's patch
    tokens; a hybrid's or Swin's map averaged over its positions)."""
    module, channels_last = feature_module(model)
    return module_features(model, module, images, channels_last)


def _bind(model: nn.Module) -> FirstMerge:
    first, _ = _modules(model)
    first._shared.ctx = reduction_context(model)
    return first


def _limited(batches: Callable[[], Iterator[Any]], max_images: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    seen = 0
    for images, labels in batches():
        if max_images:
            images, labels = images[: max_images - seen], labels[: max_images - seen]
        seen += len(labels)
        yield images, labels
        if max_images and seen >= max_images:
            return


class _Samples:
    """The first ``cap`` rows of a statistics pass, kept for a k-means fit."""

    def __init__(self, cap: int) -> None:
        self.cap, self.rows, self.parts = cap, 0, []  # type: ignore[var-annotated]

    def add(self, vectors: torch.Tensor) -> None:
        if self.rows < self.cap:
            self.parts.append(vectors[: self.cap - self.rows].cpu())
            self.rows += self.parts[-1].shape[0]

    def all(self) -> torch.Tensor:
        return torch.cat(self.parts)


#: the floats the k-means samples of all blocks' ``X~`` may hold together (1 GiB)
_BLOCK_SAMPLE_FLOATS = 2**28


def refresh_statistics(model: nn.Module, batches: Callable[[], Iterator[Any]], max_images: int = 0) -> None:
    """Algorithm 1's refresh: recompute every block's centroids, ``Q`` and the class prior, and
    the IB bound's feature/input centroids and ``Q``, over the first ``max_images`` images of
    ``batches()`` (0: all), in eval mode without gradients (docs/methods.md, "LTM / IBTM", "Statistics").
    The centroids are the class means, or with ``clusters=kmeans`` k-means centroids
    (:func:`vitbench.measure.clusters.kmeans_centroids`, the run's seed) of the same vectors."""
    first, later = _modules(model)
    shared = _bind(model)._shared
    k = int(getattr(model, "num_classes", 0) or 0)
    if k < 1:
        raise UnsupportedError("ltm needs a classification head (model.num_classes >= 1) for its class clusters")
    kmeans = shared.kmeans
    clusters = (shared.num_clusters or k) if kmeans else k
    block_cap = max(clusters, min(KMEANS_SAMPLES, _BLOCK_SAMPLE_FLOATS // max(
        1, sum(m.centroids.shape[1:].numel() for m in later))))
    was_training = model.training
    model.eval()
    shared.recording = {}
    try:
        with torch.no_grad():
            # pass 1: centroids, prior, input and feature centroids (per block: hybrids and Swin
            # tiles give k samples per image)
            block_sums = {m: ClassSums() for m in later}
            feat_sums, input_sums = ClassSums(), ClassSums()
            samples = {key: _Samples(block_cap if isinstance(key, nn.Module) else KMEANS_SAMPLES)
                       for key in (*later, "features", "inputs")} if kmeans else {}
            for images, labels in _limited(batches, max_images):
                feats = final_features(model, images).float()
                onehot = F.one_hot(labels.long(), k).float().to(feats.device)
                for m in later:
                    rec = shared.recording[m].flatten(1).float()
                    if kmeans:
                        samples[m].add(rec)
                    else:
                        block_sums[m].add(_image_rows(onehot, rec.shape[0]), rec)
                feat_sums.add(onehot, F.normalize(feats, dim=1))
                if kmeans:
                    samples["features"].add(feats)
                    samples["inputs"].add(input_vectors(images))
                else:
                    input_sums.add(onehot, input_vectors(images))
            if feat_sums.counts is None:
                raise ValueError("ltm: the statistics pass got no training batches")
            if kmeans:
                seed = run_seed()
                centroids = {m: kmeans_centroids(samples[m].all(), clusters, seed, normalize=False)
                             .view(clusters, *m.centroids.shape[1:]).to(feats.device) for m in later}
                feat_centroids = kmeans_centroids(samples["features"].all(), clusters, seed).to(feats.device)
                input_centroids = kmeans_centroids(samples["inputs"].all(), clusters, seed).to(feats.device)
            else:
                centroids = {m: block_sums[m].means().view(k, *m.centroids.shape[1:]) for m in later}
                feat_centroids, input_centroids = feat_sums.centroids(), input_sums.centroids()
            prior = feat_sums.counts / feat_sums.counts.sum()
            # pass 2: Q(a|y) against the new centroids (the forward still uses the old ones)
            block_q, feat_q = {m: ClassSums() for m in later}, ClassSums()
            for images, labels in _limited(batches, max_images):
                feats = final_features(model, images).float()
                onehot = F.one_hot(labels.long(), k).float().to(feats.device)
                for m in later:
                    rec = shared.recording[m].float()
                    block_q[m].add(_image_rows(onehot, rec.shape[0]), block_assign(rec, centroids[m]))
                feat_q.add(onehot, soft_assign(feats, feat_centroids))
    finally:
        shared.recording = None
        model.train(was_training)
    for m in later:
        like = m.mask_logits
        m.centroids = centroids[m].to(like)
        m.log_q = block_q[m].log_q().to(like)
        m.class_prior = prior.to(like)
    like = first.logits
    first.feature_centroids = feat_centroids.to(like)
    first.feature_log_q = feat_q.log_q().to(like)
    first.input_centroids = input_centroids.to(like)


# -- training hooks --------------------------------------------------------------------------
class _FinalFeatures:
    """Forward hook on the feature module (:func:`feature_module`): its pooled output, the
    features of :func:`final_features` and of the ``ib`` metric, into ``ctx.extras``."""

    def __init__(self, ctx: Any, channels_last: bool) -> None:
        self.ctx = ctx
        self.channels_last = channels_last

    def __call__(self, module: nn.Module, args: Any, out: torch.Tensor) -> None:
        size = self.ctx.state.size if self.ctx.state is not None else None
        batch = self.ctx.inputs.shape[0] if self.ctx.inputs is not None else out.shape[0]
        self.ctx.extras[FEATURES_KEY] = pooled_features(out, self.ctx.prefix, size, batch, self.channels_last)


def _before(model: nn.Module, batches: Callable[[], Iterator[Any]], max_images: int, ib_loss: bool) -> None:
    first = _bind(model)
    shared = first._shared
    shared.epoch = 0
    if ib_loss and shared.hook is None:
        shared.hook = _feature_hook(model)
    refresh_statistics(model, batches, max_images)


def _feature_hook(model: nn.Module) -> Any:
    """Register :class:`_FinalFeatures` on the feature module; returns its handle."""
    module, channels_last = feature_module(model)
    return module.register_forward_hook(_FinalFeatures(reduction_context(model), channels_last))


def _epoch_end(model: nn.Module, epoch: int, batches: Callable[[], Iterator[Any]], max_images: int,
               epochs: int) -> None:
    """Algorithm 1's refresh for the *next* epoch: none after the last one (``epoch`` counts from
    0; the stage's real epochs, :func:`stage_epochs`), so the evaluated model runs the statistics
    its masks and MLPs were trained against."""
    _modules(model)[0]._shared.epoch = epoch + 1
    if epoch + 1 < stage_epochs(model, epochs):
        refresh_statistics(model, batches, max_images)


def _after(model: nn.Module) -> None:
    shared = _modules(model)[0]._shared
    if shared.hook is not None:
        shared.hook.remove()
        shared.hook = None


def ib_weight_at(epoch: int, epochs: int, weight: float, warmup: float) -> float:
    """The IB term's weight in fine-tuning epoch ``epoch`` (from 0) of ``epochs``: 0 during the
    first ``int(warmup * epochs)`` epochs (the authors' code, ``warmup`` 0.3), ``weight`` after."""
    return 0.0 if epoch < int(warmup * epochs + 1e-9) else weight


def ib_bound_loss(model: nn.Module, logits: torch.Tensor, labels: torch.Tensor, weight: float,
                  warmup: float = 0.0, epochs: int = 1) -> Optional[torch.Tensor]:
    """``weight *`` the IB bound (docs/methods.md, "The IB loss") of this forward's final features, with the previous
    refresh's centroids and ``log Q`` (the stage's ``extra_loss``); ``None`` while the epoch is
    in the warm-up (:func:`ib_weight_at`)."""
    ctx = reduction_context(model)
    first, _ = _modules(model)
    weight = ib_weight_at(first._shared.epoch, stage_epochs(model, epochs), weight, warmup)
    if weight == 0.0:
        return None
    feats = ctx.extras.get(FEATURES_KEY) if ctx is not None else None
    if feats is None or first.feature_log_q.shape[0] == 0:
        raise RuntimeError("ltm: the IB loss needs the statistics pass and the feature hook of the "
                           "stage's `before` callback to have run")
    tau_f = soft_assign(feats, first.feature_centroids)
    tau_x = soft_assign(input_vectors(ctx.inputs), first.input_centroids)
    terms = ib_terms(tau_f, tau_x, labels, first.feature_log_q.shape[0], log_q=first.feature_log_q)
    return weight * terms.bound


def prepare_load(model: nn.Module, state_dict: dict) -> None:
    """Size the statistics buffers like the saved ones (they are empty until the first refresh)
    and bind the modules to the model's context."""
    for path, blk in model.named_modules():
        module = getattr(blk, "reducer", None)
        if not isinstance(module, (FirstMerge, ReMerge)):
            continue
        for name, buf in list(module.named_buffers(recurse=False)):
            saved = state_dict.get(f"{path}.reducer.{name}")
            if saved is not None and saved.shape != buf.shape:
                setattr(module, name, buf.new_zeros(saved.shape))
    _bind(model)


def _hybrid_reducers(params: LTMParams, info: ModelInfo, family: FamilySpec, shared: _Shared) -> list[nn.Module]:
    """Conv hybrids (docs/methods.md, "LTM / IBTM"): per token sequence, its first block merges the ``H x W``
    tokens it sees to ``P = H'W'`` (:class:`FirstMerge`, logits sized for that sequence), its
    later blocks re-merge ``P -> P`` (:class:`ReMerge`, the block's own width), and every merge
    is declared a grid merge to ``(H', W')`` so that the adapter folds to that grid and merges
    the fusion shortcut with the same matrices. The grid a sequence sees follows from the
    merges before it (the family's ``sequence_grids``); all modules share one ``_Shared``, the
    first block's :class:`FirstMerge` holds the IB bound's statistics."""
    chain, grid_fn = family.sequence_grids, family.merge_grid
    if chain is None:
        raise UnsupportedError(f"ltm does not know how the token grids of the {info.family!r} family "
                               f"follow from each other; known: {', '.join(_families_with('sequence_grids'))}")

    def sequence_info(grid: tuple[int, int]) -> ModelInfo:
        return dataclasses.replace(info, grid=grid, num_patches=grid[0] * grid[1], blocks=())

    plan = chain(info, lambda s, grid: grid_fn(sequence_info(grid), params.ratio)[1])
    reducers: list[nn.Module] = []
    for blk in info.blocks:
        seen, cells = plan[blk.sequence]
        p = cells[0] * cells[1]
        if blk.first:
            reducers.append(FirstMerge(seen, cells, p, blk.dim, params.tau, shared, fold_grid=True))
        else:
            hidden = max(1, round(params.mlp_ratio * blk.dim))
            reducers.append(ReMerge(p, blk.dim, hidden, params.eta, params.tau, shared, fold_grid=True,
                                    step_at_inference=params.ib_step == "always"))
    return reducers


def _tile_reducers(params: LTMParams, info: ModelInfo, grid_fn: MergeGrid, shared: _Shared) -> list[nn.Module]:
    """Swin (docs/methods.md, "LTM / IBTM" "On Swin"): every block merges each of its tiles (``info.blocks[i].grid``,
    ``t`` tokens) into ``P = ceil(ratio * t)`` tokens for its MLP (:class:`TileMerge`, the block's
    own width), initialised as on ViT (``auto``: ``runs``)."""
    init = "runs" if params.init == "auto" else params.init
    reducers: list[nn.Module] = []
    for blk in info.blocks:
        tile = dataclasses.replace(info, grid=blk.grid, num_patches=blk.num_patches, blocks=())
        p, cells = grid_fn(tile, params.ratio)
        hidden = max(1, round(params.mlp_ratio * blk.dim))
        reducers.append(TileMerge(blk.grid, cells, p, blk.dim, hidden, params.eta, params.tau, shared, init=init,
                                  step_at_inference=params.ib_step == "always"))
    return reducers


def _families_with(member: str) -> str:
    """The registered families whose adapter offers ``member``, for an error message."""
    host = get_host()
    return ", ".join(name for name in host.names("families") if getattr(host.family(name), member))


def build(params: LTMParams, info: ModelInfo) -> Reduction:
    family = get_host().family(info.family)
    grid_fn = family.merge_grid
    if grid_fn is None:
        raise UnsupportedError(f"ltm has no merge grid for the {info.family!r} family; "
                               f"known: {_families_with('merge_grid')}")
    if info.grid[0] * info.grid[1] != info.num_patches:
        raise UnsupportedError(f"ltm needs a patch grid: grid {info.grid} does not hold {info.num_patches} patches")
    if info.blocks and params.init == "runs" and not family.reduces_tiles:
        raise UnsupportedError(f"ltm.init='runs' does not apply to the {info.family!r} family: its merge "
                               f"folds back to a grid; valid there: auto, grid")
    shared = _Shared()
    shared.true_labels = params.step_labels == "true"
    shared.kmeans, shared.num_clusters = params.clusters == "kmeans", params.num_clusters
    if family.reduces_tiles:
        reducers = _tile_reducers(params, info, grid_fn, shared)
    elif info.blocks:
        reducers = _hybrid_reducers(params, info, family, shared)
    else:
        p, cells = grid_fn(info, params.ratio)
        hidden = max(1, round(params.mlp_ratio * info.embed_dim))
        init = "runs" if params.init == "auto" else params.init
        reducers = [FirstMerge(info.grid, cells, p, info.embed_dim, params.tau, shared, init=init)]
        reducers += [ReMerge(p, info.embed_dim, hidden, params.eta, params.tau, shared,
                             step_at_inference=params.ib_step == "always") for _ in range(1, info.depth)]
    for module in reducers:  # start deterministic, like the (eval-mode) models vitbench reduces;
        module.eval()  # model.train() turns the Gumbel noise on
    recipe = params.schedule
    ib_loss = recipe.ib_weight > 0
    stage = TrainStage(
        name="finetune", epochs=params.epochs, optimizer=params.optimizer, lr=recipe.lr,
        weight_decay=recipe.weight_decay, min_lr_ratio=recipe.min_lr_ratio, ema_decay=recipe.ema_decay,
        batch_size=params.batch_size, lr_groups=((".reducer.mlp.", recipe.mlp_lr),) if recipe.mlp_lr > 0 else (),
        trainable=None if recipe.mlp_lr > 0 else TRAINED_WITHOUT_MLPS, label_smoothing=recipe.label_smoothing,
        extra_loss=functools.partial(ib_bound_loss, weight=recipe.ib_weight, warmup=recipe.ib_warmup,
                                     epochs=params.epochs) if ib_loss else None,
        before=(functools.partial(_before, max_images=params.stats_images, ib_loss=ib_loss),),
        epoch_end=(functools.partial(_epoch_end, max_images=params.stats_images, epochs=params.epochs),),
        after=(_after,),
    )
    return Reduction(reducers, prop_attn=True, trace_source=params.trace_source, train=(stage,),
                     prepare_load=prepare_load)
