"""The GPNPU flow: plan a lowered graph for a hardware config, model it, compile it. One
planning pipeline (bevir/passes/target.py) serves all of them, so ``bevir sim``,
``bevir compile``, ``bevir sweep`` and ``bevir run --cores`` see the same plan.

    planned = plan(q, "QC-U 8MB 16MAC x4")               # partitioned, memory-planned copy
    profile = simulate(q, "QC-U 8MB 16MAC x4")           # its cycle model (the same plan)
    program = compile(q, "out/", hw="QC-U 8MB 16MAC x4")  # its per-core C programs, built
"""
from __future__ import annotations

import hashlib
import os
import shutil
from collections import Counter
from pathlib import Path

from ..errors import CodegenError
from ..extras import require
from ..fsutil import building_folder
from ..ir.graph import Graph
from ..passes.target import plan_for_target, plan_key
from ..target.cycles import Profile, model
from ..target.hw import HWConfig
from ..target.schedule import lowerable

DEFAULT_HW = "qc-u"


def hw_config(hw: str | HWConfig | None = None, cores: int | None = None) -> HWConfig:
    """A config from a preset, a vendor string, JSON text or a HWConfig (default QC-U),
    with ``cores`` replaced when given."""
    config = hw if isinstance(hw, HWConfig) else HWConfig.from_option(hw or DEFAULT_HW)
    return config.with_cores(cores) if cores else config


def plan(graph: Graph, hw: str | HWConfig | None = None, cores: int | None = None) -> Graph:
    """A copy of ``graph`` partitioned and memory-planned for ``hw`` (``cores`` replaces
    its cores): :func:`bevir.passes.target.plan_for_target`. A planned graph is returned
    as it is."""
    return plan_for_target(graph, hw_config(hw, cores))


def simulate(graph: Graph, hw: str | HWConfig | None = None, cores: int | None = None
             ) -> Profile:
    """The cycle model of ``graph`` planned for ``hw`` as :func:`compile_program` plans it."""
    config = hw_config(hw, cores)
    return model(plan_for_target(graph, config), config)


def compile_program(graph: Graph, out: str | Path, hw: str | HWConfig | None = None,
                    cores: int | None = None, progress: bool | None = None):
    """Compile ``graph`` into folder ``out`` and build it; returns the loaded program
    (:class:`~bevir.codegen.cprogram.CompiledProgram`). With ``hw`` or ``cores`` a copy of
    the graph is planned first (:func:`plan`); with neither the graph is taken as it is
    (planned already, or all of it on one core with its values in DDR). ``progress``
    shows a bar over the kernel builds (``None``: when stderr is a terminal).

    A graph compiled before is not compiled again: the whole folder is cached
    (``$BEVIR_CACHE/programs``) by the plan's key, the code of the ops' lowerings and the C
    compiler and flags, and copied from there."""
    from ..codegen.build import CFLAGS
    from ..codegen.cprogram import check_target, install, write_program
    from ..codegen.lower import code_digest, op_code_key
    from ..ops.native import cache_dir
    out = Path(out)
    require("tvm")                  # code generation's extra, named before anything else
    _check_device_work(graph)
    check_target(out)
    config = hw_config(hw, cores) if hw is not None or cores else None
    ops = sorted({n.op: n.opdef for n in graph.nodes}.items())
    key = plan_key(graph, config) if config is not None else plan_key(graph, HWConfig())
    built = cache_dir().parent / "programs" / _digest(
        key, str(config is not None), code_digest("codegen"),
        *(f"{name}:{op_code_key(opdef)}" for name, opdef in ops),
        " ".join(CFLAGS), os.environ.get("CC", "cc"))

    def build(folder: Path) -> None:
        write_program(graph if config is None else plan_for_target(graph, config), folder,
                      progress)
    for attempt in range(2):
        if not (built / "manifest.json").exists():      # else built before: no work
            _publish(build, built)
        try:
            return install(built, out)
        except CodegenError:
            if attempt:
                raise
            shutil.rmtree(built, ignore_errors=True)    # a damaged cache entry: build again


def _check_device_work(graph: Graph) -> None:
    """Refuse a graph with nothing for the device (a float model: it would compile to no
    kernel and 'run' on the host), naming its ops."""
    if any(lowerable(n) for n in graph.nodes):
        return
    ops = Counter(n.op for n in graph.nodes)
    listed = ", ".join(f"{op} x{k}" for op, k in ops.most_common(5))
    raise CodegenError(f"@{graph.name} has nothing to run on the device: none of its "
                       f"{len(graph.nodes)} nodes is integer ({listed}"
                       f"{', ...' if len(ops) > 5 else ''}); quantize it first "
                       "(bevir quantize, bevir.quantize)")


def _digest(*parts: str) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]


def _publish(fill, cached: Path) -> None:
    """Make the cache folder ``cached`` with ``fill(folder)``, whole or not at all (where
    another process made it first, its folder stays)."""
    with building_folder(cached, replace=False) as tmp:
        fill(tmp)
