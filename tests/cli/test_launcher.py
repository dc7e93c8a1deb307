"""``--launcher none|pytorch|slurm`` (issue 13 item 2): under ``torchrun --nproc-per-node 2`` on
the CPU (gloo) the cls and det evaluations are sharded by mmengine's ``DefaultSampler`` and
collected by its ``Evaluator``, with the same top-1 (det: mAP) as one process, and rank 0 alone
writes the store and report;
a learnable method fine-tunes with DDP (each rank half of each batch) and lands where one
process does; ``--launcher slurm`` takes its ranks from srun's variables (simulated here with two
processes); det trains its baseline detector and fine-tunes a learnable method's detector with
DDP; what cannot run distributed is refused before anything runs."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ranks_support import free_port, run_ranks  # tests/ranks_support.py
import torch

from vitbench.cli.main import main
from vitbench.host.distributed import SLURM_VARIABLES, TORCHRUN_VARIABLES, first_slurm_host, slurm_environment
from vitbench.errors import VitbenchError

#: an odd image count: DefaultSampler pads rank 1's part with one repeated image, which the
#: evaluator must drop (mmengine's collect_results cuts the gathered results to the data's size)
LIMIT = "199"


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]


def _top1(out: Path) -> dict[str, float]:
    return {r["method"]: r["top1_pct"] for r in _records(out)}


def _vitbench(cwd: Path, *prefix: str, args: list[str], **env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    return subprocess.run([*prefix, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


def _torchrun() -> list[str]:
    torchrun = shutil.which("torchrun")
    return [torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]


@pytest.mark.slow
def test_torchrun_two_ranks_give_the_single_process_top1_and_one_store(tmp_path):
    runner = _torchrun()
    args = ["run", "--task", "cls", "--methods", "tome", "--metrics", "accuracy", "--limit", LIMIT]
    one = _vitbench(tmp_path, sys.executable, "-m", "vitbench", args=[*args, "--out", "D1"])
    assert one.returncode == 0, one.stderr
    two = _vitbench(tmp_path, *runner, "--standalone", "--nproc-per-node", "2", "-m", "vitbench",
                    args=[*args, "--launcher", "pytorch", "--out", "D2"])
    assert two.returncode == 0, two.stderr[-4000:]
    assert _top1(tmp_path / "D2") == _top1(tmp_path / "D1")
    records = _records(tmp_path / "D2")
    assert [r["method"] for r in records] == ["baseline", "tome"]  # rank 0's records only, once
    assert all(r["status"] == "ok" and r["num_images"] == int(LIMIT) for r in records)
    assert sorted(p.name for p in (tmp_path / "D2").glob("*.jsonl")) == ["runs.jsonl"]
    assert (tmp_path / "D2" / "report.md").is_file()
    assert two.stdout.count("| tome") == 1  # one summary (rank 0's)
    assert not (tmp_path / ".dist_test").exists()  # results gathered in the spec's work folder


#: test-only methods for the ranks' failures, loaded by the torchrun-started processes as an
#: installed plugin would be: a ``*.dist-info`` with the ``vitbench`` entry point on PYTHONPATH
_RANK_FAILURES_PLUGIN = '''"""test-rank-nan: block 1's MLP turns rank 1's patch tokens into NaN (rank 0's pass unchanged);
test-rank-raise: building the method fails on rank 1 (before the evaluation) and works on rank 0."""
from dataclasses import dataclass

from vitbench.engine import Reducer
from vitbench.hookspecs import hookimpl


@dataclass(frozen=True)
class NoParams:
    pass


def _rank():
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


class Poison(Reducer):
    def __call__(self, x, state, info):  # the token step keeps every rule, finiteness included
        return x

    def mlp_forward(self, mlp, x):  # the NaN comes from block 1's MLP, for the evaluation's guard
        import torch

        y = mlp(x)
        return torch.cat([y[:, :1], y[:, 1:] * float("nan")], dim=1) if _rank() == 1 else y


def refuse(params, info):
    from vitbench.catalog import Reduction

    if _rank() == 1:
        raise RuntimeError("cannot build it here")
    return Reduction([None] * info.depth)


@hookimpl
def vitbench_register_methods(register):
    from vitbench.catalog import MethodSpec, Reduction

    register(MethodSpec("test-rank-nan", NoParams,
                        lambda p, info: Reduction([Poison() if i == 1 else None for i in range(info.depth)])))
    register(MethodSpec("test-rank-raise", NoParams, refuse))
'''


def _rank_failures_plugin(root: Path) -> Path:
    root.mkdir()
    (root / "vitbench_rank_failures.py").write_text(_RANK_FAILURES_PLUGIN)
    info = root / "vitbench_rank_failures-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vitbench-rank-failures\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[vitbench]\nrank-failures = vitbench_rank_failures\n")
    return root


@pytest.mark.slow
def test_a_rank_that_fails_alone_fails_the_run_on_every_rank_promptly(tmp_path):
    """Issue 13: under ``torchrun --nproc-per-node 2`` rank 1's evaluation shard holds NaN logits
    (test-rank-nan) or rank 1 fails before the evaluation (test-rank-raise) while rank 0 does
    fine. Neither leaves rank 0 waiting in the evaluator's gathering (gloo's default: 30 minutes):
    every rank raises the same error naming rank 1, rank 0's store holds it as the run's error
    record, and the ranks stay in step for the next run (tome)."""
    import time

    plugin = _rank_failures_plugin(tmp_path / "plugin")
    path = os.pathsep.join(p for p in (str(plugin), os.environ.get("PYTHONPATH", "")) if p)
    args = ["run", "--task", "cls", "--methods", "test-rank-nan,test-rank-raise,tome", "--metrics", "accuracy",
            "--limit", "32", "--launcher", "pytorch", "--out", "D2"]
    started = time.perf_counter()
    two = _vitbench(tmp_path, *_torchrun(), "--standalone", "--nproc-per-node", "2", "-m", "vitbench", args=args,
                    PYTHONPATH=path, VITBENCH_STRICT_PLUGINS="1", VITBENCH_DIST_TIMEOUT="600")
    took = time.perf_counter() - started
    assert two.returncode == 1, two.stderr[-4000:]
    assert took < 90, took  # about 15 s on a 2-core CPU; a rank left waiting would hit the 240 s limit
    records = {r["method"]: r for r in _records(tmp_path / "D2")}
    assert list(records) == ["baseline", "test-rank-nan", "test-rank-raise", "tome"]  # rank 0's, once
    assert (records["baseline"]["status"], records["tome"]["status"]) == ("ok", "ok")
    assert records["baseline"]["num_images"] == records["tome"]["num_images"] == 32
    nan, raised = records["test-rank-nan"], records["test-rank-raise"]
    assert nan["status"] == "error" and nan["error"].startswith("evaluation: the logits hold non-finite values (")
    assert nan["error"].endswith(") in batch 1 on rank 1 of 2")  # NonFiniteError's message, naming the rank
    assert (raised["status"], raised["error"]) == ("error", "RuntimeError: cannot build it here on rank 1 of 2")
    failed = (tmp_path / "D2" / "report.md").read_text().split("Failed runs:")[1]
    assert "on rank 1 of 2" in failed
    assert "[rank0]: Traceback" not in two.stderr and "[rank1]: Traceback" not in two.stderr  # recorded, not crashed


#: det as short as the det CLI tests run it (tests/tasks/det/test_det_cli.py): the baseline
#: detector trained 1 epoch on 4 images, light heads (the embedded set's default); an odd --limit
#: so that DefaultSampler pads rank 1's part
DET = ["run", "--task", "det", "--methods", "tome", "--data", "shapes-coco", "--detector-epochs", "1",
       "--train-limit", "4", "--limit", "5",
       "--metrics", "accuracy,gmacs,params"]
_DET_FIELDS = ("box_map", "box_ap50", "box_ap75", "num_images", "gmacs", "backbone_gmacs", "params_m")


@pytest.mark.slow
def test_torchrun_two_ranks_train_the_det_detector_with_ddp_and_evaluate_like_one_process(tmp_path):
    """det under ``torchrun --nproc-per-node 2``: the baseline detector is trained by both ranks
    together with DDP (each rank 4 of the 8 images a step), by the first run that needs it, and
    cached apart from the single-process detector (its key holds the 2 ranks: per-rank BatchNorm
    and loss normalisation make it another detector); a later 2-rank run loads it. mAP is
    evaluated on both ranks' shards and collected in the spec's work folder, GMACs/params are
    rank 0's, and on the same detector (one process's, copied over the 2-rank cache file) the
    records equal one process's. (With these short settings the detector is barely trained and
    the mAPs are near 0; the README has the comparison on the default 8-epoch detector.)"""
    cache = str(tmp_path / "cache")
    detectors = tmp_path / "cache" / "detectors"
    one = _vitbench(tmp_path, sys.executable, "-m", "vitbench", args=[*DET, "--out", "D1"], VITBENCH_CACHE=cache)
    assert one.returncode == 0, one.stderr[-4000:]
    (single,) = detectors.glob("det-mobilevit_xs-*.pth")  # one process's detector
    two = _vitbench(tmp_path, *_torchrun(), "--standalone", "--nproc-per-node", "2", "-m", "vitbench",
                    args=[*DET, "--launcher", "pytorch", "--out", "D2"], VITBENCH_CACHE=cache)
    assert two.returncode == 0, two.stderr[-4000:]
    assert "with DDP on 2 ranks" in two.stderr and two.stderr.count("detector training: epoch 1/1") == 1  # rank 0's
    (ddp,) = set(detectors.glob("det-mobilevit_xs-*.pth")) - {single}  # its own cache file
    info = json.loads(ddp.with_suffix(".json").read_text())
    assert (info["ranks"], info["rank_batch_size"], info["effective_batch_size"], info["batch_size"]) == (2, 4, 8, 8)
    assert info["images"] == 4 and info["iters"] == 1
    assert "ranks" not in json.loads(single.with_suffix(".json").read_text())
    twos = _records(tmp_path / "D2")
    assert [r["method"] for r in twos] == ["baseline", "tome"]  # rank 0's records only, once
    assert all(r["status"] == "ok" and r["num_images"] == 5 and r["detector_training"] == info for r in twos)
    weights, single_weights = torch.load(ddp, weights_only=True), torch.load(single, weights_only=True)
    assert weights.keys() == single_weights.keys()
    assert any(not torch.equal(weights[k], single_weights[k]) for k in weights)  # not one process's detector
    # the sharded evaluation on one process's detector, put where 2 ranks look for theirs
    shutil.copyfile(single, ddp)
    shutil.copyfile(single.with_suffix(".json"), ddp.with_suffix(".json"))
    same = _vitbench(tmp_path, *_torchrun(), "--standalone", "--nproc-per-node", "2", "-m", "vitbench",
                     args=[*DET, "--launcher", "pytorch", "--out", "D3"], VITBENCH_CACHE=cache)
    assert same.returncode == 0, same.stderr[-4000:]
    assert f"loading the trained det detector {ddp}" in same.stderr and "detector training" not in same.stderr
    ones, threes = _records(tmp_path / "D1"), _records(tmp_path / "D3")
    assert [r["method"] for r in threes] == ["baseline", "tome"]
    assert all(r["status"] == "ok" and r["num_images"] == 5 for r in threes)
    for a, b in zip(ones, threes):
        assert {k: a[k] for k in _DET_FIELDS} == {k: b[k] for k in _DET_FIELDS}, (a["method"], a, b)
        assert a["detector_training"] == b["detector_training"]
    for out, run in (("D2", two), ("D3", same)):
        assert sorted(p.name for p in (tmp_path / out).glob("*.jsonl")) == ["runs.jsonl"]
        assert (tmp_path / out / "report.md").is_file() and run.stdout.count("| tome") == 1
        assert not list((tmp_path / out / "work").glob("*/collect"))  # gathered there, removed by rank 0
    assert not (tmp_path / ".dist_test").exists()  # results gathered in the spec's work folder


@pytest.mark.parametrize("extra, message", [
    (["--task", "agreement", "--methods", "random-drop", "--launcher", "pytorch"],  # the example plugin's task
     "--launcher pytorch supports the cls, det, seg task(s) so far (TaskInfo.distributed); --task is 'agreement'"),
    (["--methods", "dynamicvit", "--launcher", "pytorch"], "--launcher pytorch needs the environment torchrun sets "
     "(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT missing)"),
    (["--methods", "tome", "--launcher", "slurm"], "--launcher slurm needs the environment srun sets "
     "(SLURM_PROCID, SLURM_NTASKS, SLURM_NODELIST missing); start it as `srun --ntasks N vitbench run ..."),
    (["--methods", "nope", "--launcher", "slurm"], "nope"),
])
def test_what_cannot_run_distributed_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch, extra, message):
    _outside_any_launcher(monkeypatch)
    code = main(["run", *extra, "--out", str(tmp_path / "out")])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


#: a learnable method on det at the det settings above: ltm (its statistics pass, IB loss and the
#: baseline+ft control row) fine-tuning the detector with DDP, 2 images per rank per step
DET_LEARNABLE = ["run", "--task", "det", "--methods", "ltm", "--data", "shapes-coco", "--param", "ltm.epochs=1",
                 "--detector-epochs", "1",
                 "--train-limit", "4", "--limit", "5", "--metrics", "accuracy"]


@pytest.mark.slow
def test_torchrun_two_ranks_fine_tune_a_det_method_with_ddp(tmp_path):
    """det with a learnable method under ``torchrun --nproc-per-node 2``: the method's detector
    and the control's fine-tune with DDP (each rank half of each batch); every rank ends each
    stage with the same weights (``same_on_every_rank`` raises otherwise, failing the run); rank 0
    writes one store and report with the mAP. Not compared with one process: BatchNorm keeps
    per-rank statistics (README, ``--launcher``)."""
    two = _vitbench(tmp_path, *_torchrun(), "--standalone", "--nproc-per-node", "2", "-m", "vitbench",
                    args=[*DET_LEARNABLE, "--launcher", "pytorch", "--out", "D2"], VITBENCH_CACHE=str(tmp_path / "cache"))
    assert two.returncode == 0, two.stderr[-4000:]
    records = _records(tmp_path / "D2")
    assert [r["method"] for r in records] == ["baseline", "baseline+ft", "ltm"]  # rank 0's records only, once
    assert all(r["status"] == "ok" and r["num_images"] == 5 for r in records), records
    assert all(isinstance(r["box_map"], float) and 0.0 <= r["box_map"] <= 1.0 for r in records)
    for record in records[1:]:
        (stage,) = record["train_stages"]
        assert (stage["ranks"], stage["rank_batch_size"], stage["effective_batch_size"]) == (2, 4, 8)
        assert stage["images"] == 4 and stage["iters"] >= 1 and "last_loss" in stage
    assert "last_extra" in records[2]["train_stages"][0]  # ltm's IB loss went through DDP's forward
    assert sorted(p.name for p in (tmp_path / "D2").glob("*.jsonl")) == ["runs.jsonl"]
    assert (tmp_path / "D2" / "report.md").is_file() and two.stdout.count("| ltm") == 1
    assert "the ranks hold different weights" not in two.stderr


def test_a_malformed_timeout_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch):
    for name, value in zip(TORCHRUN_VARIABLES, ("0", "2", "0", "127.0.0.1", "29500")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("VITBENCH_DIST_TIMEOUT", "ten minutes")
    assert main(["run", "--methods", "tome", "--launcher", "pytorch", "--out", str(tmp_path / "out")]) == 2
    assert ("VITBENCH_DIST_TIMEOUT='ten minutes' is not a number of seconds > 0 (e.g. 600)"
            in capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


def test_an_unknown_launcher_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--methods", "tome", "--launcher", "mpi"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'mpi'" in err and all(name in err for name in ("none", "pytorch", "slurm"))


def _outside_any_launcher(monkeypatch) -> None:
    for name in (*TORCHRUN_VARIABLES, *SLURM_VARIABLES, "SLURM_LOCALID"):
        monkeypatch.delenv(name, raising=False)


# --- learnable methods: DDP fine-tuning -------------------------------------------------------

#: ltmp (the fastest learnable method here: 24 threshold parameters) fine-tuned on 256 images,
#: 4 steps of 64 (32 per rank), evaluated on the odd LIMIT; with its default gradient bound,
#: which clamps the gradients DDP has averaged (docs/methods.md §2)
LEARNABLE = ["run", "--task", "cls", "--methods", "ltmp", "--metrics", "accuracy",
             "--limit", LIMIT, "--train-limit", "256"]


@pytest.fixture(scope="module")
def single_ltmp(tmp_path_factory) -> Path:
    """The single-process run the distributed ones are compared with."""
    cwd = tmp_path_factory.mktemp("single")
    one = _vitbench(cwd, sys.executable, "-m", "vitbench", args=[*LEARNABLE, "--out", "D1"])
    assert one.returncode == 0, one.stderr
    return cwd / "D1"


def _weights(out: Path) -> dict[str, torch.Tensor]:
    (spec,) = [r["spec_id"] for r in _records(out) if r["method"] == "ltmp"]
    return torch.load(out / "checkpoints" / f"{spec}.pth", weights_only=True)


def _like_single_process(out: Path, single: Path) -> None:
    """``out`` (a 2-rank run) against ``single``: one store, one checkpoint, the same baseline
    top-1, ltmp's within one image of it (often equal: ltmp trains deterministically
    and its CE is a mean over the batch, so the ranks' halves average to the whole batch's; its
    FLOPs penalty is not quite additive, so the weights agree to ~1e-6, not bit for bit)."""
    records = _records(out)
    assert [r["method"] for r in records] == ["baseline", "ltmp"]  # rank 0's records only, once
    assert all(r["status"] == "ok" and r["num_images"] == int(LIMIT) for r in records)
    one, two = _top1(single), _top1(out)
    assert two["baseline"] == one["baseline"]
    correct = {k: round(v * int(LIMIT) / 100) for k, v in (("one", one["ltmp"]), ("two", two["ltmp"]))}
    assert abs(correct["two"] - correct["one"]) <= 1, (one, two)  # in images: top-1 is a float32
    (stage,) = records[1]["train_stages"]
    assert (stage["iters"], stage["images"], stage["ranks"], stage["rank_batch_size"],
            stage["effective_batch_size"]) == (4, 256, 2, 32, 64)
    assert stage["iters"] == _records(single)[1]["train_stages"][0]["iters"]
    ours, theirs = _weights(out), _weights(single)
    assert ours.keys() == theirs.keys()
    for key in ours:
        torch.testing.assert_close(ours[key], theirs[key], rtol=1e-4, atol=1e-4, msg=key)
    assert sorted(p.name for p in out.glob("*.jsonl")) == ["runs.jsonl"]
    assert len(list((out / "checkpoints").iterdir())) == 1  # written once (rank 0), no temp files left
    assert (out / "report.md").is_file()


@pytest.mark.slow
def test_torchrun_two_ranks_fine_tune_a_learnable_method_like_one_process(tmp_path, single_ltmp):
    runner = _torchrun()
    two = _vitbench(tmp_path, *runner, "--standalone", "--nproc-per-node", "2", "-m", "vitbench",
                    args=[*LEARNABLE, "--launcher", "pytorch", "--out", "D2"])
    assert two.returncode == 0, two.stderr[-4000:]
    _like_single_process(tmp_path / "D2", single_ltmp)
    assert two.stdout.count("| ltmp") == 1  # one summary (rank 0's)


# --- --launcher slurm -------------------------------------------------------------------------

@pytest.mark.slow
def test_slurm_two_tasks_run_like_srun_started_them(tmp_path, single_ltmp):
    """Two processes with the variables ``srun --ntasks 2`` sets on one node (and a free
    MASTER_PORT, so parallel test runs do not collide on mmengine's default 29500)."""
    base = {k: v for k, v in os.environ.items() if k not in (*TORCHRUN_VARIABLES, "LOCAL_WORLD_SIZE")}
    base.update(OMP_NUM_THREADS="1", SLURM_NTASKS="2", SLURM_NODELIST="localhost", MASTER_PORT=str(free_port()))
    (code0, out0, err0), (code1, out1, err1) = run_ranks(
        [sys.executable, "-m", "vitbench", *LEARNABLE, "--launcher", "slurm", "--out", "D2"],
        [{**base, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)} for rank in (0, 1)], cwd=tmp_path)
    assert (code0, code1) == (0, 0), err0[-3000:] + err1[-3000:]
    _like_single_process(tmp_path / "D2", single_ltmp)
    assert "| ltmp" in out0 and out1 == ""  # rank 1 prints nothing


def test_srun_variables_become_torch_rendezvous_variables():
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODELIST": "gpu[07-08,11],cpu1"}
    assert slurm_environment(env) == {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
                                      "MASTER_ADDR": "gpu07", "MASTER_PORT": "29500"}
    kept = slurm_environment({**env, "MASTER_ADDR": "head", "MASTER_PORT": "1234"})
    assert (kept["MASTER_ADDR"], kept["MASTER_PORT"]) == ("head", "1234")
    assert slurm_environment({k: v for k, v in env.items() if k != "SLURM_LOCALID"})["LOCAL_RANK"] == "3"


@pytest.mark.parametrize("nodelist, host", [("localhost", "localhost"), ("node[03-05,09],gpu1", "node03"),
                                            ("rack[1-2]-n[7,9]", "rack1-n7"), ("a,b", "a"), ("gpu-[003-004]", "gpu-003")])
def test_the_master_is_the_first_host_of_the_node_list(nodelist, host):
    assert first_slurm_host(nodelist) == host


@pytest.mark.parametrize("env, message", [
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, "(SLURM_NODELIST missing)"),
    ({"SLURM_PROCID": "2", "SLURM_NTASKS": "2", "SLURM_NODELIST": "n1"},
     "SLURM_PROCID=2 is out of range for SLURM_NTASKS=2; valid ranks: 0..1"),
    ({"SLURM_PROCID": "x", "SLURM_NTASKS": "2", "SLURM_NODELIST": "n1"}, "SLURM_PROCID='x' is not a whole number"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NODELIST": "n[1-2"}, "SLURM_NODELIST='n[1-2' is not a Slurm host list"),
])
def test_malformed_srun_variables_are_named(env, message):
    with pytest.raises(VitbenchError) as err:
        slurm_environment(env)
    assert message in str(err.value)
