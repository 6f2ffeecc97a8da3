"""bevir's integer numerics, in one place: what the golden ops compute and what the code
generator emits, written once.

Two families (docs/numerics.md gives every formula and its error bound):

- **bevir's fixed point** (the target's scheme, the ``fx_*`` ops): rounding is *round half
  up*, ``rshift_round(v, s) = (v + (1 << (s - 1))) >> s`` (arithmetic shift, ties toward
  +inf; s <= 0 is an exact left shift); requantization (:class:`Rescale`) is
  ``saturate((acc * m + (1 << (n - 1))) >> n)`` in 64-bit integers, m = 1 for power-of-two
  ratios, else an int32 in [2**30, 2**31) (:func:`quantize_multiplier`); saturation clamps
  to the result dtype's range; the nonlinear functions are the tables and exact integer
  formulas :func:`lut_table`, :func:`softmax_exp_table`, :func:`div_table`,
  :func:`rsqrt_fixed`, :func:`bridge_table` and the bilinear taps :func:`bilinear_taps`.
- **onnxruntime-exact** (the ``qlinear_*`` ops of an INT8 ONNX model, as MLAS computes them):
  float32 requantization multipliers (:func:`conv_multiplier`), :func:`requantize` and
  :func:`saturate_round` (round half to even, zero point, saturation), :func:`fma32` (one
  rounding, as FMA3), :func:`lookup_table` and :func:`mlas_logistic`.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ..ir.opdef import get_op
from ..ir.types import AffineQuant, DType, FixedPointQuant, Quant
from . import native
from .common import require
from .kernels.gemm import exact_chunk, exact_int_matmul

I8 = DType.i8
F32, F64 = np.float32, np.float64


# ---- bevir fixed point -------------------------------------------------------------------
#: the longest reduction of an int8 product op (|sum| <= 2**16 * 2**14 = 2**30 fits int32)
MAX_REDUCTION = 1 << 16


#: frac bits of the normalized value inside fx_layer_norm
NORM_FRAC = 16


#: fx_softmax: frac bits of the exp table and the power of two of the reciprocal
EXP_FRAC, RECIP_BITS = 15, 46


def saturate(v: np.ndarray, dtype=np.int8) -> np.ndarray:
    """Clamp to the range of the integer ``dtype`` and convert."""
    info = np.iinfo(dtype)
    return np.clip(v, info.min, info.max).astype(dtype)


def rshift_round(v, shift) -> np.ndarray:
    """round_half_up(v / 2**shift) for int64 ``v``: ``(v + (1 << (shift-1))) >> shift``;
    a shift <= 0 is the exact left shift ``v << -shift``. ``shift`` broadcasts (per
    channel, per row)."""
    v = np.asarray(v, np.int64)
    s = np.asarray(shift, np.int64)
    if s.ndim == 0:                         # one shift: two passes, in place
        s = int(s)
        if s <= 0:
            return np.left_shift(v, -s)
        out = np.add(v, np.int64(1) << (s - 1))
        return np.right_shift(out, s, out=out if out.ndim else None)
    right = np.maximum(s, 0)
    half = np.where(right > 0, np.left_shift(np.int64(1), np.maximum(right - 1, 0)), 0)
    return np.left_shift(np.right_shift(v + half, right), np.maximum(-s, 0))


def quantize_multiplier(ratio: float) -> tuple[int, int]:
    """(m, n) with ratio ~= m * 2**-n, m an int32 in [2**30, 2**31): frexp of the float64
    ratio, mantissa * 2**31 rounded half up (a carry to 2**31 renormalizes)."""
    require(ratio > 0 and math.isfinite(ratio), f"requantization ratio {ratio} must be positive")
    f, e = math.frexp(ratio)
    m = math.floor(f * 2.0 ** 31 + 0.5)
    if m == 1 << 31:
        m, e = 1 << 30, e + 1
    return m, 31 - e


@dataclass(frozen=True)
class Rescale:
    """Requantization of an accumulator: ``saturate((acc * m + (1 << (n-1))) >> n)``, one
    (m, n) per tensor or per channel. m = 1 for power-of-two ratios (n may then be <= 0)."""

    multiplier: tuple[int, ...]
    shift: tuple[int, ...]

    @staticmethod
    @functools.lru_cache(maxsize=4096)
    def of(acc: Quant, out_frac: int) -> Rescale:
        """From the accumulator's quantization to frac bits ``out_frac`` (raises VerifyError
        for shifts or ratios out of range, or an affine zero point)."""
        if isinstance(acc, FixedPointQuant):
            shifts = tuple(f - out_frac for f in acc.frac_bits)
            require(all(-31 <= s <= 62 for s in shifts),
                    lambda: f"requantization shift {shifts} from frac bits "
                    f"{list(acc.frac_bits)} to {out_frac} is outside [-31, 62]")
            return Rescale((1,) * len(shifts), shifts)
        require(all(z == 0 for z in acc.zero_point), lambda: "affine quantization must be "
                f"symmetric (zero point 0), got zero points {list(acc.zero_point)}")
        pairs = [quantize_multiplier(math.ldexp(s, out_frac)) for s in acc.scale]
        require(all(1 <= n <= 62 for _, n in pairs), lambda: f"requantization ratio of "
                f"scale {list(acc.scale)} to frac bits {out_frac} is out of range")
        return Rescale(tuple(m for m, _ in pairs), tuple(n for _, n in pairs))

    def apply(self, acc: np.ndarray, axis: int | None = None, dtype=np.int8) -> np.ndarray:
        """Requantize ``acc`` (|acc| < 2**31), per channel along ``axis`` when per channel."""
        m, n = np.asarray(self.multiplier, np.int64), np.asarray(self.shift, np.int64)
        if m.size > 1:
            shape = [1] * acc.ndim
            shape[axis] = -1
            m, n = m.reshape(shape), n.reshape(shape)
        else:
            m, n = m.reshape(()), n.reshape(())
        return saturate(rshift_round(np.asarray(acc, np.int64) * m, n), dtype)


def quantize_fixed(y: np.ndarray, frac: int, dtype=np.int8) -> np.ndarray:
    """round_half_up(y * 2**frac) in float64, saturated to ``dtype`` (NaN -> the minimum)."""
    info = np.iinfo(dtype)
    v = np.nan_to_num(np.ldexp(np.asarray(y, np.float64), frac), nan=-np.inf)
    return saturate(np.floor(np.clip(v, info.min - 1.0, info.max + 1.0) + 0.5), dtype)


def int_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The exact int64 ``a @ b`` (numpy matmul rules) of int8 operands through float32 BLAS,
    the reduction split by :func:`~bevir.ops.kernels.gemm.exact_matmul` (1024 products of
    at most 128 * 128 per block) so every partial sum is exact."""
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    vnni = (native.U8S8Gemm.of(b2, a.dtype, 0)
            if a2.ndim == b2.ndim == 2 and a.dtype == b.dtype == np.int8 else None)
    if vnni is not None:          # the same integers, on the VNNI kernel
        acc = vnni(a2).astype(np.int64)
    elif a.dtype == np.int16:     # |products| <= 2**22: float64 sums of <= 2**16 are exact
        acc = np.matmul(a2.astype(np.float64), b2.astype(np.float64)).astype(np.int64)
    else:
        acc = exact_int_matmul(a2.astype(np.float32), b2.astype(np.float32),
                               exact_chunk(128 * 128)).astype(np.int64)
    if a.ndim == 1:
        acc = acc[..., 0, :]
    return acc[..., 0] if b.ndim == 1 else acc


def rsqrt_fixed(n: np.ndarray, c: int) -> tuple[np.ndarray, np.ndarray]:
    """(R, k) per element of the positive int64 ``n``: R = floor(2**k * sqrt(c / n)) exactly,
    k = (61 + bitlen(n) - bitlen(c)) // 2, so that R lies in [2**29, 2**31)."""
    uniq, inverse = np.unique(n, return_inverse=True)
    r, k = np.empty(uniq.shape, np.int64), np.empty(uniq.shape, np.int64)
    for i, v in enumerate(uniq.tolist()):
        k[i] = (61 + v.bit_length() - c.bit_length()) // 2
        r[i] = math.isqrt((c << (2 * int(k[i]))) // v)
    return r[inverse].reshape(n.shape), k[inverse].reshape(n.shape)


def bridge_table(scale: float, zero_point: int, frac: int, dtype, out_dtype=np.int8) -> np.ndarray:
    """fx_bridge's result for every code of ``dtype`` (index: the code's byte): Rescale of
    the symmetric scale ``scale`` to ``frac`` applied to code - zero_point, saturated to
    ``out_dtype``."""
    codes = np.arange(256, dtype=np.uint8).view(dtype).astype(np.int64)
    return Rescale.of(AffineQuant((scale,), (0,)), frac).apply(codes - zero_point, None, out_dtype)


@functools.lru_cache(maxsize=None)
def div_table(max_count: int, den_shift: int) -> tuple[np.ndarray, np.ndarray, int]:
    """fx_div's reciprocals: for d = 1..max_count and den = d << den_shift,
    m_pos[d] = ceil(2**S / den), m_neg[d] = floor(2**S / den), S = bitlen(258 * den_max**2)
    (index 0 unused). Read-only arrays; the same for golden model and code generator."""
    s = (258 * (max_count << den_shift) ** 2).bit_length()
    den = [d << den_shift for d in range(1, max_count + 1)]
    m_pos = np.array([0] + [-((-1 << s) // v) for v in den], np.int64)
    m_neg = np.array([0] + [(1 << s) // v for v in den], np.int64)
    for t in (m_pos, m_neg):
        t.setflags(write=False)
    return m_pos, m_neg, s


@functools.lru_cache(maxsize=None)
def softmax_exp_table(in_frac: int, dtype: DType = I8) -> np.ndarray:
    """fx_softmax's exp table: entry k = round_half_up(exp(-k * 2**-in_frac) * 2**15) for
    k = max - x in 0..255 (i8 x), or for i16 x up to the first k whose entry is 0 (larger
    differences read that last entry) (int64, read-only)."""
    n = 256 if dtype is I8 else min(1 << 16, math.ceil(math.ldexp(16 * math.log(2), in_frac)) + 1)
    k = np.arange(n, dtype=np.float64)
    t = np.floor(np.ldexp(np.exp(-np.ldexp(k, -in_frac)), EXP_FRAC) + 0.5).astype(np.int64)
    t.setflags(write=False)
    return t


def _table_from_real(y: np.ndarray, out_frac: int, dtype=np.int8) -> np.ndarray:
    """round_half_up(y * 2**out_frac) saturated to ``dtype`` (NaN -> the minimum), read-only."""
    t = quantize_fixed(y, out_frac, dtype)
    t.setflags(write=False)
    return t


@functools.lru_cache(maxsize=None)
def _cached_table(op: str, in_frac: int, out_frac: int, attrs: tuple, in_dtype: str,
                  out_dtype: str) -> np.ndarray:
    info = np.iinfo(in_dtype)
    codes = np.ldexp(np.arange(info.min, info.max + 1, dtype=np.float64), -in_frac)
    with np.errstate(all="ignore"):
        return _table_from_real(get_op(op).real(codes, **dict(attrs)), out_frac, out_dtype)


def lut_table(op: str, in_frac_bits: int, out_frac_bits: int, in_dtype=np.int8,
              out_dtype=np.int8, **attrs) -> np.ndarray:
    """The table of LUT op ``op``, one entry per input code (256 for int8 input, 65536 for
    int16): entry i is the result for the code ``i + min(in_dtype)``, round_half_up(f(code *
    2**-in_frac_bits) * 2**out_frac_bits) in float64, saturated to ``out_dtype``. Attributes
    as the op takes them (defaults filled in). Cached, read-only."""
    full = get_op(op).check_attrs({**attrs, "out_frac_bits": out_frac_bits})
    rest = tuple(sorted((k, v) for k, v in full.items() if k not in ("out_frac_bits", "out_dtype")))
    return _cached_table(op, int(in_frac_bits), int(out_frac_bits), rest,
                         np.dtype(in_dtype).name, np.dtype(out_dtype).name)


def bilinear_taps(px: np.ndarray, py: np.ndarray, bits: int):
    """The 4 bilinear taps of Q(bits) pixel coordinates: (x index, y index, weight in
    Q(2*bits)); the weights of a sample sum to 2**(2*bits) exactly."""
    one = 1 << bits
    x0, ux = px >> bits, px & (one - 1)
    y0, uy = py >> bits, py & (one - 1)
    for xi, wx in ((x0, one - ux), (x0 + 1, ux)):
        for yi, wy in ((y0, one - uy), (y0 + 1, uy)):
            yield xi, yi, wx * wy


# ---- onnxruntime-exact ---------------------------------------------------------------------
def saturate_round(v: np.ndarray, zero_point, dtype, scratch: bool = False,
                   finite: bool = False) -> np.ndarray:
    """saturate(round_half_even(v) + zero_point) as MLAS does it: v (float32) clamped to
    [min - zp, max - zp] in float (NaN becomes the minimum), rounded to nearest even, zero
    point added. ``scratch``: v may be overwritten; ``finite``: v holds no NaN (one clip
    does the clamp)."""
    info = np.iinfo(dtype)
    zp = np.asarray(zero_point, np.int32)
    lo, hi = (info.min - zp).astype(F32), (info.max - zp).astype(F32)
    v = np.asarray(v)                                # a numpy scalar: a 0-d array
    same = scratch and np.broadcast_shapes(v.shape, lo.shape) == v.shape
    if finite:
        v = np.asarray(np.clip(v, lo, hi, out=v if same else None))
    else:                                            # fmax: NaN -> lo, as MAXPS(v, lo)
        v = np.asarray(np.fmax(v, lo, out=v if same else None))
        np.minimum(v, hi, out=v)
    np.rint(v, out=v)
    if zp.any():                                     # small integers: exact in float32
        v = np.add(v, zp.astype(F32), out=v if v.ndim >= zp.ndim else None)
    return v.astype(dtype)


def requantize(acc: np.ndarray, multiplier, zero_point, dtype) -> np.ndarray:
    """MlasRequantizeOutput: the int32 accumulator (given exact, in any numeric dtype)
    converted to float32, times the float32 multiplier, then saturate_round (the product
    is finite: a plain clamp)."""
    v = np.multiply(np.asarray(acc), np.asarray(multiplier, F32), dtype=F32)
    return saturate_round(v, zero_point, dtype, scratch=True, finite=True)


def conv_multiplier(xq: AffineQuant, wq: AffineQuant, yq: AffineQuant) -> np.ndarray:
    """onnxruntime's requantization multiplier, per output channel: float32 x_scale *
    w_scale, then divided by y_scale (float32 all along)."""
    return (F32(xq.scale[0]) * np.asarray(wq.scale, F32)) / F32(yq.scale[0])


def fma32(a, b, c) -> np.ndarray:
    """Fused multiply-add a*b + c of float32 values with one rounding (as the FMA3
    instruction): the float64 product is exact; the float64 sum is rounded to odd (its
    error recovered by TwoSum), which makes the final rounding to float32 correct."""
    p = np.asarray(a, F64) * np.asarray(b, F64)
    c = np.asarray(c, F64)
    p, c = np.broadcast_arrays(p, c)
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)
    even = (s.view(np.int64) & 1) == 0
    fix = (err != 0) & even
    if fix.any():
        s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(F32)


def lookup_table(xq: AffineQuant, yq: AffineQuant, dtype: np.dtype, fn) -> np.ndarray:
    """onnxruntime's QlinearBuildLookupTable: each of the 256 codes dequantized in float32
    ((code - zp) * scale), mapped by ``fn`` (float32 in, float32 out) and quantized
    (MlasQuantizeLinear: divide by y_scale, round half to even, add zp, saturate). Indexed
    by the code's byte (uint8 view)."""
    codes = np.arange(256, dtype=np.uint8).view(dtype)
    real = (codes.astype(np.int32) - xq.zero_point[0]).astype(F32) * F32(xq.scale[0])
    y = np.asarray(fn(real), F32)
    return saturate_round(y / F32(yq.scale[0]), yq.zero_point[0], dtype)


#: MlasLogisticConstants: the odd numerator's coefficients (alpha_9 .. alpha_1) and the
#: even denominator's (beta_10 .. beta_0), highest power first
_LOGISTIC_ALPHA = (4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05,
                   8.51377133304701e-03, 2.48287947061529e-01)


_LOGISTIC_BETA = (6.10247389755681e-13, 5.76102136993427e-09, 6.29106785017040e-06,
                  1.70198817374094e-03, 1.16817656904453e-01, 9.93151921023180e-01)


def mlas_logistic(x: np.ndarray) -> np.ndarray:
    """MlasLogisticKernelFma3 (LogisticKernelFma3.S, the kernel onnxruntime runs on x86-64
    with FMA): clamp to [-18, 18]; p(x) = x * poly(x**2) and q(x) = poly(x**2), each
    Horner step one float32 FMA; p / q + 0.5; clamped below at 0."""
    x = np.minimum(np.maximum(np.asarray(x, F32), F32(-18.0)), F32(18.0))
    x2 = x * x

    def horner(coefficients):
        acc = F32(coefficients[0])
        for k in coefficients[1:]:
            acc = fma32(x2, acc, F32(k)).astype(F32)
        return acc

    p = x * horner(_LOGISTIC_ALPHA)
    q = horner(_LOGISTIC_BETA)
    return np.maximum(p / q + F32(0.5), F32(0.0))
