"""ALGM (plugins/algm/): window similarities and the window merge on hand-made grids, the
adaptive counts (the fewest over the batch), token counts and sizes on test_vit, logits against
a plain per-image reference of the description, unmerged det-style maps, conformance and bad
parameters."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import vitbench
from vitbench.catalog import ModelInfo
from vitbench.engine import reduction_context
from vitbench.errors import ParamError
from vitbench.testing import check_method
from vitbench.testing.reference_tome import _merge_one as tome_merge_one
from vitbench.testing.reference_tome import plain_merging_forward
from vitbench_plugins.algm import ALGMParams
from vitbench_plugins.algm.reduction import build, pairs_above, window_assignment, window_similarity

pytestmark = pytest.mark.usefixtures("single_thread")


def _images(n: int = 2, size: int = 160) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(0))


def _run(model, x, **params):
    reduced = vitbench.apply(copy.deepcopy(model), "algm", **params)
    with torch.inference_mode():
        out = reduced(x)
    return out, reduction_context(reduced)


def test_window_similarity_is_the_mean_over_pairs_without_self_pairs():
    """A 2x4 grid, two 2x2 windows: the left one four equal keys (mean 1); the right one (1,0),
    (1,0) in its top row and (0,1), (0,1) below: pairs (2 of 1, 4 of 0) -> 2*2/12 = 1/3."""
    e0, e1 = [1.0, 0.0], [0.0, 1.0]
    keys = torch.tensor([[e0, e0, e0, e0, e0, e0, e1, e1]])  # row-major: row 0 then row 1
    sim = window_similarity(keys, (2, 4), 2)
    assert torch.allclose(sim, torch.tensor([[1.0, 1.0 / 3.0]]))


def test_window_assignment_makes_one_token_of_each_merged_window_in_first_patch_order():
    merged = torch.tensor([[True, False, False, True]])  # a 4x4 grid: windows 0 and 3 of 2x2
    assign, tokens = window_assignment(merged, (4, 4), 2)
    assert tokens == 16 - 2 * 3
    assert assign.view(4, 4).tolist() == [[0, 0, 1, 2], [0, 0, 3, 4], [5, 6, 7, 7], [8, 9, 7, 7]]


def test_pairs_above_counts_the_fewest_over_the_batch():
    keys = torch.randn(2, 11, 8, generator=torch.Generator().manual_seed(3))
    keys[1] = keys[1, :1].expand(11, -1)  # image 1: every token alike, every pair above
    assert pairs_above(keys, 1, 0.999) == 0
    assert pairs_above(keys[1:], 1, 0.999) == 5  # the 5 A tokens of 10 patches


@pytest.mark.parametrize("threshold, counts", [
    (0.9, [101] * 6),   # random weights: nothing is that alike
    (0.2, [98, 98, 50, 50, 50, 50]),  # one window merges locally (101 - 3), then half the patches
    (-0.5, [26, 26, 14, 14, 14, 14]),  # every window, then every pair
])
def test_token_counts_follow_the_thresholds_and_sizes_add_up(vit, threshold, counts):
    out, ctx = _run(vit, _images(), threshold=threshold)
    assert ctx.token_counts == counts
    size = ctx.state.size if ctx.state.size is not None else torch.ones(2, 101, 1)
    assert torch.equal(size[:, 1:].sum(dim=1), torch.full((2, 1), 100.0))
    assert out.shape == (2, vit.num_classes) and torch.isfinite(out).all()


def test_the_count_is_the_fewest_over_the_batch(vit):
    x = _images(3)
    alone = [_run(vit, x[i:i + 1], threshold=0.1)[1].token_counts[-1] for i in range(3)]
    _, ctx = _run(vit, x, threshold=0.1)
    assert len(set(alone)) > 1 and ctx.token_counts[-1] == max(alone)  # most tokens left: fewest merged


# -- a plain reference from the description --------------------------------------------------
def _local_one(x, size, keys, prefix, threshold, cols, window=2):
    n = x.shape[0] - prefix
    rows = n // cols
    unit = F.normalize(keys[prefix:], dim=-1)
    windows = []
    for wr in range(rows // window):
        for wc in range(cols // window):
            members = [(wr * window + i) * cols + wc * window + j for i in range(window) for j in range(window)]
            pairs = [float(unit[a] @ unit[b]) for a in members for b in members if a != b]
            windows.append((sum(pairs) / len(pairs), members))
    chosen = [m for s, m in windows if s >= threshold]
    groups = {m[0]: m for m in chosen}
    inside = {p for m in chosen for p in m}
    reps = sorted(set(range(n)) - inside | set(groups))
    xs = [x[i] for i in range(prefix)] + [
        sum(x[prefix + p] for p in groups.get(rep, [rep])) / len(groups.get(rep, [rep])) for rep in reps]
    ss = [size[i] for i in range(prefix)] + [size[prefix] * len(groups.get(rep, [rep])) for rep in reps]
    return torch.stack(xs), torch.stack(ss)


def _reference_algm(model, image, threshold):
    cols = model.patch_embed.grid_size[1]
    stop = len(model.blocks) // 2 - 1

    def merge_one(block, x, size, keys, prefix):
        if block == 0:
            return _local_one(x, size, keys, prefix, threshold, cols)
        if block == stop:
            unit = F.normalize(keys, dim=-1)
            a_pos = [p for p in range(prefix, x.shape[0]) if p % 2 == 0]
            b_pos = [p for p in range(prefix, x.shape[0]) if p % 2 == 1]
            r = sum(max(float(unit[a] @ unit[b]) for b in b_pos) >= threshold for a in a_pos)
            return tome_merge_one(x, size, keys, r, prefix) if r else (x, size)
        return x, size

    return plain_merging_forward(model, image, merge_one)


@pytest.mark.parametrize("threshold", [0.2, 0.05, -0.5])
def test_logits_match_the_plain_reference_image_by_image(vit, threshold):
    x = _images(2)
    for i in range(2):  # one image at a time: the reference decides each image's count alone
        out, _ = _run(vit, x[i:i + 1], threshold=threshold)
        assert (out - _reference_algm(vit, x[i:i + 1], threshold)).abs().max() < 1e-4


# -- conformance and parameters --------------------------------------------------------------
def test_conforms():
    report = check_method("algm", {"threshold": -0.5})
    assert report.output_shape == (2, 10) and report.token_counts[-1] < report.token_counts[0]


def test_global_block_defaults_to_halfway():
    info = ModelInfo(family="vit", depth=12, embed_dim=8, num_heads=2, num_prefix_tokens=1, num_patches=196,
                     grid=(14, 14))
    reducers = build(ALGMParams(), info).reducers
    assert [i for i, r in enumerate(reducers) if r is not None] == [0, 5]


@pytest.mark.parametrize("bad, message", [
    (dict(threshold=1.5), r"algm.threshold=1.5 is out of range"),
    (dict(global_threshold=-2.0), r"algm.global_threshold=-2.0 is out of range; it must be in \[-1, 1\]"),
    (dict(window=1), r"algm.window=1 is out of range; it must be >= 2"),
    (dict(window=3), r"algm.window=3 does not tile the model's 10x10 patch grid"),
    (dict(local_block=3), r"algm.local_block=3 and global_block=2 must satisfy local_block < global_block < 6"),
    (dict(global_block=6), r"global_block=6 must satisfy local_block < global_block < 6"),
])
def test_bad_parameters_name_the_value(vit, bad, message):
    with pytest.raises(ParamError, match=message):
        vitbench.apply(copy.deepcopy(vit), "algm", **bad)


# -- fine-tuning (epochs > 0) ------------------------------------------------------------------
def _grey_vit() -> torch.nn.Module:
    from vitbench.testing import tiny_vit

    model = tiny_vit(in_chans=1)
    model.pretrained_cfg = {"input_size": (1, 32, 32), "mean": (0.2190,), "std": (0.3318,),
                            "crop_pct": 1.0, "interpolation": "bilinear"}
    return model


def test_training_free_by_default_and_fine_tunes_the_whole_network_with_epochs():
    """``epochs`` 0: no training stage; above 0: one stage that trains every backbone parameter
    with the merges in place (ALGM has none of its own), whatever ``--train-backbone`` says."""
    from vitbench.tasks.cls.data import resolve_cls_data
    from vitbench.tasks.cls.finetune import finetune

    host = vitbench.host.get_host()
    spec = host.method("algm")
    assert not spec.needs_training and not spec.trains() and spec.trains(ALGMParams(epochs=1))
    assert reduction_context(vitbench.apply(_grey_vit(), "algm")).reduction.train == ()
    model = vitbench.apply(_grey_vit(), "algm", threshold=0.5, epochs=1, lr=1e-3, batch_size=16)
    (stage,) = reduction_context(model).reduction.train
    assert stage.backbone and stage.epochs == 1 and stage.batch_size == 16
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    result = finetune(model, resolve_cls_data("fashion-mnist", model), limit=32)
    assert all(not torch.equal(before[k], p) for k, p in model.named_parameters())  # every one trained
    assert result.train_images == 32 and result.stages[0]["iters"] == 2
    assert result.trainable_params == sum(p.numel() for p in model.parameters())


def test_a_plan_fine_tunes_algm_only_with_epochs():
    """The plan gives ALGM the training fields (``--train-limit``) only when it trains, and the
    cls task then reads the training data."""
    from vitbench.core.options import RunOptions
    from vitbench.run.plan import build_plan

    common = dict(task="cls", model="test_vit", methods=["algm"], data="fashion-mnist", metrics=("accuracy",),
                  batch_size=2, device="cpu", seed=0, train_limit=64)
    _, free = build_plan(**common, overrides={})
    trained = build_plan(**common, overrides={"algm": {"epochs": 1}})[-1]
    assert (free.train_limit, trained.train_limit) == (None, 64)
    task = vitbench.host.get_host().task("cls")
    setup = task.setup(RunOptions(methods=("algm",), params={"algm": {"epochs": "1"}}, metrics=("gmacs",)))
    assert setup.data == "fashion-mnist"  # fine-tuning reads the training images
    assert task.setup(RunOptions(methods=("algm",), metrics=("gmacs",))).data is None


def test_fine_tunes_through_the_run_path(fine_tuned_run):
    """``--param algm.epochs=1`` through ``vitbench run``: fine-tuned, finite numbers, fewer GMACs."""
    fine_tuned_run("algm", "algm.epochs=1", "algm.threshold=0.0")
