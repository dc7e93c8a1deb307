"""The report's methodology paragraph, for what was measured only: how GMACs were counted when a
row counted them, how timings ran when a row was timed, how each task measures its accuracy (its
columns' ``about``), what the IB metrics are when a row measured them (docs/measuring.md, "Report
shape"), and always what a row says (label, images, interval, weights)."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from vitbench.report.row_facts import TOP5_MIN_CLASSES
from vitbench.report.task_shape import accuracy_columns

__all__ = ["ACCURACY", "PARAGRAPHS", "methodology"]

#: in :data:`PARAGRAPHS`, the records' accuracy columns: as keys any of them, as text their ``about``
ACCURACY = ("<accuracy>",)

#: ``(record keys, text)``: shown when a successful record holds one of the keys (``None``: always)
PARAGRAPHS: tuple[tuple[tuple[str, ...] | None, str], ...] = (
    (None, "A row's label names the method and its settings: the budget knob always, the other "
           "parameters where they differ from the defaults, and the budget of a matched run "
           "(`--match-gmacs F`)."),
    (("gmacs",),
     "**GMACs** are counted with `torch.utils.flop_counter.FlopCounterMode` at batch 1 on the "
     "real forward of the reduced model, so token counts that change between blocks are counted "
     "as they happen; fused attention (SDPA) is counted with an explicit formula, so fused and "
     "unfused attention count the same. 1 multiply-add = 1, the papers' \"GFLOPs\" convention "
     "(GMACs = FLOPs / 2). Input-dependent methods are averaged over real evaluation images and "
     "shown as mean ± standard deviation."),
    (("throughput_img_s",),
     "**Throughput** is the median images per second of the model forward only (eval mode, "
     "inference mode, input already on the device, after warm-up, device synchronised) at the "
     "batch size in the column header, ± the spread over repeats."),
    (("eval_img_s",),
     "**End to end** is the images per second of the accuracy evaluation as a whole (reading and "
     "decoding or the decoded-image cache, preprocessing, the model and scoring) at the evaluation "
     "batch size in the column header, from the end of its first batch (which carries one-time "
     "costs: the loader starting, a GPU loading its kernels): below the model-only throughput by "
     "what the data path costs."),
    (("latency_ms",), "**Latency** is the median milliseconds per image at batch 1."),
    (("timed_on",),
     "Every timing forwards the first evaluation images (taken again in turn for a larger batch), "
     "so that a method whose choices depend on the image (PPT's pooling or pruning, ATS's and "
     "LTMP's token counts) is timed choosing as it does on data; a run without data is timed on "
     "seeded noise (`timed_on` in runs.jsonl)."),
    (("throughput_img_s",),
     "**Speed-ups** are taken only against the baseline measured in the same run (same process "
     "configuration and session), never against a number from elsewhere; **efficiency** = "
     "speed-up / GMACs ratio (baseline GMACs / method GMACs): 1.0 means every saved MAC turned "
     "into time."),
    (("speedup_paired",),
     "**Paired speed-ups** (classification, timed eagerly): a method's speed-up is timed in turn "
     "with the baseline in its own run, one forward of the unreduced model and one of the reduced "
     "model per round on the same input at the column's batch size, alternating which goes first; "
     "it is the median over rounds of baseline seconds / method seconds (`speedup_paired` in "
     "runs.jsonl). A drift of the machine's speed between rows cancels in it, so it may differ from "
     "the ratio of the two throughput columns, which were timed minutes apart."),
    (("overhead_pct",),
     "**Overhead** is a token method's own time (scoring, matching, merging, gathering) as a share of "
     "its forward: the method's model is timed in turn with its limit, the unpatched blocks run on the "
     "method's own token counts (tokens dropped by slicing), for as many rounds as the throughput's "
     "repeats, and the cell is 1 - limit seconds / method seconds at the median round, ± its spread "
     "(`overhead_ms` in runs.jsonl: the same in milliseconds per forward at the batch size). A method "
     "whose overhead is near 0 keeps every speed-up its token counts allow."),
    (("train_throughput_img_s",),
     "**Train step** is the median images per second of a training step (`--metrics "
     "train_throughput`): a copy of the row's model in training mode, every parameter trainable, "
     "forward, a label-free loss (the mean log-sum-exp of the logits) and backward at the batch size "
     "of the throughput column, ± the spread over repeats; no optimiser step. **Train speed-up** is "
     "it over the baseline's."),
    (("gmacs", *ACCURACY),
     "Deltas (accuracy in percentage points or mAP, GMACs ↓ in %) are against the baseline of the "
     "same task and model measured on the same evaluation images, classifier head and weights."),
    (ACCURACY, ""),
    (("agreement_pct",),
     "**Agreement** is the share of the evaluation images whose top-1 class is the baseline's (the "
     "unreduced model of the same seed, weights and images): two methods at equal top-1 can keep "
     "different images' answers, and a method that changes many answers without losing accuracy "
     "no longer computes what the model computed."),
    (("top5_pct",),
     f"Top-5 is shown only for data of at least {TOP5_MIN_CLASSES} classes: with fewer, five "
     f"guesses cover more than a tenth of the classes (half of a 10-class set) and it says little."),
    (("ib_loss", "ib_bound"),
     "**IB loss** = I(X~;X) - I(X~;Y) and **IB bound** (Theorem 3.1 of the IBTM paper) are in "
     "nats, measured on the evaluation split: X~ the size-weighted mean of the final block's "
     "patch tokens, X the input image (area-downsampled to at most 32x32), soft assignments to "
     "the class centroids of each; the bound includes the input-only constant, so bound minus "
     "that constant (recorded as `ib_input_constant`) is >= the loss; lower is better for both. "
     "The IB loss can be negative: I(X~;X) >= I(X~;Y) holds for the image X itself, but this "
     "estimate reads X through its soft class clusters, which tell less about X~ than the label does."),
    (("trained",), "Learnable methods are fine-tuned before they are measured (details under each table); "
                   "column **Trained** says what each row trained: none, N steps on M images, or weights "
                   "shipped with vitbench (a run whose training settings equal theirs loads them)."),
    (None, "Where the weights came from (a random init and its seed, timm's pretrained weights, a "
           "checkpoint file and its sha256, the embedded default model) is one line under a table "
           "when every row shares it, else a column. Columns no row measured are left out; "
           "\"n/a\": the metric does not apply to that row or was not measured for it."),
)


def methodology(records: Iterable[Mapping[str, Any]]) -> str:
    """The paragraphs of :data:`PARAGRAPHS` that the successful ``records`` measured, joined."""
    ok = [r for r in records if r.get("status") == "ok"]

    columns = dict.fromkeys(c for task in dict.fromkeys(str(r.get("task")) for r in ok) for c in accuracy_columns(task))
    measured_columns = [c for c in columns if any(r.get(c.key) is not None for r in ok)]

    def measured(keys: tuple[str, ...] | None) -> bool:
        if keys is None or (keys[-1:] == ACCURACY and measured_columns):
            return True
        return any(r.get(k) not in (None, False, "") for r in ok for k in keys)

    def text(keys: tuple[str, ...] | None, words: str) -> str:
        return " ".join(dict.fromkeys(c.about for c in measured_columns if c.about)) if keys == ACCURACY else words

    return " ".join(t for keys, words in PARAGRAPHS if measured(keys) and (t := text(keys, words)))
