"""evaluate_cls against a plain torch loop, the data resolver, and their errors."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vitbench.data.fashion_mnist import DEFAULT_DIR
from vitbench.errors import DataError, NonFiniteError, ParamError
from vitbench.tasks.cls.evaluate import evaluate_cls, resolve_cls_data
from vitbench.data.input_config import input_config

needs_fmnist = pytest.mark.skipif(not (DEFAULT_DIR / "t10k-images-idx3-ubyte.gz").is_file(),
                                  reason="dataset-fashion-mnist is not installed")


def _plain_topk(model: torch.nn.Module, data, k: int) -> tuple[float, float]:
    """Top-1/top-k of a plain torch loop over the data set's own preprocessed images."""
    cfg = input_config(model)
    mean = torch.tensor(cfg.mean).view(-1, 1, 1) * 255
    std = torch.tensor(cfg.std).view(-1, 1, 1) * 255
    ds = data.build()
    hit1 = hitk = 0
    with torch.no_grad():
        for i in range(len(ds)):
            item = ds[i]
            x = item["inputs"].float()
            if data.bgr and x.shape[0] == 3:
                x = x.flip(0)
            logits = model(((x - mean) / std)[None])[0]
            label = int(item["data_samples"].gt_label)
            top = logits.topk(k).indices.tolist()
            hit1 += top[0] == label
            hitk += label in top
    return 100 * hit1 / len(ds), 100 * hitk / len(ds)


def test_top1_equals_plain_loop(model, image_folder: Path, tmp_path: Path) -> None:
    data = resolve_cls_data(str(image_folder), model)
    assert data.num_classes == 6 and data.bgr
    out = evaluate_cls(model, data, batch_size=5, work_dir=tmp_path / "wd")
    top1, top5 = _plain_topk(model, data, 5)
    assert out.pop("eval_img_s") > 0  # end to end: loading and model
    assert out == {"top1_pct": pytest.approx(top1), "top5_pct": pytest.approx(top5),
                   "num_images": 24, "num_classes": 6}
    assert not list((tmp_path / "wd").rglob("*.pth"))  # no checkpoints written


def test_limit_and_determinism(model, image_folder: Path) -> None:
    data = resolve_cls_data(str(image_folder), model)
    a = evaluate_cls(model, data, limit=7, batch_size=3)
    b = evaluate_cls(model, data, limit=7, batch_size=4)
    a.pop("eval_img_s"), b.pop("eval_img_s")  # a timing: never equal twice
    assert a == b and a["num_images"] == 7


def test_end_to_end_rate_leaves_out_the_first_batch(model, image_folder: Path) -> None:
    """A first batch that takes 3 s (one-time costs) does not set the end-to-end rate of 24 images."""
    import time

    calls = []

    def slow_first(module, args):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:
            time.sleep(3.0)

    data = resolve_cls_data(str(image_folder), model)
    handle = model.register_forward_pre_hook(slow_first)
    try:
        out = evaluate_cls(model, data, batch_size=6)
    finally:
        handle.remove()
    assert len(calls) == 4 and out["eval_img_s"] > 24 / 3.0


def test_steady_rate_counts_from_the_first_batch_end() -> None:
    from types import SimpleNamespace

    from vitbench.mm.hooks import steady_rate

    hook = SimpleNamespace(first_batch_end=10.0, first_batch_scored=32, scored=320)
    assert steady_rate(hook, 320, 19.0) == pytest.approx(288 / 9)
    assert steady_rate(hook, 640, 19.0) == pytest.approx(2 * 288 / 9)  # one rank's half of the images
    assert steady_rate(SimpleNamespace(first_batch_end=10.0, first_batch_scored=32, scored=32), 32, 11.0) is None
    assert steady_rate(SimpleNamespace(first_batch_end=None, first_batch_scored=0, scored=0), 0, 1.0) is None


def test_few_classes_have_no_top5(make_model, folder_writer, tmp_path: Path) -> None:
    model = make_model(num_classes=3)
    folder_writer(tmp_path / "val", {"x": 2, "y": 2, "z": 1})
    out = evaluate_cls(model, resolve_cls_data(str(tmp_path), model))
    assert out["top5_pct"] is None and out["num_images"] == 5 and out["num_classes"] == 3


def test_grey_model_on_folder(make_model, image_folder: Path) -> None:
    model = make_model(in_chans=1)
    data = resolve_cls_data(str(image_folder), model)
    assert not data.bgr
    out = evaluate_cls(model, data, limit=4)
    assert out["top1_pct"] == pytest.approx(_plain_topk(model, data.__class__(
        data.name, data.dataset_cfg(limit=4), data.num_classes, data.classes, data.bgr), 5)[0])


def test_missing_and_malformed_folders(model, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=rf"data folder {tmp_path / 'missing'} not found"):
        resolve_cls_data(str(tmp_path / "missing"), model)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=rf"malformed data folder {tmp_path / 'empty'}: .*ROOT/val/<class>/<image>"):
        resolve_cls_data(str(tmp_path / "empty"), model)


def test_more_classes_than_model_outputs(make_model, image_folder: Path) -> None:
    with pytest.raises(DataError, match="has 6 classes but the model predicts 4"):
        resolve_cls_data(str(image_folder), make_model(num_classes=4))


def test_imagenet_folders_keep_synset_labels(make_model, folder_writer, tmp_path: Path) -> None:
    from timm.data import ImageNetInfo

    wnids = list(ImageNetInfo().label_names())
    folder_writer(tmp_path / "val", {wnids[5]: 1, wnids[700]: 1})
    data = resolve_cls_data(str(tmp_path), make_model(num_classes=1000))
    ds = data.build()
    assert sorted(ds.get_data_info(i)["gt_label"] for i in range(2)) == [5, 700]
    assert data.num_classes == 2 and len(data.classes) == 1000


def test_bad_arguments(model, image_folder: Path) -> None:
    data = resolve_cls_data(str(image_folder), model)
    with pytest.raises(ParamError, match="batch_size must be a positive integer, got 0"):
        evaluate_cls(model, data, batch_size=0)
    with pytest.raises(ParamError, match="limit must be a positive integer"):
        evaluate_cls(model, data, limit=-1)
    with pytest.raises(ParamError, match="unknown device 'gpu0'"):
        evaluate_cls(model, data, device="gpu0")


@needs_fmnist
def test_fashion_mnist_default_arch(make_model) -> None:
    from vitbench.tasks.cls.default_model import build_arch

    model = build_arch().eval()
    data = resolve_cls_data(None, model)
    assert data.name == "fashion-mnist" and resolve_cls_data("Fashion-MNIST", model) == data
    out = evaluate_cls(model, data, limit=50, batch_size=25)
    assert out["num_images"] == 50 and out["num_classes"] == 10
    assert out["top1_pct"] == pytest.approx(_plain_topk(model, data.__class__(
        data.name, data.dataset_cfg(limit=50), 10, data.classes, False), 5)[0])
    with pytest.raises(DataError, match="fashion-mnist has 10 classes but the model predicts 6"):
        resolve_cls_data(None, make_model())


@needs_fmnist
def test_fashion_mnist_resized_for_rgb_models(make_model) -> None:
    model = make_model(num_classes=10, img_size=48)
    data = resolve_cls_data("fashion-mnist", model)
    item = data.build(limit=1)[0]
    assert tuple(item["inputs"].shape) == (3, 48, 48)


@pytest.mark.parametrize("bad", [float("nan"), float("-inf")])
def test_non_finite_logits_are_an_error_not_a_zero_row(model, image_folder: Path, bad) -> None:
    """A NaN logit scores as a wrong answer and -inf survives softmax: both must stop the evaluation."""
    data = resolve_cls_data(str(image_folder), model)
    with torch.no_grad():
        model.head.bias[2] = bad  # one class's logit, every image
    with pytest.raises(NonFiniteError, match=r"^evaluation: the logits hold non-finite values \(4 of 24\) in batch 1$"):
        evaluate_cls(model, data, batch_size=4, limit=8)
    assert not model._forward_hooks  # the guard is removed again


def test_fewer_classes_than_model_outputs_are_refused_too(make_model, image_folder: Path) -> None:
    """A 10-way head scored against a 6-class folder's labels 0-5 would be meaningless."""
    with pytest.raises(DataError, match=r"has 6 classes but the model predicts 10: .*pass --num-classes 6 "
                                        r"\(fits a new 6-way head on the train/ split, backbone frozen\) or a "
                                        r"--checkpoint whose head has 6 classes"):
        resolve_cls_data(str(image_folder), make_model(num_classes=10))
    data = resolve_cls_data(str(image_folder), make_model(num_classes=6))
    with pytest.raises(DataError, match="the model predicts 10 classes but the data .* has 6; pass --num-classes 6"):
        evaluate_cls(make_model(num_classes=10), data)


def test_bf16_evaluation_runs_the_model_in_bf16(model, image_folder: Path) -> None:
    """--precision bf16 reaches the model inside mmengine's TestLoop (which resets an autocast
    opened around runner.test()), and the metrics still get fp32 logits."""
    data = resolve_cls_data(str(image_folder), model)
    seen: list[torch.dtype] = []
    linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    hook = linear.register_forward_hook(lambda mod, args, out: seen.append(out.dtype))
    try:
        half = evaluate_cls(model, data, batch_size=4, precision="bf16")
        assert seen and set(seen) == {torch.bfloat16}
        seen.clear()
        full = evaluate_cls(model, data, batch_size=4)
        assert set(seen) == {torch.float32}
    finally:
        hook.remove()
    assert half["num_images"] == full["num_images"] and 0 <= half["top1_pct"] <= 100
    assert not hasattr(model, "test_step") or "test_step" not in vars(model)  # nothing left patched


@pytest.mark.parametrize("method", [None, "tome"])
def test_the_ib_metric_read_during_the_evaluation_equals_its_own_pass(model, image_folder: Path, method) -> None:
    """The IB samples an evaluation hands its observer (its own forwards, token sizes of a merging
    method included) give the metric a separate pass over the same images gives."""
    import vitbench
    from vitbench.measure.ib import IBSamples, measure_ib
    from vitbench.train.batches import cls_batches, data_preprocessor

    net = model if method is None else vitbench.apply(model, method, r=4)
    data = resolve_cls_data(str(image_folder), net)
    samples = IBSamples()
    out = evaluate_cls(net, data, batch_size=5, observe=samples.add)
    assert len(samples) == out["num_images"] == 24
    batches = cls_batches(data.dataset_cfg(), data_preprocessor(net, data.bgr), device="cpu", batch_size=7)()
    separate = measure_ib(net, batches, data.num_classes)
    shared = samples.terms(data.num_classes)
    for name in ("loss", "bound", "input_constant", "mi_feature_input"):
        assert getattr(shared, name).item() == pytest.approx(getattr(separate, name).item(), abs=1e-5), name
