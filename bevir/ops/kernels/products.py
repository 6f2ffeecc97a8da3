"""The product kernels the golden model runs: conv2d's (and, through the same runners,
the fused products' of bevir/ops/fused.py): native FMA products where they give the
BLAS path's bits (bevir.ops.kernels.fma), else the BLAS path (bevir.ops.kernels.conv),
prepared once per constant weight."""
from __future__ import annotations

from collections.abc import Callable

import math

import numpy as np

from ...ir.types import Layout
from .. import native
from ..common import ArrayCache, read_only
from . import kernel
from .conv import conv2d_float, conv2d_float_runner
from .fma import conv2d_fma, depthwise_runner, fma_eligible, fma_runner, linear_fma
from .gemm import stacked_matmul


def conv_args(c) -> tuple:
    """(layout, strides, pads, dilations, groups) of a convolution's context."""
    return (c.in_types[0].layout, tuple(c.strides), tuple(c.pads), tuple(c.dilations),
            c.groups)


#: prepared products (convolutions, linear layers) by weight (a graph constant): (key, bias,
#: run)
_PREPARED = ArrayCache()


def prepared_runner(c, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                    build: Callable[[], Callable[[np.ndarray], np.ndarray]]
                    ) -> Callable[[np.ndarray], np.ndarray]:
    """``build()``, a function of the input that computes the node for inputs like ``x``:
    built once per weight that nothing can change (a graph constant) while the node's
    attributes, the input's shape and type, the bias and whether native kernels run stay
    the same."""
    key = (x.shape, x.dtype, c.in_types[0].layout, c.attrs, native.enabled())
    hit = _PREPARED.get(w)
    if hit is not None and hit[1] is b and hit[0] == key:
        return hit[2]
    run = build()
    if read_only(w) and (b is None or read_only(b)):
        _PREPARED.put(w, (key[:3] + (dict(c.attrs), key[4]), b, run))
    return run


def conv2d_runner(c, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                  activation: tuple[int, int | None] = native.NO_ACTIVATION
                  ) -> tuple[Callable[[np.ndarray], np.ndarray], bool]:
    """A function computing conv2d (then ``activation``, a native.activation_code) for
    inputs like ``x``, and whether it runs natively (and applies the activation): with
    native kernels where they give conv2d_float's bits (a depthwise one by the same
    operations, :func:`depthwise_runner`; the others as FMA products, :func:`fma_runner`,
    where BLAS sums so too: native.agrees finds out once per shape), else conv2d_float."""
    args = conv_args(c)
    run = None
    if w.shape[1] == 1 and c.groups > 1:
        if x.dtype == np.float32 and native.enabled():
            run = depthwise_runner(x.shape, w, b, args[0], *args[1:4], activation)
    elif fma_eligible(x, w, b, c.groups):
        blocked = native.agreeing_blocking(
            ("conv2d", x.shape, w.shape, b is None) + args, w[0].size,
            lambda blocked, *xwb: conv2d_fma(*xwb, *args, blocked=blocked),
            lambda *xwb: conv2d_float(*xwb, *args), (x, w, b))
        if blocked is not None:
            run = fma_runner(x.shape, w, b, *args, activation, blocked)
    if run is not None:
        return run, True
    return conv2d_float_runner(x, w, b, *args), False


def conv2d_sum_runner(c, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, activation: str
                      ) -> Callable[[np.ndarray, np.ndarray, bool], np.ndarray] | None:
    """conv2d for inputs like ``x``, then an addend (C-contiguous, of the result's type)
    added in the native product's own pass (``addend + y`` where ``first``, else ``y +
    addend``: the add that reads the result, in its operand order), then ``activation``
    ("none" or "relu": add_relu's): a function of the input, the addend and ``first``, for
    an NHWC convolution where a native kernel runs with conv2d_float's bits; else None."""
    args = conv_args(c)
    code = native.activation_code(activation, {})
    if args[0] is not Layout.nhwc or code is None:
        return None
    run, ran = conv2d_runner(c, x, w, b, code)
    return run if ran else None


def linear_runner(a: np.ndarray, w: np.ndarray, bias: np.ndarray | None,
                  activation: tuple[int, int | None] = native.NO_ACTIVATION
                  ) -> Callable[[np.ndarray], np.ndarray] | None:
    """``a @ w`` (+ ``bias`` [N], then ``activation``, a native.activation_code) for float32
    inputs like ``a`` [..., K] and a 2-D weight ``w`` [K, N] (a view, maybe transposed) as
    native FMA products where they give the bits of numpy's matmul and add (native.agrees
    finds out once per shape, in BLAS's blocks of a long reduction or whole), else None."""
    k, n = w.shape
    m = math.prod(a.shape[:-1])
    if not (a.dtype == w.dtype == np.float32 and a.ndim >= 2 and m > 1 and native.enabled()
            and (bias is None or bias.dtype == np.float32 and bias.shape == (n,))):
        return None

    def numpy_path(a, w, bias):
        y = stacked_matmul(a, w)
        return y if bias is None else y + bias

    def native_path(blocked, a, w, bias):
        run = linear_fma(a.shape, w, bias, native.NO_ACTIVATION, blocked)
        return None if run is None else run(a)
    blocked = native.agreeing_blocking(
        ("linear", a.shape, w.shape, w.strides[0] < w.strides[1], bias is None), k,
        native_path, numpy_path, (a, w, bias))
    return None if blocked is None else linear_fma(a.shape, w, bias, activation, blocked)


def conv2d_prepared(c, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None
                    ) -> Callable[[np.ndarray], np.ndarray]:
    """conv2d for inputs like ``x``: :func:`conv2d_runner`'s function, prepared once per
    constant weight (the kernel's prepared form: what a prepared plan calls)."""
    return prepared_runner(c, x, w, b, lambda: conv2d_runner(c, x, w, b)[0])


@kernel("conv2d", prepare=conv2d_prepared)
def conv2d(c, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """conv2d: :func:`conv2d_prepared`'s function of ``x``."""
    return conv2d_prepared(c, x, w, b)(x)
