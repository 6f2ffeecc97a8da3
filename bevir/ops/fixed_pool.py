"""Fixed-point average pooling: the exact sum of a window's codes divided by its count,
rounded half up once (as ``fx_reduce_mean`` divides), the divisor counted as the float
``avgpool2d`` counts it (``count_include_pad``, ceil_mode's overhang)."""
from __future__ import annotations

import numpy as np

from ..ir.opdef import Bool, Ints, OpDef
from .cost import Work
from .fixed_point import OUT, fixed_type, frac_of, require_out_frac
from .common import pool_out, spatial_axes
from .kernels.pool import window_taps
from .nn import POOL_ATTRS, avgpool_counts, pool_infer
from .numerics import saturate
from .onnx_export import qdq


class FxAvgPool2d(OpDef):
    """Average pooling of i8 fixed x: per window, y = round_half_up(sum * 2**(out_frac_bits
    - f) / count), saturated; ``count`` is the float op's divisor at that position."""

    name = "fx_avgpool2d"
    onnx_export = qdq("avgpool2d")
    operands = ("x",)
    attrs = {**POOL_ATTRS, "count_include_pad": Bool(False), "dilations": Ints((1, 1)), **OUT}

    def infer(self, c, x):
        frac_of(x, "x")
        require_out_frac(c.out_frac_bits)
        t = pool_infer(c, x)
        return fixed_type(t.shape, c.out_frac_bits, x.layout)

    def cycle_cost(self, c):
        """One add per window tap and result, a rounding division per result."""
        kh, kw = c.kernel
        return Work("reduce", alu_ops=c.out_types[0].numel * (kh * kw + 2))

    def compute(self, c, x):
        t = c.in_types[0]
        axes, out = spatial_axes(t), pool_out(c, t)
        acc = np.zeros(c.out_types[0].shape, np.int64)
        for tap in window_taps(x.astype(np.int64), axes, c, out, 0):
            acc += tap
        n = avgpool_counts(c, t, np.int64)
        shift = t.quant.frac_bits[0] - c.out_frac_bits
        # round_half_up(acc * 2**-shift / n) = floor((2 * num + den) / (2 * den))
        num, den = acc << max(-shift, 0), n << max(shift, 0)
        return saturate(np.floor_divide(2 * num + den, 2 * den))

    def tvm_lowering(self, c, L, x):
        t = c.in_types[0]
        (ah, aw), out = spatial_axes(t), c.out_types[0]
        ry, rx = L.reduce_axis(c.kernel[0], "ry"), L.reduce_axis(c.kernel[1], "rx")
        shift = t.quant.frac_bits[0] - c.out_frac_bits
        n = avgpool_counts(c, t, np.int64).reshape(out.shape[ah], out.shape[aw])
        counts = L.const(n << max(shift, 0), "count")
        dil = c.dilations

        def tap(*i):
            idx = list(i)
            idx[ah] = i[ah] * c.strides[0] - c.pads[0] + ry * dil[0]
            idx[aw] = i[aw] * c.strides[1] - c.pads[1] + rx * dil[1]
            inside = L.tirx.all(idx[ah] >= 0, idx[ah] < t.shape[ah],
                                idx[aw] >= 0, idx[aw] < t.shape[aw])
            return L.sum(L.guarded(inside, L.i64(x[tuple(idx)]), "int64"), axis=[ry, rx])
        s = L.te.compute(out.shape, tap, name="acc")

        def fn(*i):
            num, den = L.shl(s[i], max(-shift, 0)), counts[i[ah], i[aw]]
            return L.saturate(L.tirx.floordiv(L.i64(2) * num + den, L.i64(2) * den), "int8")
        return L.compute(out, fn)
