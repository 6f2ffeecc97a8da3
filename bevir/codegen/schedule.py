"""Schedules for the host build: plain functions per kernel family, picked by the names of
the blocks a lowering builds, with their tile sizes as parameters. A schedule only moves
loops (reorder, fuse, split, parallel, vectorize), so it never changes a result: the
kernels stay bit-exact, and the per-kernel check says so.

- convolution (``conv_acc``, the packed direct convolution of ``conv_accumulator``):
  register tiles of 4 output columns by 16 output channels (vectorized, contiguous in the
  packed weights), the requantizing epilogue per tile, output rows in parallel;
- matrix products (``acc``, a reduction over the last operand axis): rows in parallel;
- everything else: the outermost loops of each large block in parallel.

Small kernels stay as they are: a thread launch costs more than they do.
"""
from __future__ import annotations

#: below this many iterations of a block's loop nest, nothing is parallelized
PARALLEL_MIN = 1 << 14


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


def conv(sch, block, vector: int = 16, columns: int = 4) -> None:
    """The packed convolution (b, oy, ox, oc | ry, rx, rc): tiles of ``columns`` output
    columns by ``vector`` output channels whose accumulators stay in registers (local),
    the requantizing epilogue computed per tile, output rows in parallel. Channels that
    ``vector`` does not divide keep the loop order with channels innermost."""
    b, oy, ox, oc, ry, rx, rc = sch.get_loops(block)
    consumers = sch.get_consumers(block)
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


def apply(func, name: str):
    """``func`` (a kernel's PrimFunc) scheduled for the host."""
    from tvm import s_tir
    import tvm
    sch = s_tir.Schedule(tvm.IRModule({name: func}))
    sch.work_on(name)
    root = sch.get_sblock("root")
    placed: set[str] = set()          # blocks a family schedule put into its loop nest
    for block in sch.get_child_blocks(root):
        if sch.get(block).name_hint == "conv_acc":
            placed |= {"conv_acc_init", "conv_acc_update"}
            placed |= {sch.get(c).name_hint for c in sch.get_consumers(block)}
            conv(sch, block)
    for block in sch.get_child_blocks(root):
        if sch.get(block).name_hint not in placed:
            iters = sch.get(block).iter_vars
            _parallel_outer(sch, block, sum(1 for iv in iters if int(iv.iter_type) == 0))
    return sch.mod[name]
