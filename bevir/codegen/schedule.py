"""Schedules for the host build: plain functions per kernel family, picked by the names of
the blocks a lowering builds, with their tile sizes as parameters. A schedule only moves
loops (reorder, fuse, split, parallel, vectorize), so it never changes a result: the
kernels stay bit-exact, and the per-kernel check says so.

- convolution (``conv_acc``, the packed direct convolution of ``conv_accumulator``):
  output rows in parallel, the reduction outside, output channels innermost and
  vectorized (contiguous in the packed weights and the accumulator);
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


def conv(sch, block, vector: int = 16) -> None:
    """The packed convolution: (b, oy, ox, oc | ry, rx, rc) -> (b*oy parallel, ox, ry, rx,
    rc, oc vectorized by ``vector`` lanes where the channels divide)."""
    b, oy, ox, oc, ry, rx, rc = sch.get_loops(block)
    sch.reorder(b, oy, ox, ry, rx, rc, oc)
    sch.parallel(sch.fuse(b, oy))
    if _extent(sch, oc) % vector == 0:
        _, inner = sch.split(oc, factors=[None, vector])
        sch.vectorize(inner)
    sch.decompose_reduction(block, ry)


def apply(func, name: str):
    """``func`` (a kernel's PrimFunc) scheduled for the host."""
    from tvm import s_tir
    import tvm
    sch = s_tir.Schedule(tvm.IRModule({name: func}))
    sch.work_on(name)
    root = sch.get_sblock("root")
    for block in sch.get_child_blocks(root):
        block_name = sch.get(block).name_hint
        if block_name == "conv_acc":
            conv(sch, block)
        else:
            iters = sch.get(block).iter_vars
            spatial = sum(1 for iv in iters if int(iv.iter_type) == 0)
            _parallel_outer(sch, block, spatial)
    return sch.mod[name]
