"""Decode once (issue 35, item 2): the evaluation images after the model's resize and crop are
written once to the decoded-image cache and read from there, equal to what the folder gives;
the size limit, eviction, the lock, a full disk and ``vitbench cache``."""
from __future__ import annotations

import errno
import json
import os
import multiprocessing
from pathlib import Path

import numpy as np
import pytest

from vitbench.cli.main import main
from vitbench.data import decoded as dec
from vitbench.data.fingerprint import folder_fingerprint
from vitbench.data.image_folder import eval_pipeline
from vitbench.data.workers import workers_for
from vitbench.errors import DataError, ParamError
from vitbench.mm.registry import DATASETS


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Each test its own cache folder and the default size limit."""
    monkeypatch.setenv(dec.ENV_DIR, str(tmp_path / "decoded"))
    monkeypatch.delenv(dec.ENV_LIMIT, raising=False)
    return tmp_path / "decoded"


def _cfg(root: Path, size: int = 16) -> dict:
    return {"type": "vitbench.ClsImageFolder", "data_root": str(root), "split": "val",
            "pipeline": eval_pipeline(input_size=(size, size), crop_pct=0.875, interpolation="bicubic")}


def _build(cfg: dict):
    from mmengine.registry import DefaultScope

    with DefaultScope.overwrite_default_scope("mmpretrain"):
        return DATASETS.build(cfg)


def test_decoded_images_equal_the_folder_pipeline_and_are_decoded_once(image_folder: Path) -> None:
    cfg, fp = _cfg(image_folder), folder_fingerprint(image_folder)
    decoded_cfg, count = dec.decode_once(cfg, fp)
    assert count == 6 and decoded_cfg["type"] == "vitbench.DecodedImages"
    again, count_again = dec.decode_once(cfg, fp)
    assert (again, count_again) == (decoded_cfg, 0)
    # the oracle: the folder's own pipeline, item by item (PackInputs makes CHW tensors of both)
    folder, cached = _build(cfg), _build(decoded_cfg)
    assert len(cached) == len(folder) == 6
    for i in range(6):
        a, b = folder[i], cached[i]
        assert np.array_equal(a["inputs"].numpy(), b["inputs"].numpy())
        assert a["data_samples"].gt_label.tolist() == b["data_samples"].gt_label.tolist()
    assert cached.metainfo["classes"] == ("a", "b", "c")
    assert len(_build({**decoded_cfg, "indices": 4})) == 4


def test_another_crop_or_a_changed_folder_is_another_entry(image_folder: Path) -> None:
    fp = folder_fingerprint(image_folder)
    first, _ = dec.decode_once(_cfg(image_folder), fp)
    other, count = dec.decode_once(_cfg(image_folder, size=24), fp)
    assert count == 6 and other != first
    image = next((image_folder / "val" / "a").iterdir())
    times = (image.stat().st_atime_ns, image.stat().st_mtime_ns)
    image.write_bytes(next((image_folder / "val" / "b").iterdir()).read_bytes())
    os.utime(image, ns=times)  # another image under the old name and time (`touch -r`)
    changed, count = dec.decode_once(_cfg(image_folder), folder_fingerprint(image_folder))
    assert count == 6 and changed != first
    assert len(dec.list_entries()) == 3


def test_off_and_too_large_mean_no_entry(image_folder: Path, monkeypatch) -> None:
    fp = folder_fingerprint(image_folder)
    monkeypatch.setenv(dec.ENV_LIMIT, "0")
    assert dec.decode_once(_cfg(image_folder), fp) == (None, 0)
    monkeypatch.setenv(dec.ENV_LIMIT, "0.000001")  # 1000 bytes: six 16x16x3 images need 4608
    notes: list[str] = []
    assert dec.decode_once(_cfg(image_folder), fp, note=notes.append) == (None, 0)
    assert "need 0.00 GB, above $VITBENCH_DECODED_CACHE_GB" in notes[0] and dec.list_entries() == []
    monkeypatch.setenv(dec.ENV_LIMIT, "lots")
    with pytest.raises(ParamError, match=r"\$VITBENCH_DECODED_CACHE_GB='lots' is not a size"):
        dec.decode_once(_cfg(image_folder), fp)


def test_the_least_recently_used_entry_goes_first(image_folder: Path, monkeypatch) -> None:
    fp = folder_fingerprint(image_folder)
    monkeypatch.setenv(dec.ENV_LIMIT, str((6 * 16 * 16 * 3 + 6 * 17 * 17 * 3 + 100) / 1e9))  # room for two
    first, _ = dec.decode_once(_cfg(image_folder), fp)
    second, _ = dec.decode_once(_cfg(image_folder, size=17), fp)
    assert dec.decode_once(_cfg(image_folder), fp) == (first, 0)  # read again: now the second is the older
    notes: list[str] = []
    dec.decode_once(_cfg(image_folder, size=15), fp, note=notes.append)
    kept = {e.path for e in dec.list_entries()}
    assert Path(first["path"]) in kept and Path(second["path"]) not in kept and len(kept) == 2
    assert any("least recently used" in n for n in notes)


def test_a_full_disk_is_one_clear_error_and_leaves_nothing(image_folder: Path, own_cache, monkeypatch) -> None:
    fp = folder_fingerprint(image_folder)
    calls = {"n": 0}
    real = dec._collate

    def fills_up(items):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(items)

    monkeypatch.setattr(dec, "_collate", fills_up)
    with pytest.raises(DataError, match=r"the disk filled while writing the decoded evaluation images under .*"
                                        r"set \$VITBENCH_DECODED_CACHE_GB=0"):
        dec.decode_once(_cfg(image_folder), fp)
    assert [p for p in own_cache.iterdir() if not p.name.endswith(".lock")] == []
    monkeypatch.setattr(dec, "_collate", real)
    monkeypatch.setattr(dec.shutil, "disk_usage", lambda path: type("U", (), {"free": 10})())
    with pytest.raises(DataError, match=r"there is not enough free disk for the decoded evaluation images"):
        dec.decode_once(_cfg(image_folder), fp)
    assert dec.list_entries() == []


def _fill(args: tuple[dict, str, str]) -> int:
    import os

    cfg, fp, folder = args
    os.environ[dec.ENV_DIR] = folder
    return dec.decode_once(cfg, fp)[1]


def test_two_processes_fill_an_entry_once(image_folder: Path, own_cache) -> None:
    job = (_cfg(image_folder), folder_fingerprint(image_folder), str(own_cache))
    with multiprocessing.get_context("fork").Pool(2) as pool:
        counts = pool.map(_fill, [job, job])
    assert sorted(counts) == [0, 6] and len(dec.list_entries()) == 1


def test_workers_default_to_none_for_data_in_memory() -> None:
    assert workers_for({"type": "vitbench.OfflineFashionMNIST"}) == 0
    assert workers_for({"type": "vitbench.DecodedImages"}) == 0
    assert 1 <= workers_for({"type": "vitbench.ClsImageFolder"}) <= 8
    assert workers_for({"type": "vitbench.ClsImageFolder"}, 1) == 1
    with pytest.raises(ParamError, match="--workers must be an integer >= 0, got -1"):
        workers_for({}, -1)


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_run_decodes_once_and_a_second_run_decodes_nothing(image_folder: Path, tmp_path, monkeypatch, capsys):
    args = ["run", "--task", "cls", "--model", "test_vit", "--methods", "tome", "--metrics", "accuracy,ib",
            "--batch-size", "2", "--data", str(image_folder), "--num-classes", "3", "--workers", "2"]
    # the first run times latency too: the evaluation's end-to-end speed is shown only where timing was asked
    timed = [("accuracy,ib,latency" if a == "accuracy,ib" else a) for a in args]
    assert main([*timed, "--quick", "--out", str(tmp_path / "a")]) == 0
    assert "decoding 6 evaluation images once into the cache" in capsys.readouterr().err
    first = _records(tmp_path / "a")
    assert [r["images_decoded"] for r in first] == [6, 0]
    assert all(r["eval_img_s"] > 0 and r["eval_batch_size"] == 32 for r in first)  # on a CPU
    assert "End to end (img/s, bs=32)" in (tmp_path / "a" / "report.md").read_text()
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    assert "read from the decoded-image cache" in capsys.readouterr().err
    second = _records(tmp_path / "b")
    assert [r["images_decoded"] for r in second] == [0, 0]
    assert not any("eval_img_s" in r for r in second)
    assert "End to end" not in (tmp_path / "b" / "report.md").read_text()
    monkeypatch.setenv(dec.ENV_LIMIT, "0")  # the same numbers with every image decoded as before
    assert main([*args, "--out", str(tmp_path / "c")]) == 0
    third = _records(tmp_path / "c")
    assert "images_decoded" not in third[0]
    for a, c in zip(first, third):
        assert (a["top1_pct"], a["ib_loss"]) == pytest.approx((c["top1_pct"], c["ib_loss"]))


def test_cache_list_and_clear(image_folder: Path, capsys) -> None:
    dec.decode_once(_cfg(image_folder), folder_fingerprint(image_folder))
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert "1 entry" in out and "6 images of 16x16x3" in out and str(image_folder) in out
    assert main(["cache", "clear"]) == 0
    assert "removed 1 entry" in capsys.readouterr().out and dec.list_entries() == []
    with pytest.raises(SystemExit) as exit_:
        main(["cache", "prune"])
    assert exit_.value.code == 2
    assert "invalid choice: 'prune' (choose from 'list', 'clear')" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["rows shifted", "labels zeroed", "no checksum"])
def test_an_entry_that_is_not_what_was_written_is_decoded_again(image_folder: Path, damage: str) -> None:
    cfg, fp = _cfg(image_folder), folder_fingerprint(image_folder)
    decoded_cfg, _ = dec.decode_once(cfg, fp)
    entry = Path(decoded_cfg["path"])
    truth = [(item["inputs"].numpy(), item["data_samples"].gt_label.tolist()) for item in _build(decoded_cfg)]
    if damage == "rows shifted":
        raw = (entry / "images.u8").read_bytes()
        row = 16 * 16 * 3
        (entry / "images.u8").write_bytes(raw[row:] + raw[:row])
    elif damage == "labels zeroed":
        np.save(entry / "labels.npy", np.zeros(6, dtype=np.int64))
    else:  # an entry of an older vitbench, or one cut short before its checksum
        (entry / "checksum.json").unlink()
    with pytest.raises(DataError, match=f"decoded-image cache entry {entry} cannot be read"):
        _build(decoded_cfg)  # never served as it is
    notes: list[str] = []
    again, count = dec.decode_once(cfg, fp, note=notes.append)
    assert count == 6 and again == decoded_cfg
    assert f"decoded-image cache: entry {entry.name} is" in notes[0] and "decoding the images again" in notes[0]
    for (image, label), item in zip(truth, _build(again)):
        assert np.array_equal(image, item["inputs"].numpy()) and label == item["data_samples"].gt_label.tolist()


@pytest.mark.parametrize("where", ["a file", "/dev/null"])
def test_a_cache_location_that_is_no_folder_is_one_line(image_folder: Path, tmp_path: Path, monkeypatch,
                                                       where: str) -> None:
    path = tmp_path / "plain" if where == "a file" else Path(os.devnull)
    if where == "a file":
        path.write_text("x")
    monkeypatch.setenv(dec.ENV_DIR, str(path))
    with pytest.raises(DataError, match=rf"the decoded-image cache {path} cannot be used \(.*\); point "
                                        r"\$VITBENCH_DECODED_CACHE at a writable folder"):
        dec.decode_once(_cfg(image_folder), folder_fingerprint(image_folder))


@pytest.mark.parametrize("size", ["inf", "nan", "-1"])
def test_a_cache_size_that_is_no_size_is_one_line(size: str, monkeypatch) -> None:
    monkeypatch.setenv(dec.ENV_LIMIT, size)
    with pytest.raises(ParamError, match=rf"\$VITBENCH_DECODED_CACHE_GB='{size}' is not a size"):
        dec.cache_limit_bytes()


def test_workers_above_the_usable_cores_are_lowered_with_a_note(monkeypatch, capsys, tmp_path) -> None:
    from vitbench.data import workers

    monkeypatch.setattr(workers, "usable_cores", lambda: 3)
    notes: list[str] = []
    assert workers.bounded_workers(100_000, notes.append) == 3
    assert notes == ["--workers 100000 lowered to 3, the CPU cores this process may use"]
    assert workers.bounded_workers(2, notes.append) == 2 and workers.bounded_workers(None) is None and len(notes) == 1
    assert workers_for({"type": "vitbench.ClsImageFolder"}, 100_000) == 3
    assert main(["run", "--task", "cls", "--model", "test_vit", "--methods", "tome", "--metrics", "gmacs",
                 "--workers", "100000", "--out", str(tmp_path / "out")]) == 0
    assert "vitbench: note: --workers 100000 lowered to 3, the CPU cores this process may use" in capsys.readouterr().err


def test_a_cache_that_refuses_writes_is_one_line(image_folder: Path, monkeypatch) -> None:
    """A read-only mount (root passes every permission check, so the refusal is simulated)."""
    real_mkdir = Path.mkdir

    def read_only(self: Path, *args, **kwargs):
        if self.name.endswith(".tmp"):
            raise OSError(errno.EROFS, "Read-only file system")
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(DataError, match=r"the decoded-image cache .* cannot be written \(Read-only file system\); "
                                        r"point \$VITBENCH_DECODED_CACHE at a writable folder"):
        dec.decode_once(_cfg(image_folder), folder_fingerprint(image_folder))
