"""GTP (plugins/gtp/): the spatial and semantic graphs on hand-checkable grids, token counts on
test_vit, equality with the unpatched model at r=0, logits against a plain per-image reference
built from the paper's description (spatial, semantic and mixed graphs), pruning-only sources,
conformance and bad parameters."""
from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import vitbench
from vitbench.catalog import ModelInfo
from vitbench.engine import AttnInfo, TokenState, reduction_context
from vitbench.errors import ParamError
from vitbench.testing import check_method
from vitbench_plugins.gtp import GTPParams
from vitbench_plugins.gtp.reduction import GTPReducer, build, normalised, semantic_graph, spatial_graph

pytestmark = pytest.mark.usefixtures("single_thread")


def _images(n: int = 2, size: int = 160) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(0))


def _run(model, x, **params):
    reduced = vitbench.apply(copy.deepcopy(model), "gtp", **params)
    with torch.inference_mode():
        out = reduced(x)
    return out, reduction_context(reduced)


# -- the graphs ------------------------------------------------------------------------------
def test_the_spatial_graph_links_each_patch_to_its_eight_neighbours():
    g = spatial_graph(3, 4)
    assert g.shape == (12, 12) and torch.equal(g, g.T) and g.diagonal().sum() == 0
    degree = g.sum(-1).view(3, 4)
    assert degree.tolist() == [[3, 5, 5, 3], [5, 8, 8, 5], [3, 5, 5, 3]]
    assert g[5].nonzero().flatten().tolist() == [0, 1, 2, 4, 6, 8, 9, 10]  # (1, 1): all around it


def test_the_semantic_graph_links_each_token_to_its_most_similar_others():
    tokens = torch.tensor([[[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9], [0.7, 0.7]]])
    g = semantic_graph(tokens, 2)
    assert g.sum(-1).tolist() == [[2.0] * 5] and g[0].diagonal().sum() == 0
    assert g[0, 0].nonzero().flatten().tolist() == [1, 4]
    assert g[0, 2].nonzero().flatten().tolist() == [3, 4]


def test_normalisation_is_symmetric_and_leaves_an_isolated_token_alone():
    a = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    w = normalised(a)
    assert torch.equal(w, w.T) and torch.equal(w[2], torch.zeros(3))
    g = normalised(spatial_graph(3, 3))
    assert g[4, 0] == pytest.approx(1 / math.sqrt(8 * 3))  # centre (8 edges) to a corner (3 edges)


def test_a_spatial_graph_needs_the_grid_of_the_tokens_it_meets():
    reducer = GTPReducer(2, 0.1, "spatial", 8, grid=(4, 4), first=True)
    x = torch.randn(1, 10, 8)
    attn = torch.softmax(torch.randn(1, 2, 10, 10), -1)
    with pytest.raises(ParamError, match=r"gtp graph='spatial' needs the patch grid: the first reducing block "
                                         r"has 9 patch tokens, the model's grid is 4x4"):
        reducer(x, TokenState(prefix=1), AttnInfo(attn=attn))


# -- on test_vit -----------------------------------------------------------------------------
@pytest.mark.parametrize("r, counts", [
    (8, [93, 85, 77, 69, 61, 53]),
    (30, [71, 41, 11, 2, 2, 2]),  # one patch token always stays
    ([0, 10, 0, 20, 0, 5], [101, 91, 91, 71, 71, 66]),
])
def test_token_counts_follow_the_schedule(vit, r, counts):
    out, ctx = _run(vit, _images(), r=r)
    assert ctx.token_counts == counts
    assert out.shape == (2, vit.num_classes) and torch.isfinite(out).all()


def test_r0_is_the_unpatched_model(vit):
    x = _images()
    with torch.inference_mode():
        expected = vit(x)
    out, ctx = _run(vit, x, r=0)
    assert torch.equal(out, expected) and ctx.token_counts == [101] * 6


def test_it_prunes_so_each_kept_token_still_stands_for_its_own_patch(vit):
    _, ctx = _run(vit, _images(), r=9, trace_source=True)
    source = ctx.state.source
    assert source.shape == (2, 47, 101)
    assert torch.equal(source.sum(-1), torch.ones(2, 47))  # nothing merged: one patch each
    assert ctx.state.size is None  # no proportional attention: no token stands for more


# -- a plain reference from the paper's description ------------------------------------------
def _probabilities(attn, x):
    b, n, c = x.shape
    qkv = attn.qkv(x).reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    q, k = attn.q_norm(q), attn.k_norm(k)
    probs = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(-1)
    out = (probs @ v).transpose(1, 2).reshape(b, n, c)
    return attn.proj(attn.norm(out)), probs[0]


def _graph(kind, cols, patches, tokens, neighbours):
    """The normalised graph of one image as nested lists, built with Python loops."""
    n = len(patches)
    adj = [[0.0] * n for _ in range(n)]
    if kind in ("spatial", "mixed"):
        for a in range(n):
            for b in range(n):
                ra, ca, rb, cb = patches[a] // cols, patches[a] % cols, patches[b] // cols, patches[b] % cols
                if a != b and abs(ra - rb) <= 1 and abs(ca - cb) <= 1:
                    adj[a][b] = 1.0
    if kind in ("semantic", "mixed"):
        unit = F.normalize(tokens, dim=-1)
        sim = (unit @ unit.T).tolist()
        for a in range(n):
            others = sorted((b for b in range(n) if b != a), key=lambda b: (-sim[a][b], b))
            for b in others[:neighbours]:
                adj[a][b] = 1.0
    deg = [sum(row) for row in adj]
    return [[adj[a][b] / math.sqrt(deg[a] * deg[b]) if adj[a][b] else 0.0 for b in range(n)] for a in range(n)]


def _reference_gtp(model, images, r, alpha=0.1, graph="spatial", neighbours=8):
    depth = len(model.blocks)
    schedule = [r] * depth if isinstance(r, int) else r
    cols = model.patch_embed.grid_size[1]
    prefix = model.num_prefix_tokens
    logits = []
    for i in range(images.shape[0]):
        x = model.norm_pre(model._pos_embed(model.patch_embed(images[i:i + 1])))
        patches, w = list(range(x.shape[1] - prefix)), None
        for blk, k in zip(model.blocks, schedule):
            out, probs = _probabilities(blk.attn, blk.norm1(x))
            if w is None:  # built on the tokens entering block 0
                w = _graph(graph, cols, patches, x[0, prefix:], neighbours)
            x = x + blk.ls1(out)
            if k > 0:
                n = len(patches)
                score = [float(probs[:, j + prefix, j + prefix].max() * probs[:, :, j + prefix].sum(-1).max())
                         for j in range(n)]
                order = sorted(range(n), key=lambda j: (-score[j], j))
                kept, gone = sorted(order[:n - min(k, n - 1)]), order[n - min(k, n - 1):]
                rows = [x[0, prefix + a] + alpha * sum(w[a][e] * x[0, prefix + e] for e in gone) for a in kept]
                x = torch.cat([x[:, :prefix], torch.stack(rows)[None]], dim=1)
                w = [[w[a][b] for b in kept] for a in kept]
                patches = [patches[a] for a in kept]
            x = x + blk.ls2(blk.mlp(blk.norm2(x)))
        x = model.norm(x)
        logits.append(model.head(model.fc_norm(x[:, 0])))
    return torch.cat(logits)


@pytest.mark.parametrize("params", [
    dict(r=9),
    dict(r=[0, 12, 0, 12, 0, 12], graph="semantic", alpha=0.3, neighbours=5),
    dict(r=7, graph="mixed", alpha=0.5),
    dict(r=11, alpha=0.0),  # no propagation: pruning by the importance alone
])
def test_logits_match_the_plain_reference(vit, params):
    x = _images()
    out, _ = _run(vit, x, **params)
    with torch.no_grad():
        expected = _reference_gtp(vit, x, **params)
    assert (out - expected).abs().max() < 1e-4


def test_propagation_changes_the_output():
    """alpha moves the logits: the eliminated tokens' features reach the kept ones."""
    from vitbench.testing import tiny_vit

    model, x = tiny_vit(), _images(2, 32)
    a, _ = _run(model, x, r=6, alpha=0.0)
    b, _ = _run(model, x, r=6, alpha=0.5)
    assert (a - b).abs().max() > 1e-3


# -- conformance and parameters --------------------------------------------------------------
def test_defaults_are_the_official_evaluation_command():
    assert GTPParams() == GTPParams(r=4, alpha=0.1, graph="spatial", neighbours=8, trace_source=False)


@pytest.mark.parametrize("params", [{}, {"r": 6, "graph": "mixed"}])
def test_conforms(params):
    report = check_method("gtp", params)
    assert report.output_shape == (2, 10)
    r = params.get("r", 4)
    assert report.token_counts == [max(report.token_counts[0] + r - r * (i + 1), 2)
                                   for i in range(len(report.token_counts))]


def test_a_semantic_graph_is_built_on_the_tokens_entering_block_0():
    """Where block 0 eliminates nothing, a step there only builds the graph (and keeps the fused
    kernel: it asks for the tokens, not the probabilities); a spatial graph needs no such step."""
    info = ModelInfo(family="vit", depth=3, embed_dim=8, num_heads=2, num_prefix_tokens=1, num_patches=16,
                     grid=(4, 4))
    spatial = build(GTPParams(r=[0, 2, 2]), info).reducers
    mixed = build(GTPParams(r=[0, 2, 2], graph="mixed"), info).reducers
    assert spatial[0] is None and [r.needs for r in spatial[1:]] == [frozenset({"attn"})] * 2
    assert [r.needs for r in mixed] == [frozenset({"tokens"}), frozenset({"attn"}), frozenset({"attn"})]
    assert build(GTPParams(r=0, graph="semantic"), info).reducers == [None] * 3


@pytest.mark.parametrize("bad, message", [
    (dict(r=-1), r"gtp.r=-1 is out of range; r must be an integer >= 0"),
    (dict(r=[1, 2]), r"gtp.r has 2 entries; the model has 6 blocks"),
    (dict(alpha=-1.0), r"gtp.alpha=-1.0 is out of range; it must be >= 0"),
    (dict(graph="grid"), r"gtp.graph='grid'; valid values: spatial, semantic, mixed"),
    (dict(neighbours=0), r"gtp.neighbours=0 is out of range; it must be >= 1"),
])
def test_bad_parameters_name_the_value(vit, bad, message):
    with pytest.raises(ParamError, match=message):
        vitbench.apply(copy.deepcopy(vit), "gtp", **bad)
