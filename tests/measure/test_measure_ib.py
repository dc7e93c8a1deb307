"""IB loss and bound (docs/methods.md §6) against a brute-force computation, and Theorem 3.1."""
from __future__ import annotations

import math

import pytest
import torch

from vitbench.measure.ib import (
    class_centroids, ib_terms, input_vectors, log_q_given_y, measure_ib, soft_assign, token_features,
)


def _brute(tau_f, tau_x, labels, k):
    """Plain Python loops over the definitions of docs/methods.md §6."""
    n, ka, kb = len(labels), len(tau_f[0]), len(tau_x[0])
    p_ab = [[sum(tau_f[i][a] * tau_x[i][b] for i in range(n)) / n for b in range(kb)] for a in range(ka)]
    p_ay = [[sum(tau_f[i][a] * (labels[i] == y) for i in range(n)) / n for y in range(k)] for a in range(ka)]

    def mi(joint):
        pa = [sum(r) for r in joint]
        pb = [sum(joint[a][b] for a in range(len(joint))) for b in range(len(joint[0]))]
        return sum(joint[a][b] * math.log(joint[a][b] / (pa[a] * pb[b]))
                   for a in range(len(joint)) for b in range(len(joint[0])) if joint[a][b] > 0)

    q = [[sum(tau_f[i][a] for i in range(n) if labels[i] == y) / max(1, labels.count(y))
          for a in range(ka)] for y in range(k)]
    bound = sum(tau_f[i][a] * tau_x[i][b] * math.log(tau_x[i][b])
                for i in range(n) for a in range(ka) for b in range(kb)) / n
    bound -= sum(tau_f[i][a] * math.log(q[labels[i]][a]) for i in range(n) for a in range(ka)) / n
    const = sum(tau_x[i][b] * math.log(tau_x[i][b]) for i in range(n) for b in range(kb)) / n
    return mi(p_ab) - mi(p_ay), bound, const


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_loss_and_bound_match_brute_force_and_theorem_3_1(seed):
    g = torch.Generator().manual_seed(seed)
    n, k, c, d = 24, 3, 5, 7
    labels = torch.randint(0, k, (n,), generator=g)
    feats, inputs = torch.randn(n, c, generator=g, dtype=torch.float64), torch.randn(n, d, generator=g, dtype=torch.float64)
    feats = feats + 2 * torch.nn.functional.one_hot(labels, c).double()  # some class structure
    tau_f = soft_assign(feats, class_centroids(feats, labels, k)).double()
    tau_x = soft_assign(inputs, class_centroids(inputs, labels, k)).double()
    terms = ib_terms(tau_f, tau_x, labels, k)
    loss, bound, const = _brute(tau_f.tolist(), tau_x.tolist(), labels.tolist(), k)
    assert terms.loss.item() == pytest.approx(loss, abs=1e-9)
    assert terms.bound.item() == pytest.approx(bound, abs=1e-9)
    assert terms.input_constant.item() == pytest.approx(const, abs=1e-9)
    # Theorem 3.1: bound - input-only constant >= IB loss (also with a stale Q from another epoch)
    assert terms.bound.item() - const >= terms.loss.item() - 1e-12
    stale = log_q_given_y(tau_f.roll(1, dims=0), labels, k)
    stale_terms = ib_terms(tau_f, tau_x, labels, k, log_q=stale)
    assert stale_terms.bound.item() - const >= terms.loss.item() - 1e-12


def test_soft_assignment_is_a_distribution_over_class_centroids():
    v = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 0.1]])
    labels = torch.tensor([0, 1, 0])
    cent = class_centroids(v, labels, 3)
    assert torch.allclose(cent[2], torch.zeros(2))  # an absent class: zero centroid
    tau = soft_assign(v, cent)
    assert torch.allclose(tau.sum(1), torch.ones(3))
    assert (tau.argmax(1) == labels).all()


def test_bound_is_differentiable_for_training():
    feats = torch.randn(16, 4, requires_grad=True)
    labels = torch.arange(16) % 2
    x = torch.randn(16, 6)
    tau_x = soft_assign(x, class_centroids(x, labels, 2))
    tau_f = soft_assign(feats, class_centroids(feats.detach(), labels, 2))
    ib_terms(tau_f, tau_x, labels, 2).bound.backward()
    assert feats.grad is not None and feats.grad.abs().sum() > 0


def test_input_vectors_and_token_features():
    images = torch.rand(2, 3, 224, 160)
    v = input_vectors(images)
    assert v.shape == (2, 3 * 32 * 23) and torch.allclose(v.norm(dim=1), torch.ones(2))
    tokens = torch.tensor([[[9.0], [1.0], [3.0]]])  # prefix token, then two patches
    assert token_features(tokens, 1).item() == 2.0
    size = torch.tensor([[[1.0], [3.0], [1.0]]])  # the first patch token stands for 3 patches
    assert token_features(tokens, 1, size).item() == pytest.approx(1.5)
    padded = torch.tensor([[[1.0], [3.0], [0.0]]])  # a padded token (size 0) is ignored
    assert token_features(tokens, 1, padded).item() == pytest.approx(1.0)


def test_measure_ib_on_a_model_baseline_and_reduced():
    import vitbench
    from vitbench.testing import tiny_vit

    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 3, 32, 32, generator=g), torch.arange(8) % 4) for _ in range(2)]
    base = measure_ib(tiny_vit(), batches, 4)
    tome = measure_ib(vitbench.apply(tiny_vit(), "tome", r=0), batches, 4)
    assert base.loss.item() == pytest.approx(tome.loss.item(), abs=1e-5)  # r=0 is the same model
    reduced = measure_ib(vitbench.apply(tiny_vit(), "tome", r=4), batches, 4)
    assert math.isfinite(reduced.loss.item()) and math.isfinite(reduced.bound.item())
    assert reduced.bound.item() - reduced.input_constant.item() >= reduced.loss.item() - 1e-6


def test_final_features_of_a_conv_hybrid_is_the_last_stage_map_mean():
    """The family's feature module (the last stage, before ``final_conv``), the map LTM's and
    DCS's IB terms train on (:func:`vitbench.measure.ib.feature_source`)."""
    import timm

    import vitbench
    from vitbench.measure.ib import feature_source, final_features

    torch.manual_seed(0)
    plain = timm.create_model("mobilevit_xs", num_classes=3).eval()
    images = torch.randn(2, 3, 64, 64)
    assert feature_source(plain) == (plain.stages[-1], False)
    with torch.no_grad():
        expected = plain.stages(plain.stem(images)).mean(dim=(-2, -1))
        assert torch.equal(final_features(plain, images), expected)
    reduced = vitbench.apply(timm.create_model("mobilevit_xs", num_classes=3).eval(), "tome", r=0)
    reduced.load_state_dict(plain.state_dict())
    with torch.no_grad():
        assert torch.allclose(final_features(reduced, images), expected, atol=1e-6)


def test_non_finite_features_are_an_error_naming_the_batch() -> None:
    from vitbench.errors import NonFiniteError

    def features(model, images):
        return images.flatten(1)[:, :8]

    batches = [(torch.rand(4, 3, 8, 8), torch.tensor([0, 1, 0, 1])) for _ in range(2)]
    assert torch.isfinite(measure_ib(torch.nn.Identity(), batches, 2, features=features).loss)
    batches[1][0][2, 0, 0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"^IB metrics: the final features hold non-finite values \(1 of 32\) "
                                             r"in batch 2$"):
        measure_ib(torch.nn.Identity(), batches, 2, features=features)


def test_final_features_of_a_swin_pool_its_channels_last_map():
    """timm's Swin returns its last stage as [B, H, W, C] (output_fmt NHWC): the features are the
    mean over H and W, one value per channel (a mean over W and C was a bug), of the last stage's
    output (before the final norm: the feature module the IB training terms read)."""
    from timm.models.swin_transformer import SwinTransformer

    from vitbench.measure.ib import feature_source, final_features

    torch.manual_seed(0)
    swin = SwinTransformer(img_size=56, embed_dim=16, depths=(2, 2), num_heads=(1, 2), window_size=7,
                           num_classes=3).eval()
    images = torch.randn(2, 3, 56, 56)
    assert feature_source(swin) == (swin.layers[-1], True)
    with torch.no_grad():
        fmap = swin.layers(swin.patch_embed(images))
        features = final_features(swin, images)
    assert fmap.shape == (2, 7, 7, 32) and features.shape == (2, 32)
    assert torch.allclose(features, fmap.mean(dim=(1, 2)))


def test_class_sums_accumulate_batches_into_centroids_means_and_log_q():
    """Summed batch by batch, the statistics equal the one-pass helpers on all samples."""
    from vitbench.measure.ib import ClassSums, log_q_from_sums

    g = torch.Generator().manual_seed(0)
    vectors, labels = torch.randn(12, 5, generator=g), torch.tensor([0, 1, 0, 2, 1, 0] * 2)
    sums, tau = ClassSums(), torch.rand(12, 4, generator=g).softmax(dim=1)
    q = ClassSums()
    for part in (slice(0, 7), slice(7, 12)):
        onehot = torch.nn.functional.one_hot(labels[part], 4).float()  # class 3 has no sample
        sums.add(onehot, torch.nn.functional.normalize(vectors[part], dim=1))
        q.add(onehot, tau[part])
    assert sums.counts.tolist() == [6.0, 4.0, 2.0, 0.0]
    torch.testing.assert_close(sums.centroids(), class_centroids(vectors, labels, 4))
    means = sums.means()
    torch.testing.assert_close(means[0], torch.nn.functional.normalize(vectors[labels == 0], dim=1).mean(0))
    assert torch.equal(means[3], torch.zeros(5))
    torch.testing.assert_close(q.log_q(), log_q_given_y(tau, labels, 4))
    assert torch.equal(q.log_q(), log_q_from_sums(q.sums, q.counts))
    torch.testing.assert_close(q.log_q()[3], torch.full((4,), math.log(0.25)))  # no sample: uniform

