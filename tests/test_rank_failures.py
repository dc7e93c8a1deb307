"""A rank that fails must not leave the other ranks hanging (issue 13): the helpers of
:mod:`vitbench.host.distributed` that exchange the ranks' errors, and the bounded wait
``VITBENCH_DIST_TIMEOUT``. Without a process group they are no-ops or raise locally; with one
(two gloo processes started here, a few seconds) every rank raises or records the same error,
naming the rank that failed. The end-to-end run under ``torchrun`` is in
tests/cli/test_launcher.py."""
from __future__ import annotations

import datetime
import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
from ranks_support import free_port, run_ranks  # tests/ranks_support.py

from vitbench.host.distributed import (TIMEOUT_VARIABLE, _describe_failures, collective_test, dist_timeout,
                                  failure_on_any_rank, init_launcher, raise_if_any_rank_failed)
from vitbench.errors import NonFiniteError, VitbenchError


# --- without a process group ------------------------------------------------------------------

def test_without_a_process_group_an_error_is_raised_where_it_happens():
    raise_if_any_rank_failed(None)  # nothing to exchange, nothing raised
    error = NonFiniteError("evaluation: the logits hold non-finite values (3 of 30) in batch 2")
    with pytest.raises(NonFiniteError) as raised:
        raise_if_any_rank_failed(error)
    assert raised.value is error  # the very error, message unchanged
    assert failure_on_any_rank(None) is None
    assert failure_on_any_rank("RuntimeError: boom") == "RuntimeError: boom"


def test_without_a_process_group_the_test_loop_runs_as_it_is():
    class Runner:
        def test(self):
            return {"accuracy/top1": 50.0}

    assert collective_test(Runner()) == {"accuracy/top1": 50.0}


@pytest.mark.parametrize("errors, message", [
    ([None, None], None),
    ([None, "A in batch 1"], "A in batch 1 on rank 1 of 2"),
    (["A", None, "A", "B"], "A on ranks 0, 2 of 4; B on rank 3 of 4"),
])
def test_the_ranks_errors_are_named_with_their_ranks(errors, message):
    assert _describe_failures(errors) == message


@pytest.mark.parametrize("raw, seconds", [(None, None), ("", None), (" ", None), ("90", 90.0), ("2.5", 2.5)])
def test_the_timeout_is_read_in_seconds(raw, seconds):
    assert dist_timeout({} if raw is None else {TIMEOUT_VARIABLE: raw}) == seconds


@pytest.mark.parametrize("raw", ["abc", "0", "-5", "inf", "nan", "10s"])
def test_a_malformed_timeout_is_named(raw):
    with pytest.raises(VitbenchError) as err:
        dist_timeout({TIMEOUT_VARIABLE: raw})
    assert f"VITBENCH_DIST_TIMEOUT={raw!r} is not a number of seconds > 0 (e.g. 600)" in str(err.value)


def test_the_timeout_reaches_the_process_group_on_either_path(monkeypatch):
    """gloo (CPU): torch's ``init_process_group(timeout=timedelta)``; nccl (CUDA): mmengine's
    ``init_dist(timeout=seconds)``, which makes the timedelta itself; unset: neither gets one."""
    import mmengine.dist
    import torch.distributed as torch_dist

    calls = []
    monkeypatch.setattr(torch_dist, "is_initialized", lambda: False)
    monkeypatch.setattr(torch_dist, "init_process_group", lambda **kw: calls.append(("torch", kw)))
    monkeypatch.setattr(mmengine.dist, "init_dist", lambda launcher, **kw: calls.append((launcher, kw)))
    monkeypatch.setenv(TIMEOUT_VARIABLE, "45")
    init_launcher("pytorch", "cpu")
    init_launcher("pytorch", "cuda")
    monkeypatch.delenv(TIMEOUT_VARIABLE)
    init_launcher("pytorch", "cpu")
    init_launcher("slurm", "cuda:0")
    assert calls == [("torch", {"backend": "gloo", "timeout": datetime.timedelta(seconds=45)}),
                     ("pytorch", {"backend": "nccl", "timeout": 45.0}),
                     ("torch", {"backend": "gloo"}), ("slurm", {"backend": "nccl"})]


# --- two gloo processes -----------------------------------------------------------------------

#: run by each of two ranks: runs as the executor runs them (each ends in failure_on_any_rank), with
#: rank 1 failing in some; each outcome printed as JSON
_RANK = textwrap.dedent("""
    import json, os, sys, time
    from vitbench.host.distributed import (all_ranks, barrier, collective_test, failure_on_any_rank, init_launcher,
                                      raise_if_any_rank_failed)
    from vitbench.errors import NonFiniteError, VitbenchError

    init_launcher("pytorch", "cpu")
    rank = int(os.environ["RANK"])
    out = {}

    def run(body):  # as execute.run_spec, then the outcome exchange of execute_plan
        try:
            raised = ["ok", body()]
            error = None
        except Exception as exc:
            raised = [type(exc).__name__, str(exc)]
            error = str(exc) if isinstance(exc, VitbenchError) else f"{type(exc).__name__}: {exc}"
        return raised + [failure_on_any_rank(error)]

    class Evaluator:  # as mmengine's: evaluate() gathers every rank's results (a collective)
        def evaluate(self, size):
            from mmengine.dist import all_gather_object
            return {"gathered": all_gather_object(rank)}

    class Loop:
        evaluator = Evaluator()

    class Runner:  # as mmengine's TestLoop: the iterations, then evaluator.evaluate
        test_loop = Loop()

        def __init__(self, fail_at):
            self.fail_at = fail_at

        def test(self):
            for batch in range(1, 4):
                if batch == self.fail_at:
                    raise NonFiniteError(f"the logits hold non-finite values in batch {batch}")
                time.sleep(0.2)  # the other rank works on meanwhile
            return self.test_loop.evaluator.evaluate(6)

    def early():  # rank 1 fails before the evaluation; rank 0 evaluates
        if rank == 1:
            raise RuntimeError("early")
        time.sleep(0.5)
        raise_if_any_rank_failed(None)  # as evaluate_cls before it builds its Runner (a broadcast)
        return collective_test(Runner(0))

    bad = NonFiniteError("evaluation: the logits hold non-finite values (4 of 40) in batch 3")
    out["raise"] = run(lambda: raise_if_any_rank_failed(bad if rank == 1 else None))
    out["none"] = run(lambda: raise_if_any_rank_failed(None))
    out["other type"] = run(lambda: raise_if_any_rank_failed(RuntimeError("boom") if rank == 0 else None))
    out["outcome"] = run(lambda: (_ for _ in ()).throw(RuntimeError("x")) if rank == 1 else 7)
    out["same outcome"] = run(lambda: (_ for _ in ()).throw(VitbenchError("E")))
    out["loop"] = run(lambda: collective_test(Runner(2 if rank == 1 else 0)))
    out["early"] = run(early)
    out["loop again"] = run(lambda: collective_test(Runner(0)))  # the evaluator is its own again

    def decide():  # rank 1 fails before a decision the ranks take together (a checkpoint reload)
        if rank == 1:
            raise RuntimeError("before the decision")
        return all_ranks(True)

    out["all ranks"] = run(lambda: [all_ranks(True), all_ranks(rank == 0)])
    out["decision"] = run(decide)
    out["plain evaluate"] = run(lambda: Loop.evaluator.evaluate(6))
    if os.environ.get("HANG") and rank == 1:
        time.sleep(8)  # rank 0 waits alone at the barrier: the timeout ends its wait
    started = time.perf_counter()
    if os.environ.get("HANG") and rank == 0:
        try:
            barrier()
            out["alone"] = ["ok", None]
        except Exception as exc:
            out["alone"] = [type(exc).__name__, str(exc)]
    out["waited_s"] = time.perf_counter() - started
    print("RESULT " + json.dumps(out), flush=True)
    os._exit(0)  # the process group is left as it is (a rank may have timed out)
""")


def _two_ranks(tmp_path: Path, **env: str) -> list[dict]:
    script = tmp_path / "rank.py"
    script.write_text(_RANK)
    base = {**os.environ, "OMP_NUM_THREADS": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), TIMEOUT_VARIABLE: "30", **env}
    ranks = run_ranks([sys.executable, str(script)], [{**base, "RANK": str(r), "LOCAL_RANK": str(r)} for r in (0, 1)],
                      timeout=120)
    results = []
    for code, stdout, stderr in ranks:
        lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
        assert code == 0 and lines, stderr[-3000:]
        results.append(json.loads(lines[0][len("RESULT "):]))
    return results


def test_two_ranks_raise_and_record_the_same_error_naming_the_failing_rank(tmp_path):
    """Each entry: what the run raised on the rank, then the outcome its record gets."""
    rank0, rank1 = _two_ranks(tmp_path)
    for key in ("raise", "none", "other type", "same outcome", "loop", "loop again", "all ranks", "plain evaluate"):
        assert rank0[key] == rank1[key], (key, rank0[key], rank1[key])
    nan = "evaluation: the logits hold non-finite values (4 of 40) in batch 3 on rank 1 of 2"
    assert rank0["raise"] == ["NonFiniteError", nan, nan]  # every rank raises rank 1's error, named
    assert rank0["none"] == ["ok", None, None]
    boom = "RuntimeError: boom on rank 0 of 2"
    assert rank0["other type"] == ["VitbenchError", boom, boom]
    # rank 0 succeeded, rank 1 failed alone: rank 0's record is the error, naming rank 1
    assert rank0["outcome"] == ["ok", 7, "RuntimeError: x on rank 1 of 2"]
    assert rank1["outcome"] == ["RuntimeError", "x", "RuntimeError: x on rank 1 of 2"]
    assert rank0["same outcome"] == ["VitbenchError", "E", "E"]  # every rank failed alike: as it is
    # rank 1 stops at batch 2 and meets rank 0 where rank 0 would gather: both raise its error
    loop = "the logits hold non-finite values in batch 2 on rank 1 of 2"
    assert rank0["loop"] == ["NonFiniteError", loop, loop]
    # rank 1 failed before the evaluation: rank 0 meets it at the evaluation's first agreement point
    early = "RuntimeError: early on rank 1 of 2"
    assert rank0["early"] == ["VitbenchError", early, early] and rank1["early"] == ["RuntimeError", "early", early]
    assert rank0["loop again"] == ["ok", {"gathered": [0, 1]}, None]  # in step again
    assert rank0["all ranks"] == rank1["all ranks"] == ["ok", [True, False], None]
    # all_ranks is an agreement point: rank 0 raises rank 1's earlier error there, in step
    before = "RuntimeError: before the decision on rank 1 of 2"
    assert rank0["decision"] == ["VitbenchError", before, before]
    assert rank1["decision"] == ["RuntimeError", "before the decision", before]
    assert rank0["plain evaluate"] == ["ok", {"gathered": [0, 1]}, None]  # the wrapper is gone afterwards


@pytest.mark.slow
def test_the_timeout_bounds_a_wait_for_a_rank_that_never_comes(tmp_path):
    """VITBENCH_DIST_TIMEOUT=5: rank 0 waits at a barrier that rank 1 (asleep) does not reach
    for 8 s; gloo gives up after 5 (``Timed out waiting 5000ms for recv operation``)."""
    rank0, _ = _two_ranks(tmp_path, HANG="1", **{TIMEOUT_VARIABLE: "5"})
    assert rank0["alone"][0] == "RuntimeError" and "Timed out" in rank0["alone"][1]  # not 30 minutes
    assert rank0["waited_s"] < 10.0, rank0
