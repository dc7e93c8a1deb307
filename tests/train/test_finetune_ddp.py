"""DDP fine-tuning (vitbench.tasks.cls.finetune under a process group; issue 13 item 2): two gloo
ranks on the CPU, started here with torch.multiprocessing, fine-tune the small learnable test
method (tests_support.py, ``test-gate``) on their halves of each batch and end with the same
weights as each other and as one process; a non-finite loss on one rank stops both."""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import vitbench
from vitbench.host.distributed import rank_batch_size
from vitbench.errors import VitbenchError

#: 128 training images in batches of 32 (16 per rank): 4 steps, alternating the gate's
#: weights and arch optimisers (arch_fraction 0.5), as DCS does, then a second stage (a second
#: Runner and DDP wrapper over the same parameters)
LIMIT = 128
GATE = {"arch_fraction": 0.5, "two_stages": True}


def _model() -> nn.Module:
    from vitbench.testing import tiny_vit

    model = tiny_vit(in_chans=1)
    model.pretrained_cfg = {"input_size": (1, 32, 32), "mean": (0.2190,), "std": (0.3318,),
                            "crop_pct": 1.0, "interpolation": "bilinear"}
    return model


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, out: str, nan_rank: int) -> None:
    """One rank: a gloo group, the gate fine-tuned on this rank's shard; its weights (or its
    error) written to ``out``."""
    import torch.distributed as dist

    from tests_support import register_gate
    from vitbench.errors import NonFiniteError
    from vitbench.tasks.cls.data import resolve_cls_data
    from vitbench.tasks.cls.finetune import finetune

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = vitbench.apply(_model(), register_gate(), **GATE, nan_extra_at=2 if rank == nan_rank else 0)
        data = resolve_cls_data("fashion-mnist", model)
        try:
            result = finetune(model, data, limit=LIMIT)
            torch.save({"state": model.state_dict(), "stages": result.stages}, Path(out) / f"rank{rank}.pt")
        except NonFiniteError as exc:
            (Path(out) / f"rank{rank}.err").write_text(str(exc))
    finally:
        dist.destroy_process_group()


def _spawn(out: Path, nan_rank: int = -1, world: int = 2, timeout: float = 240.0) -> None:
    """Start ``world`` ranks and wait; a rank still running after ``timeout`` s is a hang."""
    import torch.multiprocessing as mp

    ctx = mp.start_processes(_worker, args=(world, _free_port(), str(out), nan_rank), nprocs=world,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.terminate()
            pytest.fail(f"the ranks did not finish within {timeout:.0f} s (a rank waiting in a collective?)")


@pytest.mark.slow
def test_two_ranks_end_with_the_same_weights_as_each_other_and_as_one_process(tmp_path, gate_method):
    _spawn(tmp_path)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    for key, value in ranks[0]["state"].items():  # DDP averaged the gradients: the same step everywhere
        assert torch.equal(value, ranks[1]["state"][key]), key
    assert [s["name"] for s in ranks[0]["stages"]] == ["search", "retrain"]
    stage = ranks[0]["stages"][0]
    assert (stage["iters"], stage["images"], stage["ranks"], stage["rank_batch_size"],
            stage["effective_batch_size"]) == (LIMIT // 32, LIMIT, 2, 16, 32)

    from vitbench.tasks.cls.data import resolve_cls_data
    from vitbench.tasks.cls.finetune import finetune

    torch.manual_seed(0)
    one = vitbench.apply(_model(), gate_method, **GATE)
    initial = {k: v.clone() for k, v in one.state_dict().items()}
    result = finetune(one, resolve_cls_data("fashion-mnist", one), limit=LIMIT)
    changed = {k for k, v in one.state_dict().items() if not torch.equal(v, initial[k])}
    assert changed == {"blocks.0.reducer.scale", "blocks.0.reducer.alpha", "blocks.0.reducer.epochs_seen"}
    for key, value in one.state_dict().items():  # each rank's half-batches make the same batch
        torch.testing.assert_close(ranks[0]["state"][key], value, rtol=1e-5, atol=1e-6, msg=key)
    for key, value in result.stages[0].items():  # the last losses: averaged over the ranks
        if key.startswith("last_"):
            assert stage[key] == pytest.approx(value, rel=1e-5) == ranks[1]["stages"][0][key]


@pytest.mark.slow
def test_a_non_finite_loss_on_one_rank_stops_every_rank_at_that_step(tmp_path):
    _spawn(tmp_path, nan_rank=1)  # only rank 1's extra loss is NaN, at step 2
    errors = [(tmp_path / f"rank{r}.err").read_text() for r in (0, 1)]
    assert errors[0] == errors[1] == ("test-gate: the loss became non-finite (extra = nan) in stage 'search', "
                                      "epoch 1, iteration 2 on rank 1 of 2 (every rank stopped)")
    assert not list(tmp_path.glob("rank*.pt"))


@pytest.mark.parametrize("batch, world, per_rank", [(64, 2, 32), (64, 3, 21), (2, 4, 1), (7, 1, 7)])
def test_each_rank_takes_its_share_of_the_batch(batch, world, per_rank):
    assert rank_batch_size(batch, world) == per_rank


def test_a_batch_or_rank_count_below_one_is_refused():
    with pytest.raises(VitbenchError, match="batch size 0 over 2 rank"):
        rank_batch_size(0, 2)


def test_without_a_process_group_the_guards_and_syncs_are_the_single_process_ones(gate_method):
    from vitbench.errors import NonFiniteError
    from vitbench.train.stages import _mean_over_ranks, broadcast_buffers, check_losses_on_every_rank

    model = vitbench.apply(_model(), gate_method)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    broadcast_buffers(model)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert _mean_over_ranks({"ce": 1.5}) == {"ce": 1.5}
    check_losses_on_every_rank({"ce": torch.tensor(1.0), "loss": torch.tensor(1.0)}, "m", "here")
    with pytest.raises(NonFiniteError, match=r"^m: the loss became non-finite \(ce = nan\) here$"):
        check_losses_on_every_rank({"ce": torch.tensor(float("nan")), "loss": torch.tensor(1.0)}, "m", "here")
