"""Native kernels of the golden model: loops that numpy can only run as many passes over
memory (a depthwise convolution is a multiply and an add per tap, each a pass), written in C
(``kernels.c``), built once per machine by the system C compiler and cached beside the
codegen's kernels.

A native kernel performs the IEEE operations of the numpy code it stands in for, in the same
order, built without FMA contraction or fast math, so every number comes out with the same
bits (tests/test_native.py holds both paths to that; a NaN stays a NaN in the same place, but
where two NaNs meet in one add, which one's sign survives is the compiler's choice). A
self-check on special values runs when the library loads; where it fails, where no C compiler
works, or with ``BEVIR_NATIVE=0``, the numpy code runs.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import shlex
import subprocess
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from math import prod
from pathlib import Path

import numpy as np

from ...fsutil import atomic_path, run_child
from ..common import check_windows

SOURCE = Path(__file__).with_name("kernels.c")

#: -march=native: the build is this machine's (its key holds the compiler's target macros);
#: no FMA contraction and no fast math keep every multiply and add rounded as numpy rounds
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared"]

#: seconds a build may take
BUILD_TIMEOUT = 300

_BUILD_LOCK = threading.Lock()


def cache_dir() -> Path:
    """Where built kernels are kept (these and the codegen's): $BEVIR_CACHE, else
    ~/.cache/bevir/kernels."""
    root = os.environ.get("BEVIR_CACHE") or Path.home() / ".cache" / "bevir"
    path = Path(root) / "kernels"
    path.mkdir(parents=True, exist_ok=True)
    return path


def enabled() -> bool:
    """Native kernels run unless ``BEVIR_NATIVE=0`` (read at each call) or the build or its
    self-check failed."""
    return os.environ.get("BEVIR_NATIVE", "1") != "0" and library() is not None


class _Unavailable(Exception):
    """Why the native kernels cannot run here."""


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    try:
        done = run_child(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT, **kw)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise _Unavailable(f"{cmd[0]}: {e}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise _Unavailable(f"{cmd[0]}: {last}")
    return done


def _build() -> ctypes.CDLL:
    """Build (or find in the cache) and load the kernels."""
    cc = shlex.split(os.environ.get("CC", "cc"))
    # the compiler's predefined macros name its version and the processor's features
    target = _run([*cc, *FLAGS[:2], "-E", "-dM", "-x", "c", os.devnull]).stdout
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join([*cc, *FLAGS]).encode()
                         + target.encode()).hexdigest()[:20]
    try:
        lib = cache_dir() / f"golden_native_{key}.so"
        if not lib.exists():
            with atomic_path(lib) as tmp:
                _run([*cc, *FLAGS, str(SOURCE), "-o", str(tmp)])
        return ctypes.CDLL(str(lib))
    except OSError as e:
        raise _Unavailable(str(e)) from None


@functools.cache
def library() -> ctypes.CDLL | None:
    """The built kernels (built on first use, once per process), or None, with one warning,
    where they cannot be built or loaded or fail their self-check."""
    with _BUILD_LOCK:
        try:
            dll = _build()
            for name in _KERNELS:
                getattr(dll, name).restype = ctypes.c_int
            dll.bevir_gather_gemm_f32.argtypes = [ctypes.c_void_p] * 8 + [
                ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
            dll.bevir_activation_f32.argtypes = [ctypes.c_void_p] * 3
            dll.bevir_gelu_erf_a_f32.argtypes = [ctypes.c_void_p] * 5
            dll.bevir_gelu_erf_b_f32.argtypes = [ctypes.c_void_p] * 6
            dll.bevir_sigmoid_a_f32.argtypes = [ctypes.c_void_p] * 3
            dll.bevir_sigmoid_b_f32.argtypes = [ctypes.c_void_p] * 4
            dll.bevir_depthwise_conv_f32.argtypes = [ctypes.c_void_p] * 5 + [
                ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
            dll.bevir_layer_norm_f32.argtypes = [ctypes.c_void_p] * 6
            dll.bevir_global_mean_f32.argtypes = [ctypes.c_void_p] * 4
            dll.bevir_batch_norm_f32.argtypes = [ctypes.c_void_p] * 4
            dll.bevir_join_rows.argtypes = [ctypes.c_void_p] * 4
            _self_check(dll)
            return dll
        except _Unavailable as e:
            warnings.warn(f"the golden model's native kernels are off ({e}); running numpy "
                          "code instead", RuntimeWarning, stacklevel=4)
            return None


def has_vnni() -> bool:
    """The native kernels run and their build has AVX512-VNNI (the self-check found out)."""
    return enabled() and library().vnni


def address(a: np.ndarray) -> int:
    """The address of ``a``'s data for a kernel call (the caller keeps ``a`` alive): read
    through a ctypes view of its buffer where it is C-contiguous, writable and not empty,
    a third of what ``a.ctypes.data`` costs (it builds an object: a microsecond, paid
    twice or thrice by every small kernel call), else from ``a.ctypes``."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError, BufferError):
        return a.ctypes.data


def _pointers(*arrays: np.ndarray) -> list[ctypes.c_void_p]:
    """The data pointers of ``arrays`` for a kernel call (the caller keeps them alive)."""
    return [ctypes.c_void_p(address(a)) for a in arrays]


_F32 = np.dtype(np.float32)
#: the activation code (see activation_code) of no activation
NO_ACTIVATION = (-1, None)

#: the C type of each kernel's arrays, by numpy dtype
_SUFFIX = {np.dtype(t): name for t, name in [
    (np.float32, "f32"), (np.float64, "f64"), (np.int8, "i8"), (np.uint8, "u8"),
    (np.int16, "i16"), (np.int32, "i32")]}
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_KERNELS = [f"bevir_depthwise_{_SUFFIX[t]}" for t in _FLOATS] + [
    f"bevir_maxpool_{suffix}" for suffix in _SUFFIX.values()] + [
    "bevir_gather_mac_i8", "bevir_gather_mac_i16", "bevir_u8s8_gemm", "bevir_gather_gemm_f32",
    "bevir_resize_bilinear_f32", "bevir_activation_f32", "bevir_depthwise_conv_f32",
    "bevir_gelu_erf_a_f32", "bevir_gelu_erf_b_f32", "bevir_sigmoid_a_f32",
    "bevir_sigmoid_b_f32", "bevir_im2col_u32", "bevir_layer_norm_f32",
    "bevir_global_mean_f32", "bevir_batch_norm_f32", "bevir_join_rows"] + [
    f"bevir_transpose_u{8 * w}" for w in (1, 2, 4, 8)]


def _call(dll, name: str, arrays: list[np.ndarray], out: np.ndarray, kernel, strides,
          dilations) -> bool:
    """Run kernel ``name`` of ``dll`` on padded NHWC ``arrays[0]`` (and the other operands)
    into ``out`` [N, OH, OW, C]: False where it could not run (its tap offsets could not be
    allocated)."""
    n, hp, wp, c = arrays[0].shape
    oh, ow = out.shape[1:3]
    if out.shape[0] != n or out.shape[3] != c:
        raise ValueError(f"{name}: {arrays[0].shape} cannot make {out.shape}")
    check_windows((hp, wp), (oh, ow), kernel, strides, dilations)
    arrays = [contiguous(np.asarray(a, out.dtype)) for a in arrays]
    dims = (ctypes.c_int64 * 12)(n, hp, wp, c, oh, ow, *kernel, *strides, *dilations)
    return getattr(dll, name)(*_pointers(*arrays, out), dims) == 0


def _window_kernel(name: str, arrays: list[np.ndarray], out: np.ndarray, kernel, strides,
                   dilations, dtypes=tuple(_SUFFIX)) -> bool:
    """:func:`_call` with kernel ``bevir_<name>_<type>`` of the built library: False,
    writing nothing, where no native kernel takes ``out``'s dtype or the kernels are off."""
    if (out.dtype not in dtypes or arrays[0].dtype != out.dtype or not out.flags.c_contiguous
            or not out.size or not enabled()):
        return False
    return _call(library(), f"bevir_{name}_{_SUFFIX[out.dtype]}", arrays, out, kernel,
                 strides, dilations)


def depthwise(xp: np.ndarray, wt: np.ndarray, out: np.ndarray, kernel, strides,
              dilations) -> bool:
    """``out`` [N, OH, OW, C] = the depthwise convolution of padded NHWC ``xp`` with the
    tap-major weights ``wt`` [KH*KW, C], summed tap by tap (kernels.conv.depthwise_conv_nhwc).
    Returns False, writing nothing, where no native kernel takes these dtypes."""
    if wt.shape != (kernel[0] * kernel[1], out.shape[3]):
        raise ValueError(f"depthwise: weights {wt.shape} do not fit {kernel} windows of "
                         f"{out.shape[3]} channels")
    return _window_kernel("depthwise", [xp, wt], out, kernel, strides, dilations, _FLOATS)


def im2col(xp: np.ndarray, kernel, out_hw, strides, dilations, groups: int
           ) -> np.ndarray | None:
    """The group-major windows [G, N, OH, OW, KH, KW, C/G] of padded NHWC ``xp``
    (kernels.conv.im2col_nhwc) of 4-byte elements, copied natively (numpy copies runs of a few
    channels slowly); None where the kernels are off or the elements are of another width."""
    n, hp, wp, c = xp.shape
    if xp.dtype.itemsize != 4 or c % groups or not enabled():
        return None
    check_windows((hp, wp), out_hw, kernel, strides, dilations)
    xp = np.ascontiguousarray(xp)
    out = np.empty((groups, n, *out_hw, *kernel, c // groups), xp.dtype)
    dims = (ctypes.c_int64 * 13)(n, hp, wp, c, *out_hw, *kernel, *strides, *dilations, groups)
    if out.size and library().bevir_im2col_u32(*_pointers(xp, out), dims) != 0:
        raise MemoryError("im2col: no memory for the tap offsets")
    return out


def _check_bound(name: str, a: np.ndarray, fits: bool, out: np.ndarray, out_shape,
                 addend: np.ndarray | None = None) -> None:
    """A bound kernel's check of each call: C-contiguous float32 operands, ``a`` one that
    ``fits``, ``out`` writable and of ``out_shape``, ``addend`` (where given) of its shape
    (else ValueError)."""
    if not (fits and a.dtype == _F32 and a.flags.c_contiguous and out.shape == out_shape
            and out.dtype == _F32 and out.flags.c_contiguous and out.flags.writeable
            and (addend is None or addend.shape == out.shape and addend.dtype == _F32
                 and addend.flags.c_contiguous)):
        raise ValueError(f"{name}: operands {a.shape} {a.dtype} -> {out.shape} {out.dtype} do "
                         f"not fit (C-contiguous float32 -> {out_shape})")


def bind_depthwise(shape: tuple[int, ...], wt: np.ndarray, bias: np.ndarray | None,
                   out_shape: tuple[int, ...], kernel, strides, pads, dilations,
                   activation: tuple[int, int | None] = NO_ACTIVATION
                   ) -> Callable[[np.ndarray, np.ndarray], None] | None:
    """:func:`depthwise` of float32 operands padded with +0 by ``pads`` (top, left, bottom,
    right), then ``bias`` [C] (or None) added to each pixel and ``activation`` (an
    :func:`activation_code`) applied, in one native call (the numpy path's operations on
    the padded copy, conv2d's y += b, the activation op's code) that reads the padding's
    zeros without copying the input into it: for unpadded inputs of ``shape`` with the
    weights, bias and activation checked once, a function of C-contiguous float32 ``x``
    and ``out`` (and an ``addend`` laid out as ``out``, added after the bias, ``addend +
    y`` where ``first``: an add that reads the result, in its operand order); None where
    no native kernel runs."""
    if not (wt.dtype == _F32 and (bias is None or bias.dtype == _F32) and enabled()):
        return None
    n, h, w, c = shape
    oh, ow = out_shape[1:3]
    top, left, bottom, right = pads
    if (tuple(out_shape) != (n, oh, ow, c) or wt.shape != (kernel[0] * kernel[1], c)
            or (bias is not None and bias.shape != (c,))):
        raise ValueError(f"depthwise: {shape} with weights {wt.shape} and bias "
                         f"{None if bias is None else bias.shape} cannot make {out_shape}")
    check_windows((top + h + bottom, left + w + right), (oh, ow), kernel, strides, dilations)
    wt = np.ascontiguousarray(wt)
    bias = None if bias is None else np.ascontiguousarray(bias)
    fn = library().bevir_depthwise_conv_f32
    fixed = (wt.ctypes.data, None if bias is None else bias.ctypes.data)
    # bands of output rows, one a thread, each reading the rows of x its windows reach
    parts = shares(n * oh * ow * c * kernel[0] * kernel[1])
    pieces = [(0, 0, n, 0, oh)] if parts == 1 else [
        (4 * b * h * w * c, 4 * b * oh * ow * c, 1, y0, y1)
        for b in range(n) for y0, y1 in bands(oh, parts)]
    dims = [(ctypes.c_int64 * 16)(images, h, w, c, oh, ow, *kernel, *strides, *dilations,
                                  top, left, y0, y1) for _, _, images, y0, y1 in pieces]
    calls = [(x_at, out_at, ctypes.addressof(d)) for (x_at, out_at, *_), d in zip(pieces, dims)]
    sets = [calls[i::parts] for i in range(min(parts, len(calls)))]
    keep = (wt, bias, dims)                      # alive while the function is
    shape, out_shape = tuple(shape), tuple(out_shape)

    def run(x: np.ndarray, out: np.ndarray, addend: np.ndarray | None = None,
            first: bool = False, _keep=keep) -> None:
        _check_bound("depthwise", x, x.shape == shape, out, out_shape, addend)
        if not out.size:
            return
        xp, op, ap = address(x), address(out), None if addend is None else address(addend)
        if len(sets) == 1:                        # one thread: no pool, no partials
            bands_of(xp, op, ap, first, sets[0])
        else:
            parallel([functools.partial(bands_of, xp, op, ap, first, c) for c in sets])

    def bands_of(xp: int, op: int, ap: int | None, first: bool, calls) -> None:
        for x_at, out_at, d in calls:
            if fn(xp + x_at, *fixed, op + out_at, d, *activation,
                  None if ap is None else ap + out_at, first) != 0:
                raise MemoryError("depthwise: no memory for the tap offsets")
    return run


def maxpool(xp: np.ndarray, out: np.ndarray, kernel, strides, dilations) -> bool:
    """``out`` [N, OH, OW, C] = the window maxima of NHWC ``xp`` (padded with its dtype's
    lowest value), tap by tap as numpy's maximum takes them (nn.MaxPool2d). Returns False,
    writing nothing, where no native kernel takes the dtype."""
    return _window_kernel("maxpool", [xp], out, kernel, strides, dilations)


def gather_mac(v: np.ndarray, idx: np.ndarray, cw: np.ndarray, acc: np.ndarray) -> bool:
    """``acc[..., :] += v[idx[..., p]] * cw[..., p]`` for every tap p, in wrapping int32
    arithmetic (fx_ms_deform_attn's sampling): ``v`` [V, D] int8/int16 rows, ``idx`` and
    ``cw`` [..., P] (indices into v, int32 weights), ``acc`` [..., D] int32, C-contiguous,
    updated in place (an index outside v raises ValueError first). Returns False, touching
    nothing, where no native kernel takes the operands."""
    suffix = _SUFFIX.get(v.dtype)
    if (suffix not in ("i8", "i16") or acc.dtype != np.int32 or not acc.flags.c_contiguous
            or not acc.flags.writeable or idx.dtype.kind not in "iu" or cw.dtype.kind not in "iu"
            or not enabled()):
        return False
    depth = acc.shape[-1]
    if (v.ndim != 2 or v.shape[1] != depth or idx.shape != cw.shape
            or idx.shape[:-1] != acc.shape[:-1]
            or (idx.size and (idx.min() < 0 or idx.max() >= v.shape[0]))):
        raise ValueError(f"gather_mac: indices {idx.shape} into {v.shape} do not fit "
                         f"{acc.shape}")
    v, cw = np.ascontiguousarray(v), np.ascontiguousarray(cw, np.int32)
    idx = np.ascontiguousarray(idx, np.int64)
    dims = (ctypes.c_int64 * 3)(acc.size // max(depth, 1), idx.shape[-1], depth)
    return getattr(library(), f"bevir_gather_mac_{suffix}")(
        *_pointers(v, idx, cw, acc), dims) == 0


#: the activations bevir_activation_f32 applies, by op name: kind, and the parameters
#: from the op's attributes
_ACTIVATIONS = {
    "relu": (0, lambda a: (0.0, 0.0)),
    "clip": (1, lambda a: (-np.inf if a["min"] is None else a["min"],
                           np.inf if a["max"] is None else a["max"])),
    "hardsigmoid": (2, lambda a: (a["alpha"], a["beta"])),
    "hardswish": (3, lambda a: (1 / 6, 0.5)),
}


@functools.lru_cache(maxsize=None)
def _parameters(p0: float, p1: float) -> tuple[np.ndarray, int]:
    """An activation's float32 parameters, kept alive with their address."""
    p = np.array([p0, p1], np.float32)
    p.setflags(write=False)
    return p, p.ctypes.data


def activation_code(op: str, attrs) -> tuple[int, int | None] | None:
    """(kind, address of the float32 parameters) of activation ``op`` with attributes
    ``attrs`` for the native kernels (``none``: NO_ACTIVATION); None where they cannot
    apply it (another op, kernels off or failing their self-check)."""
    if op == "none":
        return NO_ACTIVATION
    spec = _ACTIVATIONS.get(op)
    if spec is None or not enabled() or not library().activations:
        return None
    kind, params = spec
    return kind, _parameters(*params(attrs))[1]


def activation(op: str, attrs, y: np.ndarray) -> bool:
    """Apply activation ``op`` (its attributes ``attrs``) to float32 ``y`` in place, as
    its numpy code computes it: False, touching nothing, where no native kernel takes it
    (another op or dtype, a view whose elements do not fill one block, kernels off). An
    elementwise pass: a transposed view (a channel-major convolution's NHWC result) runs in
    its memory's order, which numpy's loop over the view would take elementwise, slowly."""
    return activate(activation_code(op, attrs), y)


def activate(code: tuple[int, int | None] | None, y: np.ndarray) -> bool:
    """:func:`activation` by its :func:`activation_code` (None: no native kernel takes it),
    found once for a prepared product: False, touching nothing, where it does not run."""
    if code is None or y.dtype != np.float32 or not y.flags.writeable:
        return False
    block = y if y.flags.c_contiguous else y.transpose(np.argsort(y.strides)[::-1])
    if not block.flags.c_contiguous:
        return False
    dims = (ctypes.c_int64 * 2)(y.size, code[0])
    library().bevir_activation_f32(address(block), code[1], ctypes.addressof(dims))
    return True


#: elements per block of the native GELU and sigmoid: their temporaries stay in cache
GELU_BLOCK = 1 << 16


def sigmoid(x: np.ndarray, silu: bool = False) -> np.ndarray | None:
    """Sigmoid of float32 ``x`` (times ``x`` where ``silu``) as elementwise._sigmoid
    computes it: its arithmetic natively around numpy's own exp. None where no native
    kernel runs."""
    return _around_exp(x, "sigmoid", (np.float32,), flag=int(silu))


def gelu_erf(x: np.ndarray, constants: Sequence[float]) -> np.ndarray | None:
    """GELU (erf form) of float32 ``x`` as elementwise._gelu computes it: its float64
    arithmetic natively around numpy's own exp. ``constants``: sqrt(2), then the erfc
    polynomial's coefficients from the leading one, then its constant term. None where no
    native kernel runs."""
    return _around_exp(x, "gelu_erf", (np.float64, np.float64),
                       constants=np.array(constants, np.float64))


#: what an element of GELU or sigmoid costs, in multiply-adds (for :func:`shares`)
EXP_WORK = 16


def _around_exp(x: np.ndarray, name: str, temporaries, flag: int = 0,
                constants: np.ndarray | None = None) -> np.ndarray | None:
    """Kernels ``bevir_<name>_a_f32`` and ``_b_f32`` of float32 ``x``, block by block:
    the first writes the temporaries (exp's argument first), numpy's exp takes that in
    place, the second writes the result. dims: the block's length, ``flag``. The blocks
    are shared among threads (numpy's exp lets go of the GIL too), each with its own
    temporaries: every element's operations are the same."""
    if x.dtype != _F32 or not enabled():
        return None
    flat = contiguous(x).reshape(-1)          # a transposed view copied natively
    out = np.empty_like(flat)
    dll = library()
    first, second = (getattr(dll, f"bevir_{name}_{p}_f32") for p in "ab")
    extra = () if constants is None else (constants.ctypes.data,)
    parts = shares(flat.size * EXP_WORK)
    block = max(1, min(GELU_BLOCK, -(-flat.size // parts)))
    # addresses taken once: a block's are its offsets from them (an array's .ctypes costs
    # microseconds, a block's kernels tens)
    xp, op = address(flat), address(out)

    def blocks(starts: range) -> None:
        temps = [np.empty(min(block, flat.size), t) for t in temporaries]
        tp = [address(t) for t in temps]
        dims = (ctypes.c_int64 * 2)(0, flag)
        for i in starts:
            n = dims[0] = min(block, flat.size - i)
            first(xp + 4 * i, *tp, ctypes.addressof(dims), *extra)
            np.exp(temps[0][:n], out=temps[0][:n])
            second(xp + 4 * i, *tp, op + 4 * i, ctypes.addressof(dims), *extra)
    starts = range(0, flat.size, block)
    parallel([functools.partial(blocks, starts[i::parts]) for i in range(min(parts, len(starts)))])
    return out.reshape(x.shape)


def batch_norm(x: np.ndarray, axis: int, params: np.ndarray) -> np.ndarray | None:
    """kernels.norm.batch_norm's arithmetic on C-contiguous float32 ``x`` per channel of
    ``axis``, natively in one pass (numpy's code makes four over memory): ``params`` [4, C]
    float32: mean, sqrt(var + epsilon), scale, bias. None where no native kernel runs."""
    if not (x.dtype == _F32 and x.flags.c_contiguous and enabled()):
        return None
    params = np.ascontiguousarray(params, np.float32)
    out = np.empty_like(x)
    dims = (ctypes.c_int64 * 3)(prod(x.shape[:axis]), x.shape[axis], prod(x.shape[axis + 1:]))
    if x.size:
        library().bevir_batch_norm_f32(address(x), address(params), address(out), dims)
    return out


def global_mean(x: np.ndarray, channels_last: bool) -> np.ndarray | None:
    """kernels.pool.mlas_global_mean of C-contiguous float32 ``x`` [N, S, C] (channels last)
    or [N, C, S]: onnxruntime's four lanes and their order, natively, [N, C]; None where no
    native kernel runs (numpy's reductions cost more in calls than in adds on the small
    maps of squeeze-excite blocks)."""
    if not (x.dtype == _F32 and x.ndim == 3 and x.flags.c_contiguous and enabled()):
        return None
    n, s, c = x.shape if channels_last else (x.shape[0], x.shape[2], x.shape[1])
    out, lanes = np.empty((n, c), np.float32), np.empty((4, c), np.float32)
    library().bevir_global_mean_f32(*_pointers(x, out, lanes),
                                    (ctypes.c_int64 * 4)(n, s, c, int(channels_last)))
    return out


#: what an element of a layer normalization costs, in multiply-adds (for :func:`shares`)
LAYER_NORM_WORK = 8


def layer_norm(x: np.ndarray, scale: np.ndarray | None, bias: np.ndarray | None,
               epsilon: float) -> np.ndarray | None:
    """Layer normalization over the last axis of C-contiguous float32 ``x`` as
    kernels.norm's numpy code computes it (numpy's pairwise sums, in float32), ``scale``
    and ``bias`` float32 [C] or None: the same bits, in bands of rows, one a thread. None
    where no native kernel runs."""
    c = x.shape[-1] if x.ndim else 0
    if not (x.dtype == _F32 and x.flags.c_contiguous and c and x.size and enabled()
            and all(p is None or (p.dtype == _F32 and p.shape == (c,) and p.flags.c_contiguous)
                    for p in (scale, bias))):
        return None
    rows, out = x.size // c, np.empty_like(x)
    fn, xp, op = library().bevir_layer_norm_f32, address(x), address(out)
    sp, bp = (None if p is None else p.ctypes.data for p in (scale, bias))
    eps = _parameters(epsilon, 0.0)[1]         # float32(epsilon), as numpy's code adds it

    def band(top: int, bottom: int) -> None:
        dims = (ctypes.c_int64 * 2)(bottom - top, c)
        if fn(xp + 4 * top * c, sp, bp, op + 4 * top * c, ctypes.addressof(dims), eps) != 0:
            raise MemoryError("layer_norm: no memory for the squares")
    parallel([functools.partial(band, *rows_)
              for rows_ in bands(rows, min(rows, shares(x.size * LAYER_NORM_WORK)))])
    return out


#: below this many elements numpy's own transposition is as fast
SWAP_MIN_SIZE = 4096


def swap_last_axes(x: np.ndarray) -> np.ndarray | None:
    """``np.ascontiguousarray(x.swapaxes(-1, -2))`` of a C-contiguous 3-D ``x`` in 16 x 16
    tiles (numpy copies a transposition with a short axis element by element, slowly): the
    same bits, or None where no native kernel runs or ``x`` is too small to gain."""
    width = x.dtype.itemsize
    if (x.ndim != 3 or not x.flags.c_contiguous or width not in (1, 2, 4, 8)
            or x.size < SWAP_MIN_SIZE or not enabled()):
        return None
    out = np.empty(x.shape[:1] + x.shape[:0:-1], x.dtype)
    dims = (ctypes.c_int64 * 3)(*x.shape)
    getattr(library(), f"bevir_transpose_u{8 * width}")(*_pointers(x, out), dims)
    return out


#: below this many bytes a row of one operand, numpy's own concatenation is as fast
JOIN_MAX_WIDTH = 128


def join(xs: Sequence[np.ndarray], axis: int) -> np.ndarray | None:
    """``np.concatenate(xs, axis)`` of C-contiguous arrays of one dtype, natively where the
    operands' runs along ``axis`` and after it are short (numpy copies runs of a few
    channels element by element): the same bits, or None where no native kernel runs or
    numpy would copy as fast."""
    x = xs[0]
    if x.ndim == 0 or not enabled():
        return None
    axis = axis % x.ndim
    rows = prod(x.shape[:axis])
    widths = [prod(a.shape[axis:]) * a.itemsize for a in xs]
    if (rows < 2 or max(widths) > JOIN_MAX_WIDTH
            or not all(a.dtype == x.dtype and a.flags.c_contiguous and a.ndim == x.ndim
                       and a.shape[:axis] == x.shape[:axis] and a.shape[axis + 1:]
                       == x.shape[axis + 1:] for a in xs)):
        return None
    out = np.empty(x.shape[:axis] + (sum(a.shape[axis] for a in xs),) + x.shape[axis + 1:],
                   x.dtype)
    if out.size:
        library().bevir_join_rows((ctypes.c_void_p * len(xs))(*(address(a) for a in xs)),
                                  (ctypes.c_int64 * len(xs))(*widths), address(out),
                                  (ctypes.c_int64 * 2)(rows, len(xs)))
    return out


def contiguous(x: np.ndarray) -> np.ndarray:
    """``np.ascontiguousarray(x)``, through :func:`swap_last_axes` where ``x`` is a 4-D view
    of the other layout's memory (NHWC of NCHW, or NCHW of NHWC: a transposed convolution
    result), which numpy copies element by element: the same values."""
    if x.flags.c_contiguous or x.ndim != 4:
        return np.ascontiguousarray(x)
    n, a, b, c = x.shape
    if x.transpose(0, 3, 1, 2).flags.c_contiguous:          # NHWC view of NCHW memory
        y = swap_last_axes(x.transpose(0, 3, 1, 2).reshape(n, c, a * b))
    elif x.transpose(0, 2, 3, 1).flags.c_contiguous:        # NCHW view of NHWC memory
        y = swap_last_axes(x.transpose(0, 2, 3, 1).reshape(n, b * c, a))
    else:
        y = None
    return np.ascontiguousarray(x) if y is None else y.reshape(x.shape)


def resize_bilinear(x: np.ndarray, taps: tuple[np.ndarray, ...], weights: tuple[np.ndarray, ...],
                    out: np.ndarray) -> bool:
    """``out`` [outer, OH, OW, inner] = the bilinear resize of float32 ``x`` [outer, H, W,
    inner] (kernels.resize.resize_bilinear_f32's sums): ``taps`` = (yl, yh, xl, xh) input indices,
    ``weights`` = (wy1, wy2, wx1, wx2) float32 distances, per output row and column.
    Returns False, writing nothing, where no native kernel runs (an index outside x
    raises ValueError)."""
    if x.dtype != _F32 or out.dtype != _F32 or not out.flags.c_contiguous or not enabled():
        return False
    outer, h, w, inner = x.shape
    oh, ow = out.shape[1:3]
    yl, yh, xl, xh = taps
    if (out.shape != (outer, oh, ow, inner) or not yl.shape == yh.shape == (oh,)
            or not xl.shape == xh.shape == (ow,) or any(t.min(initial=0) < 0 for t in taps)
            or max(yl.max(initial=0), yh.max(initial=0)) >= h
            or max(xl.max(initial=0), xh.max(initial=0)) >= w):
        raise ValueError(f"resize_bilinear: taps do not fit {x.shape} -> {out.shape}")
    x = np.ascontiguousarray(x)
    t = np.concatenate(taps).astype(np.int64)
    wt = np.concatenate(weights).astype(_F32)
    dims = (ctypes.c_int64 * 6)(outer, h, w, inner, oh, ow)
    return library().bevir_resize_bilinear_f32(*_pointers(x, t, wt, out), dims) == 0


def threads() -> int:
    """The threads BLAS runs on (OPENBLAS_NUM_THREADS, else OMP_NUM_THREADS, else the
    processors this process may use): the large native products and depthwise convolutions
    run on as many (:func:`parallel`)."""
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


#: the least work (multiply-adds) a thread of :func:`parallel` is given: handing calls to
#: the workers and waiting for them costs ~20 us, what one thread takes for ~1 M of them
PARALLEL_WORK = 1 << 21


class _Worker:
    """A thread that runs the calls handed to it, one at a time, through two locks: a
    third of an executor's handoff (~20 us against ~60 us: no future, no queue)."""

    def __init__(self) -> None:
        self._go, self._done = threading.Lock(), threading.Lock()
        self._go.acquire()
        self._done.acquire()
        self._call: Callable[[], object] | None = None
        self._error: BaseException | None = None
        threading.Thread(target=self._serve, name="bevir-native", daemon=True).start()

    def _serve(self) -> None:
        while True:
            self._go.acquire()
            try:
                self._call()
            except BaseException as e:          # raised again in the caller's thread
                self._error = e
            self._done.release()

    def start(self, call: Callable[[], object]) -> None:
        self._call = call
        self._go.release()

    def join(self) -> None:
        self._done.acquire()
        self._call, error, self._error = None, self._error, None
        if error is not None:
            raise error


#: the worker threads of :func:`parallel` (this one runs a share too), made on first use,
#: and the lock of the caller using them
_WORKERS: list[_Worker] = []
_WORKERS_HELD = [threading.Lock()]


def _forget_workers() -> None:
    # a forked child has none of its parent's threads: it makes its own workers
    _WORKERS.clear()
    _WORKERS_HELD[0] = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_workers)


def shares(work: int) -> int:
    """How many threads a native call of ``work`` multiply-adds is split over: up to
    :func:`threads`, each given at least :data:`PARALLEL_WORK`."""
    if work < 2 * PARALLEL_WORK:
        return 1                            # without asking threads(): microseconds
    return max(1, min(threads(), work // PARALLEL_WORK))


def parallel(calls: Sequence[Callable[[], object]]) -> None:
    """Run ``calls`` at once, each on its own thread (this one runs the first): native
    calls writing apart, which let go of the GIL while they run (ctypes does), so each
    result is what the call alone would write. While another thread's calls hold the
    workers, these run one after the other here. Every call has ended when this returns
    or raises (the first error)."""
    held = _WORKERS_HELD[0]
    if len(calls) < 2 or not held.acquire(blocking=False):
        for call in calls:                  # one call, or another thread has the workers
            call()
        return
    _SPLITS[0] += 1
    try:
        while len(_WORKERS) < len(calls) - 1:
            _WORKERS.append(_Worker())
        workers = _WORKERS[:len(calls) - 1]
        for worker, call in zip(workers, calls[1:]):
            worker.start(call)
        errors = []
        for run in [calls[0], *(w.join for w in workers)]:   # every call ends before
            try:                                               # its buffers are reused
                run()
            except BaseException as e:
                errors.append(e)
        if errors:
            raise errors[0]
    finally:
        held.release()


#: native calls split over threads so far (:func:`parallel`)
_SPLITS = [0]


def splits() -> int:
    """How many native calls were split over threads so far: a golden run that sees the
    count grow holds BLAS to one thread in its graph's later runs (:func:`serial_blas`)."""
    return _SPLITS[0]


#: the golden runs under way that hold BLAS to one thread, and what restores its threads
_SERIAL_BLAS: list = [0, None]
_SERIAL_LOCK = threading.Lock()


@functools.cache
def _blas_pools():
    """The BLAS libraries loaded (threadpoolctl's view of them), found once."""
    from threadpoolctl import ThreadpoolController
    return ThreadpoolController().select(user_api="blas")


@contextlib.contextmanager
def serial_blas(hold: bool = True) -> Iterator[None]:
    """With ``hold``, while a golden run whose native calls split over :func:`threads` is
    under way: BLAS on the calling thread only. Idle BLAS workers wait for work spinning
    (OpenBLAS: ~0.1 s after each call) on the cores the native kernels' threads need: with
    both, resnet18 ran slower on 2 threads than on 1. A run with no split keeps BLAS's
    threads (they are cheaper to start than :func:`parallel`'s). BLAS splits a product by
    rows and columns, never its sums: the same bits on any number of threads. Runs on
    several threads at once share one hold; the last one out restores BLAS."""
    if not hold or threads() < 2 or not enabled():
        yield
        return
    with _SERIAL_LOCK:
        if not _SERIAL_BLAS[0]:
            _SERIAL_BLAS[1] = _blas_pools().limit(limits=1)
        _SERIAL_BLAS[0] += 1
    try:
        yield
    finally:
        with _SERIAL_LOCK:
            _SERIAL_BLAS[0] -= 1
            if not _SERIAL_BLAS[0]:
                _SERIAL_BLAS[1].restore_original_limits()


def bands(n: int, parts: int, multiple: int = 1) -> list[tuple[int, int]]:
    """``range(n)`` cut into up to ``parts`` consecutive (start, stop) bands of about
    equal size, the inner bounds multiples of ``multiple`` (empty bands left out)."""
    bounds = [0] + [min(n, round(n * i / parts / multiple) * multiple)
                    for i in range(1, parts)] + [n]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


class GatherGemm:
    """The float32 product ``out`` [M, N] = A @ b [K, N] (+ bias [N]) of one shape, A's
    element (m, k) read from a flat operand at ``rows[m] + offs[k]``, each sum of products
    fused-multiply-added in k order onto +0, in ``blocks`` (boundaries [0, ..., K]: the
    blocks' sums added in order; one block by default): ``bevir_gather_gemm_f32``, how an
    FMA kernel of BLAS sums (whether BLAS sums a given shape so is for :func:`agrees` to
    find; :func:`blas_blocks` gives its blocks of a long reduction). A
    convolution's rows are its output pixels' first window elements and its offsets the
    taps' distances from them, so it runs without an im2col copy. The offsets are checked
    once, against the operand size they are made for; :meth:`of` gives None where the
    kernel cannot run."""

    def __init__(self, rows: np.ndarray, offs: np.ndarray, size: int, n: int, groups: int = 1,
                 group_stride: int = 0, blocks: np.ndarray | None = None,
                 transposed_by: int = 0):
        rows, offs = (np.ascontiguousarray(i, np.int64) for i in (rows, offs))
        k = offs.size
        blocks = np.ascontiguousarray([0, k] if blocks is None else blocks, np.int64)
        last = (groups - 1) * group_stride
        if rows.ndim != 1 or offs.ndim != 1 or groups < 1 or group_stride < 0 or (
                rows.size and offs.size and (rows.min() < 0 or offs.min() < 0
                                             or rows.max() + offs.max() + last >= size)):
            raise ValueError(f"GatherGemm: offsets outside the {size} elements of the operand")
        if blocks.ndim != 1 or blocks.size < 2 or blocks[0] != 0 or blocks[-1] != k or np.any(
                np.diff(blocks) < 0):
            raise ValueError(f"GatherGemm: blocks {blocks.tolist()} do not split {k} products")
        if transposed_by and (groups != 1 or blocks.size != 2 or rows.size % transposed_by):
            raise ValueError("GatherGemm: only one group summed in one block is written "
                             f"transposed, by whole images of {transposed_by} rows")
        self.rows, self.offs, self.blocks, self.size, self.groups = rows, offs, blocks, size, groups
        self.m, self.k, self.n = rows.size, k, n
        #: rows of an image written transposed (its [N, rows] after the last), or 0
        self.transposed_by = transposed_by
        self.dims = (ctypes.c_int64 * 8)(self.m, n, k, groups * n, groups, group_stride,
                                         blocks.size - 1, transposed_by)
        self._fixed = (rows.ctypes.data, offs.ctypes.data)
        self._tail = (ctypes.addressof(self.dims), blocks.ctypes.data)

    @classmethod
    def of(cls, rows: np.ndarray, offs: np.ndarray, size: int, n: int, groups: int = 1,
           group_stride: int = 0, blocks: np.ndarray | None = None,
           transposed_by: int = 0) -> GatherGemm | None:
        """The product, or None where the native kernels are off or lack AVX-512."""
        if not (enabled() and library().avx512):
            return None
        return cls(rows, offs, size, n, groups, group_stride, blocks, transposed_by)

    def bind(self, b: np.ndarray, bias: np.ndarray | None,
             activation: tuple[int, int | None] = NO_ACTIVATION
             ) -> Callable[[np.ndarray, np.ndarray], None]:
        """The product with C-contiguous float32 ``b`` [G, K, N] and ``bias`` [G * N] (or
        None), then ``activation`` (an :func:`activation_code`): a function writing it for
        C-contiguous float32 ``a`` (``size`` elements) into C-contiguous float32 ``out``
        [M, G * N], where given with an ``addend`` laid out as ``out`` added after the bias
        (``addend + y`` where ``first``: an add that reads the product, in its operand
        order; not to a product written transposed). The constant operands are checked
        here, once (a convolution's weights)."""
        g = self.groups
        if not (b.shape == (g, self.k, self.n) and b.dtype == _F32 and b.flags.c_contiguous
                and (bias is None or bias.shape == (g * self.n,) and bias.dtype == _F32
                     and bias.flags.c_contiguous)):
            raise ValueError(f"GatherGemm {g}x {self.m}x{self.k}x{self.n}: operands {b.shape}, "
                             f"{None if bias is None else bias.shape}")
        kernel, size, shape = library().bevir_gather_gemm_f32, self.size, (self.m, g * self.n)
        # written transposed: image by image; each image (or the whole) in bands of rows,
        # one a thread, of whole tiles of 6 rows
        image = self.transposed_by or max(self.m, 1)
        parts = shares(self.m * self.k * g * self.n)
        pieces = [(lo + top, bottom - top, 4 * (lo * shape[1] + top) if self.transposed_by
                   else 4 * (lo + top) * shape[1])
                  for lo in range(0, self.m, image)
                  for top, bottom in bands(min(image, self.m - lo), parts, 6)]
        # a band of a transposed image is no run of memory: the activation comes after
        after = activation if self.transposed_by and parts > 1 and activation[0] >= 0 else None
        act = NO_ACTIVATION if after else activation
        dims = [(ctypes.c_int64 * 8)(rows, *self.dims[1:]) for _, rows, _ in pieces]
        calls = [(self._fixed[0] + 8 * lo, self._fixed[1], b.ctypes.data,
                  None if bias is None else bias.ctypes.data, at, ctypes.addressof(d),
                  self._tail[1], *act) for (lo, _, at), d in zip(pieces, dims)]
        whole = (ctypes.c_int64 * 2)(self.m * shape[1], after[0]) if after else None
        keep = (self, b, bias, dims, whole)       # alive while the function is
        sets = [calls[i::parts] for i in range(min(parts, len(calls)))]

        def product(a: np.ndarray, out: np.ndarray, addend: np.ndarray | None = None,
                    first: bool = False, _keep=keep) -> None:
            _check_bound("GatherGemm", a, a.size == size, out, shape, addend)
            if addend is not None and self.transposed_by:
                raise ValueError("GatherGemm: no addend to a product written transposed")
            if not out.size:
                return
            ap, op = address(a), address(out)
            res = None if addend is None else (address(addend), first)
            if len(sets) == 1:                    # one thread: no pool, no partials
                _gather_gemm_calls(kernel, ap, op, res, sets[0])
            else:
                parallel([functools.partial(_gather_gemm_calls, kernel, ap, op, res, c)
                          for c in sets])
            if whole is not None:
                library().bevir_activation_f32(op, after[1], ctypes.addressof(whole))
        return product

    def __call__(self, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None,
                 out: np.ndarray, activation: tuple[int, int | None] = NO_ACTIVATION) -> None:
        """Write the product of ``a``, ``b`` and ``bias`` into ``out``, then
        ``activation`` (see :meth:`bind`)."""
        self.bind(b, bias, activation)(a, out)


def _gather_gemm_calls(kernel, a: int, out: int, res: tuple[int, bool] | None, calls) -> None:
    """The calls of one thread of a bound GatherGemm: its bands, operand ``a`` and result
    ``out`` at the addresses given (each call's result at its offset from ``out``), and the
    addend's address and whether it is the add's first operand (``res``, or None)."""
    for rows, offs, b, bias, at, dims, blocks, act, params in calls:
        kernel(a, rows, offs, b, bias, out + at, dims, blocks, act, params,
               None if res is None else res[0] + at, 0 if res is None else res[1])


def split_blocks(k: int, q: int, u: int) -> list[int]:
    """The boundaries of a reduction of ``k`` split as BLAS's level-3 driver splits it:
    blocks of ``q`` while at least ``2 q`` are left, then (more than ``q`` left) half the
    rest rounded up to a multiple of ``u``, then what remains."""
    bounds, lo = [0], 0
    while lo < k:
        left = k - lo
        step = q if left >= 2 * q else -(-(left // 2) // u) * u if left > q else left
        lo += step
        bounds.append(lo)
    return bounds


#: the block sizes and roundings tried for BLAS's blocking of a long reduction
_BLOCKINGS = [(q, u) for q in (128, 192, 224, 240, 256, 288, 320, 384, 448, 480, 512, 576, 640,
                                768, 1024) for u in (1, 2, 4, 8, 16, 24, 32, 48, 64)]


@functools.cache
def _blas_blocking() -> tuple[int, int] | None:
    """(q, u) of :func:`split_blocks` as this BLAS splits the long reductions of float32
    products (64 x 64 ones: large enough for its blocked driver), found once by matching
    np.matmul's bits with the native kernel's; None where no candidate matches."""
    if not (enabled() and library().avx512):
        return None
    rng = np.random.default_rng(0)
    probes = []
    for k in (700, 1100, 1700, 2900):
        a, b = (rng.standard_normal(s).astype(np.float32) for s in ((64, k), (k, 64)))
        probes.append((a, b, np.matmul(a, b)))
    for q, u in _BLOCKINGS:
        for a, b, want in probes:
            k = a.shape[1]
            gemm = GatherGemm(np.arange(64) * k, np.arange(k), a.size, 64,
                              blocks=np.array(split_blocks(k, q, u)))
            got = np.empty_like(want)
            gemm(a, b[None], None, got)
            if got.tobytes() != want.tobytes():
                break
        else:
            return q, u
    return None


def blas_blocks(k: int) -> list[int] | None:
    """BLAS's blocks of a reduction of ``k`` float32 products (boundaries [0, ..., k]) in
    its blocked driver, or None where they could not be found."""
    blocking = _blas_blocking()
    return None if blocking is None else split_blocks(k, *blocking)


def agreeing_blocking(key, k: int, native: Callable[..., np.ndarray | None],
                      reference: Callable[..., np.ndarray],
                      like: Sequence[np.ndarray | None]) -> bool | None:
    """How a native product of a reduction of ``k`` gives ``reference``'s bits
    (:func:`agrees`, keyed by ``key`` and the answer): in BLAS's blocks (its blocked
    driver; where it splits ``k``) True, whole (its small-matrix kernels) False, neither
    None. ``native(blocked, *operands)``."""
    bounds = blas_blocks(k)
    for blocked in (True, False) if bounds is not None and len(bounds) > 2 else (False,):
        if agrees(key + (blocked,), functools.partial(native, blocked), reference, like):
            return blocked
    return None


def random_like(a: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Standard normal values of ``a``'s shape and dtype, with ``a``'s strides (a
    transposed view stays one; negative strides read as contiguous)."""
    if a.flags.c_contiguous or min(a.strides, default=0) < 0:
        return rng.standard_normal(a.shape).astype(a.dtype)
    span = sum((n - 1) * s for n, s in zip(a.shape, a.strides)) // a.itemsize + 1
    base = rng.standard_normal(span if a.size else 0).astype(a.dtype)
    return np.lib.stride_tricks.as_strided(base, a.shape, a.strides)


#: key -> whether the native path gave the numpy path's bits (see :func:`agrees`)
_AGREEMENT: dict = {}

#: the results :func:`agrees` compares at least: a product of few results (a
#: squeeze-excitation's 1x1 convolution on a 1x1 map: 2 of them) is tried on as many
#: random operands as it takes, where two orders could round alike by chance
AGREE_RESULTS = 256


def agrees(key, native: Callable[..., np.ndarray | None], reference: Callable[..., np.ndarray],
           like: Sequence[np.ndarray | None]) -> bool:
    """Whether ``native(*operands)`` computes the same bits as ``reference(*operands)``,
    found once per ``key`` (which must name everything that decides how either computes:
    shapes, dtypes, attributes) on random normal operands shaped and laid out in memory
    like ``like`` (None stays None; BLAS sums a transposed operand in another order than a
    contiguous one). ``native`` returns None where it cannot run: then False. Two
    summation orders of random operands differ in almost every element, so trials of
    :data:`AGREE_RESULTS` results in all tell them apart."""
    verdict = _AGREEMENT.get(key)
    if verdict is None:
        rng = np.random.default_rng(0)
        verdict, compared = True, 0
        while verdict and compared < AGREE_RESULTS:
            operands = [None if a is None else random_like(a, rng) for a in like]
            got, want = native(*operands), reference(*operands)
            verdict = (got is not None and got.dtype == want.dtype and got.shape == want.shape
                       and np.array_equal(got.view(f"u{got.dtype.itemsize}"),
                                          want.view(f"u{want.dtype.itemsize}")))
            compared += want.size or AGREE_RESULTS       # an empty result: one trial
        _AGREEMENT[key] = verdict
    return verdict


class U8S8Gemm:
    """The exact integer product ``(codes - zero_point) @ w`` of 8-bit activation codes and
    integer weights in [-128, 127] (qlinear_conv's GEMM), on AVX512-VNNI: u8 codes (int8
    ones shifted by 128) times s8 weights summed exactly in int32, less ``zero_point *
    colsum(w)``. :meth:`of` gives None where the kernel cannot take the operands."""

    #: reductions longer than this could leave int32 (255 * 128 per product)
    MAX_K = (2**31 - 1) // (255 * 128)

    def __init__(self, w: np.ndarray, shift: int, zero_point: int):
        k, n = w.shape
        self.k, self.n, self.k4, self.nb = k, n, -(-k // 4), -(-n // 16)
        padded = np.zeros((self.k4 * 4, self.nb * 16), np.int8)
        padded[:k, :n] = w
        # blocks of 16 columns, each k4 step holding 16 lanes of 4 consecutive k
        self.packed = np.ascontiguousarray(
            padded.reshape(self.k4, 4, self.nb, 16).transpose(2, 0, 3, 1))
        self.shift = shift
        self.offset = (zero_point + shift) * w.sum(0, dtype=np.int64)

    @classmethod
    def of(cls, w: np.ndarray, codes: np.dtype, zero_point) -> U8S8Gemm | None:
        """For integer-valued weights ``w`` [K, N] and activation codes of dtype ``codes``
        with one ``zero_point``; None where the kernel does not apply or cannot run."""
        zp, shift = np.asarray(zero_point), 128 if np.dtype(codes) == np.int8 else 0
        if (np.dtype(codes) not in (np.dtype(np.uint8), np.dtype(np.int8)) or zp.size != 1
                or zp.dtype.kind not in "iu" or not 0 <= int(zp.item()) + shift <= 255
                or not 0 < w.shape[0] <= cls.MAX_K or not has_vnni()
                or w.min(initial=0) < -128 or w.max(initial=0) > 127
                or not np.array_equal(w, np.round(w))):
            return None
        return cls(w.astype(np.int8), shift, int(zp.item()))

    def __call__(self, codes: np.ndarray, dll=None) -> np.ndarray:
        """int32 [M, N]: the exact product of the [M, K] codes (through ``dll``, else the
        built library)."""
        if codes.ndim != 2 or codes.shape[1] != self.k:
            raise ValueError(f"U8S8Gemm: codes {codes.shape} do not have {self.k} columns")
        m = codes.shape[0]
        if codes.dtype == np.uint8 and self.k % 4 == 0 and codes.flags.c_contiguous:
            a = codes                       # already u8 rows of whole 4-byte groups
        else:
            a = np.zeros((m, self.k4 * 4), np.uint8)
            a[:, :self.k] = codes.view(np.uint8) ^ np.uint8(self.shift) if self.shift else codes
        out = np.empty((m, self.n), np.int32)
        dims = (ctypes.c_int64 * 4)(m, self.k4, self.nb, self.n)
        if (dll or library()).bevir_u8s8_gemm(*_pointers(a, self.packed, out), dims) != 0:
            raise RuntimeError("bevir_u8s8_gemm: no AVX512-VNNI in this build")
        out -= self.offset.astype(np.int32)
        return out


#: the self-check's values: signed zeros, infinities, NaNs of both signs, extremes
_SPECIALS = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 3e38, -3e38, 1.5, -2.5]


def _self_check(dll) -> None:
    """Each float kernel against numpy on the special values, 2x2 windows over more channels
    than a vector group holds (the vector and the scalar code both run): _Unavailable where
    any number (a NaN by its place) differs, e.g. where this processor's numpy breaks a tie
    of maximum(-0, +0) the other way."""
    rng = np.random.default_rng(0)
    for dtype in _FLOATS:
        x = rng.choice(np.array(_SPECIALS, dtype), (1, 3, 6, 37))   # a row of 4 + 1 pixels
        w = rng.choice(np.array(_SPECIALS, dtype), (4, 37))
        taps = [x[:, i:i + 2, j:j + 5] for i in range(2) for j in range(2)]
        with np.errstate(all="ignore"):
            conv, pool = taps[0] * w[0], taps[0]
            for t in range(1, 4):
                conv, pool = conv + taps[t] * w[t], np.maximum(pool, taps[t])
            for name, operands, want in [("depthwise", [x, w], conv), ("maxpool", [x], pool)]:
                got = np.empty_like(want)
                ran = _call(dll, f"bevir_{name}_{_SUFFIX[dtype]}", operands, got, (2, 2),
                            (1, 1), (1, 1))
                nan, bits = np.isnan(want), f"u{dtype.itemsize}"
                if not (ran and np.array_equal(np.isnan(got), nan)
                        and np.array_equal(got[~nan].view(bits), want[~nan].view(bits))):
                    raise _Unavailable(f"{name} ({dtype}) differs from numpy on special values")
    _self_check_integers(dll, rng)
    _self_check_gemm(dll, rng)
    _self_check_activations(dll)


def _self_check_integers(dll, rng) -> None:
    """The integer kernels against numpy: wrapping int32 sums, exact u8 x s8 products (where
    the build has AVX512-VNNI)."""
    v = rng.integers(-128, 128, (5, 3)).astype(np.int8)
    idx, cw = rng.integers(0, 5, (4, 2)), rng.integers(-2**31, 2**31, (4, 2)).astype(np.int32)
    acc, want = np.zeros((4, 3), np.int32), np.zeros((4, 3), np.int32)
    with np.errstate(over="ignore"):
        for p in range(2):
            want += v[idx[:, p]].astype(np.int32) * cw[:, p, None]
    dll.bevir_gather_mac_i8(*_pointers(v, idx, cw, acc), (ctypes.c_int64 * 3)(4, 2, 3))
    if not np.array_equal(acc, want):
        raise _Unavailable("gather_mac differs from numpy's int32 arithmetic")
    codes, w = rng.integers(0, 256, (5, 9)).astype(np.uint8), rng.integers(-128, 128, (9, 33))
    try:
        got = U8S8Gemm(w.astype(np.int8), 0, 7)(codes, dll)
    except RuntimeError:                    # no AVX512-VNNI in the build: the kernel is off
        dll.vnni = False
        return
    dll.vnni = True
    if not np.array_equal(got, (codes.astype(np.int64) - 7) @ w):
        raise _Unavailable("u8s8_gemm differs from numpy's integer product")


def _self_check_gemm(dll, rng) -> None:
    """The FMA product against numpy's fused multiply-add, where the build has AVX-512."""
    # in [1, 2): each step's exact sum fits float64's 53 bits (24-bit products, sums < 16)
    a, b, bias = (rng.uniform(1, 2, s).astype(np.float32) for s in ((5, 3), (3, 35), (35,)))
    rows, offs = np.arange(0, 15, 3, dtype=np.int64), np.arange(3, dtype=np.int64)
    out = np.empty((5, 35), np.float32)
    dims, blocks = (ctypes.c_int64 * 8)(5, 35, 3, 35, 1, 0, 1, 0), np.array([0, 3])
    dll.avx512 = dll.bevir_gather_gemm_f32(*(t.ctypes.data for t in (a, rows, offs, b, bias, out)),
                                           ctypes.addressof(dims), blocks.ctypes.data, -1,
                                           None, None, 0) == 0
    if not dll.avx512:
        return
    acc = np.zeros((5, 35), np.float64)     # each FMA step exact, then rounded to float32
    for k in range(3):
        acc = (acc + a[:, k, None].astype(np.float64) * b[k]).astype(np.float32).astype(np.float64)
    if not np.array_equal(out, acc.astype(np.float32) + bias):
        raise _Unavailable("gather_gemm differs from fused multiply-adds")


def _self_check_activations(dll) -> None:
    """The activations against the ops' numpy code on special values: where one differs
    (this numpy compares otherwise), the activation kernel is off, the others run."""
    from ...ir.opdef import Ctx, get_op     # the ops import this module
    x = np.resize(np.array(_SPECIALS + [-1.0, 0.25, 2.9, 3.0, 3.1, 6.0, 7.5, -3.0], np.float32), 77)
    cases = [("relu", {}), ("clip", {"min": 0.0, "max": 6.0}), ("clip", {"min": None, "max": 1.0}),
             ("hardsigmoid", {"alpha": 0.2, "beta": 0.5}), ("hardswish", {})]
    dll.activations = True
    with np.errstate(all="ignore"):
        for op, attrs in cases:
            want = get_op(op).compute(Ctx(attrs), x)
            got = x.copy()
            kind, params = _ACTIVATIONS[op]
            p = np.array(params(attrs), np.float32)
            dims = (ctypes.c_int64 * 2)(got.size, kind)
            dll.bevir_activation_f32(got.ctypes.data, p.ctypes.data, ctypes.addressof(dims))
            if got.tobytes() != np.asarray(want, np.float32).tobytes():
                dll.activations = False
                return
