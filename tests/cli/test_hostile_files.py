"""Hostile files and bytes (issue 37, item 6): a pipe or a device where a store, a shard, an image
or a report is expected, paths and arguments no encoding decodes, and images that declare
gigabytes of pixels are one line or an error record, never a hang, a traceback or a replaced device.

Anything that could hang runs in a subprocess with a timeout, so a regression fails instead of
stalling the suite. No test writes near a real device: pipes stand in for them.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitbench.core.cache import atomic_write
from vitbench.cli.main import main
from vitbench.data.image_folder import MAX_PIXELS, LoadImage, find_split
from vitbench.errors import DataError
from vitbench.core.files import special_file

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes need a POSIX system")

QUICK = ["run", "--task", "cls", "--model", "test_vit", "--methods", "tome", "--metrics", "gmacs"]


def _vitbench(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m vitbench ARGS`` (bytes arguments allowed); a hang fails after 120 s."""
    return subprocess.run([sys.executable, "-m", "vitbench", *args], cwd=cwd, capture_output=True,
                          timeout=120, check=False, env={**os.environ, **(env or {})})


def _one_error_line(done: subprocess.CompletedProcess) -> str:
    err = done.stderr.decode("utf-8", "replace").strip()
    assert done.returncode == 2 and "Traceback" not in err, err
    return err.splitlines()[-1]


def test_special_file_names_pipes_and_devices_and_passes_files_and_folders(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "file").write_text("x")
    assert special_file(tmp_path / "pipe") == "a FIFO (named pipe)"
    assert special_file(os.devnull) == "a character device"
    assert special_file(tmp_path / "file") is None and special_file(tmp_path) is None
    assert special_file(tmp_path / "missing") is None


def test_atomic_write_never_replaces_a_pipe_with_a_file(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(OSError, match="is a FIFO"):
        atomic_write(tmp_path / "pipe", lambda tmp: tmp.write_text("report"))
    assert special_file(tmp_path / "pipe") == "a FIFO (named pipe)"
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]  # no temporary file left


def test_a_store_that_is_a_pipe_is_one_line_not_a_hang(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "runs.jsonl")
    line = _one_error_line(_vitbench("report", str(tmp_path), cwd=tmp_path))
    assert line == f"vitbench: error: result store '{tmp_path / 'runs.jsonl'}' is a FIFO (named pipe), not a file; move it away"


def test_a_shard_that_is_a_pipe_stops_a_resume_before_anything_runs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "runs-shard-1-of-2.jsonl")
    done = _vitbench(*QUICK, "--limit", "8", "--out", str(out), "--resume", cwd=tmp_path)
    assert "is a FIFO (named pipe), not a file" in _one_error_line(done)
    assert not (out / "runs.jsonl").exists()


def test_a_report_onto_a_pipe_is_refused_in_one_line(tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert main([*QUICK, "--limit", "8", "--out", str(store)]) == 0
    os.mkfifo(tmp_path / "out.md")
    line = _one_error_line(_vitbench("report", str(store), "-o", str(tmp_path / "out.md"), cwd=tmp_path))
    assert line == (f"vitbench: error: -o '{tmp_path / 'out.md'}' is a FIFO (named pipe), not a file; give the "
                    f"markdown file to write, e.g. -o report.md")
    assert special_file(tmp_path / "out.md") == "a FIFO (named pipe)"


def test_a_pipe_among_the_images_is_not_an_image(tmp_path: Path) -> None:
    folder = tmp_path / "data" / "val" / "cat"
    folder.mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(folder / "real.png")
    os.mkfifo(folder / "pipe.png")
    assert find_split(tmp_path / "data").num_images == 1


def _png_declaring(width: int, height: int) -> bytes:
    """A few hundred bytes of PNG whose header declares ``width`` x ``height`` grey pixels."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(b"\x00" * 4096, 9)) + chunk(b"IEND", b""))


@pytest.mark.parametrize("side", [14_000, 60_000])  # above the limit; far above Pillow's own
def test_an_image_declaring_gigapixels_is_refused_before_it_is_decoded(tmp_path: Path, side: int) -> None:
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(_png_declaring(side, side))
    assert side * side > MAX_PIXELS and bomb.stat().st_size < 1000
    with pytest.raises(DataError, match=rf"cannot read image {bomb}: .*decompression bomb"):
        LoadImage().transform({"img_path": str(bomb)})


def test_an_image_within_the_limit_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "fine.png"
    Image.fromarray(np.full((20, 30, 3), 7, np.uint8)).save(path)
    assert LoadImage().transform({"img_path": str(path)})["img_shape"] == (20, 30)


def test_an_exif_rotated_jpeg_is_read_as_timm_reads_it(tmp_path: Path) -> None:
    from timm.data import ImageDataset

    (tmp_path / "c").mkdir()
    path = tmp_path / "c" / "turned.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to show
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(path, exif=exif.tobytes())
    timm_img = np.asarray(ImageDataset(str(tmp_path))[0][0])
    ours = LoadImage().transform({"img_path": str(path)})["img"]
    assert timm_img.shape == (48, 64, 3) and ours.shape == (48, 64, 3)
    assert np.array_equal(ours[..., ::-1], timm_img)  # BGR for the mm pipeline, the same pixels


def test_visualize_refuses_a_bomb_in_one_line(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(_png_declaring(20_000, 20_000))  # 400 megapixels
    line = _one_error_line(_vitbench("visualize", "--method", "tome", "--image", str(bomb), "--out",
                                     str(tmp_path / "fig"), cwd=tmp_path))
    assert line.startswith(f"vitbench: error: --image {str(bomb)!r}: cannot read image {bomb}: ") and "bomb" in line


def test_paths_and_arguments_no_encoding_decodes_reach_the_report(tmp_path: Path) -> None:
    out = os.fsencode(tmp_path) + b"/out\xff"
    # a console that refuses undecodable text (PYTHONIOENCODING=...:strict) prints escapes instead
    done = _vitbench(*QUICK, "--limit", "8", "--out", out,
                     cwd=tmp_path, env={"PYTHONIOENCODING": "utf-8:strict"})
    assert done.returncode == 0, done.stderr.decode("utf-8", "replace")
    folder = Path(os.fsdecode(out))
    report = (folder / "report.md").read_text(encoding="utf-8")
    assert "--out " in report and "out\\udcff" in report  # the command, its odd byte escaped
    record = json.loads((folder / "runs.jsonl").read_text().splitlines()[0])
    assert record["status"] == "ok"
    assert b"out\\udcff/report.md" in done.stdout


def test_an_undecodable_method_name_is_one_line(tmp_path: Path) -> None:
    done = _vitbench("run", "--methods", b"to\xffme", cwd=tmp_path, env={"PYTHONIOENCODING": "utf-8:strict"})
    assert _one_error_line(done).startswith("vitbench: error: unknown method 'to\\udcffme'; valid methods: ")


def test_a_link_loop_and_a_name_no_encoding_decodes_in_a_class_folder_are_read(tmp_path: Path) -> None:
    from vitbench.data.image_folder import ClsImageFolder

    for cls in ("a", "b"):
        (tmp_path / "val" / cls).mkdir(parents=True)
        Image.fromarray(np.full((8, 8, 3), 9, np.uint8)).save(tmp_path / "val" / cls / "0.png")
    (tmp_path / "val" / "a" / "loop").symlink_to(tmp_path / "val" / "a")  # a loop back to itself
    odd = Path(os.fsdecode(bytes(tmp_path / "val" / "b") + b"/caf\xe9.png"))
    odd.write_bytes((tmp_path / "val" / "b" / "0.png").read_bytes())
    found = ClsImageFolder(str(tmp_path), "val")
    names = sorted((Path(found.get_data_info(i)["img_path"]).name, found.get_data_info(i)["gt_label"])
                   for i in range(len(found)))
    assert names == sorted([("0.png", 0), ("0.png", 1), (odd.name, 1)])
    paths = [found.get_data_info(i)["img_path"] for i in range(len(found))]
    assert all(LoadImage().transform({"img_path": p})["img"].shape == (8, 8, 3) for p in paths)
