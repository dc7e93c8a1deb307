"""Image folders: layout detection, the errors users see, and the mm data set."""
from __future__ import annotations

from pathlib import Path

import pytest

from vitbench.data.image_folder import ClsImageFolder, eval_pipeline, find_split
from vitbench.errors import DataError


def test_imagenet_layout(image_folder: Path) -> None:
    split = find_split(image_folder)
    assert split.split_dir == image_folder / "val"
    assert split.classes == ("a", "b", "c") and split.num_images == 6
    assert find_split(image_folder, "train").num_images == 3


def test_single_split_layout(tmp_path: Path, folder_writer) -> None:
    folder_writer(tmp_path, {"cat": 1, "dog": 2})
    (tmp_path / ".hidden").mkdir()
    split = find_split(tmp_path)
    assert split.split_dir == tmp_path and split.classes == ("cat", "dog")


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=rf"data folder {tmp_path / 'nope'} not found; expected ROOT/val/<class>/<image>"):
        find_split(tmp_path / "nope")


def test_no_class_folders(tmp_path: Path) -> None:
    (tmp_path / "loose.png").write_bytes(b"")
    with pytest.raises(DataError, match=rf"malformed data folder {tmp_path}: no class folders; expected ROOT/val/<class>/<image>"):
        find_split(tmp_path)


def test_no_images(tmp_path: Path) -> None:
    (tmp_path / "val" / "a").mkdir(parents=True)
    (tmp_path / "val" / "a" / "notes.txt").write_text("x")
    with pytest.raises(DataError, match=rf"malformed data folder {tmp_path / 'val'}: 1 class folders but no images"):
        find_split(tmp_path)


def test_train_without_val(tmp_path: Path, folder_writer) -> None:
    folder_writer(tmp_path / "train", {"a": 1})
    with pytest.raises(DataError, match=rf"malformed data folder {tmp_path}: it has no val/ split"):
        find_split(tmp_path)


def test_dataset_labels_and_pipeline(image_folder: Path) -> None:
    ds = ClsImageFolder(str(image_folder), pipeline=eval_pipeline(input_size=(32, 32), crop_pct=0.875))
    assert len(ds) == 6
    assert [ds.get_data_info(i)["gt_label"] for i in range(6)] == [0, 0, 1, 1, 1, 2]
    item = ds[0]
    assert tuple(item["inputs"].shape) == (3, 32, 32)
    assert ds.metainfo["classes"] == ("a", "b", "c")
    grey = ClsImageFolder(str(image_folder), indices=2,
                          pipeline=eval_pipeline(input_size=(16, 24), in_chans=1))
    assert len(grey) == 2 and tuple(grey[0]["inputs"].shape) == (1, 16, 24)


def test_label_map_skips_unmapped(image_folder: Path) -> None:
    ds = ClsImageFolder(str(image_folder), label_map={"b": 7, "c": 3},
                        pipeline=[{"type": "mmpretrain.LoadImageFromFile"}])
    assert sorted(ds.get_data_info(i)["gt_label"] for i in range(len(ds))) == [3, 7, 7, 7]


def test_bad_crop_pct() -> None:
    with pytest.raises(DataError, match="crop_pct"):
        eval_pipeline(input_size=(32, 32), crop_pct=1.5)


def test_an_empty_class_folder_is_refused_naming_it(image_folder: Path) -> None:
    (image_folder / "val" / "d").mkdir()
    (image_folder / "val" / "e").mkdir()
    with pytest.raises(DataError, match=rf"^malformed data folder {image_folder / 'val'}: class folder "
                                        rf"{image_folder / 'val' / 'd'} holds no images \(2 such folders: d, e\); "
                                        rf"remove it or add its images"):
        find_split(image_folder)
    assert find_split(image_folder, "train").classes == ("a", "b", "c")  # the other split is fine


def test_an_empty_image_file_is_refused_naming_it(image_folder: Path) -> None:
    (image_folder / "train" / "b" / "img0.png").write_bytes(b"")
    with pytest.raises(DataError, match=rf"^image {image_folder / 'train' / 'b' / 'img0.png'} is empty \(0 bytes\)"):
        find_split(image_folder, "train")


def test_a_corrupt_image_is_a_data_error_naming_it(image_folder: Path) -> None:
    bad = image_folder / "val" / "b" / "img1.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\nno image")
    ds = ClsImageFolder(str(image_folder), pipeline=eval_pipeline(input_size=(32, 32)))
    assert ds[0]["inputs"].shape == (3, 32, 32)  # the others still load
    index = [ds.get_data_info(i)["img_path"] for i in range(len(ds))].index(str(bad))
    with pytest.raises(DataError, match=rf"^cannot read image {bad}: it is corrupt or not an image; remove or replace it$"):
        ds[index]
