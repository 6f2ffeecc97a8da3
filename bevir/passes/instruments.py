"""Built-in pass instruments: timing, IR dumps, verification, statistics, reproducers,
numeric verification against the golden interpreter."""
from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file

from ..errors import BevirError, PassError, VerifyError
from ..fsutil import save_arrays, write_atomic
from ..ir.graph import Graph
from ..ir.printer import print_graph
from ..ir.serialize import constants_path, save
from ..ir.types import DType, TensorType
from ..ir.verifier import verify
from ..sim import run
from .analysis import AnalysisManager
from .core import Instrument, Pass, reproducer_text
from .rewrites import RewriteLog, RewriteRecord, limit_rewrites


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
            lines.append(f"  {other:8.4f} ({100 * other / total:5.1f}%)  "
                         "(instruments, verification)")
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
        write_atomic(path, f"// {header}\n" + print_graph(graph, constants="elide"))
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
    the IR just before that pass, so that :func:`~bevir.passes.replay` (``bevir opt
    --reproduce``) re-runs it standalone. Constants are inline up to ``inline_bytes`` in
    all; a larger graph's constants go to ``constants_path(path)`` beside it (the text
    stays small and the payloads are written once, in binary)."""

    wants_ir_before = True

    def __init__(self, path: str | os.PathLike, inline_bytes: int = 1 << 20):
        self.path = Path(path)
        self.inline_bytes = inline_bytes
        self.written: Path | None = None

    def on_failure_graph(self, pass_: Pass, graph_before: Graph | None,
                         error: BevirError) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        sidecar = constants_path(self.path)
        sidecar.unlink(missing_ok=True)
        if graph_before is None:
            text = ""
        elif sum(v.const.nbytes for v in graph_before.constants.values()) <= self.inline_bytes:
            text = print_graph(graph_before, constants="inline")
        else:
            text = print_graph(graph_before, constants="external")
            save_arrays({k: v.const for k, v in graph_before.constants.items()}, sidecar)
        write_atomic(self.path, reproducer_text(pass_, text, error))
        self.written = self.path


# ---- numeric verification against the golden interpreter -------------------------------
def probe_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic random inputs for every graph input, from ``seed``: floats standard
    normal; 8- and 16-bit integers uniform over their dtype's range, wider integers over
    the int16 range (so that sums and products of a few stay far from overflow); bools
    fair coin flips."""
    rng = np.random.default_rng(seed)
    return {v.name: _random_tensor(rng, v.type) for v in graph.inputs}


def _random_tensor(rng: np.random.Generator, t: TensorType) -> np.ndarray:
    if t.dtype is DType.bool:
        return rng.integers(0, 2, t.shape).astype(bool)
    if t.dtype.is_int:
        info = np.iinfo(t.dtype.np)
        lo, hi = max(int(info.min), -2 ** 15), min(int(info.max), 2 ** 15 - 1)
        return rng.integers(lo, hi + 1, t.shape, dtype=np.int64).astype(t.dtype.np)
    return rng.standard_normal(t.shape).astype(t.dtype.np)


def read_probe_inputs(path: str | os.PathLike, graph: Graph) -> dict[str, np.ndarray]:
    """Probe inputs from a safetensors file keyed by input name (scalars stored as [1]
    are reshaped to the input's type)."""
    try:
        arrays = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise PassError(f"cannot read probe inputs {path}: {e}") from None
    for v in graph.inputs:
        if v.name in arrays and v.type.rank == 0 and arrays[v.name].size == 1:
            arrays[v.name] = arrays[v.name].reshape(())
    return arrays


def max_abs_diff(expected: np.ndarray, actual: np.ndarray) -> float:
    """The largest elementwise ``|expected - actual|``; inf when shapes or dtypes differ,
    or where exactly one side is NaN (NaN against NaN counts as equal). Integer and bool
    mismatches are at least 1, so that no difference rounds away."""
    e, a = np.asarray(expected), np.asarray(actual)
    if e.shape != a.shape or e.dtype != a.dtype:
        return float("inf")
    if e.dtype.kind in "biu":
        if np.array_equal(e, a):
            return 0.0
        return max(1.0, float(np.max(np.abs(e.astype(np.float64) - a.astype(np.float64)))))
    e64, a64 = e.astype(np.float64), a.astype(np.float64)
    same = (e64 == a64) | (np.isnan(e64) & np.isnan(a64))
    if same.all():
        return 0.0
    return float(np.nan_to_num(np.abs(e64 - a64)[~same], nan=np.inf).max())


def _magnitude(a: np.ndarray) -> float:
    finite = np.abs(a[np.isfinite(a)]) if a.dtype.kind == "f" else np.zeros(0)
    return float(finite.max()) if finite.size else 0.0


@dataclass
class NumericsCheck:
    """One pass's comparison: per output the max abs difference and the allowed bound."""
    index: int                  # 1-based position in the pipeline
    pass_text: str
    changed: bool               # False: the graph did not change, nothing was run
    diffs: dict[str, float]
    bounds: dict[str, float]

    @property
    def failing(self) -> list[str]:
        """The outputs outside their bound."""
        return [k for k, d in self.diffs.items() if not d <= self.bounds[k]]

    @property
    def ok(self) -> bool:
        return not self.failing


class VerifyNumerics(Instrument):
    """Checks every semantics-preserving pass against the golden interpreter.

    ``inputs``: probe inputs (name -> array); default :func:`probe_inputs` of the graph
    with ``seed``. The graph runs on them before the pipeline and after each
    semantics-preserving pass that changed it (unchanged passes cost nothing), and each
    output is compared with the results before that pass: integer and bool outputs, every
    output of a quantized graph, and every output of a pass that declares ``tolerance =
    0.0`` must be bit-identical (``atol`` never loosens a pass that claims exactness);
    float outputs of a pass with a nonzero tolerance may differ by ``max(pass.tolerance *
    max|output|, atol)``. Passes with ``semantics_preserving = False`` are not checked; the
    next check starts from their result.

    On a mismatch it re-runs the pass on a copy of its input under
    :func:`~bevir.passes.rewrites.limit_rewrites`, bisecting on the budget for the first
    rewrite after which the results differ, writes a reproducer directory
    (``reproducer_dir``, default a new temporary directory) and raises a PassError naming
    the pass, the outputs, the rewrite and the directory. ``checks`` holds each pass's
    :class:`NumericsCheck`; :meth:`report` prints them, :meth:`summary` in one line.
    """

    def __init__(self, inputs: Mapping[str, np.ndarray] | None = None, *, atol: float = 0.0,
                 seed: int = 0, reproducer_dir: str | os.PathLike | None = None,
                 bisect: bool = True):
        self.inputs = None if inputs is None else dict(inputs)
        self.atol, self.seed, self.bisect = float(atol), seed, bisect
        self.reproducer_dir = None if reproducer_dir is None else Path(reproducer_dir)
        self.checks: list[NumericsCheck] = []
        self.reproducer: Path | None = None       # the directory written on a mismatch
        self.probe: dict[str, np.ndarray] = {}
        self._reference: dict[str, np.ndarray] | None = None
        self._before: Graph | None = None       # a copy of the graph before the pass
        self._quantized = False                 # whether that graph is quantized
        self._index = 0

    # ---- hooks -------------------------------------------------------------------------
    def before_pipeline(self, graph: Graph) -> None:
        self.checks, self.reproducer, self._index = [], None, 0
        self.probe = self._make_probe(graph)
        self._reference = self._golden(graph, "the input graph")

    def before_pass(self, pass_: Pass, graph: Graph) -> None:
        self._index += 1
        self._before = None
        if not pass_.semantics_preserving:
            return
        if self._reference is None:         # a non-preserving pass changed the graph
            self._reference = self._golden(graph, f"the graph before pass '{pass_.name}'")
        self._before = graph.clone()
        self._quantized = _is_quantized(graph)

    def after_pass(self, pass_: Pass, graph: Graph, changed: bool) -> None:
        if not pass_.semantics_preserving:
            if changed:
                self._reference = None
            return
        if not changed:
            zeros = dict.fromkeys(self._reference, 0.0)
            self.checks.append(NumericsCheck(self._index, str(pass_), False, zeros,
                                             self._bounds(pass_)))
            return
        actual = self._golden(graph, f"the graph after pass '{pass_.name}'", pass_)
        check = self._compare(pass_, actual)
        self.checks.append(check)
        if not check.ok:
            raise self._mismatch(pass_, check, actual)
        part = pass_.exact_part()
        if part is not None:                # its exact rewrites alone: bit for bit
            self._check_part(part)
        self._reference = actual

    def _check_part(self, part: Pass) -> None:
        """Run ``part`` (a pass's rewrites of one claim) on a copy of the pass's input and
        hold it to that claim (recorded as a check of its own)."""
        g = self._before.clone()
        part.run(g, AnalysisManager(g))
        actual = self._golden(g, f"the graph after pass '{part}'", part)
        check = self._compare(part, actual)
        self.checks.append(check)
        if not check.ok:
            raise self._mismatch(part, check, actual)

    # ---- reports -----------------------------------------------------------------------
    def report(self) -> str:
        """Per checked pass, each output's max abs difference and its bound."""
        lines = ["===- Numeric verification (max abs diff / allowed) -===", ""]
        for c in self.checks:
            lines.append(f"{c.index:2d} {c.pass_text}" + ("" if c.changed else " (unchanged)"))
            for k, d in c.diffs.items():
                lines.append(f"    {k}: {d:.3g} / {c.bounds[k]:.3g}"
                             + ("" if d <= c.bounds[k] else "  MISMATCH"))
        return "\n".join(lines) + "\n"

    def summary(self) -> str:
        """One line: how many passes were checked and the largest difference per output."""
        worst: dict[str, float] = {}
        for c in self.checks:
            for k, d in c.diffs.items():
                worst[k] = max(worst.get(k, 0.0), d)
        diffs = ", ".join(f"{k} {d:.3g}" for k, d in worst.items()) or "-"
        ran = sum(c.changed for c in self.checks)
        return (f"numerics: {len(self.checks)} pass(es) checked against the golden model "
                f"({ran} changed the graph); max abs diff per output: {diffs}")

    # ---- helpers -----------------------------------------------------------------------
    def _make_probe(self, graph: Graph) -> dict[str, np.ndarray]:
        if self.inputs is None:
            return probe_inputs(graph, self.seed)
        missing = [v.name for v in graph.inputs if v.name not in self.inputs]
        if missing:
            raise PassError(f"numeric verification: probe inputs lack graph input(s) {missing}")
        return {v.name: np.asarray(self.inputs[v.name]) for v in graph.inputs}

    def _golden(self, graph: Graph, what: str, pass_: Pass | None = None) -> dict[str, np.ndarray]:
        try:
            return run(graph, self.probe)
        except BevirError as e:
            err = PassError(f"numeric verification: the golden interpreter failed on {what}: {e}")
            err.pass_name = pass_.name if pass_ is not None else None
            raise err from e

    def _exact(self, ref: np.ndarray, pass_: Pass) -> bool:
        """Whether an output must stay bit-identical: not float, a quantized graph, or a
        pass that declares itself exact (tolerance 0), whatever ``atol`` says."""
        return ref.dtype.kind != "f" or self._quantized or pass_.claimed_tolerance == 0.0

    def _bounds(self, pass_: Pass) -> dict[str, float]:
        return {k: 0.0 if self._exact(ref, pass_)
                else max(pass_.claimed_tolerance * _magnitude(ref), self.atol)
                for k, ref in self._reference.items()}

    def _compare(self, pass_: Pass, actual: Mapping[str, np.ndarray]) -> NumericsCheck:
        diffs = {k: max_abs_diff(ref, actual[k]) if k in actual else float("inf")
                 for k, ref in self._reference.items()}
        return NumericsCheck(self._index, str(pass_), True, diffs, self._bounds(pass_))

    def _mismatch(self, pass_: Pass, check: NumericsCheck,
                  actual: dict[str, np.ndarray]) -> PassError:
        culprit, how = self._find_rewrite(pass_) if self.bisect else (None, "bisection is off")
        outputs = "; ".join(self._describe(k, check, actual, pass_) for k in check.failing)
        found = f"first differing {culprit} ({how})" if culprit else how
        message = f"pass '{pass_.name}' changed the results: {outputs}; {found}"
        path = self._write_reproducer(pass_, actual, message)
        err = PassError(f"{message}; reproducer: {path}")
        err.pass_name, err.output, err.rewrite = pass_.name, check.failing[0], culprit
        if culprit is not None:
            err.node, err.op, err.loc = culprit.node, culprit.op, culprit.loc
        return err

    def _describe(self, name: str, check: NumericsCheck, actual: dict[str, np.ndarray],
                  pass_: Pass) -> str:
        ref, bound = self._reference[name], check.bounds[name]
        got = actual.get(name)
        if got is None:
            return f"output '{name}' is gone"
        if got.shape != ref.shape or got.dtype != ref.dtype:
            return (f"output '{name}' is {got.dtype}{list(got.shape)}, "
                    f"was {ref.dtype}{list(ref.shape)}")
        need = "must be bit-identical" if self._exact(ref, pass_) else f"allowed {bound:.3g}"
        return f"output '{name}' max abs diff {check.diffs[name]:.3g} ({need})"

    # ---- bisection ---------------------------------------------------------------------
    def _trial(self, pass_: Pass, limit: int | None) -> tuple[bool, RewriteLog]:
        """Re-run a fresh copy of the pass on a copy of its input under ``limit_rewrites
        (limit)``: (whether the results differ, the rewrite log)."""
        g = self._before.clone()
        with limit_rewrites(limit) as log:
            try:
                dataclasses.replace(pass_).run(g, AnalysisManager(g))
                actual = run(g, self.probe)
            except Exception:               # a partial rewrite that breaks counts as wrong
                return True, log
        return not self._compare(pass_, actual).ok, log

    def _find_rewrite(self, pass_: Pass) -> tuple[RewriteRecord | None, str]:
        """The first rewrite after which the results differ, or why none can be named."""
        bad, full = self._trial(pass_, None)
        if not bad:
            return None, ("cannot narrow down: re-running the pass on a copy of its input "
                          "does not reproduce the mismatch")
        if full.count == 0:
            return None, ("cannot narrow down: the pass made no rewrite through the rewrite "
                          "budget (bevir.passes.rewrites.rewrite_permitted)")
        if self._trial(pass_, 0)[0]:
            return None, ("cannot narrow down: the results differ even with no rewrite "
                          "permitted (the pass changes the graph outside rewrite_permitted)")
        good, bad_at = 0, full.count
        while bad_at - good > 1:
            mid = (good + bad_at) // 2
            if self._trial(pass_, mid)[0]:
                bad_at = mid
            else:
                good = mid
        return full.entries[bad_at - 1], f"bisected over {full.count} rewrites"

    # ---- reproducer --------------------------------------------------------------------
    def _write_reproducer(self, pass_: Pass, actual: dict[str, np.ndarray], message: str) -> Path:
        """graph.bevir (+ graph.safetensors: the graph before the pass), inputs-,
        expected- and actual.safetensors, pipeline.txt and rewrite.txt."""
        path = self.reproducer_dir or Path(tempfile.mkdtemp(prefix="bevir-numerics-"))
        path.mkdir(parents=True, exist_ok=True)
        save(self._before, path / "graph.bevir")
        for name, arrays in (("inputs", self.probe), ("expected", self._reference),
                             ("actual", actual)):
            save_arrays(arrays, path / f"{name}.safetensors")
        write_atomic(path / "pipeline.txt", f"{pass_}\n")
        write_atomic(path / "rewrite.txt",
            f"{message}\n\nreplay: bevir opt {path / 'graph.bevir'} -p '{pass_}' "
            f"--verify-numerics --probe-inputs {path / 'inputs.safetensors'}\n")
        self.reproducer = path
        return path


def _is_quantized(graph: Graph) -> bool:
    """Whether any value of the graph carries quantization (an integer graph)."""
    return any(v.type.quant is not None for v in graph.values())
