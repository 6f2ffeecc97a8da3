"""The golden model's fast kernels, kept apart from the op definitions they compute.

An op's definition (its :class:`~bevir.ir.opdef.OpDef` in ``bevir/ops``) states what it
computes: operands, attributes, the result's type, what is summed. Where computing that
quickly takes more than the plain numpy statement (im2col GEMMs through BLAS, the C
kernels of :mod:`bevir.ops.native`, probes of BLAS's summation order, operands prepared
once per constant weight, strided views and flat gathers), a kernel here does it, and
the op's ``compute`` names it in one line::

    def compute(self, c, x, w, b=None):
        return kernel_for("conv2d")(c, x, w, b)      # kernels/products.py

A kernel takes what ``compute`` takes (the node's :class:`~bevir.ir.opdef.Ctx` and its
operand arrays) and returns what it returns, bit for bit the results the golden model
defines; every caller of ``OpDef.run`` (the interpreter, constant folding) gets them.
:func:`kernel_table` lists the ops that have one.

The modules:

- ``gemm``: matrix products through BLAS (the ``matmul`` kernel); exact integer products
  in float32 or float64
- ``conv``: convolutions through BLAS (im2col GEMMs, depthwise multiply-adds): the
  float sums that define conv2d's bits, and the integer convolutions' exact products
- ``fma``: native FMA products standing in for those where BLAS sums the same way
- ``products``: the ``conv2d`` kernel: which of those runs, prepared once per constant
  weight (the fused products of bevir/ops/fused.py use the same runners)
- ``norm``: layer normalization's statistics, natively over C-contiguous float32 rows;
  batch normalization, natively in one pass
- ``pool``: windows as strided views, max pooling, onnxruntime's global mean
- ``resize``: ONNX Resize as onnxruntime's kernels and ONNX's reference compute it
- ``sample``: bilinear sampling (``grid_sample``, ``ms_deform_attn``) as gathers
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...errors import VerifyError

#: a kernel: ``kernel(c, *operands)`` -> what the op's compute returns
Kernel = Callable[..., Any]

_TABLE: dict[str, Kernel] = {}


def kernel(*ops: str, prepare: Callable[..., Callable] | None = None
           ) -> Callable[[Kernel], Kernel]:
    """Register the decorated function as the kernel that computes ``ops``; ``prepare``,
    where given, makes it for one input like the one given and constant weights,
    ``prepare(c, x, *weights)``: a function of the input (:func:`prepared_kernel`)."""
    def register(fn: Kernel) -> Kernel:
        for op in ops:
            if op in _TABLE:
                raise ValueError(f"op '{op}' has two kernels: {_TABLE[op].__qualname__} "
                                 f"and {fn.__qualname__}")
            _TABLE[op] = fn
        fn.prepare = prepare
        return fn
    return register


def kernel_for(op: str) -> Kernel:
    """The kernel that computes op ``op`` (VerifyError where it has none)."""
    try:
        return _TABLE[op]
    except KeyError:
        raise VerifyError(f"op '{op}' has no kernel in bevir.ops.kernels", op=op) from None


def prepared_kernel(op: str, c, x, *weights) -> Callable[[Any], Any]:
    """The kernel of op ``op`` as a function of its first operand, for inputs like ``x`` and
    these ``weights`` (what OpDef.prepare returns): made once by the kernel's ``prepare``
    where it has one, else calling the kernel."""
    fn = kernel_for(op)
    prepare = getattr(fn, "prepare", None)
    return prepare(c, x, *weights) if prepare is not None else (lambda x: fn(c, x, *weights))


def kernel_table() -> dict[str, str]:
    """Every op with a kernel: op name -> the kernel (module.function)."""
    return {op: f"{fn.__module__}.{fn.__qualname__}" for op, fn in sorted(_TABLE.items())}


# the modules register their kernels (after the registry above exists)
from . import gemm, norm, pool, products, resize, sample  # noqa: E402, F401
