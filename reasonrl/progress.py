"""Live progress on the console: bars with ETA while a stage works, the phase a step is in.

A stage opens one :class:`Display` around its work (``with Display(console, quiet=cfg.quiet)``).
The display draws rich bars on that console and is the *current* display while open, so code far
below (``reasonrl.rollouts.generate_rollouts``, the training step) reports to it through the
module functions :func:`current`, :func:`status` and :func:`phase`, which do nothing when no
display is open. A display is off (draws nothing and is never current) with ``quiet`` or when the
console is not a terminal, so CI logs and pipes keep only the stage's summary lines, and code
that asks for progress (e.g. the engines' ``progress`` callback) is not even called then.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator

_current: ContextVar["Display | None"] = ContextVar("reasonrl_display", default=None)


class Bar:
    """One line of a display: ``advance`` counts work done (and tokens, shown as tok/s)."""

    def __init__(self, display: "Display", task: Any, unit: str, counted: bool) -> None:
        self.display, self.task, self.unit, self.counted = display, task, unit, counted
        self.done, self.tokens = 0.0, 0
        self.t0 = time.perf_counter()
        self.display.progress.update(self.task, info=self._info())

    def _info(self) -> str:
        info = self.unit if self.counted else f"{self.done:.0f} {self.unit}" if self.unit else ""
        if self.tokens:
            info += f" · {self.tokens / max(time.perf_counter() - self.t0, 1e-9):.0f} tok/s"
        return info

    def advance(self, n: float = 1, *, tokens: int = 0) -> None:
        self.done += n
        self.tokens += tokens
        self.display.progress.update(self.task, advance=n, info=self._info())

    def generated(self, completions: int, tokens: int) -> None:
        """An engine's ``progress`` callback (``reasonrl.engines.base.ProgressFn``)."""
        self.advance(completions, tokens=tokens)

    def close(self) -> None:
        self.display.progress.remove_task(self.task)


class Display:
    """A stage's live bars on ``console`` (rich, transient: they vanish when done)."""

    def __init__(self, console: Any, *, quiet: bool = False) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
        from rich.text import Text

        class Counted(ProgressColumn):  # a column shown only on bars with a total (not on status lines)
            def __init__(self, inner: Any) -> None:
                super().__init__()
                self.inner = inner

            def render(self, task: Any) -> Any:
                return self.inner.render(task) if task.total is not None else Text("")

        class Eta(ProgressColumn):
            """Time left at the average pace since the bar started (rich's own estimate looks at the
            last 30 s only, so a bar whose units take minutes, like training steps, never got one)."""

            def render(self, task: Any) -> Any:
                if task.total is None:
                    return Text("")
                done = task.completed - task.fields.get("first", 0)
                if task.finished:
                    return Text("eta 0:00:00")
                if done <= 0 or not task.elapsed:
                    return Text("eta -:--:--")
                left = int(task.elapsed / done * (task.total - task.completed))
                return Text(f"eta {left // 3600}:{left // 60 % 60:02d}:{left % 60:02d}", style="progress.remaining")

        self.console = console
        self.active = not quiet and bool(console.is_terminal)
        self.progress = Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), Counted(BarColumn(bar_width=30)), Counted(MofNCompleteColumn()),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(), Eta(), console=console, transient=True, disable=not self.active)
        self._status: Any = None
        self._token: Any = None

    def start(self) -> None:
        if self.active and self._token is None:
            self.progress.start()
            self._token = _current.set(self)

    def stop(self) -> None:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None
            self.progress.stop()

    def __enter__(self) -> "Display":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def bar(self, description: str, total: float | None, *, unit: str = "", completed: float = 0) -> Bar:
        """A bar that stays until the display closes (or its ``close()``)."""
        bar = Bar(self, self.progress.add_task(description, total=total, completed=completed, info="", first=completed), unit, counted=total is not None)
        self._show()
        return bar

    def _show(self) -> None:
        """Draw now (a new line appears at once, even when its work ends before the next redraw)."""
        if self._token is not None:
            self.progress.refresh()

    @contextmanager
    def phase(self, description: str, total: float | None = None, *, unit: str = "") -> Iterator[Bar]:
        """A bar for one piece of work, removed when it ends (no total: a pulsing line with the count and elapsed time)."""
        b = self.bar(description, total, unit=unit)
        try:
            yield b
        finally:
            b.close()

    def status(self, description: str) -> None:
        """What the current step is doing: one pulsing line, its clock restarted at each change."""
        if self._status is None:
            self._status = self.progress.add_task(description, total=None, info="")
        else:
            self.progress.reset(self._status, description=description, total=None, info="")
        self._show()

    def print(self, *objects: Any) -> None:
        """A line above the bars (the console's own print when the display is off)."""
        self.console.print(*objects)


def current() -> Display | None:
    """The open, active display of this context (None when nothing is shown)."""
    return _current.get()


def status(description: str) -> None:
    """Tell the current display what the step is doing now (no-op without one)."""
    d = current()
    if d is not None:
        d.status(description)


def open_bar(description: str, total: float | None = None, *, unit: str = "") -> Bar | None:
    """A bar on the current display until its ``close()`` (None when nothing is shown)."""
    d = current()
    return d.bar(description, total, unit=unit) if d is not None else None


@contextmanager
def phase(description: str, total: float | None = None, *, unit: str = "", display: Display | None = None) -> Iterator[Bar | None]:
    """:meth:`Display.phase` on ``display`` (default: the current one); yields None when nothing is shown."""
    d = display if display is not None and display.active else current()
    if d is None:
        yield None
        return
    with d.phase(description, total, unit=unit) as b:
        yield b
