"""Schedules for the host build: plain functions per kernel family, picked by the names of
the blocks a lowering builds, with their tile sizes as parameters. A schedule only moves
loops (reorder, fuse, split, parallel, vectorize), so it never changes a result: the
kernels stay bit-exact, and the per-kernel check says so.

- convolution (``conv_acc``, the packed direct convolution of ``conv_accumulator``):
  register tiles of 4 output columns by 32 output channels (16 where 32 does not divide;
  vectorized, contiguous in the packed weights), the requantizing epilogue per tile,
  output rows in parallel;
- matrix products (``acc``: matmul, and linear with its weights packed to [K, N]):
  register tiles of 4 rows by 16 columns (8 or 4 where 16 does not divide; vectorized),
  the epilogue per tile, rows in parallel;
- everything else: the outermost loops of each large block in parallel.

Small kernels stay as they are: a thread launch costs more than they do.
"""
from __future__ import annotations

from ..extras import require

#: below this many iterations of a block's loop nest, nothing is parallelized
PARALLEL_MIN = 1 << 14


def _reduces_last(sch, block) -> bool:
    """The block's reduction iterators come after its spatial ones."""
    kinds = [int(iv.iter_type) for iv in sch.get(block).iter_vars]
    return 2 in kinds and kinds == sorted(kinds)


def _extent(sch, loop) -> int:
    return int(sch.get(loop).extent)


def _parallel_outer(sch, block, spatial: int) -> None:
    """Fuse the block's leading spatial loops until there are enough iterations to share,
    and run them in parallel."""
    loops = sch.get_loops(block)[:spatial]
    if not loops:
        return
    total = 1
    for lp in loops:
        total *= _extent(sch, lp)
    if total < PARALLEL_MIN:
        return
    take, n = [], 1
    for lp in loops:
        take.append(lp)
        n *= _extent(sch, lp)
        if n >= 64:
            break
    sch.parallel(sch.fuse(*take) if len(take) > 1 else take[0])


def conv(sch, block, vector: int = 32, columns: int = 4) -> None:
    """The packed convolution (b, oy, ox, oc | ry, rx, rc): tiles of ``columns`` output
    columns by ``vector`` output channels (halved to 16 where 32 does not divide them)
    whose accumulators stay in registers (local), the requantizing epilogue computed per
    tile, output rows in parallel. Channels that 16 does not divide keep the loop order
    with channels innermost."""
    b, oy, ox, oc, ry, rx, rc = sch.get_loops(block)
    consumers = sch.get_consumers(block)
    vector = vector if _extent(sch, oc) % vector == 0 else vector // 2
    if _extent(sch, oc) % vector or len(consumers) != 1:
        sch.reorder(b, oy, ox, ry, rx, rc, oc)
        sch.parallel(sch.fuse(b, oy))
        sch.decompose_reduction(block, ry)
        return
    oxo, oxi = sch.split(ox, factors=[None, columns])
    oco, oci = sch.split(oc, factors=[None, vector])
    sch.reorder(b, oy, oxo, oco, ry, rx, rc, oxi, oci)
    sch.reverse_compute_at(consumers[0], oco)
    sch.set_scope(block, 0, "local")
    sch.unroll(oxi)
    sch.vectorize(oci)
    sch.parallel(sch.fuse(b, oy))
    sch.decompose_reduction(block, ry)


def product(sch, block, vector: int = 16, rows: int = 4) -> bool:
    """A matrix product (batch..., m, n | k), b contiguous along n: register tiles of
    ``rows`` x ``vector`` (vectorized along n; ``vector`` halved, down to 4, until it divides
    n) in local accumulators, the epilogue per tile, the outer rows in parallel. False
    (nothing done) where 4 does not divide n or there is no row axis."""
    loops = sch.get_loops(block)
    consumers = sch.get_consumers(block)
    reductions = [int(iv.iter_type) for iv in sch.get(block).iter_vars].count(2)
    if reductions != 1 or len(loops) < 3 or len(consumers) != 1:
        return False
    *outer, m, n, k = loops
    # the widest vector of at most ``vector`` lanes that divides n (attention's 900 keys: 4)
    vector = next((v for v in (vector, vector // 2, vector // 4) if _extent(sch, n) % v == 0), 0)
    if vector < 4:
        return False
    no, ni = sch.split(n, factors=[None, vector])
    mo, mi = sch.split(m, factors=[None, rows]) if _extent(sch, m) % rows == 0 else (m, None)
    sch.reorder(*outer, mo, no, k, *([mi] if mi is not None else []), ni)
    sch.reverse_compute_at(consumers[0], no)
    sch.set_scope(block, 0, "local")
    if mi is not None:
        sch.unroll(mi)
    sch.vectorize(ni)
    sch.parallel(sch.fuse(*outer, mo) if outer else mo)
    sch.decompose_reduction(block, k)
    return True


def apply(func, name: str):
    """``func`` (a kernel's PrimFunc) scheduled for the host."""
    tvm, s_tir = require("tvm"), require("tvm.s_tir")
    sch = s_tir.Schedule(tvm.IRModule({name: func}))
    sch.work_on(name)
    root = sch.get_sblock("root")
    placed: set[str] = set()          # blocks a family schedule put into its loop nest
    for block in sch.get_child_blocks(root):
        family = {"conv_acc": conv, "acc": product}.get(sch.get(block).name_hint)
        if family is not None and _reduces_last(sch, block):
            name_ = sch.get(block).name_hint
            consumers = {sch.get(c).name_hint for c in sch.get_consumers(block)}
            if family(sch, block) is not False:
                placed |= {name_, f"{name_}_init", f"{name_}_update"} | consumers
    for block in sch.get_child_blocks(root):
        if sch.get(block).name_hint not in placed:
            iters = sch.get(block).iter_vars
            spatial = sum(1 for iv in iters if int(iv.iter_type) == 0)
            _vectorize_inner(sch, block, spatial)
            _parallel_outer(sch, block, spatial)
    return sch.mod[name]


def _vectorize_inner(sch, block, spatial: int, lanes: int = 8) -> None:
    """An elementwise block (every loop spatial): its innermost loop split by ``lanes``
    and vectorized, where ``lanes`` divides it and there are outer loops left to share."""
    loops = sch.get_loops(block)
    if not loops or spatial != len(loops) or len(sch.get(block).iter_vars) != spatial:
        return
    inner = loops[-1]
    if _extent(sch, inner) % lanes or _extent(sch, inner) == lanes and len(loops) == 1:
        return
    sch.vectorize(sch.split(inner, factors=[None, lanes])[1])
