"""The ``dcs`` plugin's reduction code (its reducers and ``build``), imported when a run asks for
the method; its parameters and registration are :mod:`vitbench_plugins.dcs`, which every
command imports and which therefore imports no torch.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any, Optional

import torch
from torch import nn

from vitbench.errors import UnsupportedError
from vitbench.kit import (
    AttnInfo, ChannelGate, FamilySpec, GatedDecisions, ModelInfo, QKChannelMask, Reducer, Reduction, TokenState,
    TrainStage, check_mlp, gated_mlp, get_host, reduction_context, shrink_mlp, sparse_mlp, stage_epochs,
)
from vitbench.kit.channel_budget import ComputeBudget, enforce_budget
from vitbench.kit.ib import (
    KMEANS_SAMPLES, class_centroids, feature_source, ib_terms, input_vectors, kmeans_centroids, log_q_given_y,
    module_features, pooled_features, run_seed, soft_assign,
)
from vitbench_plugins.dcs import DCSParams


#: share of the search's batches that update ``alpha`` (docs/methods.md, "DCS": 70% weights, 30% alpha)
ARCH_FRACTION = 0.3
#: where the retraining's forward leaves the final block's tokens for the IB bound
_TOKENS_KEY = "dcs_final_tokens"


class IBStatistics(nn.Module):
    """What the retraining's IB bound needs from the previous epoch (docs/methods.md, "The IB loss"), as buffers.

    ``feature_centroids [A, C]`` and ``input_centroids [A, D]`` (class centroids of the final
    features and of the inputs, ``A = K``; or with ``num_clusters`` the DCS paper's k-means
    centroids, ``A = num_clusters``), ``log_q [K, A]`` (``log Q(a|y)``), ``epochs_done``
    (finished retraining epochs, for ``t_warm``). Empty until the first statistics pass; a
    checkpoint carries them (``prepare_load`` gives an empty module the saved shapes).
    ``num_clusters``: ``None`` for class centroids, ``0`` for k-means with the class count.
    """

    def __init__(self, num_clusters: Optional[int] = None) -> None:
        super().__init__()
        self.num_clusters = num_clusters
        self.register_buffer("feature_centroids", torch.zeros(0))
        self.register_buffer("input_centroids", torch.zeros(0))
        self.register_buffer("log_q", torch.zeros(0))
        self.register_buffer("epochs_done", torch.zeros((), dtype=torch.long))

    @property
    def ready(self) -> bool:
        return self.log_q.numel() > 0

    @torch.no_grad()
    def refresh(self, model: nn.Module, batches: Callable[[], Any]) -> None:
        """One pass over ``batches()`` in eval mode: centroids and ``log Q(a|y)`` of the model
        as it is now (LTM's Algorithm 1; DCS retrains with the same bound). The classes are
        ``model.num_classes`` (or more, if a label says so)."""
        device = self.log_q.device
        feats, labels = [], []
        input_sums: Optional[torch.Tensor] = None  # per class, summed once: inputs never change
        inputs: list[torch.Tensor] = []  # k-means: the first KMEANS_SAMPLES input vectors, once
        kmeans = self.num_clusters is not None
        num_classes = int(getattr(model, "num_classes", 0) or 0)
        was_training = model.training
        model.eval()
        try:
            for images, y in batches():
                images, y = images.to(device), y.to(device).long()
                num_classes = max(num_classes, int(y.max()) + 1)
                feats.append(_final_features(model, images).float())
                labels.append(y)
                if self.input_centroids.numel():
                    continue
                if not kmeans:
                    input_sums = _add_per_class(input_sums, input_vectors(images), y, num_classes)
                elif sum(len(v) for v in inputs) < KMEANS_SAMPLES:
                    inputs.append(input_vectors(images).cpu())
        finally:
            model.train(was_training)
        if not feats:
            raise ValueError("dcs: the statistics pass of the IB bound got no training batches")
        f, y = torch.cat(feats), torch.cat(labels)
        if kmeans:  # the DCS paper's A = B = C k-means clusters (docs/methods.md, "DCS")
            a, seed = self.num_clusters or num_classes, run_seed()
            self.feature_centroids = kmeans_centroids(f[:KMEANS_SAMPLES], a, seed).to(device)
            if inputs:
                self.input_centroids = kmeans_centroids(torch.cat(inputs)[:KMEANS_SAMPLES], a, seed).to(device)
        else:
            self.feature_centroids = class_centroids(f, y, num_classes)
        self.log_q = log_q_given_y(soft_assign(f, self.feature_centroids), y, num_classes)
        if input_sums is not None:
            self.input_centroids = nn.functional.normalize(_grow(input_sums, num_classes), dim=1)


def _grow(sums: torch.Tensor, rows: int) -> torch.Tensor:
    """``sums`` with zero rows appended up to ``rows`` rows."""
    if sums.shape[0] >= rows:
        return sums
    return torch.cat([sums, sums.new_zeros(rows - sums.shape[0], sums.shape[1])])


def _add_per_class(sums: Optional[torch.Tensor], vectors: torch.Tensor, labels: torch.Tensor,
                   num_classes: int) -> torch.Tensor:
    """``sums [K, D]`` plus the ``vectors [n, D]`` added to their class's row (grown to ``K``)."""
    if sums is None:
        sums = vectors.new_zeros(num_classes, vectors.shape[1])
    return _grow(sums, num_classes).index_add_(0, labels, vectors)


class _CaptureTokens:
    """Forward hook on the feature module (:func:`feature_module`): leaves its output (tokens,
    or a map on a conv hybrid) in the context's extras.

    An object, not a closure, so ``copy.deepcopy`` of the model gives the copy's hook the copy's
    context."""

    def __init__(self, key: str, context: Any, channels_last: bool = False) -> None:
        self.key = key
        self.context = context
        self.channels_last = channels_last

    def __call__(self, module: nn.Module, args: tuple, out: torch.Tensor) -> None:  # type: ignore[type-arg]
        self.context.extras[self.key] = out.permute(0, 3, 1, 2) if self.channels_last else out


def _family(model: nn.Module) -> FamilySpec:
    return get_host().family_of(model)


def feature_module(model: nn.Module) -> nn.Module:
    """The module whose output the retraining's IB bound reads, the ``ib`` metric's
    (:func:`vitbench.measure.ib.feature_source`: the family's last block or stage)."""
    source = feature_source(model)
    if source is None:
        raise UnsupportedError(f"dcs: the {_family(model).name!r} family adapter names no feature module "
                               f"(FamilySpec.feature_module) for the IB bound of the retraining")
    return source[0]


def channels_last(model: nn.Module) -> bool:
    """Whether the feature module's map is ``[B, H, W, C]`` (the family's ``channels_last``)."""
    return _family(model).channels_last


def _final_features(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """The pooled output of the feature module (:func:`vitbench.measure.ib.module_features`):
    the features the bound is trained on."""
    return module_features(model, feature_module(model), images, channels_last(model))


class DCSReducer(nn.Module, GatedDecisions, Reducer):
    """One block's DCS channel selection: Q/K masks, MLP channel gate, temperature.

    The token step (``forward``) returns ``x`` unchanged; :meth:`qk` and :meth:`mlp_forward` are
    the block's channel hooks. Submodules: ``qk_mask`` (``arch`` both|qk), ``mlp_gate`` (``arch``
    both|out, until the shrink), ``ib`` (the last block only, when the retraining uses the IB
    bound); buffers ``tau`` and, after the shrink, ``kept``.

    Its part of the compute budget (:mod:`vitbench.kit.channel_budget`): the MLP's ``fc1`` and
    ``fc2`` (``2 * N * H`` MACs per kept channel, ``N`` tokens per image, ``H`` hidden width)
    and the Q/K mask Linear(s) (``N * C * C`` each); the rest of the block is counted as fixed.
    """

    needs: frozenset[str] = frozenset()
    selects_channels = True

    def __init__(self, dim: int, num_heads: int, arch: str, separate: bool, tau0: float) -> None:
        super().__init__()
        self.channels = dim
        self.register_buffer("tau", torch.tensor(float(tau0)))
        self.register_buffer("kept", None)
        self.qk_mask = QKChannelMask(dim, num_heads, dim // num_heads, separate) if arch != "out" else None
        self.mlp_gate = ChannelGate(dim) if arch != "qk" else None
        self.ib: Optional[IBStatistics] = None
        self._last_shape: Optional[tuple[int, int]] = None  # (tokens in the batch, hidden) of the last forward
        self.cost_shape: Optional[tuple[int, int]] = None  # the same per image, fixed by the budget's count

    def forward(self, x: torch.Tensor, state: TokenState, info: AttnInfo) -> torch.Tensor:
        return x

    def qk(self, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mask the per-head queries and keys ``[B, h, N, d]`` (identity without ``qk_mask``)."""
        if self.qk_mask is None:
            return q, k
        return self.qk_mask(q, k, x, self.tau)

    def mlp_forward(self, mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The block's MLP on the normed tokens: gated in the search, sparse after the shrink."""
        tokens = x.numel() // x.shape[-1]
        if self.kept is not None:
            self._last_shape = (tokens, mlp.fc1.out_features)
            return sparse_mlp(mlp, x, self.kept)
        if self.mlp_gate is None:
            self._last_shape = (tokens, 0)
            return mlp(x)
        check_mlp(mlp)  # fail in the first forward, not after a whole search epoch
        self._last_shape = (tokens, mlp.fc1.out_features)
        return gated_mlp(mlp, x, self.mlp_gate(self.tau))

    # -- the compute budget (vitbench.kit.channel_budget) --------------------------------

    gated_part = "this block's MLP"

    def budget_gate(self) -> Optional[ChannelGate]:
        return self.mlp_gate

    def budget_units(self) -> list[tuple[float, torch.Tensor]]:
        """What the budget drops when the search kept too much: single channels, lowest
        ``alpha`` first."""
        return [(float(a), torch.tensor([c])) for c, a in enumerate(self.mlp_gate.alpha.detach().tolist())]

    def _mask_macs(self, tokens: int) -> int:
        if self.qk_mask is None:
            return 0
        return tokens * sum(m.in_features * m.out_features for m in self.qk_mask.modules() if isinstance(m, nn.Linear))

    def block_macs(self, keep: Optional[torch.Tensor]) -> torch.Tensor | float:
        """MACs per image of the MLP (gated or shrunk; ``fc1`` reads and ``fc2`` writes each kept
        channel: ``2 * N * H`` per channel) and of the Q/K mask Linears (``N * C * C`` each), at
        the decision ``keep [C]`` or (``None``) as the block is now. With ``arch=qk`` the MLP is
        not the method's and is left to the counted fixed part."""
        if self.cost_shape is None:
            raise RuntimeError("dcs: the compute budget has not been measured (ComputeBudget.measure)")
        tokens, hidden = self.cost_shape
        mask = self._mask_macs(tokens)
        if keep is not None:
            return 2 * tokens * hidden * keep.sum() + mask
        if self.kept is not None:
            return float(2 * tokens * hidden * self.kept.numel() + mask)
        if self.mlp_gate is not None:
            return float(2 * tokens * hidden * self.channels + mask)
        return float(mask)

    def baseline_macs(self) -> float:
        """The unpatched block's part that :meth:`block_macs` models: the whole MLP (if gated)."""
        tokens, hidden = self.cost_shape or (0, 0)
        return float(2 * tokens * hidden * self.channels) if self.mlp_gate is not None or self.kept is not None else 0.0

    @property
    def alpha_count(self) -> int:
        return 0 if self.mlp_gate is None else self.mlp_gate.alpha.numel()

    def shrink(self, mlp: nn.Module, index: Optional[torch.Tensor] = None) -> None:
        """Fix the architecture: keep the channels ``index`` (default ``alpha > 0``), shrink
        ``mlp`` to them and drop the gate. Does nothing without a gate (``arch=qk``)."""
        if self.mlp_gate is None:
            return
        if index is None:
            index = self.mlp_gate.kept_index()
        shrink_mlp(mlp, index)
        self.kept = index.to(device=self.tau.device, dtype=torch.long)
        self.mlp_gate = None

    def shrink_block(self, block: nn.Module, index: Optional[torch.Tensor] = None) -> None:
        """:meth:`shrink` on the MLP of ``block`` (the timm ``Block`` a ReducingBlock wraps)."""
        self.shrink(block.mlp, index)


def _blocks(model: nn.Module) -> Iterator[tuple[str, nn.Module, Any]]:
    """``(name, wrapper, reducer)`` of every block wrapper holding a DCS reducer (a
    :class:`DCSReducer` or the family's ``channel_reducer``), in forward order."""
    channel_reducer = _family(model).channel_reducer
    reducers = (DCSReducer,) if channel_reducer is None else (DCSReducer, channel_reducer)
    for name, module in model.named_modules():
        if isinstance(getattr(module, "reducer", None), reducers):
            yield name, module, module.reducer


def dcs_reducers(model: nn.Module) -> list[Any]:
    """The DCS reducers of a patched model, in block order."""
    return [reducer for _, _, reducer in _blocks(model)]


def _ib_statistics(model: nn.Module) -> Optional[IBStatistics]:
    return next((r.ib for r in dcs_reducers(model) if r.ib is not None), None)


def decay_tau(tau_decay: float) -> Callable[[nn.Module, int, Callable[[], Any]], None]:
    """``epoch_end`` callback: multiply every block's ``tau`` by ``tau_decay``."""
    def callback(model: nn.Module, epoch: int, batches: Callable[[], Any]) -> None:
        for reducer in dcs_reducers(model):
            reducer.tau.mul_(tau_decay)
    return callback


def _measured(model: nn.Module, budget: float, image: Optional[torch.Tensor] = None) -> ComputeBudget:
    """The model's :class:`~vitbench.kit.channel_budget.ComputeBudget`, counted once (on
    ``image``, else on the last forward's first input) and kept on the first reducer."""
    reducers = dcs_reducers(model)
    cost = getattr(reducers[0], "compute_budget", None)
    if cost is None:
        if image is None:
            ctx = reduction_context(model)
            image = None if ctx is None else ctx.inputs
        if image is None:
            raise RuntimeError("dcs: the compute budget is counted on a training image; run the search "
                               "stage's `before` callback or a forward first")
        cost = ComputeBudget.measure(model, image[:1].detach(), reducers, budget)
        reducers[0].compute_budget = cost
    return cost


def measure_budget(budget: float) -> Callable[[nn.Module, Callable[[], Any]], None]:
    """``before`` callback of the search: count the model once at batch 1 on the first training
    image and build the cost model (:func:`_measured`); a budget the model cannot reach fails
    here, before any training."""
    def callback(model: nn.Module, batches: Callable[[], Any]) -> None:
        images, _ = next(iter(batches()))
        _measured(model, budget, images[:1])
    return callback


def search_loss(budget: float, lam: float) -> Callable[[nn.Module, torch.Tensor, torch.Tensor], Optional[torch.Tensor]]:
    """``extra_loss`` of the search: ``lam * max(0, log(cost / (budget * baseline)))``.

    ``cost`` is the counted-GMACs model of the whole network (:mod:`vitbench.kit.channel_budget`)
    at the hard decision ``alpha > 0`` -- the architecture the shrink would keep now, Q/K mask
    Linears included -- with the straight-through gradient of ``sigmoid(alpha / tau)``. Zero
    once the decision fits the budget, so the cross-entropy alone ranks the channels there."""
    def extra_loss(model: nn.Module, logits: torch.Tensor, labels: torch.Tensor) -> Optional[torch.Tensor]:
        if lam == 0:
            return None
        reducers = dcs_reducers(model)
        cost = _measured(model, budget)
        macs = cost.macs([r.decision() for r in reducers])
        return lam * torch.clamp(torch.log(macs / cost.target), min=0.0)
    return extra_loss


def shrink_to_budget(budget: float) -> Callable[[nn.Module], None]:
    """``after`` callback of the search: the hard decision ``alpha > 0``, made to fit the budget
    by dropping the lowest-``alpha`` kept channels (:func:`~vitbench.kit.channel_budget.
    enforce_budget`, logged), then every gated MLP (or LiteMLA projection) shrinks to it."""
    def callback(model: nn.Module) -> None:
        blocks = list(_blocks(model))
        if all(r.hard_decision() is None for _, _, r in blocks):
            return
        result = enforce_budget(_measured(model, budget), [r for _, _, r in blocks])
        for (_, block, reducer), keep in zip(blocks, result.keep):
            if keep is not None:
                reducer.shrink_block(block.block, keep.nonzero().flatten())
        blocks[0][2].budget_result = result
    return callback


def _ib_active(ib: IBStatistics, t_warm: int) -> bool:
    return int(ib.epochs_done) >= t_warm


def ib_before(t_warm: int) -> Callable[[nn.Module, Callable[[], Any]], None]:
    """``before`` callback of the retraining: capture the final block's tokens in every forward
    and, if the bound is on from the first epoch, fill the statistics."""
    def callback(model: nn.Module, batches: Callable[[], Any]) -> None:
        ib = _ib_statistics(model)
        if ib is None:
            return
        last = feature_module(model)
        if not any(isinstance(h, _CaptureTokens) for h in last._forward_hooks.values()):
            last.register_forward_hook(_CaptureTokens(_TOKENS_KEY, reduction_context(model), channels_last(model)))
        if _ib_active(ib, t_warm):
            ib.refresh(model, batches)
    return callback


def ib_epoch_end(t_warm: int, epochs: int) -> Callable[[nn.Module, int, Callable[[], Any]], None]:
    """``epoch_end`` callback of the retraining: count the epoch; refresh the statistics when
    the next epoch uses the bound (nothing to refresh after the last of ``epochs``, or of the
    epochs the task runs the stage for, :func:`~vitbench.kit.stage_epochs`)."""
    def callback(model: nn.Module, epoch: int, batches: Callable[[], Any]) -> None:
        ib = _ib_statistics(model)
        if ib is None:
            return
        ib.epochs_done += 1
        if _ib_active(ib, t_warm) and int(ib.epochs_done) < stage_epochs(model, epochs):
            ib.refresh(model, batches)
    return callback


def ib_after(model: nn.Module) -> None:
    """``after`` callback of the retraining: remove the token capture hook."""
    hooks = feature_module(model)._forward_hooks
    for key in [k for k, h in hooks.items() if isinstance(h, _CaptureTokens)]:
        del hooks[key]


def ib_loss(eta: float, t_warm: int) -> Callable[[nn.Module, torch.Tensor, torch.Tensor], Optional[torch.Tensor]]:
    """``extra_loss`` of the retraining: ``eta * IB bound`` of the final patch-token mean
    (docs/methods.md, "The IB loss") once ``t_warm`` retraining epochs are done."""
    def extra_loss(model: nn.Module, logits: torch.Tensor, labels: torch.Tensor) -> Optional[torch.Tensor]:
        ib = _ib_statistics(model)
        ctx = reduction_context(model)
        if ib is None or ctx is None or not _ib_active(ib, t_warm):
            return None
        if not ib.ready:
            raise RuntimeError("dcs: the IB statistics are empty; the retrain stage's `before` "
                               "callback (the statistics pass) did not run")
        tokens = ctx.extras.get(_TOKENS_KEY)
        if tokens is None or ctx.inputs is None:
            raise RuntimeError("dcs: the forward left no final tokens or inputs; the retrain "
                               "stage's `before` callback did not run")
        size = ctx.state.size if ctx.state is not None else None
        tau_f = soft_assign(pooled_features(tokens, ctx.prefix, size), ib.feature_centroids)
        tau_x = soft_assign(input_vectors(ctx.inputs), ib.input_centroids)
        return eta * ib_terms(tau_f, tau_x, labels, ib.log_q.shape[0], log_q=ib.log_q).bound
    return extra_loss


def prepare_load(model: nn.Module, state_dict: dict) -> None:
    """Shrink a freshly applied model to the widths saved in ``state_dict`` and give empty IB
    statistics the saved shapes, so ``model.load_state_dict(state_dict, strict=True)`` works.

    Keys may carry a prefix (a wrapper's ``backbone.``): a block's keys are found by suffix."""
    for name, block, reducer in _blocks(model):
        kept = _find(state_dict, f"{name}.reducer.kept")
        if kept is not None and reducer.kept is None:
            reducer.shrink_block(block.block, kept.to(torch.long))
        ib_name = f"{name}.reducer.ib."
        if reducer.ib is not None:
            for buffer, value in list(reducer.ib.named_buffers()):
                saved = _find(state_dict, ib_name + buffer)
                if saved is not None and saved.shape != value.shape:
                    setattr(reducer.ib, buffer, torch.empty(saved.shape, dtype=value.dtype, device=value.device))


def _find(state_dict: dict, key: str) -> Optional[torch.Tensor]:
    if key in state_dict:
        return state_dict[key]
    pattern = re.compile(r"(^|\.)" + re.escape(key) + "$")
    matches = [k for k in state_dict if pattern.search(k)]
    return state_dict[matches[0]] if len(matches) == 1 else None


def _reducers(params: DCSParams, info: ModelInfo) -> list[Any]:
    """One reducer per attention block, sized by ``info.blocks`` when the family fills it
    (hybrids: per-block widths) and by the scalar fields otherwise."""
    separate = params.qk_mask == "separate"
    channel_reducer = get_host().family(info.family).channel_reducer
    if channel_reducer is not None:  # blocks that are not ViT blocks (EfficientViT's LiteMLA)
        return [channel_reducer.from_block(b, params.arch, separate, params.tau0) for b in info.blocks]
    shapes = [(b.dim, b.num_heads) for b in info.blocks] or [(info.embed_dim, info.num_heads)] * info.depth
    return [DCSReducer(dim, heads, params.arch, separate, params.tau0) for dim, heads in shapes]


def build(params: DCSParams, info: ModelInfo) -> Reduction:
    reducers = _reducers(params, info)
    if params.uses_ib:
        reducers[-1].ib = IBStatistics(None if params.clusters == "class" else params.num_clusters or 0)
    for reducer in reducers:  # a new module trains; these start as inference (no Gumbel noise)
        reducer.eval()
    gated = params.arch != "qk"
    stages = [TrainStage(
        name="search",
        epochs=params.search_epochs,
        optimizer=params.optimizer,
        lr=params.lr,
        lr_groups=(("alpha", params.arch_lr),) if gated else (),
        arch_keys=("alpha",) if gated else (),
        arch_fraction=ARCH_FRACTION if gated else 0.0,
        batch_size=params.batch_size,
        extra_loss=search_loss(params.budget, params.lam) if gated else None,
        before=(measure_budget(params.budget),) if gated else (),
        epoch_end=(decay_tau(params.tau_decay),),
        after=(shrink_to_budget(params.budget),),
    )]
    if params.retrain_epochs > 0 and params.arch != "out":  # arch=out: nothing to retrain
        stages.append(TrainStage(
            name="retrain",
            epochs=params.retrain_epochs,
            optimizer=params.optimizer,
            lr=params.lr,
            batch_size=params.batch_size,
            trainable=("qk_mask",),
            extra_loss=ib_loss(params.eta, params.t_warm) if params.uses_ib else None,
            before=(ib_before(params.t_warm),) if params.uses_ib else (),
            epoch_end=(ib_epoch_end(params.t_warm, params.retrain_epochs),) if params.uses_ib else (),
            after=(ib_after,) if params.uses_ib else (),
        ))
    return Reduction(reducers, prop_attn=False, train=tuple(stages), prepare_load=prepare_load)
