"""Live progress of an embedded run: sessions per stage and finished sessions by status.

:class:`ProgressState` is plain bookkeeping (unit-tested); :class:`ProgressDisplay` shows it as a ``rich`` live
table on a terminal, or as one plain line per change when output is redirected (CI logs, pipes).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Self

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

__all__ = ["STAGES", "ProgressDisplay", "ProgressState"]

# Gateway stages, in order; "queued" is a session the rollout server has not dispatched (or will retry).
STAGES = ("queued", "init", "ready", "running", "postrun", "done")
_IN_FLIGHT = frozenset({"init", "ready", "running", "postrun", "done"})
_HEARTBEAT_S = 30.0


class ProgressState:
    """Counts of one or more tasks' sessions per stage and, once finished, per terminal status.

    Args:
        total: Sessions expected (grows with :meth:`add_sessions`).
        clock: Time source (tests pass a fake).
    """

    def __init__(self, total: int = 0, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self._clock = clock
        self.started = clock()
        self._stage: dict[str, str] = {}
        self._finished: dict[str, str] = {}
        self.rewards: list[float] = []
        self.calls = 0

    def add_sessions(self, count: int) -> None:
        """Expect ``count`` more sessions (a retry round of ``polar generate``)."""
        self.total += count

    def stage(self, session_id: str, stage: str) -> None:
        """Record a gateway stage change (``init``, ``ready``, ``running``, ``postrun``, ``done``)."""
        if session_id not in self._finished:
            self._stage[session_id] = stage

    def finished(self, session_id: str, status: str, reward: float, calls: int) -> None:
        """Record a session's final result."""
        if session_id in self._finished:
            return
        self._finished[session_id] = status
        self._stage.pop(session_id, None)
        self.rewards.append(reward)
        self.calls += calls

    @property
    def elapsed_s(self) -> float:
        """Seconds since the state was created."""
        return self._clock() - self.started

    def stage_counts(self) -> dict[str, int]:
        """Sessions per stage, ``queued`` and ``done`` included; the counts sum to :attr:`total`."""
        # A session the gateway has finished is still in flight until the rollout server records its result.
        counts = Counter("postrun" if s == "done" else s for s in self._stage.values() if s in _IN_FLIGHT)
        done = len(self._finished)
        live = sum(counts.values())
        out = {"queued": max(0, self.total - done - live)}
        out.update({s: counts.get(s, 0) for s in ("init", "ready", "running", "postrun")})
        out["done"] = done
        return out

    def status_counts(self) -> dict[str, int]:
        """Finished sessions per terminal status."""
        return dict(sorted(Counter(self._finished.values()).items()))

    @property
    def mean_reward(self) -> float:
        """Mean reward of finished sessions (0 when none)."""
        return sum(self.rewards) / len(self.rewards) if self.rewards else 0.0

    def line(self) -> str:
        """One plain-text line: elapsed time, stage counts and finished statuses."""
        stages = " ".join(f"{k}={v}" for k, v in self.stage_counts().items())
        statuses = ", ".join(f"{k} {v}" for k, v in self.status_counts().items()) or "-"
        return f"[{_clock_text(self.elapsed_s)}] {stages} | {statuses} | mean reward {self.mean_reward:.2f}"


def _clock_text(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}"


class _Renderable:
    """Re-rendered by ``rich.live.Live`` on every refresh, so the clock ticks without events."""

    def __init__(self, title: str, state: ProgressState) -> None:
        self._title = title
        self._state = state

    def __rich__(self) -> RenderableType:
        state = self._state
        heading = Text(f"{self._title}  ")
        heading.append(_clock_text(state.elapsed_s), style="bold")
        table = Table()
        counts = state.stage_counts()
        for stage in STAGES:
            table.add_column(stage.upper(), justify="right")
        table.add_row(*(str(counts[s]) for s in STAGES))
        statuses = ", ".join(f"{k} {v}" for k, v in state.status_counts().items()) or "none finished yet"
        footer = Text(f"{statuses}  ·  mean reward {state.mean_reward:.2f}  ·  model calls {state.calls}")
        return Group(heading, table, footer)


class ProgressDisplay:
    """Shows a :class:`ProgressState` while a run goes on; use as a context manager.

    Args:
        console: Where to draw.
        title: Heading of the table.
        state: The state to show.
        live: A live-updating table (terminals) rather than plain lines (pipes, CI logs).
    """

    def __init__(self, console: Console, title: str, state: ProgressState, *, live: bool) -> None:
        self.console = console
        self.state = state
        self._title = title
        self._live = Live(_Renderable(title, state), console=console, refresh_per_second=4) if live else None
        self._last_line = ""
        self._last_print = 0.0

    def __enter__(self) -> Self:
        if self._live is not None:
            self._live.start()
        else:
            self.console.print(self._title, highlight=False, soft_wrap=True)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._live is not None:
            self._live.stop()
        else:
            self.changed(force=True)

    def note(self, text: str) -> None:
        """Print a line above the table (or in the log of lines)."""
        self.console.print(text, highlight=False, soft_wrap=True)

    def notes(self, lines: Iterable[str]) -> None:
        """Print several lines."""
        for line in lines:
            self.note(line)

    def changed(self, *, force: bool = False) -> None:
        """Tell the display the state changed; plain mode prints a line when the counts moved."""
        if self._live is not None:
            self._live.refresh()
            return
        line = self.state.line()
        body = line.split("] ", 1)[-1]
        now = time.monotonic()
        if force or body != self._last_line or now - self._last_print >= _HEARTBEAT_S:
            self._last_line, self._last_print = body, now
            self.console.print(line, highlight=False, soft_wrap=True)
