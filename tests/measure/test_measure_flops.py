"""GMACs counting: published numbers, fused == unfused attention, per-image statistics."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from vitbench.errors import ParamError
from vitbench.measure import GmacsResult, attention_flop_formulas, count_gmacs, count_gmacs_at
from vitbench.measure.flops import ATTENTION_OPS

TINY = (3, 32, 32)


def set_fused_attn(model: nn.Module, fused: bool) -> None:
    """Switch timm's fused attention per instance (timm reads ``attn.fused_attn`` each forward)."""
    for block in model.blocks:
        block.attn.fused_attn = fused


def counted_flops(fn, custom_mapping=None) -> int:  # type: ignore[no-untyped-def]
    with torch.inference_mode():
        counter = FlopCounterMode(display=False, custom_mapping=custom_mapping)
        with counter:
            fn()
    return counter.get_total_flops()


# --- the spec's reference numbers ----------------------------------------------------------


@pytest.mark.parametrize(("fixture", "expected"), [("deit_s", 4.60), ("vit_b", 17.56)])
def test_reference_gmacs_fused_and_unfused(
    request: pytest.FixtureRequest, fixture: str, expected: float
) -> None:
    model = request.getfixturevalue(fixture)
    try:
        set_fused_attn(model, True)
        fused = count_gmacs_at(model)
        set_fused_attn(model, False)
        unfused = count_gmacs_at(model)
    finally:
        set_fused_attn(model, True)
    assert round(fused.mean, 2) == expected
    assert round(unfused.mean, 2) == expected
    assert fused.mean == pytest.approx(unfused.mean, rel=1e-6)
    assert fused == GmacsResult(mean=fused.mean, std=0.0, n=1)


def test_stock_counter_misses_fused_attention_and_ours_does_not(tiny_vit: nn.Module) -> None:
    """Guards the premise: if torch starts counting the CPU kernel, this tells us."""
    x = torch.randn(1, *TINY)
    tiny_vit.eval()
    set_fused_attn(tiny_vit, False)
    unfused = counted_flops(lambda: tiny_vit(x))
    set_fused_attn(tiny_vit, True)
    stock_fused = counted_flops(lambda: tiny_vit(x))
    ours_fused = counted_flops(lambda: tiny_vit(x), attention_flop_formulas())
    # 2 blocks, 2 heads, 65 tokens, head dim 32: QK^T and A.V
    attention = 2 * 2 * (2 * 1 * 2 * 65 * 65 * 32)
    assert stock_fused == unfused - attention
    assert ours_fused == unfused


# --- every SDPA variant counts 2*B*h*N*N_k*d MACs ------------------------------------------


def sdpa_expected_flops(b: int, h: int, n: int, n_k: int, d: int, d_v: int) -> int:
    return 2 * b * h * n * n_k * (d + d_v)


@pytest.mark.parametrize(
    "case",
    ["plain", "float_mask", "bool_mask", "scale", "gqa", "cross_dv", "3d", "math_backend", "dropout"],
)
def test_sdpa_calls_count_like_two_bmms(case: str) -> None:
    b, h, n, n_k, d, d_v = 2, 4, 9, 9, 16, 16
    kv_heads = h
    kwargs: dict[str, object] = {}
    if case == "float_mask":
        kwargs["attn_mask"] = torch.zeros(n, n_k)
    elif case == "bool_mask":
        kwargs["attn_mask"] = torch.ones(n, n_k, dtype=torch.bool)
    elif case == "scale":
        kwargs["scale"] = 0.3
    elif case == "gqa":
        kv_heads, kwargs["enable_gqa"] = 2, True
    elif case == "cross_dv":
        n_k, d_v = 5, 8
    elif case == "dropout":
        kwargs["dropout_p"] = 0.5
    q = torch.randn(b, h, n, d)
    k = torch.randn(b, kv_heads, n_k, d)
    v = torch.randn(b, kv_heads, n_k, d_v)
    if case == "3d":
        q, k, v = q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)

    def run() -> None:
        if case == "math_backend":
            with sdpa_kernel(SDPBackend.MATH):
                F.scaled_dot_product_attention(q, k, v)
        else:
            F.scaled_dot_product_attention(q, k, v, **kwargs)  # type: ignore[arg-type]

    assert counted_flops(run, attention_flop_formulas()) == sdpa_expected_flops(b, h, n, n_k, d, d_v)


@pytest.mark.parametrize("name", [op for op in ATTENTION_OPS if "scaled_dot_product" in op])
def test_every_sdpa_kernel_has_the_same_formula(name: str) -> None:
    """Kernels we cannot run here (CUDA, MPS, XPU) are checked through their formula."""
    if not hasattr(torch.ops.aten, name):
        pytest.skip(f"aten.{name} is not in this torch build")
    packet = getattr(torch.ops.aten, name)
    ours = attention_flop_formulas()
    registry = FlopCounterMode(display=False, custom_mapping=ours).flop_registry
    assert packet in registry, f"aten.{name} would not be counted"
    assert (packet in ours) != (packet in flop_registry), "add only what torch lacks"
    q = torch.empty(3, 6, 197, 64, device="meta")
    k = torch.empty(3, 6, 50, 64, device="meta")
    assert registry[packet](q, k, k, out_val=None) == sdpa_expected_flops(3, 6, 197, 50, 64, 64)


def test_cpu_kernel_is_what_we_add() -> None:
    assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu in attention_flop_formulas()


@pytest.mark.parametrize("kind", ["mha", "encoder_layer"])
def test_nn_fast_paths_count_like_the_slow_paths(kind: str) -> None:
    torch.manual_seed(0)
    if kind == "mha":
        mha = nn.MultiheadAttention(64, 4, batch_first=True).eval()

        def module(x: torch.Tensor) -> torch.Tensor:
            return mha(x, x, x, need_weights=False)[0]
    else:
        module = nn.TransformerEncoderLayer(64, 4, dim_feedforward=96, batch_first=True).eval()
    x = torch.randn(2, 10, 64)
    enabled = torch.backends.mha.get_fastpath_enabled()
    try:
        torch.backends.mha.set_fastpath_enabled(True)
        fast = counted_flops(lambda: module(x), attention_flop_formulas())
        torch.backends.mha.set_fastpath_enabled(False)
        slow = counted_flops(lambda: module(x), attention_flop_formulas())
    finally:
        torch.backends.mha.set_fastpath_enabled(enabled)
    assert fast == slow > 0


# --- per-image statistics ------------------------------------------------------------------


def test_three_images_of_a_fixed_model_have_zero_std(tiny_vit: nn.Module) -> None:
    result = count_gmacs(tiny_vit, torch.randn(3, *TINY))
    assert result.n == 3
    assert result.std == 0.0
    assert result.mean == count_gmacs_at(tiny_vit, TINY).mean > 0


class InputDependent(nn.Module):
    """Runs its ``[D, D]`` matmul once per image whose first pixel is positive, else twice."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.flatten(1)
        for _ in range(1 if x[0, 0, 0, 0] > 0 else 2):
            y = y @ self.weight
        return y


def test_input_dependent_model_reports_mean_and_sample_std() -> None:
    images = torch.ones(4, 2, 2, 2)
    images[:1] = -1.0  # 1 image at 2 matmuls, 3 at 1
    result = count_gmacs(InputDependent(8), images)
    one = 8 * 8 / 1e9  # MACs of [1, 8] @ [8, 8]
    per_image = [2 * one, one, one, one]
    assert result.n == 4
    assert result.mean == pytest.approx(sum(per_image) / 4, rel=1e-12)
    mean = sum(per_image) / 4
    assert result.std == pytest.approx(math.sqrt(sum((g - mean) ** 2 for g in per_image) / 3), rel=1e-12)


def test_count_is_deterministic_and_restores_training_flags(tiny_vit: nn.Module) -> None:
    tiny_vit.train()
    tiny_vit.blocks[0].eval()  # a mixed state must survive, not be flattened to train()
    assert count_gmacs_at(tiny_vit, TINY, n=2, seed=3) == count_gmacs_at(tiny_vit, TINY, n=2, seed=3)
    assert tiny_vit.training
    assert not tiny_vit.blocks[0].training
    assert tiny_vit.blocks[1].training


def test_counts_in_eval_and_inference_mode() -> None:
    seen: list[tuple[bool, bool]] = []

    class Probe(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append((self.training, torch.is_inference_mode_enabled()))
            return x

    count_gmacs(Probe().train(), torch.zeros(2, 1, 1, 1))
    assert seen == [(False, True), (False, True)]  # one forward per image, at batch 1


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("images", "fragment"),
    [
        (torch.zeros(3, 32, 32), "(3, 32, 32)"),
        (torch.zeros(0, 3, 32, 32), "(0, 3, 32, 32)"),
        (torch.zeros(1, 3, 32, 32, dtype=torch.uint8), "torch.uint8"),
        ([[1.0]], "list"),
    ],
)
def test_bad_images_are_refused(tiny_vit: nn.Module, images: object, fragment: str) -> None:
    with pytest.raises(ParamError, match=r"images") as err:
        count_gmacs(tiny_vit, images)  # type: ignore[arg-type]
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [({"n": 0}, "n must be >= 1, got 0"), ({"input_size": (32, 32)}, "(32, 32)"), ({"seed": -1}, "-1")],
)
def test_bad_count_gmacs_at_arguments(tiny_vit: nn.Module, kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ParamError) as err:
        count_gmacs_at(tiny_vit, **{"input_size": TINY, **kwargs})  # type: ignore[arg-type]
    assert fragment in str(err.value)


def test_compiled_model_is_refused(tiny_vit: nn.Module) -> None:
    with pytest.raises(ParamError, match=r"torch\.compile"):
        count_gmacs_at(torch.compile(tiny_vit), TINY)


def test_a_non_finite_forward_is_not_counted(tiny_vit: nn.Module) -> None:
    """The count of a forward that produced NaN (input-dependent methods decide on NaNs) is an error."""
    from vitbench.errors import NonFiniteError

    images = torch.randn(3, 3, 32, 32)
    images[1, 0, 0, 0] = float("nan")  # the second image only
    with pytest.raises(NonFiniteError, match=r"^GMACs: the counted forward's outputs hold non-finite values "
                                             r"\(10 of 10\) on image 2 of 3$"):
        count_gmacs(tiny_vit, images)
