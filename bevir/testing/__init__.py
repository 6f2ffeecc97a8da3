"""The golden model in tests: assertions that say where two runs differ, stored golden
outputs, and the first layer where two graphs diverge.

    from bevir.testing import assert_bit_exact, assert_close, compare_graphs

    assert_bit_exact(program.run(inputs), bevir.run(graph, inputs))

    def test_my_pass(golden):              # the pytest plugin's fixture (bevir.testing.plugin)
        out = golden(graph, inputs)        # runs the golden model; compared with the stored run

Every assertion reports, per output: the number of differing elements, the first differing
index, the two values there and the max abs difference. Bit-exact compares the bits (so
``-0.0`` and ``0.0`` differ, and a NaN equals the same NaN).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..ir.graph import Graph
from ..ir.serialize import graph_digest
from ..sim.compare import ErrorReport, LayerError, compare_graphs

__all__ = ["assert_bit_exact", "assert_close", "compare_graphs", "ErrorReport", "LayerError",
           "Difference", "differences", "graph_digest", "GoldenStore", "GoldenMismatch"]

Arrays = Mapping[str, np.ndarray] | np.ndarray


class GoldenMismatch(AssertionError):
    """Outputs that differ from what they are compared with; ``differences`` says where."""

    def __init__(self, message: str, differences: list[Difference]):
        super().__init__(message)
        self.differences = differences


@dataclass
class Difference:
    """How one output differs: ``count`` elements of ``size``; the first at ``index`` with
    ``actual`` / ``expected`` there; ``max_abs`` the largest |actual - expected|.
    ``problem`` is set instead when shapes or dtypes disagree or the output is missing."""
    name: str
    count: int
    size: int
    index: tuple[int, ...] | None = None
    actual: object = None
    expected: object = None
    max_abs: float = 0.0
    problem: str = ""

    def __str__(self) -> str:
        if self.problem:
            return f"{self.name}: {self.problem}"
        return (f"{self.name}: {self.count} of {self.size} elements differ; first at "
                f"{list(self.index)}: actual {self.actual!r}, expected {self.expected!r}; "
                f"max abs difference {self.max_abs:.6g}")


def _as_dict(x: Arrays) -> dict[str, np.ndarray]:
    return {"output": np.asarray(x)} if isinstance(x, np.ndarray) or not isinstance(x, Mapping) \
        else {k: np.asarray(v) for k, v in x.items()}


def _bits(a: np.ndarray) -> np.ndarray:
    """The elements as unsigned integers of their width (complex: two per element)."""
    a = np.asarray(a, order="C")
    if a.dtype.kind in "fc":
        return a.view(f"u{a.dtype.itemsize // (2 if a.dtype.kind == 'c' else 1)}")
    return a


def _differ(actual: np.ndarray, expected: np.ndarray, rtol: float | None, atol: float) -> np.ndarray:
    """Boolean mask of differing elements: by bits (``rtol`` None), else by closeness."""
    if rtol is None:
        mask = _bits(actual) != _bits(expected)
        return mask.reshape(actual.shape + (-1,)).any(-1) if actual.dtype.kind == "c" else mask
    return ~np.isclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True)


def differences(actual: Arrays, expected: Arrays, *, rtol: float | None = None,
                atol: float = 0.0) -> list[Difference]:
    """Per output of ``expected``, how ``actual`` differs (bit for bit when ``rtol`` is
    None, else ``np.isclose``); outputs that agree are left out."""
    actual, expected = _as_dict(actual), _as_dict(expected)
    out = [Difference(name, a.size, a.size, problem="not among the expected outputs")
           for name, a in actual.items() if name not in expected]
    for name, e in expected.items():
        if name not in actual:
            out.append(Difference(name, e.size, e.size, problem="missing from the actual outputs"))
            continue
        a = actual[name]
        if a.shape != e.shape or a.dtype != e.dtype:
            out.append(Difference(name, e.size, e.size, problem=(
                f"actual {a.dtype}{list(a.shape)}, expected {e.dtype}{list(e.shape)}")))
            continue
        mask = _differ(a, e, rtol, atol)
        count = int(np.count_nonzero(mask))
        if count:
            index = tuple(int(i) for i in np.unravel_index(int(np.argmax(mask.reshape(-1))), e.shape))
            with np.errstate(invalid="ignore", over="ignore"):
                diff = np.abs(a.astype(np.float64) - e.astype(np.float64))
            out.append(Difference(name, count, int(e.size), index, a[index].item(), e[index].item(),
                                  float(np.nanmax(diff)) if diff.size else 0.0))
    return out


def _raise(diffs: list[Difference], what: str) -> None:
    if diffs:
        raise GoldenMismatch(f"outputs not {what}:\n  " + "\n  ".join(map(str, diffs)), diffs)


def assert_bit_exact(actual: Arrays, expected: Arrays) -> None:
    """Every output of ``expected`` present in ``actual`` with the same shape, dtype and
    bits; else :class:`GoldenMismatch` saying per output where they differ."""
    _raise(differences(actual, expected), "bit-exact")


def assert_close(actual: Arrays, expected: Arrays, *, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Like :func:`assert_bit_exact` with ``np.isclose(actual, expected, rtol, atol)``
    (NaN equal to NaN) per element."""
    _raise(differences(actual, expected, rtol=rtol, atol=atol), f"close (rtol {rtol}, atol {atol})")


class GoldenStore:
    """Golden outputs stored as safetensors in ``folder``, one file per (name, graph and
    inputs digest). :meth:`check` runs the golden model and compares with the stored run;
    a missing file is written (``update`` rewrites every file it is asked about)."""

    def __init__(self, folder: str | Path, update: bool = False):
        self.folder, self.update = Path(folder), update
        self.written: list[Path] = []

    def path(self, name: str, graph: Graph, inputs: Mapping[str, np.ndarray]) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        return self.folder / f"{safe}-{graph_digest(graph, inputs)}.safetensors"

    def check(self, name: str, graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The golden model's outputs of ``graph`` on ``inputs``, asserted bit-exact
        against the stored ones (stored first when there are none)."""
        from safetensors.numpy import load_file
        from ..ir.serialize import save_arrays
        from ..sim.interpreter import run
        outputs = run(graph, inputs)
        path = self.path(name, graph, inputs)
        if self.update or not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            save_arrays(outputs, path)
            self.written.append(path)
        else:
            stored = load_file(str(path))
            diffs = differences(outputs, stored)
            _raise(diffs, f"bit-exact with the stored golden run {path.name} (refresh with "
                   "--bevir-update-golden if the change is intended)")
        return outputs
