"""Progress of the long steps (training, evaluation, GMACs, timings, the plan): where a step is, how
long it has run and about how long it has left.

Any layer reports through :func:`track`, :func:`steps` or :func:`start`; what the reports become is
the sink the command line installed with :func:`reporting`: bars with elapsed time and time left on
a terminal (:class:`BarSink`), plain lines elsewhere -- a line now and then and a final line with
the step's time (:class:`LineSink`) --, nothing on a distributed rank > 0 (:class:`NullSink`). With
no sink installed (library use, tests) a report costs one attribute read and prints nothing. A
step marked ``timing`` is never redrawn from a background thread, so no drawing runs beside a timed
forward. Advancing a step ends the steps opened after it that are still open (a loop that raised
inside a hook never closed them). Imports no torch; rich only when a sink is made.
"""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any, Optional, TypeVar

__all__ = ["BarSink", "LineSink", "NullSink", "Sink", "Step", "active", "duration", "reporting", "say",
           "shows_bars", "sink_for", "start", "steps", "track"]

T = TypeVar("T")

#: seconds between two plain progress lines of one step (its start and end lines aside)
LINE_INTERVAL = 30.0


def duration(seconds: float) -> str:
    """``0.42 s``, ``12.3 s``, ``2 min 05 s``, ``1 h 02 min``: a step's time in words."""
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class Step:
    """One long step as a sink shows it: ``what``, ``done`` of ``total`` ``unit`` (total may be
    unknown), since ``started``; :meth:`advance` it, :meth:`close` it at its end."""

    def __init__(self, sink: "Sink", what: str, total: Optional[int], unit: str, timing: bool) -> None:
        self.sink, self.what, self.total, self.unit, self.timing = sink, what, total, unit, timing
        self.done = 0
        self.text = ""
        self.started = self.at = time.perf_counter()  # ``at``: the last advance
        self.closed = False
        self.key: Any = None  # the sink's handle
        self.expected: Optional[tuple[float, float]] = None  # (seconds left, when said): :meth:`expect`

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def left(self) -> Optional[float]:
        """Seconds left: the caller's estimate (:meth:`expect`) less the time since it was given,
        else the mean pace of the items done less the time spent since the last one; None before
        the first item or without a total."""
        if self.expected is not None:
            seconds, said = self.expected
            return max(0.0, seconds - (time.perf_counter() - said))
        if not self.total or not self.done:
            return None
        per_item = (self.at - self.started) / self.done
        return max(0.0, per_item * (self.total - self.done) - (time.perf_counter() - self.at))

    def advance(self, n: int = 1) -> None:
        self.done += n
        self.at = time.perf_counter()
        self.sink.advanced(self, moved=True)

    def expect(self, seconds: Optional[float]) -> None:
        """The time left as the caller estimates it now, where items differ in cost (None: the mean
        pace again)."""
        self.expected = None if seconds is None else (seconds, time.perf_counter())

    def set_total(self, total: Optional[int]) -> None:
        """The number of items, once known (a runner's iterations)."""
        self.total = total
        self.sink.advanced(self)

    def note(self, text: str) -> None:
        """A short note shown beside the bar (the current run, the last loss)."""
        self.text = text
        self.sink.advanced(self)

    def close(self, ok: bool = True) -> None:
        """End the step: a final line with its time (``ok=False``: it stopped early)."""
        if not self.closed:
            self.closed = True
            self.sink.closed(self, ok)


class Sink:
    """Where steps are shown; the base shows nothing (:class:`NullSink`)."""

    bars = False

    def __init__(self) -> None:
        self.open: list[Step] = []
        self.lock = threading.RLock()

    def start(self, what: str, total: Optional[int], unit: str, timing: bool) -> Step:
        step = Step(self, what, total, unit, timing)
        with self.lock:
            self.open.append(step)
            self.started(step)
        return step

    def advanced(self, step: Step, moved: bool = False) -> None:
        """``step`` changed: ``moved`` on (an item done), else its total or note."""
        with self.lock:
            if moved and self.open and self.open[-1] is not step and step in self.open:
                for child in self.open[self.open.index(step) + 1:]:
                    child.close(ok=False)
            self.shown(step, moved)

    def closed(self, step: Step, ok: bool) -> None:
        with self.lock:
            if step in self.open:
                for child in self.open[self.open.index(step) + 1:]:
                    child.close(ok=False)
                self.open.remove(step)
            self.ended(step, ok)

    def say(self, markup: str) -> None:
        """A line of text (rich markup) above the bars."""

    def started(self, step: Step) -> None:
        pass

    def shown(self, step: Step, moved: bool) -> None:
        pass

    def ended(self, step: Step, ok: bool) -> None:
        pass

    def stop(self) -> None:
        """End every open step and release the display."""
        with self.lock:
            for step in list(self.open):
                step.close(ok=False)


class NullSink(Sink):
    """Shows nothing: a distributed rank > 0 (rank 0 reports for all)."""


def _counted(step: Step) -> str:
    unit = f" {step.unit}" if step.unit else ""
    return f"{step.done}/{step.total}{unit}" if step.total else f"{step.done}{unit}"


class LineSink(Sink):
    """Plain lines on a stream that is no terminal (a log, CI): a line every ``interval`` seconds
    while a step runs (done so far, elapsed, time left) and one when it ends, with its time."""

    def __init__(self, stream: Optional[IO[str]] = None, interval: float = LINE_INTERVAL) -> None:
        super().__init__()
        self.stream = stream
        self.interval = interval
        self.last: dict[int, float] = {}

    def _write(self, text: str) -> None:
        stream = self.stream or sys.stderr
        stream.write(text + "\n")
        stream.flush()

    def say(self, markup: str) -> None:
        from rich.text import Text

        self._write(Text.from_markup(markup).plain)

    def started(self, step: Step) -> None:
        self.last[id(step)] = step.started

    def shown(self, step: Step, moved: bool) -> None:
        now = time.perf_counter()
        if not moved or now - self.last.get(id(step), step.started) < self.interval or (step.total and step.done >= step.total):
            return  # (the last item: the step's final line follows)
        self.last[id(step)] = now
        left = step.left()
        self._write(f"vitbench: {step.what}: {_counted(step)}, {duration(step.elapsed)} elapsed"
                    + (f", about {duration(left)} left" if left is not None else "")
                    + (f" ({step.text})" if step.text else ""))

    def ended(self, step: Step, ok: bool) -> None:
        self.last.pop(id(step), None)
        how = "done" if ok else "stopped"
        self._write(f"vitbench: {step.what}: {how}, {_counted(step)} in {duration(step.elapsed)}")


class BarSink(Sink):
    """Rich bars on a terminal: each open step's bar, count, elapsed time and time left (the mean
    pace so far); lines said go above them. Redrawn after each advance (at most ``fps`` times a
    second) and every second by a thread, except while a ``timing`` step is open."""

    bars = True

    def __init__(self, console: Any = None, fps: float = 4.0) -> None:
        super().__init__()
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, SpinnerColumn,
                                   TextColumn, TimeElapsedColumn)
        from rich.text import Text

        class TimeLeft(ProgressColumn):
            """``0:01:23 left`` as :meth:`Step.left` estimates it (``-:--:--`` before the first item)."""

            def render(self, task: Any) -> Text:
                left = task.fields["step"].left()
                if left is None:
                    return Text("-:--:-- left", style="progress.remaining")
                minutes, secs = divmod(int(left), 60)
                return Text(f"{minutes // 60}:{minutes % 60:02d}:{secs:02d} left", style="progress.remaining")

        self.console = console or Console(stderr=True, highlight=False)
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("elapsed,"), TimeLeft(),
            TextColumn("{task.fields[note]}", style="dim", markup=False),
            console=self.console, auto_refresh=False, speed_estimate_period=24 * 3600.0,
            redirect_stdout=False, redirect_stderr=True)
        self.gap = 1.0 / fps
        self.drawn = 0.0
        self.quit = threading.Event()
        self.progress.start()
        self.ticker = threading.Thread(target=self._tick, name="vitbench-progress", daemon=True)
        self.ticker.start()

    def _tick(self) -> None:
        while not self.quit.wait(1.0):
            with self.lock:
                if not any(step.timing for step in self.open):
                    self._draw()

    def _draw(self) -> None:
        self.drawn = time.perf_counter()
        self.progress.refresh()

    def say(self, markup: str) -> None:
        with self.lock:
            self.progress.console.print(markup, highlight=False, soft_wrap=True)

    def started(self, step: Step) -> None:
        step.key = self.progress.add_task(step.what, total=step.total, note="", step=step)
        self._draw()

    def shown(self, step: Step, moved: bool) -> None:
        self.progress.update(step.key, completed=step.done, total=step.total, note=step.text)
        if time.perf_counter() - self.drawn >= self.gap:
            self._draw()

    def ended(self, step: Step, ok: bool) -> None:
        self.progress.remove_task(step.key)
        self._draw()  # a line printed now goes above the last drawn bars: draw them without this one
        how = "done" if ok else "stopped"
        self.progress.console.print(f"vitbench: {step.what}: {how}, {_counted(step)} in {duration(step.elapsed)}",
                                    style="dim", markup=False, highlight=False, soft_wrap=True)

    def stop(self) -> None:
        super().stop()
        self.quit.set()
        self.ticker.join(timeout=2)
        self.progress.stop()


_sink: Optional[Sink] = None


def active() -> Optional[Sink]:
    """The installed sink, or None (library use)."""
    return _sink


def shows_bars() -> bool:
    """Whether the installed sink draws bars (then periodic text lines are not needed)."""
    return _sink is not None and _sink.bars


def sink_for(console: Any = None, *, quiet: bool = False) -> Sink:
    """The sink for a command: nothing when ``quiet`` (a rank > 0), bars when ``console`` (default:
    stderr's) is a terminal, else plain lines on its stream."""
    if quiet:
        return NullSink()
    from rich.console import Console

    given = console is not None
    console = console or Console(stderr=True, highlight=False)
    if console.is_terminal and not console.is_dumb_terminal:
        return BarSink(console)
    return LineSink(console.file if given else None)  # None: sys.stderr as it is at each line


@contextlib.contextmanager
def reporting(sink: Sink) -> Iterator[Sink]:
    """Install ``sink`` for the block (the command line's run); the previous one after it."""
    global _sink
    previous, _sink = _sink, sink
    try:
        yield sink
    finally:
        _sink = previous
        sink.stop()


class _NoStep(Step):
    """The step of no sink: every call does nothing."""

    def __init__(self) -> None:
        self.done, self.total, self.closed = 0, None, True

    def advance(self, n: int = 1) -> None:
        pass

    def expect(self, seconds: Optional[float]) -> None:
        pass

    def set_total(self, total: Optional[int]) -> None:
        pass

    def note(self, text: str) -> None:
        pass

    def close(self, ok: bool = True) -> None:
        pass


_NO_STEP = _NoStep()


def start(what: str, total: Optional[int] = None, unit: str = "", *, timing: bool = False) -> Step:
    """Open a step (close it yourself); ``timing``: never redrawn from a background thread."""
    sink = _sink
    if sink is None:
        return _NO_STEP
    return sink.start(what, total, unit, timing)


@contextlib.contextmanager
def steps(what: str, total: Optional[int] = None, unit: str = "", *, timing: bool = False) -> Iterator[Step]:
    """A step for the block: ``with steps("evaluating", 40, "batches") as step: ... step.advance()``;
    it ends with the block (``stopped`` when the block raised)."""
    step = start(what, total, unit, timing=timing)
    try:
        yield step
    except BaseException:
        step.close(ok=False)
        raise
    step.close()


def track(items: Iterable[T], what: str, total: Optional[int] = None, unit: str = "", *,
          timing: bool = False) -> Iterator[T]:
    """``items`` one by one, a step advanced after each (``total``: ``len(items)`` when it has one)."""
    if _sink is None:
        yield from items
        return
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with steps(what, total, unit, timing=timing) as step:
        for item in items:
            yield item
            step.advance()


def say(markup: str) -> bool:
    """Print a line (rich markup) through the installed sink, above any bar; False when none is
    installed (the caller prints it itself)."""
    if _sink is None:
        return False
    _sink.say(markup)
    return True
