"""The published rows vitbench can re-run: one :class:`Recipe` per row (docs/reproduce.md).

Every number here is one the project already cites (docs/methods.md, README.md, the tests) or a
paper's abstract states (``source`` says which): a paper's GFLOPs (multiply-accumulates, as
vitbench's GMACs) and top-1, or, where the project has only an official implementation's count,
that count, said so in ``source``. What is not cited is ``None`` and the ``note`` says so; no
number is filled in from memory (ATC, Sinkhorn and PatchMerger have their setting only). Methods
whose papers the project cites no number of (PiToMe, ATS, EViT/``topk``, DPC-KNN, K-Medoids) have
no row (docs/reproduce.md, "Rows left out").
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Optional

from vitbench.errors import choices_error

__all__ = ["CIFAR100_TEST", "IMAGENET_VAL", "RECIPES", "Recipe", "recipe"]

#: what ``--data`` must hold for an ImageNet row (the cls task's folder layout)
IMAGENET_VAL = ("the ImageNet-1k validation images as class folders, PATH/val/<wnid>/<image> or "
                "PATH/<wnid>/<image> (1000 synset folders n01440764 ...)")
#: what ``--data`` must hold for a row of the PPT thesis
CIFAR100_TEST = "the CIFAR-100 test images as class folders, PATH/val/<class>/<image> (100 folders)"


@dataclass(frozen=True)
class Recipe:
    """One published row: what to run (model, method, parameters) and what the source reports."""

    #: the row's id on the command line (``vitbench reproduce ID``)
    id: str
    #: a registered method name (``vitbench list methods``)
    method: str
    #: a timm model name
    model: str
    #: where the numbers come from (paper, and where in the project it is cited)
    source: str
    #: the method's parameters (validated against its parameter dataclass by the tests)
    params: Mapping[str, Any] = field(default_factory=dict)
    #: the source's GFLOPs of the reduced model (multiply-accumulates); ``None``: not cited
    paper_gflops: Optional[float] = None
    #: the source's top-1 (%) of the reduced model; ``None``: not cited
    paper_top1: Optional[float] = None
    #: the source's GFLOPs and top-1 (%) of its unreduced baseline, where cited
    paper_baseline_gflops: Optional[float] = None
    paper_baseline_top1: Optional[float] = None
    #: the source's GFLOPs as a fraction of its baseline's, where only that is cited
    paper_fraction: Optional[float] = None
    #: the source's throughput (images/s) of the reduced model and of its baseline, and on what GPU
    paper_img_s: Optional[float] = None
    paper_baseline_img_s: Optional[float] = None
    paper_gpu: str = ""
    #: why the count is not held to 2 % of the source's (empty: it is)
    gmacs_reason: str = ""
    #: whether ``--check-gmacs`` counts the row on random weights (False: meaningless untrained)
    count: bool = True
    #: the head's class count (``--num-classes``); ``None``: the model's 1000
    num_classes: Optional[int] = None
    #: what ``--data`` must hold
    data: str = IMAGENET_VAL
    #: how many images the source evaluated on: a top-1 is checked only on as many
    eval_images: int = 50_000
    #: the row's own top-1 tolerance in points; ``None``: :data:`vitbench.report.reproduced.TOP1_TOLERANCE_PP`
    top1_tolerance_pp: Optional[float] = None
    #: the row's own speed-up tolerance (a fraction); ``None``: :data:`vitbench.report.reproduced.SPEEDUP_TOLERANCE`
    speedup_tolerance: Optional[float] = None
    #: what the source leaves open and what vitbench chose
    note: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))
        if self.paper_gflops is None and self.paper_fraction is None and not self.gmacs_reason:
            raise ValueError(f"recipe {self.id}: no GFLOPs to compare with, and no reason given")
        if not self.count and not self.gmacs_reason:
            raise ValueError(f"recipe {self.id}: not counted, and no reason given")
        if (self.paper_img_s is not None or self.paper_baseline_img_s is not None) and not self.paper_gpu:
            raise ValueError(f"recipe {self.id}: a throughput without the GPU it was measured on")

    @property
    def paper_speedup(self) -> Optional[float]:
        """The source's speed-up (its throughput over its baseline's), where it gives both."""
        if self.paper_img_s is None or not self.paper_baseline_img_s:
            return None
        return self.paper_img_s / self.paper_baseline_img_s

    @property
    def params_text(self) -> str:
        """``r=13 layers=(3, 6, 9)``, or ``defaults``."""
        return " ".join(f"{k}={_text(v)}" for k, v in self.params.items()) or "defaults"


def _text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value)


_DEIT_S = "deit_small_patch16_224"
_SWIN_T = "swin_tiny_patch4_window7_224"
_SWIN_B = "swin_base_patch4_window7_224"
_NO_TOP1 = "The source's top-1 for this row is not cited in the project."
_SWIN_R = "r is vitbench's per-tile budget that lands at the row's GFLOPs (the source's setting is not cited). "
_THESIS = ("the thesis on PPT's score functions (docs/methods.md, 'PPT' and 'Token scorers'): DeiT-S fine-tuned "
           "on CIFAR-100 to 83.56 %, then pruned")
_THESIS_NOTE = ("needs the DeiT-S fine-tuned on CIFAR-100 (--checkpoint). The thesis' r and blocks are not "
                "recorded in the project: PPT's defaults (r=50 at blocks 3, 6, 9).")
_THESIS_REASON = "the thesis' GFLOPs are not cited in the project (counted, not compared)"
_KEEP_RATES = "the paper states keep rates, not GFLOPs (counted, not compared)"
_README_NO_GFLOPS = "the README states top-1 and throughput, not GFLOPs (counted, not compared)"
_MCTF_T_REASON = ("as on DeiT-S, the official block also runs attention·V and the value and output projections on "
                  "the fused tokens: vitbench counts 0.726, +2.2 % (docs/methods.md, 'MCTF')")
#: MCTF-Fast's 35 % of the tokens at blocks 3, 6 and 9 as merge counts of 197 tokens
_MCTF_FAST_R = (0, 0, 0, 68, 0, 0, 44, 0, 0, 29, 0, 0)
_MCTF_FAST_NOTE = ("training-free variant (the README's checkpoint is fine-tuned), so expect a top-1 below the "
                   "README's; the README gives no baseline throughput, so no speed-up to check.")
_HAURUM_LINKAGE = "average linkage is the official training script's default; the paper reports all three."

RECIPES: tuple[Recipe, ...] = (
    Recipe("tome-deit-s-r13", "tome", _DEIT_S, params={"r": 13}, paper_gflops=2.706, paper_baseline_gflops=4.599,
           source="ToMe (Bolya et al., ICLR 2023); GMACs: the official code's count on the same timm DeiT-S "
                  "(docs/methods.md, 'ToMe', tests/plugins/test_gmacs_reference.py)",
           note="the paper's printed DeiT-S GFLOPs and top-1 are not cited in the project."),
    Recipe("tome-vit-s-r13", "tome", "vit_small_patch16_224", params={"r": 13}, paper_top1=79.30,
           paper_baseline_top1=81.41, paper_img_s=1564, paper_baseline_img_s=953, paper_gpu="V100",
           source="ToMe (Bolya et al., ICLR 2023), the official README's off-the-shelf table: ViT-S/16 (timm "
                  "AugReg weights) at r=13",
           gmacs_reason=_README_NO_GFLOPS,
           note="timm's vit_small_patch16_224 (augreg_in21k_ft_in1k) stands for the README's ViT-S/16; "
                "training-free. Compare the speed-up ratio (1.64x), not the im/s: those are the README's V100."),
    Recipe("tome-vit-b-r13", "tome", "vit_base_patch16_224", params={"r": 13}, paper_top1=82.60,
           paper_baseline_top1=84.57, paper_img_s=511, paper_baseline_img_s=309, paper_gpu="V100",
           source="ToMe (Bolya et al., ICLR 2023), the official README's off-the-shelf table: ViT-B/16 at r=13",
           gmacs_reason=_README_NO_GFLOPS,
           note="timm's vit_base_patch16_224 stands for the README's ViT-B/16 (which timm weights it used is "
                "not recorded here); training-free. Speed-up 1.65x on the README's V100."),
    Recipe("tome-vit-l-r7", "tome", "vit_large_patch16_224", params={"r": 7}, paper_top1=84.26,
           paper_baseline_top1=85.82, paper_img_s=167, paper_baseline_img_s=95, paper_gpu="V100",
           source="ToMe (Bolya et al., ICLR 2023), the official README's off-the-shelf table: ViT-L/16 at r=7",
           gmacs_reason=_README_NO_GFLOPS,
           note="timm's vit_large_patch16_224 stands for the README's ViT-L/16 (which timm weights it used is "
                "not recorded here); training-free. Speed-up 1.76x on the README's V100."),
    Recipe("tome-vit-l-384-r23", "tome", "vit_large_patch16_384", params={"r": 23}, paper_top1=86.14,
           paper_baseline_top1=86.92, paper_img_s=56, paper_baseline_img_s=28, paper_gpu="V100",
           source="ToMe (Bolya et al., ICLR 2023), the official README's off-the-shelf table: ViT-L/16 @ 384 at r=23",
           gmacs_reason=_README_NO_GFLOPS,
           note="timm's vit_large_patch16_384 stands for the README's ViT-L/16 @ 384 (which timm weights it used "
                "is not recorded here); training-free. Speed-up 2.00x on the README's V100."),
    Recipe("tome-swin-t", "tome", _SWIN_T, params={"r": 10}, paper_gflops=3.91, paper_baseline_gflops=4.50,
           source="the IBTM paper's ToMe-Swin-T row (docs/methods.md, 'Swin')", note=_SWIN_R + _NO_TOP1),
    Recipe("tome-swin-b", "tome", _SWIN_B, params={"r": 12}, paper_gflops=13.0, paper_baseline_gflops=15.4,
           source="the published ToMe-Swin-B row, 15.4 -> 13.0 (docs/methods.md, 'Swin', "
                  "tests/engine/families/test_swin.py); the paper and table are not named there",
           note=_SWIN_R + _NO_TOP1),
    Recipe("ppt-deit-s", "ppt", _DEIT_S, params={"r": 50, "layers": (3, 6, 9)}, paper_gflops=2.944, paper_top1=79.50,
           paper_baseline_gflops=4.6, paper_baseline_top1=79.8,
           source="PPT (Wu et al., 2023), DeiT-S off the shelf (docs/methods.md, 'PPT'); the table number is "
                  "not recorded in the project",
           note="training-free. The official code's count on the same timm DeiT-S is 2.942 (docs/methods.md, 'PPT')."),
    Recipe("ppt-thesis-cls-attn", "ppt", _DEIT_S, paper_top1=65.30, paper_baseline_top1=83.56, num_classes=100,
           data=CIFAR100_TEST, eval_images=10_000, gmacs_reason=_THESIS_REASON, source=_THESIS + ", cls-attn scorer",
           note=_THESIS_NOTE),
    Recipe("ppt-thesis-entropy", "entropy", _DEIT_S, paper_top1=63.40, paper_baseline_top1=83.56, num_classes=100,
           data=CIFAR100_TEST, eval_images=10_000, gmacs_reason=_THESIS_REASON, source=_THESIS + ", entropy ('diversity') scorer",
           note=_THESIS_NOTE),
    Recipe("ppt-thesis-average", "average", _DEIT_S, paper_top1=62.59, paper_baseline_top1=83.56, num_classes=100,
           data=CIFAR100_TEST, eval_images=10_000, gmacs_reason=_THESIS_REASON, source=_THESIS + ", average-attention scorer",
           note=_THESIS_NOTE),
    Recipe("ltmp-swin-t", "ltmp", _SWIN_T, params={"target": 0.88}, paper_gflops=3.95, paper_baseline_gflops=4.50,
           source="the LTMP-Swin-T row as docs/methods.md, 'LTMP' ('On Swin') cites it; the paper and table are "
                  "not named there",
           gmacs_reason="learned thresholds: the count depends on training (untrained, they merge almost "
                        "nothing on random keys: 4.49)", count=False,
           note="target 0.88 = 3.95 / 4.49, a fraction of the counted GMACs on Swin (docs/methods.md, 'LTMP'). "
                + _NO_TOP1),
    Recipe("ibtm-vit-b", "ibtm", "vit_base_patch16_224", params={"ratio": 0.7}, paper_gflops=12.85,
           paper_top1=83.96, paper_baseline_gflops=17.58, paper_baseline_top1=83.74,
           source="the IBTM paper, IBTM-ViT-B after 50 fine-tuning epochs (docs/methods.md, 'LTM / IBTM')",
           note="counted before any class statistics; with ImageNet's 1000 classes the IB step's distances "
                "add about 2.3 GMACs (docs/methods.md, 'LTM / IBTM'). vitbench fine-tunes 2 epochs, backbone frozen. "
                "Which ViT-B weights the paper started from is not recorded."),
    Recipe("ibtm-swin-t", "ibtm", _SWIN_T, params={"ratio": 0.7}, paper_gflops=3.82, paper_baseline_gflops=4.50,
           source="the IBTM paper's IBTM-Swin-T row (docs/methods.md, 'LTM / IBTM' 'On Swin')",
           gmacs_reason="the paper's ratio for Swin-T is not cited: ratio 0.7 counts 3.98 before class "
                        "statistics (docs/methods.md, 'LTM / IBTM')",
           note="ratio 0.7 is vitbench's default, not the paper's. " + _NO_TOP1),
    Recipe("ibtm-mobilevit-s", "ibtm", "mobilevit_s", params={"ratio": 0.7}, paper_gflops=1.17, paper_top1=79.05,
           paper_baseline_gflops=1.40, paper_baseline_top1=78.4,
           source="the IBTM/LTM papers' MobileViT-S row (docs/methods.md, 'LTM / IBTM')",
           gmacs_reason="the baselines differ: the paper counts MobileViT-S as 1.40 GFLOPs, vitbench counts "
                        "timm's mobilevit_s at 256 px as 2.00 (docs/methods.md, 'LTM / IBTM')",
           note="the paper's ratio for MobileViT-S is not cited; 0.7 is vitbench's default."),
    Recipe("dcs-mobilevit-s", "dcs", "mobilevit_s", paper_gflops=1.2, paper_top1=81.0, paper_baseline_gflops=1.6,
           paper_baseline_top1=78.4, source="the DCS paper, DCS-MobileViT-S (docs/methods.md, 'DCS')",
           gmacs_reason="channels are chosen by the search (fine-tuning): untrained, DCS keeps every channel; "
                        "and the paper's baseline (1.6) is not timm's count (2.00)", count=False,
           note="the paper's 1.2 / 1.6 = 0.75 is below what gating MLP channels reaches on MobileViT "
                "(docs/methods.md, 'DCS'), so the default budget 0.9 runs; the paper's arch for this row is not "
                "recorded."),
    Recipe("dcs-efficientvit-b1", "dcs", "efficientvit_b1", params={"budget": 0.885}, paper_gflops=0.46,
           paper_top1=81.2, paper_baseline_gflops=0.52, paper_baseline_top1=79.4,
           source="the DCS paper, DCS-EfficientViT-B1 (docs/methods.md, 'DCS')",
           gmacs_reason="channels are chosen by the search (fine-tuning): untrained, DCS keeps every channel",
           count=False,
           note="budget 0.885 = 0.46 / 0.52, the paper's ratio (vitbench's budget is a GMACs fraction); the "
                "paper's arch for this row is not recorded."),
    Recipe("tofu-swin-t", "tofu", _SWIN_T, params={"r": 10}, paper_gflops=3.91, paper_baseline_gflops=4.50,
           source="the IBTM paper's ToFu-Swin-T row (README.md 'Backbone families', docs/methods.md, 'The hook point')",
           note=_SWIN_R + "ToFu's own paper's rows are not cited in the project. " + _NO_TOP1),
    Recipe("mctf-deit-s", "mctf", _DEIT_S, params={"r": (0,) + (16,) * 11}, paper_gflops=2.60, paper_top1=80.1,
           paper_baseline_top1=79.8,
           source="MCTF (Lee et al., CVPR 2024), the official DeiT-S setting and the official README's DeiT-S "
                  "row (79.8 -> 80.1 top-1 at 2.60 GFLOPs); GFLOPs: the official code's fvcore count "
                  "(docs/methods.md, 'MCTF')",
           gmacs_reason="the official block also runs attention·V and the value and output projections on "
                        "the fused tokens: vitbench counts 2.66 (docs/methods.md, 'MCTF')",
           note="vitbench runs the training-free variant (no token-reduction-consistency fine-tuning); a top-1 "
                "above the baseline's, as the README's, comes with that fine-tuning, so expect this row below it."),
    Recipe("mctf-deit-t", "mctf", "deit_tiny_patch16_224", params={"r": (0,) + (16,) * 11}, paper_gflops=0.71,
           paper_top1=72.7, paper_baseline_top1=72.2,
           source="MCTF (Lee et al., CVPR 2024), the official README's DeiT-T row (72.2 -> 72.7 top-1 at 0.71 "
                  "GFLOPs)",
           gmacs_reason=_MCTF_T_REASON,
           note="r=16 in blocks 2-12, the official evaluation script's DeiT-T setting (run/eval_deit_t_mctf.sh, "
                "the same as DeiT-S's); training-free variant, so expect a top-1 below the README's."),
    Recipe("mctf-fast-deit-s", "mctf", _DEIT_S, params={"r": _MCTF_FAST_R}, paper_gflops=2.76, paper_top1=80.1,
           paper_baseline_top1=79.8,
           source="MCTF-Fast (Lee et al., CVPR 2024), 35 % at blocks 3, 6, 9 (run/eval_deit_s_mctf_fast.sh), the "
                  "official README's MCTF-Fast (DeiT-S) row (79.8 -> 80.1 top-1 at 2.76 GFLOPs, 3302 im/s on an "
                  "RTX 3090, the baseline's not given)",
           note=_MCTF_FAST_NOTE),
    Recipe("mctf-fast-deit-t", "mctf", "deit_tiny_patch16_224", params={"r": _MCTF_FAST_R}, paper_gflops=0.75,
           paper_top1=72.7, paper_baseline_top1=72.2,
           source="MCTF-Fast (Lee et al., CVPR 2024), 35 % at blocks 3, 6, 9 (run/eval_deit_t_mctf_fast.sh), the "
                  "official README's MCTF-Fast (DeiT-T) row (72.2 -> 72.7 top-1 at 0.75 GFLOPs, 7386 im/s on an "
                  "RTX 3090, the baseline's not given)",
           note=_MCTF_FAST_NOTE),
    Recipe("zero-tprune-deit-s", "zero-tprune", _DEIT_S, params={"r": 11}, paper_fraction=0.653,
           source="Zero-TPrune (Wang et al., CVPR 2024): the headline 0.653x of the baseline's FLOPs as "
                  "docs/methods.md, 'Zero-TPrune' cites it",
           note="the model of that headline is not recorded in the project (DeiT-S here, compared as a "
                "fraction); r=11 in every block is vitbench's schedule (the paper's is not given). " + _NO_TOP1),
    Recipe("diffrate-deit-s", "diffrate", _DEIT_S, params={"keep": 0.3}, paper_gflops=2.9,
           paper_baseline_gflops=4.6,
           source="DiffRate (Chen et al., ICCV 2023), the DeiT-S point (docs/methods.md, 'DiffRate')",
           note="the paper's searched per-block rates are not in the project: vitbench's constant-r schedule "
                "at keep=0.3 lands at the paper's compute (diffrate-search-deit-s searches them). " + _NO_TOP1),
    Recipe("diffrate-search-deit-s", "diffrate-search", _DEIT_S, params={"gmacs_fraction": 0.63}, paper_gflops=2.9,
           paper_baseline_gflops=4.6,
           source="DiffRate (Chen et al., ICCV 2023), the DeiT-S point (docs/methods.md, 'DiffRate')",
           gmacs_reason="learned rates: the count depends on the search (training)", count=False,
           note="gmacs_fraction 0.63 = about 2.9 / 4.6 (plugins/diffrate.py); backbone frozen. " + _NO_TOP1),
    Recipe("dynamicvit-deit-s", "dynamicvit", _DEIT_S, params={"keep": 0.7, "layers": (3, 6, 9)}, paper_gflops=2.9,
           paper_top1=79.3, paper_baseline_gflops=4.6, paper_baseline_top1=79.8,
           source="DynamicViT (Rao et al., NeurIPS 2021), DeiT-S at rho 0.7 (docs/methods.md, 'DynamicViT')",
           gmacs_reason="the paper's modules sit before blocks 4, 7, 10, vitbench's after a block's attention: "
                        "layers (3, 6, 9) count 3.07, (2, 5, 8) 2.82; the paper's lies between "
                        "(docs/methods.md, 'DynamicViT')",
           note="the paper trains the whole model 30 epochs with distillation; vitbench trains the "
                "predictors one epoch, no distillation."),
    Recipe("atc-deit-s", "atc", _DEIT_S, params={"keep": 0.5, "layers": (3, 6, 9), "linkage": "average"},
           paper_baseline_gflops=4.6,
           source="ATC (Haurum et al., ECCV 2024), DeiT-S fine-tuned on ImageNet at keep rate 0.5, reduction "
                  "at the 4th, 7th and 10th blocks (the paper's classification table; docs/methods.md, 'ATC')",
           gmacs_reason=_KEEP_RATES + "; the official schedule keeps int(196 * 0.5^s) = 98, 49, 24 tokens, "
                        "vitbench ceil(keep * N): 98, 49, 25 (docs/methods.md, 'ATC')",
           note="the paper's top-1 for this row is not recorded in the project (its table has not been quoted "
                "from the paper; nothing is filled in from memory). The paper fine-tunes the whole model 30 epochs; ATC "
                "itself is training-free, so this row runs off the shelf. " + _HAURUM_LINKAGE),
    Recipe("sinkhorn-deit-s", "sinkhorn", _DEIT_S, params={"keep": 0.5, "layers": (3, 6, 9)},
           paper_baseline_gflops=4.6,
           source="Sinkhorn clustering as benchmarked in Haurum et al., 'Which Tokens to Use?' (ICCV Workshops "
                  "2023), DeiT-S on ImageNet at keep rate 0.5, blocks 4, 7, 10 (the paper's results table; "
                  "docs/methods.md, 'Sinkhorn')",
           gmacs_reason=_KEEP_RATES + "; the official code clusters to int(196 * 0.5^s) = 98, 49, 24 centres, "
                        "vitbench to 98, 49, 25, and counts the transport (N_p M C MACs per listed block)",
           note="the paper's top-1 for this row is not recorded in the project (its table has not been quoted "
                "from the paper; nothing is filled in from memory). The paper trains the whole model 30 epochs, "
                "vitbench the centres one epoch (docs/methods.md, 'Sinkhorn' lists the other deviations)."),
    Recipe("patchmerger-deit-s", "patchmerger", _DEIT_S, params={"tokens": 24, "layer": 5},
           paper_baseline_gflops=4.6,
           source="PatchMerger (Renggli et al., 2022) as benchmarked in Haurum et al., 'Which Tokens to Use?' "
                  "(ICCV Workshops 2023), DeiT-S on ImageNet at keep rate 0.5 (the paper's results table; "
                  "docs/methods.md, 'PatchMerger')",
           gmacs_reason=_KEEP_RATES + "; and the benchmark's PatchMerger merges at blocks 4, 7 and 10 to "
                        "int(196 * 0.5^s) = 98, 49, 24 tokens, vitbench's (the layer of Renggli et al.) once: "
                        "24 tokens in block 6 (layer=5) is vitbench's nearest setting, not the benchmark's",
           note="the paper's top-1 for this row is not recorded in the project (its table has not been quoted "
                "from the paper; nothing is filled in from memory). Renggli et al.'s own rows (JFT pre-training) are "
                "not cited in the project. The benchmark trains the whole model 30 epochs, vitbench the merger "
                "one epoch."),
    Recipe("dtem-deit-s", "dtem", _DEIT_S, params={"r": 12}, paper_fraction=0.628, paper_top1=79.85,
           source="DTEM (Lee & Hong, NeurIPS 2024), the abstract's DeiT-S headline: 37.2 % fewer FLOPs at "
                  "79.85 % top-1 on ImageNet-1k (arXiv 2412.10569; the method: docs/methods.md, 'DTEM')",
           note="the abstract states the reduction, not GFLOPs or r: r=12 per block is the ToMe-style schedule "
                "whose count is 0.628x the baseline's (2.886 / 4.599). Whether the 79.85 is the modular (frozen "
                "backbone) or the end-to-end row of the paper's table is not recorded here (it matches DeiT-S's "
                "own 79.8, so likely end-to-end); vitbench trains the embeddings only unless --train-backbone."),
)


def recipe(row: str) -> Recipe:
    """The recipe with id ``row``; an unknown id is an error listing the valid ones."""
    for r in RECIPES:
        if r.id == row:
            return r
    raise choices_error("reproduce row", row, [r.id for r in RECIPES])
