"""Built-in pass instruments: timing, IR dumps, verification, statistics, reproducers."""
from __future__ import annotations

import os
import time
from pathlib import Path

from ..errors import BevirError, PassError, VerifyError
from ..ir.graph import Graph
from ..ir.printer import print_graph
from ..ir.verifier import verify
from .manager import Instrument, Pass, reproducer_text


class Timing(Instrument):
    """Wall time per pass, accumulated over runs; :meth:`report` prints MLIR-style."""

    def __init__(self):
        self.rows: dict[tuple[int, str], float] = {}   # (position, pass text) -> seconds
        self.total = 0.0
        self._index = 0
        self._t0 = self._tp = 0.0

    def before_pipeline(self, graph: Graph) -> None:
        self._index = 0
        self._t0 = time.perf_counter()

    def before_pass(self, pass_: Pass, graph: Graph) -> None:
        self._tp = time.perf_counter()

    def after_pass(self, pass_: Pass, graph: Graph, changed: bool) -> None:
        key = (self._index, str(pass_))
        self.rows[key] = self.rows.get(key, 0.0) + time.perf_counter() - self._tp
        self._index += 1

    def after_pipeline(self, graph: Graph) -> None:
        self.total += time.perf_counter() - self._t0

    def report(self) -> str:
        total = self.total or sum(self.rows.values()) or 1e-12
        bar = "===" + "-" * 73 + "==="
        lines = [bar, "Execution time report".center(len(bar)).rstrip(), bar,
                 f"  Total Execution Time: {total:.4f} seconds", "",
                 "  ----Wall Time----  ----Name----"]
        for (_, text), t in self.rows.items():
            lines.append(f"  {t:8.4f} ({100 * t / total:5.1f}%)  {text}")
        other = total - sum(self.rows.values())
        if other > 0 and self.rows:
            lines.append(f"  {other:8.4f} ({100 * other / total:5.1f}%)  (instruments, verification)")
        lines.append(f"  {total:8.4f} (100.0%)  Total")
        return "\n".join(lines) + "\n"


class DumpIR(Instrument):
    """Writes the IR (large constants elided) to ``dir``: ``00_input.bevir``, then
    ``NN_<pass>.bevir`` after pass NN; with ``only_changed`` only after passes that
    changed the graph."""

    def __init__(self, dir: str | os.PathLike, only_changed: bool = False):
        self.dir = Path(dir)
        self.only_changed = only_changed
        self.written: list[Path] = []
        self._index = 0

    def _write(self, name: str, header: str, graph: Graph) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / name
        path.write_text(f"// {header}\n" + print_graph(graph, constants="elide"))
        self.written.append(path)

    def before_pipeline(self, graph: Graph) -> None:
        self._index = 0
        self._write("00_input.bevir", "input", graph)

    def after_pass(self, pass_: Pass, graph: Graph, changed: bool) -> None:
        self._index += 1
        if changed or not self.only_changed:
            self._write(f"{self._index:02d}_{pass_.name}.bevir",
                        f"after {pass_}" + ("" if changed else " (unchanged)"), graph)


class VerifyEach(Instrument):
    """Verifies the input and the graph after every pass; a broken graph stops the
    pipeline with a PassError naming the pass (the VerifyError is its cause)."""

    def before_pipeline(self, graph: Graph) -> None:
        try:
            verify(graph)
        except VerifyError as e:
            raise VerifyError(f"the input graph is invalid: {e}") from e

    def after_pass(self, pass_: Pass, graph: Graph, changed: bool) -> None:
        # verified even when graph.version did not move: a pass that mutated the graph
        # behind the Graph API's back is caught too
        try:
            verify(graph)
        except VerifyError as e:
            err = PassError(f"pass '{pass_.name}' produced invalid IR: {e}")
            err.pass_name = pass_.name
            raise err from e


class Statistics(Instrument):
    """Collects each pass's statistics (summed over runs); :meth:`report` prints a table."""

    def __init__(self):
        self.stats: dict[tuple[int, str], dict[str, int]] = {}
        self._index = 0

    def before_pipeline(self, graph: Graph) -> None:
        self._index = 0

    def after_pass(self, pass_: Pass, graph: Graph, changed: bool) -> None:
        acc = self.stats.setdefault((self._index, str(pass_)), {})
        for k, v in pass_.statistics.items():
            acc[k] = acc.get(k, 0) + v
        self._index += 1

    def by_pass(self) -> dict[str, dict[str, int]]:
        """Pass text -> counter -> value (passes that appear twice are summed)."""
        out: dict[str, dict[str, int]] = {}
        for (_, text), counters in self.stats.items():
            acc = out.setdefault(text, {})
            for k, v in counters.items():
                acc[k] = acc.get(k, 0) + v
        return out

    def report(self) -> str:
        lines = ["===- Pass statistics -===", ""]
        width = max((len(k) for c in self.stats.values() for k in c), default=0)
        for (_, text), counters in self.stats.items():
            lines.append(text)
            if not counters:
                lines.append("  (none)")
            for k, v in sorted(counters.items()):
                lines.append(f"  {k.ljust(width)}  {v:>10}")
        return "\n".join(lines) + "\n"


class Reproducer(Instrument):
    """On failure, writes ``path``: the failing pass's pipeline in a header comment, then
    the IR just before that pass with constants inline, so that
    :func:`~bevir.passes.replay` (``bevir opt --reproduce``) re-runs it standalone."""

    wants_ir_before = True

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.written: Path | None = None

    def on_failure(self, pass_: Pass, graph_before_text: str, error: BevirError) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(reproducer_text(pass_, graph_before_text, error))
        self.written = self.path
