"""A one-line progress bar for long work (calibration, compilation, full-size runs)."""
from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import TextIO, TypeVar

T = TypeVar("T")


class Progress:
    """A one-line progress bar on stderr, redrawn at most 10 times a second.

    ``enabled=None`` shows it only when stderr is a terminal; with a ``unit`` it shows the
    rate too (e.g. ``2.41 frames/s``). A context manager: leaving the block closes the bar.
    """

    def __init__(self, total: int | None, desc: str = "", enabled: bool | None = None,
                 stream: TextIO | None = None, unit: str | None = None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.total, self.desc, self.n, self.unit = total, desc, 0, unit
        self._start = self._drawn = time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.perf_counter()
        if self.enabled and now - self._drawn >= 0.1:
            self._drawn = now
            self._draw(now)

    def iterate(self, items: Iterable[T]) -> Iterator[T]:
        """``items``, counting each one as it is handed out."""
        for item in items:
            yield item
            self.update()

    def _draw(self, now: float, end: str = "") -> None:
        elapsed = f"{now - self._start:.1f}s"
        if self.total:
            done = min(self.n / self.total, 1.0)
            bar = "#" * int(24 * done)
            text = f"{self.desc} [{bar:<24}] {self.n}/{self.total} {elapsed}"
        else:
            text = f"{self.desc} {self.n} {elapsed}"
        if self.unit and now > self._start:
            text += f" {self.n / (now - self._start):.2f} {self.unit}/s"
        self.stream.write("\r" + text + end)
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw(time.perf_counter(), end="\n")

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
