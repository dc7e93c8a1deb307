"""Malformed input to every command (issue 22, item 4): one line ``vitbench: error: ...`` that
names the bad value and the valid ones, exit 2, no traceback, before anything loads; a corrupt
image found while a run evaluates is that run's ``error`` record instead."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitbench.cli.main import main

GMACS = ["--metrics", "gmacs"]


def _error_line(err: str) -> str:
    """The one error line of ``err`` (plugin load warnings of the environment aside), no traceback."""
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if not line.startswith("vitbench: warning: plugin")]
    errors = [line for line in lines if line.startswith("vitbench: error:")]
    assert len(errors) == 1, err
    return errors[0]


def _only_line(err: str) -> str:
    """Like :func:`_error_line`, and nothing else was said (nothing loaded before the error)."""
    line = _error_line(err)
    assert [x for x in err.splitlines() if not x.startswith("vitbench: warning: plugin")] == [line], err
    return line


RUN_CASES = [
    # value -> the bad value and the valid ones, as the line names them
    (["--methods", "tome", "--param", "tome.r=(13,NaN)"], ["tome.r='(13,NaN)'", "not a finite number"]),
    (["--methods", "tome", "--param", "tome.r=(13,nan)"], ["tome.r='(13,nan)'", "not a finite number"]),
    (["--methods", "tome", "--param", "tome.r=(13,1e999)"], ["tome.r='(13,1e999)'", "not a finite number"]),
    (["--methods", "ppt", "--param", "ppt.threshold=nan"], ["ppt.threshold='nan'", "not a finite number"]),
    (["--methods", "ppt", "--param", "ppt.threshold=-inf"], ["ppt.threshold='-inf'", "not a finite number"]),
    (["--methods", "tome", "--param", "tome.r=1e999"], ["tome.r='1e999'", "Union[int, list[int]"]),
    (["--methods", "tome", "--param", "tome.r="], ["'tome.r='", "has no value", "METHOD.KEY=VALUE"]),
    (["--methods", "tome", "--param", "tome.r=8", "--param", "tome.r=13"],
     ["--param tome.r is given twice", "'8' and '13'"]),
    (["--methods", "ltm", "--param", "ibtm.ratio=0.5", "--param", "ltm.ratio=0.6"],
     ["--param ltm.ratio is given twice", "'0.5' and '0.6'", "alias 'ltm'"]),
    (["--methods", "tome", "--seed", "99999999999"], ["seed 99999999999 is out of range", ">= 0 and <= 4294967295"]),
    (["--methods", "tome", "--seed", "4294967296"], ["seed 4294967296 is out of range", "<= 4294967295"]),
    (["--methods", "tome", "--seed", "-1"], ["seed -1 is out of range", ">= 0"]),
    (["--methods", "tome", "--seed", "abc"], ["--seed 'abc' is not an integer"]),
    (["--methods", "tome", "--seeds", "0,99999999999"], ["seed 99999999999 is out of range", "<= 4294967295"]),
    (["--methods", "tome", "--seeds", "0,-3"], ["seed -3 is out of range"]),
    (["--methods", ","], ["--methods is empty", "vitbench list methods"]),
    (["--methods", ""], ["--methods is empty"]),
    (["--methods", "tömé☃"], ["unknown method 'tömé☃'", "valid methods: ", "tome"]),
    (["--methods", "tome", "--limit", "0"], ["--limit 0 is out of range", ">= 1"]),
    (["--methods", "tome", "--limit", "-1"], ["--limit -1 is out of range", ">= 1"]),
    (["--methods", "tome", "--limit", "abc"], ["--limit 'abc' is not an integer", ">= 1"]),
    (["--methods", "tome", "--batch-size", "0"], ["--batch-size 0 is out of range", "from 1 to 65536"]),
    (["--methods", "tome", "--batch-size", str(10**12)], [f"--batch-size {10**12} is out of range", "1 to 65536"]),
    (["--methods", "tome", "--batch-size", "1.5"], ["--batch-size '1.5' is not an integer"]),
    (["--methods", "tome", "--num-classes", "0"], ["--num-classes 0 is out of range", ">= 1"]),
    (["--methods", "tome", "--train-limit", "x"], ["--train-limit 'x' is not an integer"]),
    (["--methods", "tome", "--match-gmacs", "nan"], ["--match-gmacs 'nan' is out of range", "(0, 1]"]),
    (["--methods", "tome", "--shard", "3/2"], ["--shard '3/2'", "1 <= I <= N"]),
    (["--methods", "tome", "--metrics", ""], ["--metrics '' names no metric", "accuracy, gmacs"]),
    (["--methods", "tome", "--metrics", ","], ["--metrics ',' names no metric", "accuracy, gmacs"]),
    (["--methods", "tome", "--metrics", "gmacs,☃"], ["unknown metric '☃'", "valid metrics: accuracy"]),
    (["--methods", "tome", "--model", ""], ["--model '' is empty", "vitbench list models"]),
    (["--methods", "tome", "--data", " "], ["--data ' ' is empty", "data folder"]),
    (["--methods", "tome", "--checkpoint", ""], ["--checkpoint '' is empty", "weights file"]),
    (["--methods", "tome", "--device", "gpu"], ["unknown device 'gpu'", "valid devices: cpu, cuda"]),
    (["--methods", "tome", "--precision", "fp8"], ["unknown precision 'fp8'", "bf16, fp16, fp32"]),
]


@pytest.mark.parametrize("args, expected", RUN_CASES, ids=[" ".join(a[2:]) or "methods" for a, _ in RUN_CASES])
def test_malformed_run_input_is_one_line_before_anything_runs(tmp_path, capsys, args, expected):
    out = tmp_path / "out"
    assert main(["run", *GMACS, *args, "--out", str(out)]) == 2  # a case's own --metrics comes last
    line = _only_line(capsys.readouterr().err)
    for text in expected:
        assert text in line
    assert not out.exists()


@pytest.mark.parametrize("budgets, expected", [
    ("1.5,abc", ["--budgets item '1.5' is out of range", "(0, 1]"]),
    ("0.5,abc", ["--budgets item 'abc' is not a number", "(0, 1]"]),
    (",", ["--budgets ',' is empty", "(0, 1]"]),
    ("nan", ["--budgets item 'nan' is out of range"]),
])
def test_malformed_sweep_budgets(tmp_path, capsys, budgets, expected):
    out = tmp_path / "out"
    assert main(["sweep", "--methods", "tome", "--budgets", budgets, *GMACS, "--out", str(out)]) == 2
    line = _only_line(capsys.readouterr().err)
    for text in expected:
        assert text in line
    assert not out.exists()


def test_cuda_without_a_device(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    assert main(["run", "--methods", "tome", "--device", "cuda", *GMACS, "--out", str(tmp_path / "o")]) == 2
    assert "--device cuda: no CUDA device is available here; valid devices: cpu" in _only_line(capsys.readouterr().err)


def _store(folder: Path, text: str | bytes) -> Path:
    folder.mkdir()
    (folder / "runs.jsonl").write_bytes(text.encode() if isinstance(text, str) else text)
    return folder


def test_malformed_report_input(tmp_path, capsys):
    report = str(tmp_path / "r.md")
    cases = [
        (tmp_path / "missing", ["result store", "missing' does not exist"]),
        (_store(tmp_path / "empty", ""), ["holds no records: runs.jsonl is empty"]),
        (_store(tmp_path / "garbage", "garbage\n{not json\n[1, 2]\n{\"a\": 1}\n"),
         ["holds no records: its 4 line(s) are no run records", "line 1, not a complete JSON object: 'garbage'"]),
        (_store(tmp_path / "binary", bytes(range(256))), ["holds no records: its 2 line(s) are no run records"]),
        (tmp_path / "missing.jsonl", ["does not exist"]),
    ]
    (tmp_path / "nostore").mkdir()
    cases.append((tmp_path / "nostore", ["holds no records: there is no runs.jsonl"]))
    for store, expected in cases:
        assert main(["report", str(store), "-o", report]) == 2
        line = _only_line(capsys.readouterr().err)
        assert all(text in line for text in expected), line
    assert main(["report", "", "-o", report]) == 2
    assert "the result store '' is empty" in _only_line(capsys.readouterr().err)
    good = _store(tmp_path / "good", json.dumps({"spec_id": "a", "status": "ok", "task": "cls", "model": "m",
                                                 "method": "baseline", "metrics": {}}) + "\n")
    for output, expected in [(str(tmp_path), "is a folder"), ("", "is no file name"), (".", "is no file name"),
                             (str(good / "runs.jsonl" / "x.md"), "its folder cannot be made")]:
        assert main(["report", str(good), "-o", output]) == 2
        line = _only_line(capsys.readouterr().err)
        assert f"-o {output!r}" in line and expected in line


def test_report_never_writes_over_a_file_of_the_store(tmp_path, capsys):
    record = json.dumps({"spec_id": "a", "status": "ok", "task": "cls", "model": "m", "method": "baseline",
                         "metrics": {}}) + "\n"
    good = _store(tmp_path / "good", record)
    (good / "runs-shard-1-of-2.jsonl").write_text(record)
    before = {f.name: f.read_bytes() for f in good.iterdir()}
    for target in ("runs.jsonl", "runs-shard-1-of-2.jsonl"):
        for store in (good, good / "runs.jsonl"):
            output = str(good / target)
            assert main(["report", str(store), "-o", output]) == 2
            line = _only_line(capsys.readouterr().err)
            assert f"-o {output!r} is a file of the result store" in line and "would replace its records" in line
    assert {f.name: f.read_bytes() for f in good.iterdir()} == before


def test_unknown_model_suggests_the_close_supported_name(tmp_path, capsys):
    assert main(["run", "--methods", "tome", "--model", "deit_tinyy", *GMACS, "--out", str(tmp_path / "o")]) == 2
    line = _error_line(capsys.readouterr().err)
    assert "unknown model 'deit_tinyy'; close timm models: deit_tiny_patch16_224" in line


def _folder(root: Path, classes=("a", "b"), per_class: int = 2) -> Path:
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for name in classes:
            (root / split / name).mkdir(parents=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(root / split / name / f"{i}.png")
    return root


def _head_run(data: Path, out: Path) -> list[str]:
    return ["run", "--task", "cls", "--model", "test_vit", "--num-classes", "2", "--data", str(data),
            "--methods", "tome", "--limit", "4", "--metrics", "accuracy", "--out", str(out)]


def test_a_corrupt_training_image_is_one_line_naming_it(tmp_path, capsys):
    """The new head is fitted on train/ before the runs: a corrupt PNG there stops the command."""
    data = _folder(tmp_path / "data")
    bad = data / "train" / "a" / "1.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\nthis is no image")
    assert main(_head_run(data, tmp_path / "out")) == 2
    line = _error_line(capsys.readouterr().err)
    assert f"cannot read image {bad}: it is corrupt or not an image" in line
    assert not (tmp_path / "out" / "runs.jsonl").exists()


def test_a_corrupt_evaluation_image_is_an_error_record_naming_it(tmp_path, capsys):
    data = _folder(tmp_path / "data")
    bad = data / "val" / "b" / "0.png"
    bad.write_bytes(bad.read_bytes()[:40])  # truncated
    out = tmp_path / "out"
    assert main(_head_run(data, out)) == 1
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert [r["status"] for r in records] == ["error", "error"]
    assert all(r["error"].startswith(f"cannot read image {bad}: it is corrupt or not an image") for r in records)
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("split", ["train", "val"])
def test_an_empty_class_folder_is_refused_naming_it(tmp_path, capsys, split):
    data = _folder(tmp_path / "data")
    (data / split / "c").mkdir()
    assert main(_head_run(data, tmp_path / "out")) == 2
    line = _error_line(capsys.readouterr().err)
    assert f"class folder {data / split / 'c'} holds no images; remove it or add its images" in line


def test_the_console_script_says_one_line(tmp_path):
    """The same through a real process: the one line on stderr, exit 2."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for args, expected in [
        (["run", "--methods", "tome", "--seed", "99999999999", *GMACS, "--out", "o"], "seed 99999999999 is out of range"),
        (["report", "missing", "-o", "r.md"], "result store 'missing' does not exist"),
    ]:
        done = subprocess.run([sys.executable, "-m", "vitbench", *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=240, check=False)
        assert done.returncode == 2
        assert expected in _only_line(done.stderr)


@pytest.mark.parametrize("args, expected", [
    (["list", "nonsense"], "invalid choice: 'nonsense'"),
    (["list"], "the following arguments are required: kind"),
    (["run", "--methods", "tome", "--launcher", "x"], "invalid choice: 'x'"),
    (["sweep", "--methods", "tome"], "the following arguments are required: --budgets"),
    (["run", "--methods", "tome", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
])
def test_argparse_errors_are_one_line_too(capsys, args, expected):
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    line = _only_line(capsys.readouterr().err)
    assert line.startswith("vitbench: error: ") and expected in line and "--help" in line


def test_report_names_each_skipped_line_on_stderr_and_in_the_report(tmp_path, capsys):
    good = {"spec_id": "a", "status": "ok", "task": "cls", "model": "m", "method": "baseline", "label": "baseline",
            "top1_pct": 50.0, "num_images": 4}
    store = _store(tmp_path / "store", json.dumps(good) + '\n{"status": "ok"}\nnot json\n')
    assert main(["report", str(store), "-o", str(tmp_path / "r.md")]) == 0
    err = capsys.readouterr().err
    assert "vitbench: warning: skipped runs.jsonl line 2 (no string 'spec_id'): " in err
    assert "vitbench: warning: skipped runs.jsonl line 3 (not a complete JSON object): not json" in err
    md = (tmp_path / "r.md").read_text()
    assert "**2 line(s) of the store are no run record and were skipped:**" in md
    assert "- `runs.jsonl line 3 (not a complete JSON object): not json`" in md
