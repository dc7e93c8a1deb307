"""Fashion-MNIST from the Debian package: reader, errors, and the mm data set."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from vitbench.data.fashion_mnist import (
    DEFAULT_DIR,
    ENV_DIR,
    OfflineFashionMNIST,
    fashion_mnist_files,
    load_fashion_mnist,
    pad_images,
)
from vitbench.errors import DataError, UnknownNameError

needs_data = pytest.mark.skipif(not (DEFAULT_DIR / "t10k-images-idx3-ubyte.gz").is_file(),
                                reason="dataset-fashion-mnist is not installed")


@needs_data
def test_split_sizes_and_balance() -> None:
    x_train, y_train = load_fashion_mnist("train")
    x_test, y_test = load_fashion_mnist("test")
    assert x_train.shape == (60000, 28, 28) and x_train.dtype == np.uint8
    assert x_test.shape == (10000, 28, 28)
    assert y_train.shape == (60000,) and y_test.shape == (10000,)
    assert np.bincount(y_train, minlength=10).tolist() == [6000] * 10
    assert np.bincount(y_test, minlength=10).tolist() == [1000] * 10
    assert not x_train.flags.writeable  # the per-process cache is shared


def test_missing_files_say_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_DIR, str(tmp_path / "nowhere"))
    with pytest.raises(DataError, match=r"nowhere/t10k-images-idx3-ubyte.gz is missing.*apt-get install dataset-fashion-mnist"):
        load_fashion_mnist("test")


def test_unknown_split() -> None:
    with pytest.raises(UnknownNameError, match="valid Fashion-MNIST splits: test, train"):
        fashion_mnist_files("validation")


@needs_data
def test_env_dir_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copy(DEFAULT_DIR / name, tmp_path / name)
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    images, _labels = fashion_mnist_files("test")
    assert images.parent == tmp_path
    assert load_fashion_mnist("test")[0].shape == (10000, 28, 28)


def test_pad_images() -> None:
    x = np.full((2, 28, 28), 7, dtype=np.uint8)
    out = pad_images(x, 32)
    assert out.shape == (2, 32, 32)
    assert out[:, 2:30, 2:30].min() == 7 and out.sum() == 7 * 2 * 28 * 28
    with pytest.raises(DataError, match="use a size >= 28"):
        pad_images(x, 20)


@needs_data
def test_mm_dataset_items_and_subsets() -> None:
    ds = OfflineFashionMNIST(split="test", indices=5)
    assert len(ds) == 5
    item = ds[0]
    assert tuple(item["inputs"].shape) == (1, 32, 32)
    _, labels = load_fashion_mnist("test")
    assert int(item["data_samples"].gt_label) == int(labels[0])
    picked = OfflineFashionMNIST(split="train", indices=[3, 10])
    assert [int(picked[i]["data_samples"].gt_label) for i in range(2)] == \
        [int(v) for v in load_fashion_mnist("train")[1][[3, 10]]]
    rgb = OfflineFashionMNIST(split="test", indices=1, channels=3)
    assert tuple(rgb[0]["inputs"].shape) == (3, 32, 32)
    assert ds.metainfo["classes"][9] == "Ankle boot"


@needs_data
def test_mm_dataset_builds_from_scoped_config() -> None:
    from mmengine.registry import DATASETS

    ds = DATASETS.build({"type": "vitbench.OfflineFashionMNIST", "split": "test", "indices": 2})
    assert isinstance(ds, OfflineFashionMNIST) and len(ds) == 2
