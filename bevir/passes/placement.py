"""Placing buffers with known live ranges in one memory: the lower bound (the most bytes
live at once), best fit in a given order, and a hill-climb over that order that stops at
the bound (Vela's search). The memory plan (:mod:`bevir.passes.memory_plan`) places each
core's OCM with it; anything with ``size``, ``start``, ``end`` (inclusive steps) and a
settable ``offset`` can be placed."""
from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol


class Placed(Protocol):
    """A buffer to place: ``size`` bytes live from step ``start`` to ``end``."""

    size: int
    start: int
    end: int
    offset: int


def live_bytes(bufs: Sequence[Placed], num_steps: int) -> list[int]:
    """Bytes live at each step."""
    diff = [0] * (num_steps + 1)
    for b in bufs:
        diff[b.start] += b.size
        diff[b.end + 1] -= b.size
    out, acc = [], 0
    for d in diff[:-1]:
        acc += d
        out.append(acc)
    return out


def lower_bound(bufs: Sequence[Placed], num_steps: int) -> int:
    """``max_t sum(live bytes)``: no placement can use less."""
    return max(live_bytes(bufs, num_steps), default=sum(b.size for b in bufs))


def conflicts(bufs: Sequence[Placed]) -> list[list[int]]:
    """For each buffer, the buffers of some bytes live at some common step (interval
    sweep; an empty buffer constrains no other)."""
    order = sorted(range(len(bufs)), key=lambda i: (bufs[i].start, i))
    out: list[list[int]] = [[] for _ in bufs]
    active: list[int] = []
    for i in order:
        active = [j for j in active if bufs[j].end >= bufs[i].start]
        for j in active:
            if bufs[j].size:
                out[i].append(j)
            if bufs[i].size:
                out[j].append(i)
        active.append(i)
    return out


def _place(bufs: Sequence[Placed], clash: Sequence[list[int]], order: Sequence[int],
           start: int = 0, placed: Sequence[int] | None = None) -> tuple[list[int], int]:
    """Best fit in ``order``: each buffer into the smallest gap among the placed buffers
    it conflicts with (the lowest such gap), else on top of them. ``placed``: the offsets
    of an earlier placement whose order agrees with ``order`` on its first ``start``
    buffers, which therefore keep their offsets (only the rest is placed again)."""
    sizes = [b.size for b in bufs]
    offsets = [-1] * len(bufs)
    for i in order[:start]:
        offsets[i] = placed[i]
    peak = max((offsets[i] + sizes[i] for i in order[:start]), default=0)
    for i in order[start:]:
        size = sizes[i]
        taken = sorted([(offsets[j], offsets[j] + sizes[j]) for j in clash[i]
                        if offsets[j] >= 0])
        best, best_gap, top = None, None, 0
        for lo, hi in taken:
            gap = lo - top
            if gap >= size and (best_gap is None or gap < best_gap):
                best, best_gap = top, gap
            if hi > top:
                top = hi
        offsets[i] = top if best is None else best
        peak = max(peak, offsets[i] + size)
    return offsets, peak


def place_core(bufs: list[Placed], num_steps: int, search_steps: int, rng: random.Random,
               patience: int = 20) -> dict[str, int]:
    """Set the offsets of one core's buffers, from 0. Returns the figures (lower bound,
    peak, search steps used). The search stops at the bound, after ``search_steps``
    placements, or after ``patience`` placements in a row that did not lower the peak."""
    bound = lower_bound(bufs, num_steps)
    clash = conflicts(bufs)
    span = lambda i: bufs[i].end - bufs[i].start  # noqa: E731
    starts = [sorted(range(len(bufs)), key=lambda i: (-bufs[i].size, -span(i), i)),
              sorted(range(len(bufs)), key=lambda i: (-span(i), -bufs[i].size, i))]
    order, (offsets, peak) = min(((o, _place(bufs, clash, o)) for o in starts),
                                 key=lambda r: r[1][1])
    used = stuck = 0
    while peak > bound and used < search_steps:       # hill-climb: lift a top buffer earlier
        if stuck >= patience:
            break
        used, stuck = used + 1, stuck + 1
        tops = [i for i in range(len(bufs)) if offsets[i] + bufs[i].size == peak]
        pos = order.index(tops[rng.randrange(len(tops))])
        if pos == 0:
            continue
        trial, to = list(order), rng.randrange(pos)
        trial.insert(to, trial.pop(pos))
        t_offsets, t_peak = _place(bufs, clash, trial, to, offsets)
        if t_peak <= peak:
            stuck = 0 if t_peak < peak else stuck
            order, offsets, peak = trial, t_offsets, t_peak
    for b, o in zip(bufs, offsets):
        b.offset = o
    return {"lower_bound": bound, "peak": peak, "search_steps": used}
