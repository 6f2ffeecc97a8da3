"""The pass manager: runs a pipeline of passes on a graph with instruments and an analysis
cache; :func:`optimize` in one call; :func:`replay` reads a reproducer back."""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ..errors import BevirError, PassError, raised_at, source_of
from ..ir.graph import Graph
from ..ir.parser import parse
from ..ir.serialize import constants_path, load
from .analysis import AnalysisManager
from .core import REPRODUCER_TAG, Instrument, Pass, parse_pipeline, pipeline_text
from .instruments import VerifyEach, VerifyNumerics


class PassManager:
    """Runs passes in order on a graph, in place.

    ``passes``: pass instances or pipeline text. ``instruments``: :class:`Instrument`
    objects, called in order. ``verify_each``: verify the input and the graph after every
    pass (adds a :class:`~bevir.passes.instruments.VerifyEach` unless one is given).
    ``verify_numerics``: True, or probe inputs (name -> array), checks every
    semantics-preserving pass against the golden interpreter (adds a
    :class:`~bevir.passes.instruments.VerifyNumerics` unless one is given; give one
    yourself for its other options). Verification runs before numeric verification.
    A pass that raises, or leaves invalid IR, stops the pipeline with a PassError naming it.
    """

    def __init__(self, passes: str | Sequence[Pass] = (), instruments: Sequence[Instrument] = (),
                 verify_each: bool = True,
                 verify_numerics: bool | Mapping[str, np.ndarray] = False):
        self.passes: list[Pass] = (parse_pipeline(passes) if isinstance(passes, str)
                                   else list(passes))
        for p in self.passes:
            if not isinstance(p, Pass):
                raise PassError(f"not a pass: {p!r}")
        self.instruments = list(instruments)
        if verify_numerics is not False and not _has(self.instruments, VerifyNumerics):
            probe = None if verify_numerics is True else verify_numerics
            self.instruments.append(VerifyNumerics(probe))
        if verify_each and not _has(self.instruments, VerifyEach):
            first = next((k for k, i in enumerate(self.instruments)
                          if isinstance(i, VerifyNumerics)), len(self.instruments))
            self.instruments.insert(first, VerifyEach())

    def add(self, pass_: Pass | str) -> PassManager:
        self.passes += parse_pipeline(pass_) if isinstance(pass_, str) else [pass_]
        return self

    @property
    def pipeline(self) -> str:
        return pipeline_text(self.passes)

    def run(self, graph: Graph, am: AnalysisManager | None = None) -> Graph:
        """Run the pipeline on ``graph`` (in place) and return it."""
        am = am or AnalysisManager(graph)
        snapshot = any(i.wants_ir_before for i in self.instruments)
        for inst in self.instruments:
            inst.before_pipeline(graph)
        for p in self.passes:
            before = graph.clone() if snapshot else None
            for inst in self.instruments:
                inst.before_pass(p, graph)
            version = graph.version
            p.reset_statistics()
            try:
                p.run(graph, am)
            except Exception as e:
                what = (str(e) if isinstance(e, BevirError) else
                        f"{type(e).__name__}: {e}{raised_at(e, source_of(p))}")
                err = PassError(f"pass '{p.name}' failed: {what}")
                err.pass_name = p.name
                self._fail(p, before, err)
                raise err from e
            changed = graph.version != version
            if changed:
                am.invalidate(p.preserves)
            try:
                for inst in self.instruments:
                    inst.after_pass(p, graph, changed)
            except PassError as e:
                self._fail(p, before, e)
                raise
        for inst in self.instruments:
            inst.after_pipeline(graph)
        return graph

    def _fail(self, p: Pass, before: Graph | None, error: BevirError) -> None:
        for inst in self.instruments:
            inst.on_failure_graph(p, before, error)


def _has(instruments: Sequence[Instrument], cls: type) -> bool:
    return any(isinstance(i, cls) for i in instruments)


def optimize(graph: Graph, pipeline: str | Sequence[Pass] = "canonicalize,cse,dce",
             **pm_kwargs) -> Graph:
    """Run ``pipeline`` on ``graph`` in place (see :class:`PassManager`) and return it;
    e.g. ``optimize(graph, "canonicalize,cse", verify_numerics=True)``."""
    return PassManager(pipeline, **pm_kwargs).run(graph)


def replay(path: str | Path) -> tuple[Graph, list[Pass]]:
    """Read a reproducer written by :class:`~bevir.passes.instruments.Reproducer`:
    the recorded graph and pipeline (run them with a PassManager to replay the failure)."""
    path = Path(path)
    text = path.read_text()
    for line in text.splitlines():
        if line.startswith(REPRODUCER_TAG):
            rest = line[len(REPRODUCER_TAG):].strip()
            if not rest.startswith("pipeline="):
                break
            try:
                pipeline = json.loads(rest[len("pipeline="):])
            except json.JSONDecodeError:
                break
            sidecar = constants_path(path)     # large constants live beside the text
            graph = load(path) if sidecar.exists() else parse(text, source=str(path))
            return graph, parse_pipeline(pipeline)
    raise PassError(f"{path}: not a bevir reproducer (no '{REPRODUCER_TAG} pipeline=\"...\"' line)")
