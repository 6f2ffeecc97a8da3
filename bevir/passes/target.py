"""The planning pipeline of the GPNPU: one plan for ``bevir compile``, ``bevir sim``,
``bevir sweep``, ``bevir run --cores`` and the benches.

    planned = plan_for_target(graph, HWConfig.parse("QC-U 8MB 16MAC x4"))

On a copy of the lowered graph it runs :func:`target_pipeline`: the epilogues fused into
their producers (``fuse{enable=fuse-qlinear-clip}``: a relu or clip of a QLinear op's codes
clamps its result, bit for bit), ``stripe-images{hw=...}`` (layers too large for the OCM
run a few images at a time), ``partition{hw=...}`` and ``plan-memory{hw=...}``. The
partition is kept only where it pays: the graph is also planned on one core, both are
modelled (bevir/target/cycles.py), and the faster one is the plan (a partitioned graph is
never slower than one core); where the split is faster than one core's MAC roofline, one
core cannot win and is not planned. The figures are in
``graph.meta["partition"]["modelled"]``: ``one_core`` (or ``one_core_at_least``, the
roofline), ``partitioned``, ``kept``.
A graph planned already (it has a memory plan) is taken as it is.

Plans are cached on disk (``$BEVIR_CACHE/plans``) by the graph's content (text,
constants, meta), the hardware config and the code of the passes, ops, IR and target, so
planning an unchanged graph again reads the plan back.
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np

from ..fsutil import building_folder
from ..errors import PassError, VerifyError
from ..ir.graph import Graph
from ..ir.verifier import verify
from ..ir.serialize import graph_digest, load, meta_document, save
from ..ops.native import cache_dir
from ..target.cycles import model
from ..target.hw import HWConfig
from .core import Pass, make_pass
from .manager import optimize

#: the fusions the target pipeline runs first: epilogues into their producers
EPILOGUES = "fuse-qlinear-clip"


def target_pipeline(hw: HWConfig, cores: int = 0) -> list[Pass]:
    """The passes that plan a lowered graph for ``hw`` (``cores``: 0 for the config's)."""
    return [make_pass("fuse", enable=EPILOGUES), make_pass("stripe-images", hw=hw, cores=cores),
            make_pass("partition", hw=hw, cores=cores),
            make_pass("plan-memory", hw=hw)]


def planned(graph: Graph) -> bool:
    """Whether ``graph`` carries a memory plan (it is ready for code generation)."""
    return "memory_plan" in graph.meta


def plan_for_target(graph: Graph, hw: HWConfig, cache: bool = True) -> Graph:
    """A copy of ``graph`` planned for ``hw`` (see the module docstring); ``graph`` itself
    is left as it is. A graph planned already is returned as it is."""
    if planned(graph):
        return graph
    folder = cache_dir().parent / "plans" / plan_key(graph, hw)
    if cache and (folder / "graph.bevir").exists():
        return load(folder / "graph.bevir")
    if "partition" in graph.meta:           # partitioned by hand: plan its memory
        best = _planned(graph, [make_pass("plan-memory", hw=hw)])
    else:
        best = _faster(graph, hw)
    if cache:
        _publish(best, folder)
    return best


def _faster(graph: Graph, hw: HWConfig) -> Graph:
    """The graph planned on ``hw``'s cores or on one, whichever the model says is faster.
    One core is not planned where the split beats one core's MAC roofline (every step
    takes at least its MACs over the array's peak, and one core runs them one by one)."""
    if hw.cores == 1:
        return _planned(graph, target_pipeline(hw, cores=1))
    split = _planned(graph, target_pipeline(hw))
    profile = model(split, hw)
    t_split, bound = profile.makespan, math.ceil(profile.macs / hw.peak_macs_per_cycle)
    if t_split < bound:
        figures = {"one_core_at_least": bound, "partitioned": t_split, "kept": True}
        best = split
    else:
        one = _planned(graph, target_pipeline(hw, cores=1))
        t_one = model(one, hw).makespan
        best = split if t_split < t_one else one
        figures = {"one_core": t_one, "partitioned": t_split, "kept": best is split}
    best.meta["partition"] = {**best.meta["partition"], "modelled": {
        **figures, "hw": hw.option_text()}}
    return best


def _planned(graph: Graph, pipeline: list[Pass]) -> Graph:
    """A copy of ``graph`` through ``pipeline``, verified once at the end (the passes are
    bevir's own); where that fails, the pipeline runs again verifying its input and the
    graph after each pass, so that the error names what broke it."""
    try:
        out = optimize(graph.clone(), pipeline, verify_each=False)
        verify(out)
    except (PassError, VerifyError):
        optimize(graph.clone(), pipeline)         # names the invalid input or pass
        raise
    return out


def plan_key(graph: Graph, hw: HWConfig) -> str:
    """The graph's content (text, constants, meta), the hardware and the code of the
    passes, ops, IR and target: what a plan depends on."""
    doc, arrays = meta_document(graph)
    h = hashlib.sha256(f"{graph_digest(graph)}|{hw.hash}|{source_digest()}|"
                       f"{json.dumps(doc, sort_keys=True)}".encode())
    for k in sorted(arrays or {}):
        h.update(k.encode() + np.ascontiguousarray(arrays[k]).tobytes())
    return h.hexdigest()[:20]


def source_digest(packages: tuple[str, ...] = ("passes", "ops", "ir", "target")) -> str:
    """A digest of the source files of bevir's ``packages``."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for package in packages:
        for f in sorted((root / package).glob("*.py")):
            h.update(f"{package}/{f.name}".encode() + f.read_bytes())
    return h.hexdigest()[:16]


def _publish(graph: Graph, folder: Path) -> None:
    """Save ``graph`` into the cache folder, whole or not at all (a racing writer's folder
    stays)."""
    with building_folder(folder, replace=False) as tmp:
        save(graph, tmp / "graph.bevir")
