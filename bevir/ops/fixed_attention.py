"""Fixed-point multi-scale deformable attention (``fx_ms_deform_attn``): pixel coordinates
rounded to ``weight_bits`` fraction bits, bilinear corner weights times the attention
weights, int32 accumulation over levels, points and corners."""
from __future__ import annotations

import numpy as np

from ..ir.opdef import Int, Ints, OpDef, Piece, Str
from ..ir.types import FixedPointQuant
from . import native
from .attention import level_shapes
from .common import require
from .cost import sampling_work
from .fixed_point import I16, I32, OUT, fixed_type, frac_of, require_out_frac
from .numerics import Rescale, bilinear_taps, rshift_round
from .onnx_export import ms_deform_attn, qdq


class FxMsDeformAttn(OpDef):
    """Integer multi-scale deformable attention (ms_deform_attn): value (i8 fixed, (bs, V,
    H, d)), sampling_locations (i16/i32 fixed<F>, (bs, Nq, H, L, P, 2) as (x, y): normalized
    [0, 1] or pixel coordinates, per ``coordinates``), attention_weights (i8 fixed, (bs, Nq,
    H, L, P)) -> i8 fixed<out_frac_bits> (bs, Nq, H*d). Pixel coordinates (pixel k's centre
    at k) are rounded to ``weight_bits`` B fraction bits; corner weights are products of
    the fractional parts (Q2B), times the attention weight, rshift_round by B; int32
    accumulation over levels, points and corners (out-of-range corners are zero), then
    rshift_round by fv + fa + B - out_frac_bits and saturation."""

    name = "fx_ms_deform_attn"
    onnx_export = qdq(ms_deform_attn)
    operands = ("value", "sampling_locations", "attention_weights")
    attrs = {"spatial_shapes": Ints(), **OUT, "weight_bits": Int(8),
             "coordinates": Str("normalized", ("normalized", "pixel"))}
    #: by batch (value, locations and weights of those batch entries), by queries (their
    #: locations and weights; the value replicated)
    splits = ("batch", "queries")

    def split_axis(self, c, kind):
        if kind in self.splits:
            return 0 if kind == "batch" else 1
        return super().split_axis(c, kind)

    def split_piece(self, c, kind, start, stop):
        axis = self.split_axis(c, kind)
        return Piece((None if kind == "queries" else (0, start, stop),
                      (axis, start, stop), (axis, start, stop)))

    def infer(self, c, value, loc, aw):
        fv, fa = frac_of(value, "value"), frac_of(aw, "attention_weights")
        fl = frac_of(loc, "sampling_locations", (I16, I32))
        require(value.rank == 4 and loc.rank == 6 and aw.rank == 5 and loc.shape[-1] == 2
                and loc.shape[:5] == aw.shape and value.shape[0] == loc.shape[0]
                and value.shape[2] == loc.shape[2], f"shapes do not fit: {value}, {loc}, {aw}")
        levels = level_shapes(c.spatial_shapes)
        require(len(c.spatial_shapes) == 2 * loc.shape[3] and
                value.shape[1] == sum(h * w for h, w in levels),
                f"spatial_shapes {list(c.spatial_shapes)} do not fit value {value} and "
                f"{loc.shape[3]} levels")
        require(1 <= c.weight_bits <= 12, f"weight_bits {c.weight_bits} outside [1, 12]")
        require(c.coordinates == "pixel" or fl >= 1, "normalized locations need frac bits >= 1")
        samples = loc.shape[3] * loc.shape[4]
        require(128 * samples * (128 * (1 << c.weight_bits) + 2) < 1 << 31,
                f"{samples} samples per output could overflow the int32 accumulator")
        require_out_frac(c.out_frac_bits)
        Rescale.of(FixedPointQuant((fv + fa + c.weight_bits,)), c.out_frac_bits)
        return fixed_type((loc.shape[0], loc.shape[1], value.shape[2] * value.shape[3]),
                          c.out_frac_bits)

    def pixel(self, c, coord: np.ndarray, size: int) -> np.ndarray:
        """Q(weight_bits) pixel coordinates from the locations along one axis."""
        f = c.in_types[1].quant.frac_bits[0]
        v = coord.astype(np.int64)
        if c.coordinates == "normalized":
            v = v * size - (1 << (f - 1))
        return rshift_round(v, f - c.weight_bits)

    def compute(self, c, value, loc, aw):
        bs, _, heads, d = value.shape
        acc = np.zeros((bs, loc.shape[1], heads, d), np.int32)
        start = 0
        for lvl, (h, w) in enumerate(level_shapes(c.spatial_shapes)):
            v = value[:, start:start + h * w].transpose(0, 2, 1, 3).reshape(-1, d)
            start += h * w
            self._sample_level(c, acc, v, (h, w), loc[:, :, :, lvl], aw[:, :, :, lvl])
        fv, _, fa = (t.quant.frac_bits[0] for t in c.in_types)
        out = Rescale.of(FixedPointQuant((fv + fa + c.weight_bits,)), c.out_frac_bits).apply(acc)
        return out.reshape(bs, loc.shape[1], heads * d)

    def _sample_level(self, c, acc, v, size, loc, aw) -> None:
        """Accumulate one level's samples into acc (bs, Nq, H, d)."""
        (h, w), bits = size, c.weight_bits
        bs, _, heads, points = aw.shape
        base = (np.arange(bs)[:, None, None, None] * heads
                + np.arange(heads)[None, None, :, None]) * (h * w)
        a = aw.astype(np.int64)
        px, py = self.pixel(c, loc[..., 0], w), self.pixel(c, loc[..., 1], h)
        for xi, yi, wt in bilinear_taps(px, py, bits):
            ok = (xi >= 0) & (xi < w) & (yi >= 0) & (yi < h)
            cw = np.where(ok, rshift_round(a * wt, bits), 0).astype(np.int32)
            idx = np.where(ok, yi * w + xi, 0) + base
            if native.gather_mac(v, idx, cw, acc):
                continue
            for p in range(points):
                acc += v[idx[..., p]].astype(np.int32) * cw[..., p, None]

    def tvm_lowering(self, c, L, value, loc, aw):
        bs, _, heads, d = c.in_types[0].shape
        nq, points = c.in_types[2].shape[1], c.in_types[2].shape[4]
        f, bits = c.in_types[1].quant.frac_bits[0], c.weight_bits
        one = L.i64(1 << bits)

        def pixel(coord, size):         # self.pixel on one coordinate
            v = L.i64(coord)
            if c.coordinates == "normalized":
                v = v * L.i64(size) - L.i64(1 << (f - 1))
            return L.rshift_round(v, f - bits)

        def taps(b, q, h, ch, lvl, p, start, size):
            """The level's 4 bilinear taps of value channel ch (bilinear_taps, _sample_level)."""
            (hh, ww), a = size, L.i64(aw[b, q, h, lvl, p])
            px, py = pixel(loc[b, q, h, lvl, p, 0], ww), pixel(loc[b, q, h, lvl, p, 1], hh)
            x0, y0 = px >> L.i64(bits), py >> L.i64(bits)
            ux, uy = px - (x0 << L.i64(bits)), py - (y0 << L.i64(bits))    # px & (one - 1)
            total = 0
            for xi, wx in ((x0, one - ux), (x0 + L.i64(1), ux)):
                for yi, wy in ((y0, one - uy), (y0 + L.i64(1), uy)):
                    inside = L.tirx.all(xi >= L.i64(0), xi < L.i64(ww), yi >= L.i64(0),
                                        yi < L.i64(hh))
                    pos = L.cast(L.i64(start) + yi * L.i64(ww) + xi, "int32")
                    v = L.guarded(inside, L.cast(value[b, pos, h, ch], "int32"), "int32")
                    total = total + v * L.cast(L.rshift_round(a * wx * wy, bits), "int32")
            return total

        levels = level_shapes(c.spatial_shapes)
        starts = np.cumsum([0] + [hh * ww for hh, ww in levels]).tolist()

        def acc(b, q, h, ch):           # int32 sum over levels (unrolled), points and taps
            p = L.reduce_axis(points, "p")
            return L.sum(sum(taps(b, q, h, ch, lvl, p, starts[lvl], size)
                             for lvl, size in enumerate(levels)), axis=p)
        a = L.te.compute((bs, nq, heads, d), acc, name="acc")
        fv, _, fa = (t.quant.frac_bits[0] for t in c.in_types)
        r = Rescale.of(FixedPointQuant((fv + fa + bits,)), c.out_frac_bits)
        return L.compute(c.out_types[0], lambda b, q, j: L.rescale(a[b, q, j // d, j % d], r,
                                                                    None, "int8"))

    def macs(self, c):
        return c.in_types[2].numel * c.in_types[0].shape[3] * 4


    def cycle_cost(self, c):
        return sampling_work(c.in_types[0], c.in_types[2])
