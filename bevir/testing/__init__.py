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


def _differ(actual: np.ndarray, expected: np.ndarray, rtol: float | None, atol: float
            ) -> np.ndarray:
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
            first = int(np.argmax(mask.reshape(-1)))
            index = tuple(int(i) for i in np.unravel_index(first, e.shape))
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


def assert_close(actual: Arrays, expected: Arrays, *, rtol: float = 1e-5, atol: float = 1e-6
                 ) -> None:
    """Like :func:`assert_bit_exact` with ``np.isclose(actual, expected, rtol, atol)``
    (NaN equal to NaN) per element."""
    _raise(differences(actual, expected, rtol=rtol, atol=atol), f"close (rtol {rtol}, atol {atol})")


class GoldenStore:
    """Golden runs stored in ``folder``, one per name: the outputs (``<name>.safetensors``)
    and the graph that gave them (``<name>.graph.bevir``, its constants beside it), so that
    a run that differs names the first output and the first layer where the graph parts
    from the stored one. :meth:`check` runs the golden model and compares with the stored
    run. A missing run is written unless ``write`` is False (CI: nothing is ever written,
    a missing run fails); ``update`` rewrites the stored runs instead of comparing."""

    def __init__(self, folder: str | Path, update: bool = False, write: bool = True):
        if update and not write:
            raise ValueError("update=True needs write=True")
        self.folder, self.update, self.write = Path(folder), update, write
        self.written: list[Path] = []

    def path(self, name: str) -> Path:
        """The outputs file of the run stored as ``name``."""
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        return self.folder / f"{safe}.safetensors"

    def check(self, name: str, graph: Graph, inputs: Mapping[str, np.ndarray]
              ) -> dict[str, np.ndarray]:
        """The golden model's outputs of ``graph`` on ``inputs``, asserted bit-exact
        against the run stored as ``name`` (stored first when there is none and writing
        is allowed)."""
        from safetensors.numpy import load_file
        from ..sim.interpreter import run
        outputs = run(graph, inputs)
        path = self.path(name)
        if self.update or not path.exists():
            if not self.write:
                raise GoldenMismatch(f"no stored golden run {path} (nothing is written in CI: "
                                     "run the test where CI is not set and commit the files)",
                                     [])
            self._store(path, graph, inputs, outputs)
            return outputs
        diffs = differences(outputs, load_file(str(path)))
        if diffs:
            raise GoldenMismatch(f"outputs not bit-exact with the stored golden run {path.name}"
                                 f"{self._where(path, graph, inputs)}:\n  "
                                 + "\n  ".join(map(str, diffs)) + "\n(refresh with "
                                 "--bevir-update-golden if the change is intended)", diffs)
        return outputs

    @staticmethod
    def _graph_path(path: Path) -> Path:
        return path.with_suffix(".graph.bevir")

    def _store(self, path: Path, graph: Graph, inputs: Mapping[str, np.ndarray],
               outputs: Mapping[str, np.ndarray]) -> None:
        from ..fsutil import save_arrays
        from ..ir.serialize import save
        path.parent.mkdir(parents=True, exist_ok=True)
        save_arrays(outputs, path, metadata={"inputs": _inputs_digest(inputs)})
        save(graph, self._graph_path(path))
        self.written.append(path)

    def _where(self, path: Path, graph: Graph, inputs: Mapping[str, np.ndarray]) -> str:
        """Where the run parts from the stored one: the inputs, or the first value of
        ``graph`` that differs from the stored graph's value of its name."""
        from safetensors import safe_open
        from ..ir.serialize import load
        with safe_open(str(path), "np") as f:
            stored_inputs = (f.metadata() or {}).get("inputs")
        if stored_inputs != _inputs_digest(inputs):
            return " (the inputs differ from the stored run's)"
        stored = self._graph_path(path)
        if not stored.exists():
            return ""
        first = compare_graphs(load(stored), graph, inputs, local=False).first_divergence()
        if first is None:
            return ""
        return (f"; the first differing layer: '{first.layer}' ({first.op} -> %{first.value},"
                f" max abs difference {first.max_abs:.6g})")


def _inputs_digest(inputs: Mapping[str, np.ndarray]) -> str:
    """The digest of the inputs alone (their names, dtypes, shapes and bytes)."""
    return graph_digest(Graph("inputs"), inputs)
