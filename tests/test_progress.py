"""Progress of the long steps (:mod:`vitbench.core.progress`): bars with the time left on a terminal,
plain lines elsewhere, nothing on a rank > 0 or without a sink (library use)."""
from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from vitbench.core import progress

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=120, color_system="standard"), out


def test_a_tracked_loop_on_a_terminal_draws_a_bar_with_the_time_left():
    console, out = _terminal()
    assert isinstance(progress.sink_for(console), progress.BarSink)
    sink = progress.BarSink(console, fps=1e6)  # a redraw after every item
    with progress.reporting(sink):
        assert progress.shows_bars()
        assert list(progress.track(range(3), "evaluating accuracy", unit="batches")) == [0, 1, 2]
    text = out.getvalue()
    assert "\x1b[" in text  # drawn as a terminal's bar
    plain = ANSI.sub("", text)
    assert re.search(r"evaluating accuracy .*━.* 2/3 \d:\d\d:\d\d elapsed, \d:\d\d:\d\d left", plain), plain
    assert "-:--:-- left" in plain  # before the first item no estimate
    assert "vitbench: evaluating accuracy: done, 3/3 batches in" in plain
    assert not progress.shows_bars()  # the sink is gone after the block


def test_without_a_terminal_the_steps_are_plain_lines_without_ansi_codes():
    out = io.StringIO()
    sink = progress.sink_for(Console(file=out, width=120))
    assert isinstance(sink, progress.LineSink)
    sink.interval = 0  # a line after every item (30 s apart by default)
    with progress.reporting(sink):
        assert not progress.shows_bars()
        with progress.steps("runs of the plan", 2, "runs") as runs:
            for _ in progress.track([1, 2, 3], "counting GMACs", unit="images"):
                pass
            runs.note("tome (r=8)")
            runs.advance()
            assert progress.say("[bold][2/2][/bold] tome: done")
            runs.advance()
    text = out.getvalue()
    assert "\x1b" not in text
    lines = text.splitlines()
    assert lines[0].startswith("vitbench: counting GMACs: 1/3 images, ") and "left" in lines[0]
    assert re.fullmatch(r"vitbench: counting GMACs: done, 3/3 images in \d+\.\d\d s", lines[2])
    assert lines[3].startswith("vitbench: runs of the plan: 1/2 runs, ") and lines[3].endswith("(tome (r=8))")
    assert lines[4] == "[2/2] tome: done"
    assert re.fullmatch(r"vitbench: runs of the plan: done, 2/2 runs in \d+\.\d\d s", lines[5])
    assert len(lines) == 6  # no periodic line for a step's last item: its final line follows


def test_a_rank_above_0_prints_nothing():
    console, out = _terminal()
    sink = progress.sink_for(console, quiet=True)
    assert isinstance(sink, progress.NullSink)
    with progress.reporting(sink):
        for _ in progress.track(range(3), "timing throughput (batch 32)", unit="forwards", timing=True):
            pass
        assert progress.say("[1/1] baseline: done")  # swallowed, not printed by the caller either
    assert out.getvalue() == ""


def test_without_a_sink_nothing_is_reported(capsys):
    assert progress.active() is None
    assert list(progress.track(range(2), "anything")) == [0, 1]
    with progress.steps("anything", 2) as step:
        step.advance()
    assert progress.say("a line") is False
    assert capsys.readouterr() == ("", "")


def test_advancing_a_step_ends_the_steps_a_failure_left_open():
    out = io.StringIO()
    with progress.reporting(progress.LineSink(out)):
        with progress.steps("runs of the plan", 1, "runs") as runs:
            progress.start("fine-tuning tome", 10, "iterations").advance()  # a hook whose loop raised
            runs.advance()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("vitbench: fine-tuning tome: stopped, 1/10 iterations in ")
    assert lines[1].startswith("vitbench: runs of the plan: done, 1/1 runs in ")


def test_a_block_that_raises_says_its_step_stopped():
    out = io.StringIO()
    with pytest.raises(RuntimeError), progress.reporting(progress.LineSink(out)):
        with progress.steps("training", 4, "iterations") as step:
            step.advance()
            raise RuntimeError("diverged")
    assert out.getvalue().startswith("vitbench: training: stopped, 1/4 iterations in ")


@pytest.mark.parametrize("seconds, words", [(0.421, "0.42 s"), (12.34, "12.3 s"), (125, "2 min 05 s"),
                                            (3725, "1 h 02 min")])
def test_durations_in_words(seconds, words):
    assert progress.duration(seconds) == words


HOSTILE = "bad [/x] value [red]not red[/] and [bold"


@pytest.mark.parametrize("terminal", [True, False])
def test_text_from_users_and_plugins_is_never_read_as_markup(terminal):
    """A method label, note or error holding ``[/...]`` is printed as it is: no MarkupError mid-plan."""
    from vitbench.api import _Progress

    console, out = _terminal() if terminal else (Console(file=io.StringIO(), width=200), None)
    out = out or console.file
    sink = progress.sink_for(console)
    with progress.reporting(sink):
        with progress.steps(HOSTILE, 2, "runs") as runs:
            runs.note(HOSTILE)
            runs.advance()
            say = _Progress()
            say.step(1, 2, HOSTILE, HOSTILE)
            say.note(HOSTILE)
            runs.advance()
    plain = ANSI.sub("", out.getvalue())
    assert f"[1/2] {HOSTILE}: {HOSTILE}" in plain and f"vitbench: {HOSTILE}" in plain
    assert f"vitbench: {HOSTILE}: done, 2/2 runs in" in plain


def test_a_resumed_training_counts_the_iterations_left(monkeypatch):
    """Resumed at 469 of 938 iterations, the step counts the 469 left (its rate and time left are
    this run's) and says where it resumed."""
    from types import SimpleNamespace

    from vitbench.mm.hooks import ProgressHook

    started: list[tuple] = []
    monkeypatch.setattr(progress, "start", lambda what, total, unit, **kw: started.append((what, total, unit)))
    hook = ProgressHook(what="training the default model")
    hook.before_train(SimpleNamespace(iter=469, max_iters=938))
    hook.before_train(SimpleNamespace(iter=0, max_iters=938))
    assert started == [("training the default model (resumed after 469 of 938 iterations)", 469, "iterations"),
                       ("training the default model", 938, "iterations")]


def test_a_step_told_its_time_left_shows_that_estimate_not_the_mean_pace():
    out = io.StringIO()
    sink = progress.LineSink(out, interval=0)
    with progress.reporting(sink):
        with progress.steps("runs of the plan", 3, "runs") as runs:
            runs.expect(600.0)  # the runs left cost more than the first one did
            runs.advance()
            assert 590.0 < runs.left() <= 600.0
            runs.expect(None)
            assert runs.left() < 60.0  # the mean pace again: one quick item of three
    assert "about 10 min 00 s left" in out.getvalue() or "about 9 min 59 s left" in out.getvalue()
