"""A timing waits for a quiet machine (bounded) and is taken again once when its spread is too wide,
inside a run; outside one (a library call) it times at once."""
from __future__ import annotations

import dataclasses

import pytest

from vitbench.measure import load
from vitbench.measure.load import MachineLoad, wait_for_quiet, waiting
from vitbench.measure.speed import LatencyResult, quiet_timing


def _loads(*values):
    it = iter(values)
    return lambda: MachineLoad(next(it), 2, 2)


class Clock:
    def __init__(self):
        self.now = 0.0

    def sleep(self, s):
        self.now += s

    def __call__(self):
        return self.now


def test_a_busy_machine_is_waited_for_until_it_is_quiet(capsys):
    clock = Clock()
    with waiting(True):
        waited = wait_for_quiet("timing latency", read=_loads(4.0, 3.9, 2.4), sleep=clock.sleep, clock=clock)
    assert waited == 2 * load.POLL_S
    assert "waiting for a quiet machine before timing latency: load average 4.00 above 2 cores + 0.5" in \
        capsys.readouterr().err


def test_the_wait_is_bounded_and_not_repeated_once_it_ran_out(capsys):
    clock = Clock()
    with waiting(True):
        waited = wait_for_quiet("x", read=lambda: MachineLoad(9.0, 2, 2), sleep=clock.sleep, clock=clock)
        assert waited == pytest.approx(load.WAIT_LIMIT_S, abs=load.POLL_S)
        assert "stayed busy (load average 9.00); timing anyway, marked" in capsys.readouterr().err
        assert wait_for_quiet("y", read=lambda: MachineLoad(9.0, 2, 2), sleep=clock.sleep, clock=clock) == 0.0
    with waiting(True):  # a new run waits again
        assert wait_for_quiet("z", read=_loads(9.0, 1.0), sleep=clock.sleep, clock=clock) == load.POLL_S


def test_outside_a_run_or_with_no_wait_nothing_waits():
    busy = lambda: MachineLoad(9.0, 2, 2)  # noqa: E731
    assert wait_for_quiet("x", read=busy) == 0.0
    with waiting(False):
        assert wait_for_quiet("x", read=busy) == 0.0
    assert MachineLoad(None, 2, 2).busy is False and MachineLoad(2.5, 2, 2).busy is False


def test_a_wide_spread_is_timed_again_once_in_a_run(monkeypatch):
    monkeypatch.setattr(load, "machine_load", lambda: MachineLoad(0.1, 2, 2))
    results = iter([LatencyResult(median_ms=10.0, spread_ms=3.0, repeats=5, warmup=1),
                    LatencyResult(median_ms=10.0, spread_ms=0.5, repeats=5, warmup=1)])
    with waiting(True):
        again = quiet_timing(lambda: next(results), "timing latency")
    assert (again.spread_ms, again.retimed) == (0.5, True)
    assert again.fields()["latency_retimed"] is True and "latency_waited_s" not in again.fields()
    once = quiet_timing(lambda: LatencyResult(median_ms=10.0, spread_ms=3.0, repeats=5, warmup=1), "x")
    assert not once.retimed and dataclasses.asdict(once)["waited_s"] == 0.0  # outside a run: as measured


def test_the_command_line_can_turn_the_wait_off():
    from vitbench.cli.main import build_parser
    from vitbench.cli.run_cmd import run_options

    args = build_parser().parse_args(["run", "--methods", "tome", "--no-wait"])
    assert run_options(args, "cls").wait is False
    assert run_options(build_parser().parse_args(["run", "--methods", "tome"]), "cls").wait is True
