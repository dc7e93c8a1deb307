"""``vitbench run`` with accuracy: an ImageNet-style folder, and the embedded default (slow)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from vitbench.cli.main import main


def _folder(root, classes=("cat", "dog"), per_class=3):
    rng = np.random.default_rng(0)
    for c in classes:
        (root / "val" / c).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(root / "val" / c / f"{i}.png")
    return root


def test_accuracy_on_an_imagenet_style_folder(tmp_path):
    """test_vit's 1000-way head on a 2-class folder: --num-classes 2 fits a new head first."""
    data = _split_folder(_folder(tmp_path / "data"), "train", per_class=2, seed=1)
    out = tmp_path / "out"
    rc = main(["run", "--methods", "tome", "--param", "tome.r=8", "--model", "test_vit", "--data", str(data),
               "--num-classes", "2", "--metrics", "accuracy,gmacs", "--out", str(out)])
    assert rc == 0
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert [r["num_images"] for r in records] == [6, 6]
    assert all(0.0 <= r["top1_pct"] <= 100.0 for r in records)
    assert records[0]["data"] == str(data)
    assert all(r["head"]["num_classes"] == 2 and r["head"]["train_images"] == 4 for r in records)


@pytest.mark.slow
def test_embedded_default_end_to_end(tmp_path):
    """The main job on the embedded default (trains the Fashion-MNIST ViT once if not cached)."""
    out = tmp_path / "out"
    rc = main(["run", "--task", "cls", "--methods", "tome,ppt", "--param", "tome.r=4", "--param", "ppt.r=12",
               "--metrics", "accuracy,gmacs,params,throughput", "--limit", "500", "--batch-size", "16",
               "--out", str(out)])
    assert rc == 0
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    base, tome, ppt = records
    assert base["model"] == "vitbench-fmnist-vit" and base["data"] == "fashion-mnist"
    assert base["num_images"] == 500 and base["num_classes"] == 10
    assert base["top1_pct"] > 70.0  # a trained model, far above chance (10%)
    assert tome["gmacs"] < base["gmacs"] and ppt["gmacs"] < base["gmacs"]
    assert "Top-1 (%)" in (out / "report.md").read_text()


def _split_folder(root, split, classes=("cat", "dog"), per_class=3, seed=0):
    rng = np.random.default_rng(seed)
    for c in classes:
        (root / split / c).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(root / split / c / f"{i}.png")
    return root


def test_learnable_method_fine_tunes_saves_a_checkpoint_and_reloads_it_on_resume(tmp_path, gate_method):
    data = _split_folder(_split_folder(tmp_path / "data", "val"), "train", per_class=4, seed=1)
    out = tmp_path / "out"
    args = ["run", "--methods", gate_method, "--model", "test_vit", "--data", str(data), "--num-classes", "2",
            "--metrics", "accuracy,gmacs,ib", "--train-limit", "6", "--out", str(out)]
    assert main(args) == 0
    base, gate = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert gate["trained"] == "fine-tuned" and gate["train_images"] == 6
    assert gate["train_stages"][0]["iters"] == 1  # 6 images, batch 32
    assert base["ib_loss"] is not None and gate["ib_bound"] is not None
    assert base["gmacs_on"] == "evaluation images"
    ckpt = out / "checkpoints" / f"{gate['spec_id']}.pth"
    assert ckpt.is_file()
    # a failed run is retried by --resume, and the learnable method reloads its checkpoint
    lines = (out / "runs.jsonl").read_text().splitlines()
    failed = dict(json.loads(lines[1]), status="error", error="interrupted")
    (out / "runs.jsonl").write_text("\n".join(lines + [json.dumps(failed)]) + "\n")
    assert main(args + ["--resume"]) == 0
    again = json.loads((out / "runs.jsonl").read_text().splitlines()[-1])
    assert again["trained"] == "checkpoint" and again["top1_pct"] == gate["top1_pct"]
    assert "ib" in (out / "report.md").read_text().lower()


def test_learnable_method_without_training_data_is_a_clear_error(tmp_path, gate_method, capsys):
    rc = main(["run", "--methods", gate_method, "--model", "test_vit", "--metrics", "gmacs",
               "--out", str(tmp_path / "out")])
    assert rc == 2
    assert "test-gate must be fine-tuned: pass --data PATH" in capsys.readouterr().err


@pytest.mark.slow
def test_learnable_methods_on_the_embedded_default(tmp_path):
    """Every learnable built-in fine-tunes (briefly) and is measured on the default model."""
    out = tmp_path / "out"
    rc = main(["run", "--task", "cls", "--methods", "ibtm,ltmp,dcs", "--train-limit", "192",
               "--param", "ltm.stats_images=128", "--metrics", "accuracy,gmacs,ib", "--limit", "300",
               "--out", str(out)])
    assert rc == 0
    base, ltm, ltmp, dcs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert [r["method"] for r in (ltm, ltmp, dcs)] == ["ltm", "ltmp", "dcs"]
    assert all(r["trained"] == "fine-tuned" and r["train_images"] == 192 for r in (ltm, ltmp, dcs))
    assert dcs["train_stages"][0]["name"] == "search"  # arch=out (default): no Q/K masks to retrain
    assert all(r["status"] == "ok" for r in (base, ltm, ltmp, dcs))
    assert ltm["gmacs"] < base["gmacs"] and ltmp["gmacs"] < base["gmacs"] and dcs["gmacs"] < base["gmacs"]
    # accuracy well above chance (10 classes: 10 %) for every learnable method, not only a row
    assert base["top1_pct"] > 70.0
    assert all(r["top1_pct"] > 50.0 for r in (ltm, ltmp, dcs)), [r["top1_pct"] for r in (ltm, ltmp, dcs)]
    assert all(r["ib_bound"] - r["ib_input_constant"] >= r["ib_loss"] - 1e-6 for r in (base, ltm, ltmp, dcs))
    assert all((out / "checkpoints" / f"{r['spec_id']}.pth").is_file() for r in (ltm, ltmp, dcs))


@pytest.mark.slow
def test_the_same_command_twice_gives_the_same_numbers_on_cpu(tmp_path):
    """Determinism on CPU (docs/measuring.md): fine-tuning (Gumbel noise, data order) and
    evaluation are seeded, so two runs of one command agree exactly."""
    def run(out):
        rc = main(["run", "--task", "cls", "--methods", "ibtm,tome", "--train-limit", "256",
                   "--param", "ltm.stats_images=128", "--metrics", "accuracy,gmacs,ib", "--limit", "300",
                   "--out", str(out)])
        assert rc == 0
        return [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]

    first, second = run(tmp_path / "a"), run(tmp_path / "b")
    for a, b in zip(first, second, strict=True):
        assert a["status"] == b["status"] == "ok"
        assert (a["top1_pct"], a["top5_pct"], a["gmacs"], a["ib_loss"]) == \
            (b["top1_pct"], b["top5_pct"], b["gmacs"], b["ib_loss"]), a["method"]
    assert first[1]["method"] == "ltm" and first[1]["top1_pct"] > 50.0


def test_the_same_relative_data_from_two_directories_is_two_data_sets(tmp_path, monkeypatch):
    """Issue 37, item 2: ``--data data`` is held resolved, so resuming from another working
    directory measures that folder and the report shows two groups, not one."""
    out = tmp_path / "out"
    for where, seed in (("a", 1), ("b", 2)):
        _split_folder(_folder(tmp_path / where / "data"), "train", per_class=2, seed=seed)
        monkeypatch.chdir(tmp_path / where)
        assert main(["run", "--methods", "tome", "--param", "tome.r=8", "--model", "test_vit", "--data", "data",
                     "--num-classes", "2", "--metrics", "accuracy", "--resume", "--out", str(out)]) == 0
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert [r["data"] for r in records] == [str(tmp_path / w / "data") for w in "aabb"]
    groups = [line for line in (out / "report.md").read_text().splitlines() if line.startswith("### Measured on")]
    assert [g.split(" of ")[1].split(";")[0] for g in groups] == [str(tmp_path / w / "data") for w in "ab"]


def test_a_run_with_limit_pairs_its_speed_up_over_fewer_rounds_and_says_so(tmp_path, capsys):
    """``--limit``: a cheap look, its paired speed-up timed over the throughput's 10 rounds, not 30."""
    data = _split_folder(_folder(tmp_path / "data"), "train", per_class=2, seed=1)
    out = tmp_path / "out"
    rc = main(["run", "--methods", "tome", "--param", "tome.r=8", "--model", "test_vit", "--data", str(data),
               "--num-classes", "2", "--limit", "4", "--metrics", "accuracy,throughput", "--batch-size", "2",
               "--out", str(out)])
    assert rc == 0
    base, tome = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert tome["speedup_paired"] and tome["speedup_rounds"] == tome["throughput_repeats"] == 10
    assert "timing_repeats" not in tome  # the throughput and latency keep their repeats
    assert "Speed-ups timed in turn over 10 rounds instead of 30 (`--limit`" in (out / "report.md").read_text()


def test_a_flat_folder_of_ten_classes_runs_with_num_classes_and_the_report_names_its_layout(tmp_path):
    """``meta/val.txt`` naming 10 classes over a flat val/, ``--num-classes 10``: a 10-class set,
    not ImageNet, its head fitted on train/<class>/; the heading says how the folder was read."""
    rng = np.random.default_rng(0)
    root = tmp_path / "flat"
    (root / "val").mkdir(parents=True)
    (root / "meta").mkdir()
    lines = []
    for i in range(20):
        Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(root / "val" / f"{i:03d}.png")
        lines.append(f"{i:03d}.png {i % 10}\n")
        (root / "train" / f"c{i % 10}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(root / "train" / f"c{i % 10}" / f"{i}.png")
    (root / "meta" / "val.txt").write_text("".join(lines))
    out = tmp_path / "out"
    assert main(["run", "--methods", "tome", "--model", "test_vit", "--data", str(root), "--num-classes", "10",
                 "--metrics", "accuracy", "--out", str(out)]) == 0
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert all(r["num_classes"] == 10 and r["num_images"] == 20 for r in records)
    assert all(r["data_layout"] == "flat folder, meta/val.txt, labels 0-9" for r in records)
    assert f"{root} (flat folder, meta/val.txt, labels 0-9), 10 classes" in (out / "report.md").read_text()
