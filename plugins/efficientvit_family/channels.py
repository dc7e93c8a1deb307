"""EfficientViT's channel reducer: DCS's Q/K masks and output gate on a LiteMLA (docs/methods.md, "DCS",
"on EfficientViT"); the family adapter offers it as :attr:`~vitbench.catalog.FamilySpec.channel_reducer`."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from vitbench.kit.family import (
    BlockInfo, ChannelGate, GatedDecisions, LiteMLAHooks, QKChannelMask, Reducer, check_pointwise_proj,
    conv_output_channels, shrink_proj_input, shrink_qk_mask
)
from vitbench.errors import UnsupportedError

__all__ = ["BRANCHES", "DCSLiteMLAReducer"]

#: branches of every LiteMLA of timm's EfficientVit: the 1x1 ``qkv`` and one 5x5 aggregation
BRANCHES = 2


class DCSLiteMLAReducer(nn.Module, GatedDecisions, LiteMLAHooks, Reducer):
    """One EfficientViT LiteMLA's DCS channel selection (docs/methods.md, "DCS" on EfficientViT: "Q/K of
    each LiteMLA branch, and the concatenated branch outputs feeding the projection").

    The hooks are those of :mod:`vitbench_plugins.efficientvit_family.adapter`:

    - ``qk_mask`` (``arch`` both|qk): ``theta = Linear(x)`` from the LiteMLA's input map (each
      position a token, ``C`` channels) to one logit per query/key channel of every branch and
      head (``BRANCHES * C``), the same straight-through Gumbel mask as on a ViT, applied to the
      ReLU-kernel features ``phi(Q)``, ``phi(K)`` (:meth:`qk`);
    - ``out_gate`` (``arch`` both|out): architecture logits ``alpha`` over the ``BRANCHES * C``
      concatenated branch outputs; :meth:`proj_forward` runs ``proj(out * g)``.

    :meth:`shrink` (after the search) keeps the channels with ``alpha > 0``: ``proj.conv`` reads
    only those (a :class:`~vitbench.engine.channel_select.PointwiseConv` under the same name),
    ``kept`` holds their indices, ``heads_used`` the heads with at least one kept channel --
    only those heads' attention (their q, k, v) runs, and the Q/K mask's Linear keeps only
    their rows. Within a kept head all ``d`` value channels are computed (the head's ``k^T v``
    product is ``[d, d+1]`` either way); the ``qkv`` and aggregation convolutions keep every
    channel, because the 5x5 branch's grouped 1x1 conv mixes all ``d`` channels of a head of
    the 1x1 branch, so timm's shapes stay and only ``proj`` changes shape in the state dict.
    """

    needs: frozenset[str] = frozenset()
    selects_channels = True

    def __init__(self, in_channels: int, num_heads: int, head_dim: int, arch: str, separate: bool,
                 tau0: float) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.in_channels = in_channels
        self.num_heads = num_heads  # every head of every branch (H')
        self.total_channels = num_heads * head_dim
        self.register_buffer("tau", torch.tensor(float(tau0)))
        self.register_buffer("kept", None)
        self.register_buffer("heads_used", None, persistent=False)  # derived from ``kept``
        self.register_buffer("kept_positions", None, persistent=False)
        self.register_buffer("pairs_used", None, persistent=False)
        self.register_buffer("head_positions", None, persistent=False)
        self.pair_macs_per_position: Optional[int] = None  # set by the first forward (observe)
        self.qk_mask = QKChannelMask(in_channels, num_heads, head_dim, separate) if arch != "out" else None
        self.out_gate = ChannelGate(num_heads * head_dim) if arch != "qk" else None
        self.ib: Optional[nn.Module] = None  # DCS: the IB bound's statistics (the last block only)
        self._last_shape: Optional[tuple[int, int]] = None  # (HW, proj's C_out) of the last forward
        self.cost_shape: Optional[tuple[int, int]] = None  # fixed by the budget's batch-1 count

    @classmethod
    def from_block(cls, block: BlockInfo, arch: str, separate: bool, tau0: float) -> "DCSLiteMLAReducer":
        """The reducer of the LiteMLA ``block`` describes (every head of every :data:`BRANCHES`)."""
        return cls(block.dim, BRANCHES * block.num_heads, block.dim // block.num_heads, arch, separate, tau0)

    def qk(self, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mask the kernel features ``[B, H', HW, d]`` of the computed heads (identity without
        ``qk_mask``); ``x [B, HW, C]`` the LiteMLA's input positions."""
        if self.qk_mask is None:
            return q, k
        return self.qk_mask(q, k, x, self.tau)

    def selected_heads(self) -> Optional[torch.Tensor]:
        """The heads whose attention runs, as positions among those the convolutions compute:
        after the shrink ``head_positions`` (the shrunk convolutions compute only the kept pairs),
        else ``heads_used`` (``None`` before the shrink: every head)."""
        return self.head_positions if self.head_positions is not None else self.heads_used

    def proj_forward(self, proj: nn.Module, out: torch.Tensor) -> torch.Tensor:
        """``proj`` on the concatenated branch outputs ``[B, H'*d, H, W]``: gated in the search,
        reading only the kept channels after the shrink."""
        self._last_shape = (out.shape[-2] * out.shape[-1], proj.conv.out_channels)
        if self.kept is not None:
            return proj(out.index_select(1, self.kept_positions))
        if self.out_gate is None:
            return proj(out)
        check_pointwise_proj(proj)  # fail in the first forward, not after a whole search epoch
        return proj(out * self.out_gate(self.tau).to(out.dtype)[:, None, None])

    # -- the compute budget (vitbench.kit.channel_budget) --------------------------------

    gated_part = 'this LiteMLA'

    def budget_gate(self) -> Optional[ChannelGate]:
        return self.out_gate

    def observe(self, mla: nn.Module, x: torch.Tensor) -> None:
        """Every forward: on the first (the module still whole), check that the ``qkv`` and
        aggregation convolutions can drop a head pair and record what a pair costs per
        position (:meth:`_pair_macs`)."""
        if self.pair_macs_per_position is not None or self.out_gate is None:
            return
        from timm.models.efficientvit_mit import LiteMLA

        qkv, d = mla.qkv, self.head_dim
        plain = (type(mla) is LiteMLA and type(qkv.conv) is nn.Conv2d and qkv.conv.groups == 1
                 and isinstance(qkv.norm, nn.Identity) and isinstance(qkv.act, nn.Identity)
                 and all(isinstance(op, nn.Sequential) and len(op) == 2
                         and all(type(c) is nn.Conv2d for c in op) for op in mla.aggreg))
        if not plain:
            raise UnsupportedError("DCS on EfficientViT needs timm's LiteMLA with a plain 1x1 qkv conv "
                                   "(no norm/activation) and (depthwise, grouped 1x1) aggregation convs; "
                                   "use arch=qk (Q/K channel masks only) for this model")
        per_pair = qkv.conv.in_channels * 3 * d
        for dw, pw in mla.aggreg:
            per_pair += 3 * d * (dw.kernel_size[0] * dw.kernel_size[1] + pw.in_channels // pw.groups)
        self.pair_macs_per_position = per_pair

    def _head_macs(self, hw: int) -> int:
        """MACs per image of one computed head: its linear attention ``k^T [v 1]`` and ``q (k^T
        [v 1])`` (``2 * HW * d * (d + 1)``) and its rows of the Q/K mask Linear(s) (``HW * C * d``
        each)."""
        d = self.head_dim
        mask = 0 if self.qk_mask is None else hw * self.in_channels * d * (2 if self.qk_mask.separate else 1)
        return 2 * hw * d * (d + 1) + mask

    def _pair_macs(self, hw: int) -> int:
        """MACs per image of one head pair's q/k/v: ``3d`` rows of the 1x1 ``qkv`` conv and the
        same channels of each aggregation (depthwise ``k x k``, then grouped 1x1 over ``d``)."""
        if self.pair_macs_per_position is None:
            raise RuntimeError("dcs: no forward has run through this LiteMLA yet")
        return hw * self.pair_macs_per_position

    def block_macs(self, keep: Optional[torch.Tensor]) -> torch.Tensor | float:
        """MACs per image of what DCS changes in this LiteMLA, at the decision ``keep [H'*d]`` or
        (``None``) as the block is now: ``proj`` (``HW * C_out`` per kept input channel), the
        attention of every head with a kept output channel and its Q/K mask rows
        (:meth:`_head_macs`), and the q/k/v convolutions of every head pair with a kept head
        (:meth:`_pair_macs`). With ``arch=qk`` only the mask is the method's (every head runs,
        proj is whole). Only the ``proj`` term carries the straight-through gradient; heads and
        pairs are counted hard."""
        if self.cost_shape is None:
            raise RuntimeError("dcs: the compute budget has not been measured (ComputeBudget.measure)")
        hw, c_out = self.cost_shape
        if keep is not None:
            used = keep.detach().view(-1, self.head_dim).sum(1) > 0
            half = self.num_heads // 2
            heads, pairs = int(used.sum()), int((used[:half] | used[half:]).sum())
            return hw * c_out * keep.sum() + heads * self._head_macs(hw) + pairs * self._pair_macs(hw)
        if self.kept is not None:
            return float(hw * c_out * self.kept.numel() + self.heads_used.numel() * self._head_macs(hw)
                         + self.pairs_used.numel() * self._pair_macs(hw))
        if self.out_gate is not None:
            return float(hw * c_out * self.total_channels + self.num_heads * self._head_macs(hw)
                         + self.num_heads // 2 * self._pair_macs(hw))
        return float(self.num_heads * (self._head_macs(hw) - 2 * hw * self.head_dim * (self.head_dim + 1)))

    def baseline_macs(self) -> float:
        """The unpatched LiteMLA's part that :meth:`block_macs` models (if gated): ``proj``,
        every head's attention, every pair's q/k/v convolutions."""
        if self.cost_shape is None or (self.out_gate is None and self.kept is None):
            return 0.0
        hw, c_out = self.cost_shape
        d = self.head_dim
        return float(hw * c_out * self.total_channels + self.num_heads * 2 * hw * d * (d + 1)
                     + self.num_heads // 2 * self._pair_macs(hw))

    def budget_units(self) -> list[tuple[float, torch.Tensor]]:
        """What the budget drops when the search kept too much: whole head pairs (the ``2d``
        output channels of a 1x1-branch head and of the 5x5-branch head computed from its q/k/v;
        dropping both frees the pair's ``qkv`` and aggregation rows too, 2.5x what its ``proj``
        columns alone save), least important first by the mean ``alpha`` of their channels."""
        d, half = self.head_dim, self.num_heads // 2
        alpha = self.out_gate.alpha.detach().view(self.num_heads, d)
        units = []
        for t in range(half):
            channels = torch.cat([torch.arange(t * d, (t + 1) * d), torch.arange((t + half) * d, (t + half + 1) * d)])
            units.append((float(torch.cat([alpha[t], alpha[t + half]]).mean()), channels))
        return units

    @property
    def alpha_count(self) -> int:
        return 0 if self.out_gate is None else self.out_gate.alpha.numel()

    def shrink(self, mla: nn.Module, index: Optional[torch.Tensor] = None) -> None:
        """Fix the architecture: keep the output channels ``index`` (default ``alpha > 0``),
        shrink ``proj``, the q/k/v convolutions and the Q/K mask to them (class docstring) and
        drop the gate. Does nothing without a gate (``arch=qk``)."""
        if self.out_gate is None:
            return
        if index is None:
            index = self.out_gate.kept_index()
        index = index.to(device=self.tau.device, dtype=torch.long)
        d, half = self.head_dim, self.num_heads // 2
        shrink_proj_input(mla.proj, index)
        heads = torch.unique(index // d)  # sorted
        pairs = torch.unique(heads % half)
        rows = (pairs[:, None] * 3 * d + torch.arange(3 * d, device=pairs.device)).flatten()
        mla.qkv.conv = conv_output_channels(mla.qkv.conv, rows)
        for op in mla.aggreg:  # their inputs become the kept qkv rows, in order
            op[0] = conv_output_channels(op[0], rows)
            op[1] = conv_output_channels(op[1], rows)
        if self.qk_mask is not None:
            shrink_qk_mask(self.qk_mask, heads)
        computed = torch.cat([pairs, pairs + half])  # heads the shrunk convs compute, in order
        self.kept = index
        self.heads_used = heads
        self.pairs_used = pairs
        self.head_positions = torch.searchsorted(computed, heads)
        self.kept_positions = torch.searchsorted(heads, index // d) * d + index % d
        self.out_gate = None

    def shrink_block(self, block: nn.Module, index: Optional[torch.Tensor] = None) -> None:
        """:meth:`shrink` on ``block`` (the LiteMLA a ReducingLiteMLA wraps)."""
        self.shrink(block, index)
