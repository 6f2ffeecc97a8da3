"""Micro-kernels of the host build: C functions the llvm kernels call (``call_extern``)
where TVM's own code generation falls short, linked into the host library.

TVM 0.27 has no working tensorization for the x86 dot-product instructions, so the
integer convolution's inner product (AVX512-VNNI ``vpdpbusd``: four u8 x s8 products
added into each int32 lane) is written here in C, and only the accumulation: the inputs
are packed and the result requantized by the TE computes of the op's own lowering, so
every rounding stays in :mod:`bevir.ops.numerics`. The sums are exact integers, so a
kernel with a micro-kernel gives the same bits as the one without it (the per-lowering
tests build both).

- ``vnni_conv.c``: ``bevir_vnni_conv``, the columns of one output row of an ungrouped
  convolution per call, the calls in TVM's parallel loop (:func:`conv_accumulator`); a
  matrix product is a 1x1 convolution of one long row (:func:`matmul_accumulator`).
"""
from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import numpy as np

from ...errors import CodegenError
from ...extras import require
from ...fsutil import atomic_path, run_child

SOURCES = sorted(Path(__file__).parent.glob("*.c"))

#: flags for the micro-kernels: the instructions they use, nothing that rounds
CFLAGS = ["-O3", "-std=gnu11", "-fPIC", "-mavx512f", "-mavx512bw", "-mavx512vnni",
          "-ffp-contract=off", "-fno-fast-math", "-Wall"]

#: 16 output channels per vector
CHANNEL_BLOCK = 16
#: the most output channels of an NCHW result (its scratch block holds 16 columns of them)
NCHW_CHANNELS = 2048


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether the host build may call the micro-kernels: this processor has AVX512-VNNI
    (by LLVM's view of it), the C compiler builds them and ``BEVIR_MICRO_KERNELS`` is not
    ``0``. Otherwise every kernel is TVM's own code (the same bits, slower)."""
    if os.environ.get("BEVIR_MICRO_KERNELS", "1") == "0":
        return False
    codegen = require("tvm.target.codegen")
    from ..machine import host_target
    try:
        if not codegen.llvm_cpu_has_features(["avx512vnni", "avx512bw"], host_target()):
            return False
    except Exception:           # an LLVM that cannot tell: not used
        return False
    try:
        objects()
    except CodegenError:        # a compiler without these instructions: not used
        return False
    return True


def objects() -> list[str]:
    """The micro-kernels compiled for linking (cached by source and flags)."""
    from ..machine import cache_dir
    h = hashlib.sha256(" ".join(CFLAGS).encode())
    for src in SOURCES:
        h.update(src.read_bytes())
    out = cache_dir() / f"micro_{h.hexdigest()[:16]}.o"
    if not out.exists():
        cc = os.environ.get("CC", "cc")
        srcs = "".join(f'#include "{s}"\n' for s in SOURCES)
        with atomic_path(out) as tmp:
            done = run_child([cc, *CFLAGS, "-x", "c", "-c", "-", "-o", str(tmp)], input=srcs,
                             capture_output=True, text=True)
            if done.returncode != 0:
                raise CodegenError(f"micro-kernel build failed ({cc}): "
                                   f"{(done.stderr.strip().splitlines() or [done.returncode])[-1]}")
    return [str(out)]


def conv_accumulator(c, L, x, w, x_zero: int):
    """The exact int32 accumulator of the convolution of node ``c`` (x - x_zero, raw
    weight codes), in the result's layout, computed by ``bevir_vnni_conv``; None where the
    micro-kernel does not apply (grouped, not 8-bit, output channels not a multiple of 16
    or too many for an NCHW result). x is packed as NHWC unsigned codes padded with the
    zero point (:func:`_unsigned`), one call per output row."""
    from ...ir.types import Layout
    t, out = c.in_types[0], c.out_types[0]
    o, cg, kh, kw = c.in_types[1].shape
    nhwc = t.layout is Layout.nhwc
    if c.groups != 1 or not _applies(x, w, o) or (not nhwc and o > NCHW_CHANNELS):
        return None
    tirx = L.tirx
    n, ch, hh, ww = (t.shape[0], t.shape[3], t.shape[1], t.shape[2]) if nhwc else t.shape
    oh, ow = (out.shape[1], out.shape[2]) if nhwc else (out.shape[2], out.shape[3])
    (sy, sx), (dy, dx) = c.strides, c.dilations
    top, left = c.pads[0], c.pads[1]
    hp = max((oh - 1) * sy + (kh - 1) * dy + 1, top + hh)
    wp = max((ow - 1) * sx + (kw - 1) * dx + 1, left + ww)
    cp, uz = -(-ch // 4) * 4, _unsigned_zero(x, x_zero)

    def packed_x(b, y, xx, cin):
        inside = tirx.all(y >= top, y < top + hh, xx >= left, xx < left + ww, cin < ch)
        index = (b, y - top, xx - left, tirx.min(cin, ch - 1))
        load = x[index if nhwc else (index[0], index[3], index[1], index[2])]
        pad = tirx.Select(cin < ch, tirx.const(uz, "int32"), tirx.const(0, "int32"))
        return tirx.if_then_else(inside, _unsigned(L, load), L.cast(pad, "uint8"))
    u = L.te.compute((n, hp, wp, cp), packed_x, name="x_vnni")
    geometry = (hp, wp, cp, oh, ow, o, kh, kw, sy, sx, dy, dx, 0 if nhwc else 1)
    return _call(L, u, _packed_weights(L, w, (o, ch, kh, kw), cp, uz, lambda *i: i), out.shape,
                 geometry, rows=n * oh, columns=ow)


#: columns of a matrix product's row per call (a multiple of the 6-column tile)
MATRIX_COLUMNS = 48


def matmul_accumulator(L, x, w, shape):
    """The exact int32 accumulator x @ w^T of 8-bit codes (x [..., K] centered at 0, w
    [N, K]) of result ``shape`` [..., N], computed by ``bevir_vnni_conv`` as a 1x1
    convolution of one row of M = prod(x.shape[:-1]) columns, MATRIX_COLUMNS per call; None
    where the micro-kernel does not apply."""
    n, kk = (int(d) for d in w.shape)
    if not _applies(x, w, n):
        return None
    tirx = L.tirx
    lead = tuple(int(d) for d in x.shape[:-1])
    m = int(np.prod(lead, dtype=np.int64))
    cp, uz = -(-kk // 4) * 4, _unsigned_zero(x, 0)

    def packed_x(*i):
        k = i[-1]
        load = _unsigned(L, x[tuple(i[:-1]) + (tirx.min(k, kk - 1),)])
        return tirx.if_then_else(k < kk, load, tirx.const(0, "uint8"))
    u = L.te.compute(lead + (cp,), packed_x, name="x_vnni")
    wv = _packed_weights(L, w, (n, kk, 1, 1), cp, uz, lambda oc, rc, ry, rx: (oc, rc))
    geometry = (1, m, cp, 1, m, n, 1, 1, 1, 1, 1, 1, 0)
    return _call(L, u, wv, shape, geometry, rows=1, columns=m, per_call=MATRIX_COLUMNS)


def _applies(x, w, channels: int) -> bool:
    return channels % CHANNEL_BLOCK == 0 and x.dtype in ("int8", "uint8") and w.dtype == "int8"


def _unsigned_zero(x, x_zero: int) -> int:
    """The zero point of x's codes made unsigned (int8 shifted by 128)."""
    return x_zero + (128 if x.dtype == "int8" else 0)


def _unsigned(L, code):
    """An 8-bit code as the unsigned byte vpdpbusd reads (int8 shifted by 128)."""
    return L.cast(L.cast(code, "int32") + 128, "uint8") if code.dtype == "int8" else code


def _packed_weights(L, w, dims, cp: int, uz: int, index):
    """(w packed [O/16, KH, KW, C/4, 16, 4] with zero channels up to ``cp``, the correction
    uz * sum(w) per output channel); ``index(oc, rc, ry, rx)`` indexes w."""
    te, tirx = L.te, L.tirx
    o, ch, kh, kw = dims

    def packed(ob, ry, rx, c4, j, lane):
        rc = c4 * 4 + lane
        load = w[index(ob * CHANNEL_BLOCK + j, tirx.min(rc, ch - 1), ry, rx)]
        return tirx.if_then_else(rc < ch, load, tirx.const(0, "int8"))
    wv = te.compute((o // CHANNEL_BLOCK, kh, kw, cp // 4, CHANNEL_BLOCK, 4), packed, name="w_vnni")
    rc, ry, rx = L.reduce_axis(ch, "rc"), L.reduce_axis(kh, "ry"), L.reduce_axis(kw, "rx")
    corr = te.compute((o,), lambda oc: te.sum(L.cast(w[index(oc, rc, ry, rx)], "int32") * uz,
                                               axis=[rc, ry, rx]), name="corr_vnni")
    return wv, corr


def _call(L, u, weights, shape, geometry, rows: int, columns: int, per_call: int | None = None):
    """The extern stage: ``bevir_vnni_conv`` on every row, ``per_call`` columns at a time
    (all of them: None), the calls in a parallel loop."""
    tirx = L.tirx
    wv, corr = weights
    chunks = 1 if per_call is None else -(-columns // per_call)
    step = columns if per_call is None else per_call

    def body(ins, outs):
        t = tirx.Var("t", "int32")
        begin = (t % chunks) * step
        args = [*(b.access_ptr("r") for b in ins), outs[0].access_ptr("w"), t // chunks, begin,
                tirx.min(begin + step, columns), *geometry]
        return tirx.For(t, 0, rows * chunks, tirx.ForKind.PARALLEL,
                        tirx.Evaluate(tirx.call_extern("int32", "bevir_vnni_conv", *args)))
    ins = [u, wv, corr]
    return L.te.extern(shape, ins, body, name="conv_acc_vnni", dtype="int32",
                       in_buffers=[tirx.decl_buffer(a.shape, a.dtype, f"{a.op.name}_buf")
                                   for a in ins],
                       out_buffers=[tirx.decl_buffer(shape, "int32", "conv_acc_vnni_buf")])
