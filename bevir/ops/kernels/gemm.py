"""Matrix products through BLAS: float products as numpy's matmul sums them (a stack of
matrices by one matrix as one GEMM), and integer products exactly, in float32 GEMMs whose
partial sums stay below 2^24 (docs/numerics.md)."""
from __future__ import annotations

import math

import numpy as np

from . import kernel

#: float32 represents every integer of magnitude up to this exactly
F32_EXACT = 1 << 24


def exact_chunk(max_abs_product: float) -> int:
    """The longest reduction of integer products of at most ``max_abs_product`` whose
    every partial sum, in any order, stays exact in float32."""
    return max(1, int(F32_EXACT // max(max_abs_product, 1)))


def exact_matmul(a: np.ndarray, b: np.ndarray, chunk: int | None, out: np.ndarray) -> None:
    """``out[...] = a @ b``. With ``chunk`` (integer-valued float32 operands), the
    reduction is split so each float32 GEMM sums at most ``chunk`` products (exact, by
    :func:`exact_chunk`); the chunks add up in ``out``, float64 when there are several."""
    k = a.shape[-1]
    if chunk is None or k <= chunk:
        np.matmul(a, b, out=out)
        return
    for k0 in range(0, k, chunk):
        part = np.matmul(a[..., k0:k0 + chunk], b[..., k0:k0 + chunk, :])
        if k0:
            out += part
        else:
            out[...] = part


def int_acc_dtype(k: int, chunk: int | None, acc_dtype) -> np.dtype:
    """The accumulator dtype of a reduction of length ``k``: float64 when it is split."""
    return np.dtype(np.float64 if chunk is not None and k > chunk else acc_dtype)


def exact_int_matmul(a: np.ndarray, b: np.ndarray, chunk: int) -> np.ndarray:
    """``a @ b`` (numpy matmul rules) of integer-valued float32 operands, exactly: float32,
    or float64 when the reduction is split (:func:`exact_matmul`)."""
    if a.ndim == 1 or b.ndim == 1:          # numpy's 1-D promotion: one float64 product
        return np.matmul(a.astype(np.float64), b.astype(np.float64))
    out = np.empty(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]),
                   int_acc_dtype(a.shape[-1], chunk, np.float32))
    exact_matmul(a, b, chunk, out)
    return out


def stacked_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.matmul(a, b)``. A stack of matrices times one matrix runs as one GEMM of all
    their rows: numpy would call BLAS once per matrix and read ``b`` each time."""
    if a.ndim > 2 and b.ndim == 2:
        rows = a.reshape(math.prod(a.shape[:-1]), a.shape[-1])     # not -1: K may be 0
        return np.matmul(rows, b).reshape(a.shape[:-1] + b.shape[1:])
    return np.matmul(a, b)


@kernel("matmul")
def matmul(c, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """matmul: numpy's matmul, a stack of matrices by one matrix as one GEMM (as
    onnxruntime's MatMul does: a row's result does not depend on the stack's shape)."""
    return stacked_matmul(a, b)
