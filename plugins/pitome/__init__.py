"""PiToMe: spectrum-preserving token merging, training-free (Tran et al., *Accelerating
Transformers with Spectrum-Preserving Token Merging*, NeurIPS 2024; Sec. 3, the energy score and
Algorithm 1; docs/methods.md, "PiToMe").

In every block, after the attention residual (docs/methods.md, "The hook point"), on the head-averaged keys of
the patch tokens: each token's energy ``E_i = 1/N_p * sum_j f_m(cos(k_i, k_j))``
(``f_m(x) = x`` above the margin ``m``, else ``alpha * (exp(x - m) - 1)``); the ``2r`` highest
are split alternately into sets A and B, the rest are protected; every A token merges into its
most similar B token (size-weighted, as ToMe). The margin falls with depth,
``m_l = margin - margin_decay * l / L``.

Parameters: ``r`` (ToMe's knob; :func:`ratio_schedule` turns the paper's keep ratio into it),
``margin``, ``margin_decay``, ``alpha``, ``energy`` (``paper``, or the official code's ``elu``),
``prop_attn``, ``trace_source``. docs/methods.md, "PiToMe" lists the differences from the official code."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from vitbench.errors import ParamError
from vitbench.kit import HELP, BudgetKnob, MethodSpec, Range, hookimpl, param, patch_count


#: the energy functions (module docstring): the paper's equation, or the official code's ELU
ENERGIES = ("paper", "elu")


@dataclass(frozen=True)
class PiToMeParams:
    """``r``: tokens merged per block (an int, or one per block); ``margin``/``margin_decay``:
    block ``l`` of ``L`` uses the margin ``margin - margin_decay * l / L``; ``alpha``: the scale
    below the margin; ``energy``: ``"paper"`` or ``"elu"`` (the official code's form)."""

    r: Union[int, list[int]] = field(default=16, metadata={HELP: "tokens merged per block: one int, or one per block"})
    margin: float = field(default=0.9, metadata={HELP: (
        "energy margin at the first block (block l of L uses margin - margin_decay * l / L)")})
    margin_decay: float = field(default=0.9, metadata={HELP: (
        "how much the margin falls from the first block to the last")})
    alpha: float = param(1.0, "the energy's scale below the margin", range=Range(0))
    energy: str = param("paper", "the energy score: paper, or elu (the official code's form)", choices=ENERGIES)
    prop_attn: bool = field(default=True, metadata={HELP: "proportional attention: add log(size) to the logits"})
    trace_source: bool = field(default=False, metadata={HELP: "record the patches each token stands for"})

    def __post_init__(self) -> None:
        values = [self.r] if isinstance(self.r, int) else list(self.r)
        if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in values):
            raise ParamError(f"pitome.r={self.r!r} is out of range; r must be an integer >= 0 "
                             f"(or a list of them, one per block)")
        if not -1.0 <= self.margin <= 1.0:
            raise ParamError(f"pitome.margin={self.margin} is out of range; it must be in [-1, 1] "
                             f"(a cosine similarity)")
        low, high = self.margin - 1.0, self.margin + 1.0
        if not low <= self.margin_decay <= high:
            raise ParamError(f"pitome.margin_decay={self.margin_decay} is out of range; with "
                             f"margin={self.margin} it must be in [{low:g}, {high:g}], so that every "
                             f"block's margin stays in [-1, 1]")


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="pitome",
        kind="merging",
        params=PiToMeParams,
        build="vitbench_plugins.pitome.reduction:build",
        # r tokens merged per block: more r, fewer GMACs; a per-block list lands between integers
        budget=BudgetKnob("r", larger_means="less", low=0, high=patch_count, integer=True, per_block=True),
        description="PiToMe: energy-protected bipartite merging, r tokens merged per block (training-free)",
    ))
