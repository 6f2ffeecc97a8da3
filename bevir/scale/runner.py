"""Where bevir.scale's work runs: in this process, or as Ray tasks.

    workers = Workers()                         # this process, one chunk after another
    workers = Workers(ray="local", cpus=2)      # an embedded Ray on this machine's cores
    workers = Workers(ray="ray://head:10001")   # a Ray cluster
    for k, result in workers.map(task, shared, chunks):
        ...                                     # as each chunk finishes

The same ``task(shared, chunk)`` runs either way, so single-process and distributed
results are computed by the same code. On Ray, ``shared`` is put in the object store once
and each chunk is one task; a task whose worker dies is retried by Ray (``retries``), and
its result is the same as the first attempt's would have been (tasks are pure). Plugins
(``--load`` files and modules) are imported in each worker before a task reads a model.
Models travel as :class:`GraphRef`: pickled as their saved files, loaded once per worker
process.
"""
from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ..errors import BevirError
from ..extras import require
from ..ir.graph import Graph
from ..ir.serialize import graph_digest, load, save
from ..plugins import load_plugins

T = TypeVar("T")
R = TypeVar("R")

#: the graphs this process has loaded from GraphRefs, by digest
_LOADED: dict[str, Graph] = {}


class ScaleError(BevirError):
    """Distributed work that cannot start or did not finish."""


def describe(e: BaseException) -> str:
    """An exception in one line: a BevirError's message, else ``Type: message``."""
    text = str(e) if isinstance(e, BevirError) else f"{type(e).__name__}: {e}"
    return " ".join(text.split())


class GraphRef:
    """A graph that can be sent to other processes: pickled as its saved files (text,
    constants, meta), loaded at most once per process on first :attr:`graph` access (after
    the plugins its ops need are imported)."""

    def __init__(self, graph: Graph):
        self._graph: Graph | None = graph
        self._files: dict[str, bytes] | None = None

    @functools.cached_property
    def digest(self) -> str:
        """The graph's content digest (:func:`~bevir.ir.serialize.graph_digest`)."""
        return graph_digest(self._graph)

    @property
    def graph(self) -> Graph:
        if self._graph is None:
            self._graph = _LOADED.get(self.digest)
        if self._graph is None:
            with tempfile.TemporaryDirectory(prefix="bevir-graph-") as d:
                for name, data in self._files.items():
                    (Path(d) / name).write_bytes(data)
                self._graph = _LOADED[self.digest] = load(Path(d) / "model.bevir")
        return self._graph

    def __getstate__(self) -> dict[str, Any]:
        if self._files is None:
            with tempfile.TemporaryDirectory(prefix="bevir-graph-") as d:
                save(self._graph, Path(d) / "model.bevir")
                self._files = {p.name: p.read_bytes() for p in Path(d).iterdir()}
        return {"digest": self.digest, "_files": self._files, "_graph": None}


@dataclass(frozen=True)
class Plugins:
    """Plugin files and modules to import before work (see :func:`bevir.plugins.load_plugins`)."""

    files: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()

    def load(self) -> None:
        load_plugins(self.files, self.modules)


@dataclass
class Workers:
    """Runs chunks of work: here (``ray=None``) or on Ray (``"local"``: an embedded Ray
    started on ``cpus`` cores of this machine, default all; else a cluster address, as
    ``ray.init(address=...)`` takes it; a Ray already initialized in this process is
    used as it is). ``retries``: how often Ray reruns a task whose worker died."""

    ray: str | None = None
    cpus: int | None = None
    plugins: Plugins = field(default_factory=Plugins)
    retries: int = 3

    @property
    def distributed(self) -> bool:
        return self.ray is not None

    @property
    def count(self) -> int:
        """How many chunks can run at once."""
        if not self.distributed:
            return 1
        ray = require("ray")
        self._start()
        return max(int(ray.cluster_resources().get("CPU", 1)), 1)

    def _start(self) -> None:
        ray = require("ray")
        if ray.is_initialized():
            return
        try:
            if self.ray in ("local", ""):
                ray.init(num_cpus=self.cpus or os.cpu_count(), include_dashboard=False,
                         logging_level="ERROR", log_to_driver=False)
            else:
                ray.init(address=self.ray, logging_level="ERROR", log_to_driver=False)
        except Exception as e:          # an unreachable cluster, a bad address
            raise ScaleError(f"cannot start Ray at {self.ray!r}: {type(e).__name__}: {e}") from None

    def chunks(self, items: Sequence[T], per_worker: int = 4) -> list[list[T]]:
        """``items`` cut into contiguous chunks, ``per_worker`` per worker that can run
        (one per item when not distributed: progress and results as each finishes)."""
        n = min(len(items), self.count * per_worker) if self.distributed else len(items)
        bounds = [round(i * len(items) / max(n, 1)) for i in range(n + 1)]
        return [list(items[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a]

    def map(self, task: Callable[[Any, T], R], shared: Any, chunks: Sequence[T]
            ) -> Iterator[tuple[int, R]]:
        """``(k, task(shared, chunks[k]))`` for every chunk, as each finishes."""
        if not self.distributed:
            self.plugins.load()
            for k, chunk in enumerate(chunks):
                yield k, task(shared, chunk)
            return
        ray = require("ray")
        self._start()
        remote = ray.remote(max_retries=self.retries)(_run_task)
        ref = ray.put(shared)
        pending = {remote.remote(task, self.plugins, ref, chunk): k
                   for k, chunk in enumerate(chunks)}
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for d in done:
                    yield pending.pop(d), _result(d)
        finally:
            for left in pending:                # the caller stopped early (an error)
                ray.cancel(left)


def _run_task(task: Callable[[Any, T], R], plugins: Plugins, shared: Any, chunk: T) -> R:
    try:
        plugins.load()
        return task(shared, chunk)
    except BevirError as e:         # travels as one line: not every error class pickles
        raise ScaleError(describe(e)) from None


def _result(ref) -> Any:
    ray = require("ray")
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:    # the task's own exception, one line
        cause = e.cause if getattr(e, "cause", None) is not None else e
        if isinstance(cause, BevirError):
            raise cause from None
        raise ScaleError(f"a task failed: {type(cause).__name__}: {cause}") from None
    except ray.exceptions.RayError as e:        # workers lost beyond the retries
        raise ScaleError(f"a task did not finish: {type(e).__name__}: {e}") from None
