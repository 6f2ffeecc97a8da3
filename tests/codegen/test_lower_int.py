"""Generated kernels of the integer forms of the elementwise ops (add, sub, mul, max, min,
equal, less, greater, not) and of cumsum, against their golden ops, for the llvm and the
C build: every pair of edge values of every integer dtype (both ends of the range, where
sums and products wrap), bools computed on the device, all the directions of cumsum. Each
check must find 0 differing elements. Then the position ids RoBERTa computes from its
token ids, as one device stage of a compiled program, bit-exact."""
from __future__ import annotations

import tempfile

import numpy as np
import pytest

import bevir
from bevir import DType, TensorType
from bevir.codegen.lower import kernel_def
from bevir.codegen.program import Program
from bevir.errors import CodegenError
from bevir.target import HWConfig, lowerable, model, stages
from bevir.testing import assert_bit_exact
from tests.shared import assert_counted_as_modelled

INTS = [DType.i8, DType.u8, DType.i16, DType.i32, DType.i64]


def edges(dtype: DType) -> np.ndarray:
    """Both ends of ``dtype``'s range and their neighbours, 0, +-1, +-2 and a mid value."""
    info = np.iinfo(dtype.np)
    v = [info.min, info.min + 1, info.min + 2, -2, -1, 0, 1, 2, info.max // 3,
         info.max - 1, info.max]
    return np.array(sorted({x for x in v if info.min <= x <= info.max}), dtype.np)


def check(graph: bevir.Graph, feeds: dict) -> None:
    """Every node of ``graph`` has a kernel, bit-exact with its golden op, in both builds."""
    assert all(lowerable(n) for n in graph.nodes)
    for target in ("llvm", "c"):
        report = Program(graph, target).check(feeds)
        assert report.ok, (target, report.mismatch)
        assert report.checked == len(graph.nodes), target


def one_op(op: str, arrays: list[np.ndarray], **attrs) -> tuple[bevir.Graph, dict]:
    b = bevir.Builder(op)
    ins = [b.input(f"x{k}", TensorType(a.shape, DType.from_numpy(a.dtype)))
           for k, a in enumerate(arrays)]
    b.output("y", b.op(op, *ins, **attrs))
    return b.graph, {f"x{k}": a for k, a in enumerate(arrays)}


def wrapped(exact: np.ndarray, dtype: DType) -> np.ndarray:
    """The low bits of ``exact`` (an array of Python ints) as ``dtype``'s values: two's
    complement for the signed dtypes."""
    bits = 8 * dtype.itemsize
    signed = np.iinfo(dtype.np).min < 0

    def low(v: int) -> int:
        v %= 1 << bits
        return v - (1 << bits) if signed and v >> (bits - 1) else v
    return np.array([low(int(v)) for v in exact.reshape(-1)], dtype.np).reshape(exact.shape)


def pairs(dtype: DType) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of edge values, as a column against a row (the kernel broadcasts)."""
    v = edges(dtype)
    return v.reshape(-1, 1), v.reshape(1, -1)


EXACT = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
         "max": max, "min": min}


@pytest.mark.parametrize("op", EXACT)
@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_integer_arithmetic_wraps_as_numpy(op, dtype):
    a, b = pairs(dtype)
    graph, feeds = one_op(op, [a, b])
    # the golden op gives the low bits of the exact result (Python ints): the grid wraps
    exact = np.array([[EXACT[op](int(x), int(y)) for y in b[0]] for x in a[:, 0]], object)
    want = wrapped(exact, dtype)
    assert_bit_exact(bevir.run(graph, feeds)["y"], want)
    if op in ("add", "sub", "mul"):
        assert (exact != want.astype(object)).any()     # some results overflow
    check(graph, feeds)


@pytest.mark.parametrize("op", ["equal", "less", "greater"])
@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_integer_comparisons_give_bools(op, dtype):
    a, b = pairs(dtype)
    graph, feeds = one_op(op, [a, b])
    y = bevir.run(graph, feeds)["y"]
    assert y.dtype == np.bool_ and y.any() and not y.all()
    check(graph, feeds)


@pytest.mark.parametrize("dtype", [DType.i32, DType.i64], ids=str)
def test_a_scalar_operand_broadcasts(dtype):
    x = np.resize(edges(dtype), (3, 7))
    graph, feeds = one_op("add", [x, np.array(np.iinfo(dtype.np).max, dtype.np)])
    check(graph, feeds)


def test_bools_computed_on_the_device():
    """Bools from an integer comparison feed not, the arithmetic ops (add is or, mul is
    and), max, min, the comparisons and a cast back to integers, each on the device."""
    b = bevir.Builder("bools")
    x, y = (b.input(n, TensorType((2, 6), DType.i16)) for n in "xy")
    e, g = b.equal(x, y), b.greater(x, y)
    n = b.op("not", e)
    for k, op in enumerate(["add", "mul", "max", "min", "equal", "less", "greater"]):
        b.output(f"{op}{k}", b.op(op, n, g))
    b.output("i", b.cast(n, to="i32"))
    feeds = {"x": np.array([[0, 1, -1, 5, 7, 3], [2, 2, 9, -4, 0, 1]], np.int16),
             "y": np.array([[0, 2, -1, 4, 7, 9], [2, 1, 9, -5, 1, 1]], np.int16)}
    check(b.graph, feeds)


@pytest.mark.parametrize("dtype", INTS, ids=str)
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_cumsum_wraps_as_numpy(dtype, axis, exclusive, reverse):
    v = edges(dtype)
    x = np.resize(np.concatenate([v, v[::-1]]), (3, len(v), 4))
    graph, feeds = one_op("cumsum", [x], axis=axis, exclusive=exclusive, reverse=reverse)
    # the low bits of the exact running sums, from Python ints
    ax = axis % 3
    exact = np.cumsum(np.flip(x, ax) if reverse else x, axis=ax, dtype=object)
    if exclusive:
        exact = exact - (np.flip(x, ax) if reverse else x).astype(object)
    exact = np.flip(exact, ax) if reverse else exact
    want = wrapped(exact, dtype)
    assert_bit_exact(bevir.run(graph, feeds)["y"], want)
    assert (exact != want.astype(object)).any()     # some sums overflow
    check(graph, feeds)


def test_a_float_cumsum_is_refused_naming_the_node():
    """The lowering takes integers: a float cumsum (the host's) is one line naming it."""
    b = bevir.Builder("floats")
    with b.loc("model.embeddings"):
        y = b.cumsum(b.input("x", TensorType((2, 3))), axis=1)
    with pytest.raises(CodegenError, match="op 'cumsum' node %.* from 'model.embeddings': "
                                           "the lowering takes integer operands, got f32"):
        kernel_def(y.producer)


def test_integer_div_has_no_lowering_and_says_where():
    graph, _ = one_op("div", [np.ones((4,), np.int32), np.ones((4,), np.int32)])
    with pytest.raises(CodegenError, match="op 'div' node .*: op 'div' has no lowering"):
        Program(graph, "c")


PAD = 1


def position_ids() -> bevir.Graph:
    """RoBERTa's position ids as torch.export gives them: ``mask = ids != pad``,
    ``cumsum(mask) * mask + pad``, through its casts, then the gathers they index."""
    b = bevir.Builder("roberta.embeddings")
    ids = b.input("ids", TensorType((2, 16), DType.i64))
    table = b.input("table", TensorType((40, 8), DType.i32))
    mask = b.cast(b.op("not", b.equal(ids, b.const(np.int64(PAD)))), to="i32")
    running = b.cast(b.cumsum(b.cast(mask, to="i64"), axis=1), to="i32")
    pos = b.cast(b.mul(b.add(running, b.const(np.int32(0))), mask), to="i64")
    pos = b.add(pos, b.const(np.int64(PAD)))
    b.output("pos", pos)
    b.output("emb", b.gather(table, pos, axis=0))
    return b.graph


def test_roberta_position_ids_run_on_the_device_bit_exact():
    graph = position_ids()
    ids = np.array([[0, 5, 9, 2, 1, 1, 7, 1, 3, 3, 8, 1, 1, 1, 1, 1],
                    [0, 1, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 2]], np.int64)
    feeds = {"ids": ids, "table": np.arange(320, dtype=np.int32).reshape(40, 8)}
    want = bevir.run(graph, feeds)
    assert want["pos"][0].tolist() == [2, 3, 4, 5, 1, 1, 6, 1, 7, 8, 9, 1, 1, 1, 1, 1]
    assert [dev for dev, _ in stages(graph)] == [True]        # no host stage
    check(graph, feeds)
    hw = HWConfig.parse("QC-U 8MB 16MAC x4")
    with tempfile.TemporaryDirectory() as out:
        program = bevir.compile(graph, f"{out}/prog", hw=hw)
        assert [s["device"] for s in program.manifest["stages"]] == [True]
        assert_bit_exact(program.run(feeds), want)
        assert_counted_as_modelled(program, hw)     # the plan the model costs is what ran
    # the cycle model charges each of them ALU work (none is a free view)
    costed = {r.op: r for r in model(program.graph, hw).records}
    for op in ("equal", "not", "cumsum", "add", "mul", "cast"):
        assert costed[op].terms["alu"] >= 1 and costed[op].own_cycles > 0, op


def test_a_bool_from_floats_stays_on_the_host():
    """Only bools computed from integers move to the device: the host's float geometry
    (a comparison, its not, a where) keeps its stage."""
    b = bevir.Builder("geometry")
    x = b.input("x", TensorType((4,)))
    keep = b.op("not", b.greater(x, b.const(np.float32(0))))
    b.output("y", b.where(keep, x, b.const(np.float32(0))))
    assert not any(lowerable(n) for n in b.graph.nodes)
    assert [dev for dev, _ in stages(b.graph)] == [False]
