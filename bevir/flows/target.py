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
from pathlib import Path

from ..ir.graph import Graph
from ..passes.target import plan_for_target, plan_key
from ..target.cycles import Profile, model
from ..target.hw import HWConfig

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
    """The cycle model of ``graph`` planned for ``hw`` as :func:`compile` plans it."""
    config = hw_config(hw, cores)
    return model(plan_for_target(graph, config), config)


def compile(graph: Graph, out: str | Path, hw: str | HWConfig | None = None,
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
    from ..codegen.cprogram import CompiledProgram, write_program
    from ..codegen.lower import op_code_key
    from ..ops.native import cache_dir
    out = Path(out)
    config = hw_config(hw, cores) if hw is not None or cores else None
    ops = sorted({n.op: n.opdef for n in graph.nodes}.items())
    key = plan_key(graph, config) if config is not None else plan_key(graph, HWConfig())
    built = cache_dir().parent / "programs" / _digest(
        key, str(config is not None), *(f"{name}:{op_code_key(opdef)}" for name, opdef in ops),
        " ".join(CFLAGS), os.environ.get("CC", "cc"))
    if (built / "manifest.json").exists():     # built before: the same files, no work
        shutil.copytree(built, out, dirs_exist_ok=True)
        return CompiledProgram.load(out)
    if config is not None:
        graph = plan_for_target(graph, config)
    program = write_program(graph, out, progress)
    _publish(lambda tmp: shutil.copytree(out, tmp, dirs_exist_ok=True), built)
    return program


def _digest(*parts: str) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]


def _publish(fill, cached: Path) -> None:
    """Make the cache folder ``cached`` with ``fill(folder)``, whole or not at all."""
    tmp = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    fill(tmp)
    try:
        tmp.rename(cached)                      # a racing writer's copy wins
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
