"""Live progress on a terminal: finished kernels scroll above a status block that is redrawn."""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TextIO

from kbd.plan.limits import format_size
from kbd.results.record import Record
from kbd.shared.outcomes import format_counts
from kbd.shared.protocol import START_PHASE


@dataclass
class _Running:
    started: float
    phase: str = START_PHASE
    rss: int = 0


@dataclass
class Progress:
    """Tracks a run; `render()` redraws the status block (terminal) or does nothing (plain)."""

    total: int
    live: bool
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    done: int = 0
    started_at: float = field(default_factory=time.monotonic)
    running: dict[str, _Running] = field(default_factory=dict)
    tally: Counter = field(default_factory=Counter)
    _drawn: int = 0

    def started(self, kernel: str) -> None:
        self.running[kernel] = _Running(time.monotonic())
        self.render()

    def phase(self, kernel: str, phase: str) -> None:
        if kernel in self.running:
            self.running[kernel].phase = phase

    def memory(self, kernel: str, rss: int) -> None:
        if kernel in self.running:
            self.running[kernel].rss = rss

    def finished(self, record: Record, text: str | None) -> None:
        """Count a record; print `text` (its line) above the status block, if given."""
        self.running.pop(record.label, None)
        self.done += 1
        self.tally[record.outcome] += 1
        self._clear()
        if text is not None:
            print(text, file=self.stream, flush=True)
        self.render()

    def notice(self, text: str) -> None:
        self._clear()
        print(text, file=self.stream, flush=True)
        self.render()

    def render(self) -> None:
        if not self.live:
            return
        self._clear()
        now = time.monotonic()
        elapsed = now - self.started_at
        counts = format_counts(self.tally)
        eta = ""
        if self.done:
            remaining = elapsed / self.done * (self.total - self.done)
            eta = f"  ETA {remaining:.0f}s"
        lines = [f"[{self.done}/{self.total}] {elapsed:.0f}s{eta}  {counts}"]
        for kernel, run in sorted(self.running.items(), key=lambda kv: kv[1].started):
            lines.append(
                f"  {now - run.started:6.1f}s  {format_size(run.rss):>10}  {run.phase:<24} {kernel}"
            )
        self.stream.write("\n".join(lines) + "\n")
        self.stream.flush()
        self._drawn = len(lines)

    def close(self) -> None:
        self._clear()

    def _clear(self) -> None:
        if self.live and self._drawn:
            self.stream.write("\x1b[1A\x1b[2K" * self._drawn)
            self.stream.flush()
            self._drawn = 0
