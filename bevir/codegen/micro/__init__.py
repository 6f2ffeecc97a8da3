"""Micro-kernels of the host build: C functions the llvm kernels call (``call_extern``)
where TVM's own code generation falls short, linked into the host library.

TVM 0.27 has no working tensorization for the x86 dot-product instructions, so the
integer convolution's inner product (AVX512-VNNI ``vpdpbusd``: four u8 x s8 products
added into each int32 lane) is written here in C, and only the accumulation: the inputs
are packed and the result requantized by the TE computes of the op's own lowering, so
every rounding stays in :mod:`bevir.ops.numerics`. The sums are exact integers, so a
kernel with a micro-kernel gives the same bits as the one without it (the per-lowering
tests build both).

- ``vnni_conv.c``: ``bevir_vnni_conv_row``, one output row of an ungrouped convolution
  per call, the rows in TVM's parallel loop (:func:`conv_accumulator`).
"""
from __future__ import annotations

import functools
import hashlib
import os
import subprocess
from pathlib import Path

from ...errors import CodegenError

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
    (by LLVM's view of it) and ``BEVIR_MICRO_KERNELS`` is not ``0``."""
    if os.environ.get("BEVIR_MICRO_KERNELS", "1") == "0":
        return False
    from tvm.target import codegen
    from ..build import host_target
    try:
        return bool(codegen.llvm_cpu_has_features(["avx512vnni", "avx512bw"], host_target()))
    except Exception:           # an LLVM that cannot tell: not used
        return False


def objects() -> list[str]:
    """The micro-kernels compiled for linking (cached by source and flags)."""
    from ..build import cache_dir
    h = hashlib.sha256(" ".join(CFLAGS).encode())
    for src in SOURCES:
        h.update(src.read_bytes())
    out = cache_dir() / f"micro_{h.hexdigest()[:16]}.o"
    if not out.exists():
        cc = os.environ.get("CC", "cc")
        tmp = out.with_suffix(f".{os.getpid()}.tmp.o")
        srcs = " ".join(f'#include "{s}"' for s in SOURCES)
        done = subprocess.run([cc, *CFLAGS, "-x", "c", "-c", "-", "-o", str(tmp)], input=srcs,
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise CodegenError(f"micro-kernel build failed ({cc}): "
                               f"{(done.stderr.strip().splitlines() or [done.returncode])[-1]}")
        tmp.replace(out)
    return [str(out)]


def conv_accumulator(c, L, x, w, x_zero: int):
    """The exact int32 accumulator of the convolution of node ``c`` (x - x_zero, raw
    weight codes), in the result's layout, computed by ``bevir_vnni_conv_row``; None
    where the micro-kernel does not apply (grouped, not 8-bit, output channels not a
    multiple of 16 or too many for an NCHW result). Packs x as unsigned codes (int8 shifted by 128) padded with the zero point
    and channels to a multiple of 4 (zeros), the weights as [O/16, KH, KW, C/4, 16, 4],
    and the correction zero_point * sum(w) per output channel."""
    from ...ir.types import Layout
    t, out = c.in_types[0], c.out_types[0]
    o, cg, kh, kw = c.in_types[1].shape
    nhwc = t.layout is Layout.nhwc
    if (c.groups != 1 or o % CHANNEL_BLOCK or x.dtype not in ("int8", "uint8")
            or w.dtype != "int8" or (not nhwc and o > NCHW_CHANNELS)):
        return None
    te, tirx = L.te, L.tirx
    n, ch, hh, ww = (t.shape[0], t.shape[3], t.shape[1], t.shape[2]) if nhwc else t.shape
    oh, ow = (out.shape[1], out.shape[2]) if nhwc else (out.shape[2], out.shape[3])
    (sy, sx), (dy, dx) = c.strides, c.dilations
    top, left = c.pads[0], c.pads[1]
    hp = max((oh - 1) * sy + (kh - 1) * dy + 1, top + hh)
    wp = max((ow - 1) * sx + (kw - 1) * dx + 1, left + ww)
    cp = -(-ch // 4) * 4
    shift = 128 if x.dtype == "int8" else 0
    uz = x_zero + shift                 # the zero point of the unsigned codes

    def u_code(b, y, xx, cin):
        load = x[(b, y, xx, cin) if nhwc else (b, cin, y, xx)]
        return L.cast(L.cast(load, "int32") + shift, "uint8") if shift else load

    def packed_x(b, y, xx, cin):
        inside = tirx.all(y >= top, y < top + hh, xx >= left, xx < left + ww)
        cin_ = tirx.min(cin, ch - 1)
        pad = tirx.Select(cin < ch, tirx.const(uz, "int32"), tirx.const(0, "int32"))
        return tirx.if_then_else(tirx.all(inside, cin < ch),
                                 u_code(b, y - top, xx - left, cin_), L.cast(pad, "uint8"))
    u = te.compute((n, hp, wp, cp), packed_x, name="x_vnni")

    def packed_w(ob, ry, rx, c4, j, lane):
        rc = c4 * 4 + lane
        return tirx.if_then_else(rc < ch, w[ob * CHANNEL_BLOCK + j, tirx.min(rc, ch - 1), ry, rx],
                                 tirx.const(0, "int8"))
    wv = te.compute((o // CHANNEL_BLOCK, kh, kw, cp // 4, CHANNEL_BLOCK, 4), packed_w,
                    name="w_vnni")
    rc, ry, rx = L.reduce_axis(ch, "rc"), L.reduce_axis(kh, "ry"), L.reduce_axis(kw, "rx")
    corr = te.compute((o,), lambda oc: te.sum(L.cast(w[oc, rc, ry, rx], "int32") * uz,
                                               axis=[rc, ry, rx]), name="corr_vnni")
    rows = n * oh

    def call(ins, outs):
        r = tirx.Var("r", "int32")
        args = [*(b.access_ptr("r") for b in ins), outs[0].access_ptr("w"), r,
                hp, wp, cp, oh, ow, o, kh, kw, sy, sx, dy, dx, 0 if nhwc else 1]
        return tirx.For(r, 0, rows, tirx.ForKind.PARALLEL,
                        tirx.Evaluate(tirx.call_extern("int32", "bevir_vnni_conv_row", *args)))
    buffers = [tirx.decl_buffer(a.shape, a.dtype, f"{a.op.name}_buf") for a in (u, wv, corr)]
    return te.extern(out.shape, [u, wv, corr], call, name="conv_acc_vnni", dtype="int32",
                     in_buffers=buffers,
                     out_buffers=[tirx.decl_buffer(out.shape, "int32", "conv_acc_vnni_buf")])
