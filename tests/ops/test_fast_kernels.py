"""The golden model's fast paths compute exactly what their plain definitions compute: the
activations evaluated block by block and without masked operations, and a stack of matrices
times one matrix as one GEMM. Every comparison is of the bytes (NaN payloads and the sign of
zero included)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from bevir.ops import elementwise as E
from bevir.ops.kernels.gemm import stacked_matmul

SPECIALS = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-300, -1e-300, 1e30, -1e30,
            88.8, -88.8, 104.0, -104.0, 2.7e-8, -2.7e-8]


def plain_erf(x: np.ndarray) -> np.ndarray:
    """The Chebyshev-fitted erf written as its formula: one pass, np.where for the sign."""
    z = np.abs(x.astype(np.float64))
    t = 1.0 / (1.0 + 0.5 * z)
    acc = t * 0.17087277
    for c in E._ERFC_TAIL:
        acc = (acc + c) * t
    erfc = np.exp(-(z * z) - 1.26551223 + acc) * t
    return np.where(x < 0, erfc - 1.0, 1.0 - erfc).astype(x.dtype)


def plain_sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, x.dtype.type(1), e) / (e + x.dtype.type(1))


def inputs(dtype) -> np.ndarray:
    """More than a few blocks of values across the ranges that matter, and the specials."""
    rng = np.random.default_rng(0)
    n = len(SPECIALS) * (3 * E.BLOCK // len(SPECIALS) + 5)
    x = np.concatenate([rng.standard_normal(n) * s for s in (0.01, 1.0, 10.0)] + [SPECIALS])
    with np.errstate(over="ignore"):
        return x.astype(dtype).reshape(-1, len(SPECIALS))


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_activations_are_their_definitions_bit_for_bit(dtype):
    x = inputs(dtype)
    with np.errstate(all="ignore"):
        assert same_bytes(E._erf(x), plain_erf(x))
        assert same_bytes(E._sigmoid(x), plain_sigmoid(x))
        assert same_bytes(E.Silu.fn(x), x * plain_sigmoid(x))
        xd = x.astype(np.float64)
        gelu = (0.5 * xd * (1 + plain_erf(xd / np.sqrt(2)))).astype(dtype)
        assert same_bytes(E._gelu(x, "none"), gelu)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int8, np.int32])
def test_relu_is_maximum_with_zero_bit_for_bit(dtype):
    """Blocks of zeros in place of the scalar: NaN kept, -0 made +0, every layout and size."""
    with np.errstate(invalid="ignore"):
        x = inputs(np.float64) * 100 if np.dtype(dtype).kind == "i" else inputs(dtype)
        x = x.astype(dtype)
    for v in (x, x.T, x.reshape(-1)[:5], x.reshape(-1)[:E.BLOCK + 1], np.asarray(x[0, 1])):
        assert same_bytes(E.relu_values(v), np.maximum(v, v.dtype.type(0)))


def test_erf_never_gives_negative_zero():
    # erfc is 1.0 exactly on a run of float64s near |x| = 2.66e-8: erfc - 1 is +0 there,
    # and so is erf; find the run by bisection and take the floats around it
    lo, hi = 0.0, 1e-7
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 1.0 - plain_erf(np.array([mid]))[0] > 1.0 else (lo, mid)
    x = -(lo + np.arange(-3000, 3000) * np.spacing(lo))
    y = E._erf(x)
    assert np.any(y == 0)
    assert not np.any((y == 0) & np.signbit(y))
    assert same_bytes(y, plain_erf(x))


def test_blockwise_keeps_shape_and_small_inputs():
    assert E._erf(np.float32(0.5)).shape == ()
    x = inputs(np.float32)[:7].reshape(7, 1, len(SPECIALS))
    with np.errstate(all="ignore"):
        assert same_bytes(E._gelu(x, "tanh"), E._gelu(x.reshape(-1), "tanh").reshape(x.shape))


@pytest.mark.parametrize("a_shape,b_shape", [((2, 3, 5, 8), (8, 4)), ((7, 1, 16), (16, 6)),
                                             ((3, 8), (8, 2)), ((2, 3, 8), (2, 8, 4)),
                                             ((8,), (8, 3)), ((2, 3, 8), (8,)),
                                             ((2, 3, 0), (0, 4)), ((0, 3, 5), (5, 2)),
                                             ((2, 3, 5), (5, 0))])
def test_stacked_matmul_is_numpy_matmul_with_rows_folded(a_shape, b_shape):
    rng = np.random.default_rng(1)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    got = stacked_matmul(a, b)
    assert got.shape == np.matmul(a, b).shape
    if a.ndim > 2 and b.ndim == 2:
        want = np.matmul(a.reshape(math.prod(a.shape[:-1]), a.shape[-1]), b).reshape(got.shape)
    else:
        want = np.matmul(a, b)
    assert same_bytes(got, want)
    np.testing.assert_allclose(got, np.matmul(a, b), rtol=1e-5, atol=1e-5)


def test_compact_copies_any_view_and_reshape_keeps_views():
    """compact is np.ascontiguousarray for every kind of view (a short strided last axis
    takes its own path); reshape stays a view wherever numpy's would be one."""
    from bevir.ops.shape import compact
    from bevir.ir.opdef import Ctx, get_op
    x = np.arange(2 * 6 * 4 * 3, dtype=np.float32).reshape(2, 6, 4, 3)
    for v in (x, x.transpose(0, 2, 3, 1), x.transpose(0, 1, 3, 2), x[:, ::2], x[..., ::2],
              x.reshape(48, 3).T, x.reshape(-1)[::5], np.asarray(x[0, 0, 0, 0])):
        c = compact(v)
        assert c.flags.c_contiguous and same_bytes(c, np.ascontiguousarray(v))
    reshape = get_op("reshape")
    shuffled = x.reshape(2, 6, 4, 3).transpose(0, 1, 3, 2)         # needs a copy
    y = reshape.compute(Ctx({"shape": (2, 6, 12)}), shuffled)
    assert same_bytes(y, np.ascontiguousarray(shuffled).reshape(2, 6, 12))
    split = x.reshape(48, 3).T                                      # stays a view
    assert np.shares_memory(reshape.compute(Ctx({"shape": (3, 1, 48)}), split), x)


# ---- the kernel table: an op's compute reaches its kernel, whoever runs the op --------------
def _table_cases(rng):
    """op -> (operands, attributes) of a small node of each op that has a kernel."""
    def f32(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)
    return {
        "conv2d": ([f32(1, 4, 7, 7), f32(6, 2, 3, 3), f32(6)],
                   {"groups": 2, "strides": (2, 1), "pads": (1, 1, 1, 1), "dilations": (1, 2)}),
        "matmul": ([f32(2, 3, 8), f32(8, 5)], {}),
        "maxpool2d": ([f32(1, 3, 7, 6)], {"kernel": (3, 3), "strides": (2, 2),
                                          "pads": (1, 1, 1, 1), "ceil_mode": True}),
        "global_avgpool": ([f32(2, 3, 5, 7)], {}),
        "layer_norm": ([f32(2, 3, 24), f32(24), f32(24)], {"epsilon": 1e-6}),
        "batch_norm": ([f32(2, 3, 4, 5), f32(3), f32(3), f32(3), np.abs(f32(3))],
                       {"epsilon": 1e-3}),
        "resize": ([f32(1, 2, 4, 5)], {"size": (1, 2, 7, 9), "mode": "linear"}),
        "grid_sample": ([f32(1, 2, 5, 6), f32(1, 3, 4, 2, scale=0.7)], {}),
        "ms_deform_attn": ([f32(1, 2 * 3 + 1, 2, 4),
                            rng.uniform(-0.1, 1.1, (1, 3, 2, 2, 2, 2)).astype(np.float32),
                            rng.uniform(0, 1, (1, 3, 2, 2, 2)).astype(np.float32)],
                           {"spatial_shapes": (2, 3, 1, 1)}),
    }


def _one_node(op, operands, attrs, constants: bool):
    from bevir import Builder, TensorType
    b = Builder(op)
    vals = [b.const(a, f"k{i}") if constants else b.input(f"in{i}", TensorType.of(a))
            for i, a in enumerate(operands)]
    b.output("y", b.op(op, *vals, **attrs))
    return b.graph, ({} if constants else {f"in{i}": a for i, a in enumerate(operands)})


def test_every_kernel_is_reached_by_its_ops_compute(monkeypatch):
    """The table lists exactly the ops below, each a registered op; running one (the
    interpreter) and folding one (canonicalize's fold-constants) both call its kernel."""
    import bevir
    from bevir.ops import get_op, kernels
    cases = _table_cases(np.random.default_rng(2))
    assert set(kernels.kernel_table()) == set(cases)
    for op, (operands, attrs) in cases.items():
        get_op(op)
        calls = []
        fast = kernels.kernel_for(op)
        monkeypatch.setitem(kernels._TABLE, op, lambda c, *a, fast=fast: calls.append(1) or fast(c, *a))
        graph, feed = _one_node(op, operands, attrs, constants=False)
        bevir.run(graph, feed)
        graph, _ = _one_node(op, operands, attrs, constants=True)
        folded = bevir.optimize(graph, "canonicalize")
        assert not folded.nodes and len(calls) == 2, op


@pytest.mark.parametrize("op", sorted(_table_cases(np.random.default_rng(0))))
def test_constant_folding_gives_the_golden_models_bits(op):
    """A node folded at compile time holds the bytes the golden model computes at run time."""
    import bevir
    operands, attrs = _table_cases(np.random.default_rng(3))[op]
    graph, feed = _one_node(op, operands, attrs, constants=False)
    want = bevir.run(graph, feed)["y"]
    graph, _ = _one_node(op, operands, attrs, constants=True)
    folded = bevir.optimize(graph, "canonicalize")
    assert same_bytes(bevir.run(folded, {})["y"], want)


def test_the_kernel_table_refuses_a_second_kernel_and_names_a_missing_one():
    from bevir import VerifyError
    from bevir.ops.kernels import kernel, kernel_for
    with pytest.raises(ValueError, match="op 'conv2d' has two kernels"):
        kernel("conv2d")(lambda c, x, w, b=None: x)
    assert kernel_for("conv2d").__module__ == "bevir.ops.kernels.products"
    with pytest.raises(VerifyError, match="op 'relu' has no kernel"):
        kernel_for("relu")
