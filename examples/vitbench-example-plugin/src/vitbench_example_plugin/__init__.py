"""random-drop: keep a seeded random subset of the patch tokens at a few blocks; and the
``agreement`` task (:mod:`vitbench_example_plugin.agreement`).

An example of a third-party vitbench method plugin, and a useful baseline: a pruning method
that does no better than random at choosing which tokens to drop is not choosing well.

At each block listed in ``layers`` (0-indexed), every image keeps ``ceil(keep * (N - prefix))``
of its patch tokens, chosen uniformly at random; prefix tokens (cls, dist, registers) are always
kept, first, and the kept patches stay in their original order. The choice is drawn from a
generator seeded with ``seed + block index``, so a reduced model is deterministic (the same
tokens for the same batch position in every forward) and two blocks do not drop alike.

Every vitbench command imports this module, so it holds only what registers (the parameters and
the hooks) and imports no torch; the reducer and ``build`` are in
:mod:`vitbench_example_plugin.random_drop`, named by reference and imported on first use.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from vitbench.errors import ParamError
from vitbench.kit import HELP, BudgetKnob, MethodSpec, hookimpl

__version__ = "0.1.0"


@dataclass(frozen=True)
class RandomDropParams:
    """``keep``: fraction of patch tokens kept at each of ``layers``; ``seed``: the draw's seed."""

    keep: float = field(default=0.5, metadata={HELP: "fraction of patch tokens kept at each listed block"})
    layers: Optional[tuple[int, ...]] = field(default=None, metadata={
        HELP: "the blocks that drop tokens (0-based); None: a quarter, half and three quarters of the depth"})
    seed: int = field(default=0, metadata={HELP: "seed of the random draw (block b draws with seed + b)"})

    def __post_init__(self) -> None:
        if not 0.0 < self.keep <= 1.0:
            raise ParamError(f"random-drop.keep={self.keep} is out of range; it must be in (0, 1]")
        if self.layers is not None and any(layer < 0 for layer in self.layers):
            raise ParamError(f"random-drop.layers={list(self.layers)}: block indices are >= 0")
        if self.seed < 0:
            raise ParamError(f"random-drop.seed={self.seed} is out of range; it must be >= 0")


@hookimpl
def vitbench_register_methods(register):  # type: ignore[no-untyped-def]
    register(MethodSpec(
        name="random-drop",
        kind="pruning",
        params=RandomDropParams,
        build="vitbench_example_plugin.random_drop:build",  # imported when a run asks for the method
        # the fraction of patch tokens kept at each listed block: --match-gmacs searches it
        budget=BudgetKnob("keep", larger_means="more", low=0.001, high=1.0),
        description="keep a seeded random subset of the patch tokens at listed blocks (baseline)",
    ))


@hookimpl
def vitbench_register_tasks(register):  # type: ignore[no-untyped-def]
    from vitbench_example_plugin.agreement import AgreementTask  # torch-free too: it imports torch in its methods

    register(AgreementTask())
