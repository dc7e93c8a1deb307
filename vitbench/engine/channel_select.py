"""Channel selection by straight-through Gumbel-sigmoid masks (DCS, docs/methods.md, "DCS").

Family-independent building blocks of the DCS plugin: they see tensors, an MLP module or a
1x1-conv projection, never a model family. :class:`QKChannelMask` is the input-dependent
query/key channel mask; :class:`ChannelGate` the per-channel architecture logits with the hard
keep/drop decision the search's cost counts; :func:`gated_mlp`, :func:`shrink_mlp` and
:func:`sparse_mlp` gate, shrink and run the MLP; :func:`check_pointwise_proj`,
:func:`shrink_proj_input` and :class:`PointwiseConv` do the same for a 1x1-conv projection
(EfficientViT's ``LiteMLA.proj``); :func:`shrink_qk_mask` and :func:`conv_output_channels`
reduce a mask or a convolution to the heads or channels still computed. The masks use
:func:`~vitbench.engine.masks.straight_through_mask` (shared with LTMP and LTM)."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from vitbench.engine.masks import gumbel_difference, straight_through_mask
from vitbench.errors import UnsupportedError

__all__ = [
    "GatedDecisions",
    "KEEP_LOGIT", "ChannelGate", "NoChannels", "PointwiseConv", "QKChannelMask", "check_mlp",
    "conv_output_channels",
    "check_pointwise_proj", "gated_mlp", "gumbel_difference", "shrink_mlp", "shrink_proj_input",
    "shrink_qk_mask", "sparse_mlp", "straight_through_mask",
]

#: initial mask logit: untrained masks keep every channel (docs/methods.md, "DCS", "Initial logit")
KEEP_LOGIT = 2.0


def _keep_all_linear(in_features: int, out_features: int) -> nn.Linear:
    linear = nn.Linear(in_features, out_features)
    nn.init.zeros_(linear.weight)
    nn.init.constant_(linear.bias, KEEP_LOGIT)
    return linear


class QKChannelMask(nn.Module):
    """Input-dependent query/key channel mask (DCS, docs/methods.md, "DCS", "Q/K channels").

    ``theta = Linear(x)`` maps the block's normed input ``x [B, N, in_features]`` to one logit
    per query/key channel (``num_heads * head_dim``), reshaped per head to ``[B, h, N, d]``; the
    mask multiplies Q and K, so the logits become ``(Q*M)(K*M)^T / sqrt(d)`` (the scale stays
    the full head width's). ``separate=True`` learns one Linear for Q and one for K (the
    ablation ``qk_mask=separate``). The Linear starts with zero weight and bias
    :data:`KEEP_LOGIT`, so the untrained mask keeps every channel.
    """

    def __init__(self, in_features: int, num_heads: int, head_dim: int, separate: bool = False) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        width = num_heads * head_dim
        if separate:
            self.theta_q = _keep_all_linear(in_features, width)
            self.theta_k = _keep_all_linear(in_features, width)
        else:
            self.theta = _keep_all_linear(in_features, width)
        self.separate = separate

    def _per_head(self, theta: torch.Tensor) -> torch.Tensor:
        b, n, _ = theta.shape
        return theta.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)

    def masks(self, x: torch.Tensor, tau: torch.Tensor | float) -> tuple[torch.Tensor, torch.Tensor]:
        """The masks ``(M_q, M_k)``, each ``[B, h, N, d]`` (the same tensor when shared)."""
        if self.separate:
            mq = straight_through_mask(self._per_head(self.theta_q(x)), tau, self.training)
            mk = straight_through_mask(self._per_head(self.theta_k(x)), tau, self.training)
            return mq, mk
        m = straight_through_mask(self._per_head(self.theta(x)), tau, self.training)
        return m, m

    def forward(self, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor,
                tau: torch.Tensor | float) -> tuple[torch.Tensor, torch.Tensor]:
        """Masked ``(q, k)``: per-head ``[B, h, N, d]`` queries and keys times their masks."""
        mq, mk = self.masks(x, tau)
        return q * mq.to(q.dtype), k * mk.to(k.dtype)


class ChannelGate(nn.Module):
    """Architecture logits ``alpha [C]`` of the attention-output/MLP channels (docs/methods.md, "DCS").

    ``g = sigmoid((alpha + g1 - g2) / tau)``, hard with a straight-through gradient like
    :func:`straight_through_mask` (Gumbel noise in training only). ``alpha`` starts at
    :data:`KEEP_LOGIT`, so every channel is kept until the search says otherwise; after the
    search the kept channels are ``alpha > 0``, deterministically.
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.full((channels,), KEEP_LOGIT))

    def forward(self, tau: torch.Tensor | float) -> torch.Tensor:
        """The gate ``g [C]``: exactly 0 or 1 in the forward."""
        return straight_through_mask(self.alpha, tau, self.training)

    def expected_kept(self, tau: torch.Tensor | float) -> torch.Tensor:
        """``sigmoid(alpha / tau) [C]``: each channel's noise-free probability of being kept, the
        soft relaxation of the keep/drop decision."""
        return torch.sigmoid(self.alpha / tau)

    def decision(self, tau: torch.Tensor | float) -> torch.Tensor:
        """The keep/drop decision the shrink will take, ``alpha > 0`` as exact 0/1 ``[C]``, with
        the gradient of :meth:`expected_kept` (straight-through, no noise): what the search's
        compute cost counts (docs/methods.md, "DCS"), so the cost the loss sees is the cost of the
        architecture the shrink keeps, and its gradient still reaches every ``alpha``."""
        return straight_through_mask(self.alpha, tau, False)

    def kept_index(self) -> torch.Tensor:
        """The channels kept after the search, ``alpha > 0``, as sorted indices ``[C~]``."""
        return (self.alpha.detach() > 0).nonzero().flatten()


def check_mlp(mlp: nn.Module) -> None:
    """Raise :class:`UnsupportedError` unless ``mlp`` is a timm ``Mlp`` with Linear fc1/fc2.

    The shrink slices ``fc1``'s input columns and ``fc2``'s output rows and relies on the
    ``fc1 -> act -> drop -> norm -> fc2 -> drop`` order of ``timm.layers.Mlp``; gated MLPs
    (``GluMlp``, ``SwiGLU``) and the 1x1-conv variant are refused rather than shrunk wrongly."""
    from timm.layers import Mlp

    if type(mlp) is not Mlp or not isinstance(mlp.fc1, nn.Linear) or not isinstance(mlp.fc2, nn.Linear):
        raise UnsupportedError(
            f"DCS channel selection needs a timm Mlp with Linear fc1/act/drop/norm/fc2; this block's "
            f"MLP is a {type(mlp).__name__}"
            + (" with 1x1 convolutions" if type(mlp) is Mlp else "")
            + "; use arch=qk (Q/K channel masks only) for this model")


def gated_mlp(mlp: nn.Module, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """The MLP with gate ``g [C]`` on its input and its output: ``mlp(x * g) * g``."""
    gate = gate.to(x.dtype)
    return mlp(x * gate) * gate


def _linear_like(weight: torch.Tensor, bias: torch.Tensor | None, like: nn.Linear) -> nn.Linear:
    """A Linear holding copies of ``weight``/``bias``, frozen exactly when ``like`` was.

    Built as a 1x1 Linear whose parameters are then replaced, so no random initialisation is
    spent (and none warns when nothing is kept)."""
    linear = nn.Linear(1, 1, bias=bias is not None, device=weight.device, dtype=weight.dtype)
    linear.out_features, linear.in_features = weight.shape
    linear.weight = nn.Parameter(weight.detach().clone(), requires_grad=like.weight.requires_grad)
    if bias is not None:
        linear.bias = nn.Parameter(bias.detach().clone(), requires_grad=like.bias.requires_grad)
    return linear


def shrink_mlp(mlp: nn.Module, index: torch.Tensor) -> None:
    """Replace ``mlp.fc1``/``mlp.fc2`` in place by Linears on the kept channels ``index [C~]``.

    ``fc1`` keeps only the input columns ``index`` (``[H, C~]``); ``fc2`` only the output rows
    ``index`` (``[C~, H]``) and their biases. The module names stay ``fc1``/``fc2``, so the
    state-dict keys stay the timm ones, only smaller. Use :func:`sparse_mlp` to run it.
    """
    check_mlp(mlp)
    index = index.to(mlp.fc1.weight.device)
    fc1, fc2 = mlp.fc1, mlp.fc2
    mlp.fc1 = _linear_like(fc1.weight[:, index], fc1.bias, fc1)
    mlp.fc2 = _linear_like(fc2.weight[index], None if fc2.bias is None else fc2.bias[index], fc2)


def sparse_mlp(mlp: nn.Module, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """A shrunk MLP on ``x [..., C]``: read channels ``index``, write them back, the rest zero.

    Equals :func:`gated_mlp` with the 0/1 gate whose ones are ``index``."""
    y = mlp(x.index_select(-1, index))
    return y.new_zeros(*x.shape[:-1], x.shape[-1]).index_copy(x.dim() - 1, index, y)


def shrink_qk_mask(mask: QKChannelMask, heads: torch.Tensor) -> None:
    """Keep only the logits of ``heads [h~]`` (sorted head indices) in ``mask``'s Linear(s).

    For a block whose attention then runs only those heads (EfficientViT after the shrink: a
    head none of whose output channels is kept is skipped), so the mask is computed for them
    alone. The Linears keep their names (``theta``/``theta_q``/``theta_k``), only fewer rows."""
    heads = heads.to(device=next(mask.parameters()).device, dtype=torch.long)
    rows = (heads[:, None] * mask.head_dim + torch.arange(mask.head_dim, device=heads.device)).flatten()
    names = ("theta_q", "theta_k") if mask.separate else ("theta",)
    for name in names:
        linear = getattr(mask, name)
        setattr(mask, name, _linear_like(linear.weight[rows], linear.bias[rows], linear))
    mask.num_heads = int(heads.numel())


class PointwiseConv(nn.Conv2d):
    """A 1x1 ``nn.Conv2d`` that also works with no input channels (all of them dropped): it then
    returns the bias (or zeros) at every position, as the full conv does on all-zero input.
    (``F.conv2d`` returns an empty tensor for an empty weight.) Same parameters and state-dict
    keys as ``nn.Conv2d``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.in_channels > 0:
            return super().forward(x)
        b, _, h, w = x.shape
        out = x.new_zeros(b, self.out_channels, h, w)
        return out if self.bias is None else out + self.bias.view(1, -1, 1, 1).to(x.dtype)


def check_pointwise_proj(proj: nn.Module) -> None:
    """Raise :class:`UnsupportedError` unless ``proj.conv`` is a plain 1x1 ``nn.Conv2d`` (stride 1,
    no groups or dilation), the layout :func:`shrink_proj_input` can slice by input channel."""
    conv = getattr(proj, "conv", None)
    if not (isinstance(conv, nn.Conv2d) and conv.kernel_size == (1, 1) and conv.stride == (1, 1)
            and conv.groups == 1 and conv.padding in ((0, 0), "valid")):
        raise UnsupportedError(
            f"DCS output-channel selection needs a projection whose `conv` is a plain 1x1 Conv2d; "
            f"this block's projection is a {type(proj).__name__} with {type(conv).__name__} "
            f"{'' if conv is None else conv}; use arch=qk (Q/K channel masks only) for this model")


def shrink_proj_input(proj: nn.Module, index: torch.Tensor) -> None:
    """Replace ``proj.conv`` in place by a :class:`PointwiseConv` reading only the input channels
    ``index [C~]`` (its weight ``[out, C~, 1, 1]``; the bias, norm and activation unchanged), so
    ``proj(out[:, index])`` equals ``proj(out * g)`` for the 0/1 gate ``g`` whose ones are
    ``index``. The parameters inherit the frozen flag; the module name stays ``conv``."""
    check_pointwise_proj(proj)
    conv = proj.conv
    index = index.to(device=conv.weight.device, dtype=torch.long)
    new = PointwiseConv(1, conv.out_channels, 1, bias=conv.bias is not None, device="meta")
    new.in_channels = int(index.numel())
    new.weight = nn.Parameter(conv.weight[:, index].detach().clone(), requires_grad=conv.weight.requires_grad)
    if conv.bias is not None:
        new.bias = nn.Parameter(conv.bias.detach().clone(), requires_grad=conv.bias.requires_grad)
    proj.conv = new


class NoChannels(nn.Module):
    """What a convolution becomes when none of its output channels is kept: ``[B, 0, H', W']``
    at the size the convolution would give (``stride``), no parameters, no MACs."""

    def __init__(self, stride: int = 1) -> None:
        super().__init__()
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, h, w = x.shape
        return x.new_zeros(b, 0, -(-h // self.stride), -(-w // self.stride))


def conv_output_channels(conv: nn.Conv2d, rows: torch.Tensor) -> nn.Module:
    """A copy of ``conv`` computing only its output channels ``rows [R]`` (sorted; whole groups
    when ``conv`` is grouped), frozen exactly when ``conv`` was; :class:`NoChannels` for none.

    A plain conv keeps its inputs and loses weight rows; a grouped conv (depthwise included)
    keeps the groups of ``rows`` and reads only their input channels, which must be the first
    ``len(rows) * in_per_group`` channels of its new input in the same order (the caller
    slices the producer of those inputs alike)."""
    rows = rows.to(device=conv.weight.device, dtype=torch.long)
    if rows.numel() == 0:
        return NoChannels(int(conv.stride[0]))
    out_per_group = conv.out_channels // conv.groups
    groups = 1
    in_channels = conv.in_channels
    if conv.groups > 1:
        group_ids = torch.unique(rows // out_per_group)
        expected = (group_ids[:, None] * out_per_group + torch.arange(out_per_group, device=rows.device)).flatten()
        if not torch.equal(expected, rows):
            raise ValueError(f"conv_output_channels: the rows of a grouped conv must be whole groups of "
                             f"{out_per_group}; got {rows.tolist()}")
        groups = int(group_ids.numel())
        in_channels = groups * (conv.in_channels // conv.groups)
    new = nn.Conv2d(in_channels, int(rows.numel()), conv.kernel_size, stride=conv.stride, padding=conv.padding,
                    dilation=conv.dilation, groups=groups, bias=conv.bias is not None,
                    padding_mode=conv.padding_mode, device="meta")
    new.weight = nn.Parameter(conv.weight[rows].detach().clone(), requires_grad=conv.weight.requires_grad)
    if conv.bias is not None:
        new.bias = nn.Parameter(conv.bias[rows].detach().clone(), requires_grad=conv.bias.requires_grad)
    return new


class GatedDecisions:
    """The keep/drop decisions of a reducer's one :class:`ChannelGate`, as a compute budget reads them."""

    #: what the reducer gates, for the error before any forward ("this LiteMLA")
    gated_part = "this module"

    def budget_gate(self) -> Optional["ChannelGate"]:
        """The gate whose decisions the budget counts (``None``: no gate)."""
        raise NotImplementedError

    def snapshot_shape(self) -> None:
        """Fix the last forward's shapes (a batch-1 count) as the ones the costs are for."""
        if self._last_shape is None:  # type: ignore[attr-defined]
            raise RuntimeError(f"dcs: no forward has run through {self.gated_part} yet")
        self.cost_shape = self._last_shape  # type: ignore[attr-defined]

    def hard_decision(self) -> Optional[torch.Tensor]:
        """The search's keep/drop decision ``alpha > 0`` as 0/1 (``None`` without a gate)."""
        gate = self.budget_gate()
        return None if gate is None else (gate.alpha.detach() > 0).float()

    def decision(self) -> Optional[torch.Tensor]:
        """:meth:`hard_decision` with the straight-through gradient of ``sigmoid(alpha / tau)``."""
        gate = self.budget_gate()
        return None if gate is None else gate.decision(self.tau)  # type: ignore[attr-defined]

    def alpha_values(self) -> torch.Tensor:
        return self.budget_gate().alpha.detach()  # type: ignore[union-attr]
