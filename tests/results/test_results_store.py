"""The JSONL result store: round-trip, resume semantics, crash safety, JSON-safe scalars."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from vitbench.results import CorruptLine, ResultStore, latest_records, to_jsonable


def rec(spec_id: str, status: str = "ok", **extra):
    return {"spec_id": spec_id, "task": "cls", "model": "m", "method": "tome",
            "params": {"r": 13}, "seed": 0, "status": status, "error": None, **extra}


def test_round_trip_keeps_records_in_order(tmp_path):
    store = ResultStore(tmp_path / "out")  # the folder is created on the first append
    records = [rec("a", top1_pct=81.2, env={"plugins": [{"name": "tome", "version": "0.1"}]}),
               rec("b", status="error", error="boom")]
    for r in records:
        store.append(r)
    assert store.path == tmp_path / "out" / "runs.jsonl"
    assert ResultStore(tmp_path / "out").records() == records
    assert store.corrupt_lines == []
    # one complete line per record
    assert store.path.read_bytes().count(b"\n") == 2


def test_store_accepts_the_jsonl_path_itself(tmp_path):
    ResultStore(tmp_path).append(rec("a"))
    assert [r["spec_id"] for r in ResultStore(tmp_path / "runs.jsonl").records()] == ["a"]


def test_missing_store_is_empty(tmp_path):
    store = ResultStore(tmp_path / "nothing")
    assert store.records() == []
    assert store.latest() == {}
    assert store.finished_ids() == set()


def test_resume_skips_ok_and_skipped_retries_errors_latest_wins(tmp_path):
    store = ResultStore(tmp_path)
    store.append(rec("ok1"))
    store.append(rec("skip1", status="skipped", error="not supported"))
    store.append(rec("err1", status="error", error="boom"))
    store.append(rec("retried", status="error", error="first try failed"))
    store.append(rec("retried", status="ok", top1_pct=80.0))
    store.append(rec("regressed", status="ok"))
    store.append(rec("regressed", status="error", error="second try failed"))

    assert store.finished_ids() == {"ok1", "skip1", "retried"}
    latest = store.latest()
    assert latest["retried"]["status"] == "ok" and latest["retried"]["top1_pct"] == 80.0
    assert latest["regressed"]["error"] == "second try failed"
    # a retried spec keeps the place where it first appeared
    assert list(latest) == ["ok1", "skip1", "err1", "retried", "regressed"]


def test_truncated_last_line_is_skipped_and_reported(tmp_path):
    store = ResultStore(tmp_path)
    store.append(rec("a"))
    store.append(rec("b"))
    data = store.path.read_bytes()
    store.path.write_bytes(data[: len(data) - 20])  # killed in the middle of writing "b"

    assert [r["spec_id"] for r in store.records()] == ["a"]
    assert len(store.corrupt_lines) == 1
    bad = store.corrupt_lines[0]
    assert isinstance(bad, CorruptLine) and bad.lineno == 2
    assert bad.text.startswith('{"spec_id": "b"')
    assert store.finished_ids() == {"a"}  # "b" runs again on resume


def test_append_after_a_truncated_line_starts_a_fresh_line(tmp_path):
    store = ResultStore(tmp_path)
    store.append(rec("a"))
    with open(store.path, "ab") as f:
        f.write(b'{"spec_id": "b", "sta')
    store.append(rec("b"))
    assert [r["spec_id"] for r in store.records()] == ["a", "b"]
    assert [c.lineno for c in store.corrupt_lines] == [2]
    assert store.finished_ids() == {"a", "b"}


def test_numpy_and_torch_scalars_and_nan_are_stored_as_json(tmp_path):
    store = ResultStore(tmp_path)
    store.append(rec(
        "a", top1_pct=np.float32(81.5), gmacs=torch.tensor(4.6, dtype=torch.float64),
        batch_size=np.int64(64), ib_loss=float("nan"), ib_bound=np.float64("inf"),
        speedup=torch.tensor(float("nan")), ok=np.bool_(True), shape=np.arange(3),
        params={"r": np.int32(13), "ratio": torch.tensor(0.5)},
    ))
    line = store.path.read_text()
    assert "NaN" not in line and "Infinity" not in line
    r = json.loads(line)
    assert r["top1_pct"] == 81.5 and r["gmacs"] == 4.6 and r["batch_size"] == 64
    assert r["ib_loss"] is None and r["ib_bound"] is None and r["speedup"] is None
    assert r["ok"] is True and r["shape"] == [0, 1, 2]
    assert r["params"] == {"r": 13, "ratio": 0.5}


def test_to_jsonable_nested_and_unknown_values():
    out = to_jsonable({"a": (1, float("-inf")), 3: {np.float16(1.0)}, "p": pytest})
    assert out["a"] == [1, None] and out["3"] == [1.0]
    assert isinstance(out["p"], str)
    assert not any(isinstance(v, float) and math.isnan(v) for v in out["a"] if v is not None)


def test_latest_records_is_pure_and_keeps_first_position():
    records = [rec("x", status="error"), rec("y"), rec("x", status="ok")]
    latest = latest_records(records)
    assert [(r["spec_id"], r["status"]) for r in latest] == [("x", "ok"), ("y", "ok")]
    assert records[0]["status"] == "error"  # input untouched


@pytest.mark.parametrize("line, reason", [
    ('{"status": "ok", "task": "cls", "model": "m", "method": "tome"}', "no string 'spec_id'"),
    ('{"spec_id": 7, "status": "ok", "task": "cls", "model": "m", "method": "tome"}', "no string 'spec_id'"),
    ('{"spec_id": "x", "status": null, "task": "cls", "model": "m", "method": "tome"}', "no string 'status'"),
    ('[1, 2]', "not a complete JSON object"),
    ('"text"', "not a complete JSON object"),
    ('[' * 100000, "not a complete JSON object"),
])
def test_a_line_that_is_no_run_record_is_skipped_with_its_reason(tmp_path, line, reason):
    store = ResultStore(tmp_path)
    store.append(rec("a"))
    with open(store.path, "a") as f:
        f.write(line + "\n")
    assert [r["spec_id"] for r in store.records()] == ["a"]
    (bad,) = store.corrupt_lines
    assert bad.lineno == 2 and bad.reason == reason
    assert bad.describe().startswith(f"runs.jsonl line 2 ({reason}): ")
    assert len(bad.describe()) < 120


def test_a_store_that_cannot_be_read_is_one_error(tmp_path):
    from vitbench.errors import DataError

    (tmp_path / "runs.jsonl").mkdir()
    with pytest.raises(DataError, match="cannot be read"):
        ResultStore(tmp_path).records()
