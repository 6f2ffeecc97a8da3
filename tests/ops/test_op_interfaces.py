"""Every op carries its own knowledge: the registry says, per op, which interfaces it
implements, and the declarations are consistent with what the passes accept."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import bevir
from bevir import Builder, Layout, TensorType
from bevir.ops import all_ops, get_op, interface_table
from bevir.ops.linalg import Contraction, Convolution, MatrixProduct
from bevir.passes.quantize import LOWERINGS

OPS = all_ops()


def test_the_registry_prints_each_ops_interfaces(capsys):
    table = interface_table()
    print(table)
    assert len(table.splitlines()) == len(all_ops())
    ops = {n: op for n, op in all_ops().items()       # tests register ops of their own
           if type(op).__module__.startswith("bevir.")}
    counts = {k: sum(k in op.interfaces() for op in ops.values())
              for k in ("infer", "compute", "macs", "nhwc", "fixed_point", "decompose")}
    print(counts)
    # every op has a type rule and reference semantics
    assert counts["infer"] == counts["compute"] == len(ops)
    assert counts["nhwc"] >= 30 and counts["fixed_point"] >= 20 and counts["decompose"] >= 4


def test_fixed_point_lowerings_name_strategies_and_registered_targets():
    for name, op in OPS.items():
        spec = op.fixed_point
        if spec is not None:
            assert spec.how in LOWERINGS, name
            assert spec.target is None or get_op(spec.target).name == spec.target


def test_products_share_one_family_each():
    convs = {n for n, op in OPS.items() if isinstance(op, Convolution)}
    products = {n for n, op in OPS.items() if isinstance(op, MatrixProduct)}
    assert convs == {"conv2d", "conv2d_act", "qlinear_conv", "conv_integer", "fx_conv2d"}
    assert products == {"matmul", "qlinear_matmul", "matmul_integer", "fx_matmul"}
    others = {n for n, op in OPS.items() if isinstance(op, Contraction)
              and type(op).__module__.startswith("bevir.")} - convs - products
    # docs/ops.md names each family's ops as the registry has them
    doc = " ".join((Path(__file__).resolve().parents[2] / "docs" / "ops.md").read_text().split())

    def listed(pattern):
        return set(re.findall(r"`(\w+)`", re.search(pattern, doc).group(1)))
    assert listed(r"convolutions \((.*?)\) derive") == convs
    assert listed(r"products \((.*?)\) `MatrixProduct`") == products
    assert listed(r"; ([^;]*?) are `Contraction`s") == others
    # one MAC formula: results x reduction length, for every contraction
    assert all(type(op).macs is Contraction.macs for op in OPS.values()
               if isinstance(op, Contraction))


def test_an_unknown_lowering_strategy_is_an_error_naming_the_op(monkeypatch):
    import numpy as np
    from bevir.ir.opdef import FixedLowering

    b = bevir.Builder()
    x = b.input("x", bevir.TensorType((2, 3), bevir.DType.f32))
    b.output("y", b.relu(x))
    g = b.graph
    bevir.calibrate(g, [{"x": np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)}])
    monkeypatch.setattr(type(get_op("relu")), "fixed_point", FixedLowering("teleport"))
    try:
        bevir.quantize(g)
    except bevir.PassError as e:
        assert "op 'relu' declares the fixed-point lowering 'teleport'" in str(e)
    else:
        raise AssertionError("quantize accepted an unknown lowering strategy")


def test_the_top_level_api_holds_the_everyday_names_and_flows_live_in_submodules():
    for name in bevir.__all__:
        assert getattr(bevir, name) is not None, name
    assert {"Pass", "PassManager", "Interpreter", "OpDef", "Builder", "from_onnx"} <= set(bevir.__all__)
    assert not hasattr(bevir, "quantize_backbone")
    assert callable(bevir.flows.quantize_backbone)


# ---- memory order: a result never depends on how its operands lie in memory -------------
def other_order(x: np.ndarray) -> np.ndarray:
    """The values of ``x`` as a view of memory in another order (its axes reversed)."""
    axes = tuple(range(x.ndim))[::-1]
    return np.ascontiguousarray(x.transpose(axes)).transpose(axes)


def single_op(op: str, shapes: list[tuple[int, ...]], rng, layout=Layout.plain, **attrs):
    """A node of ``op`` on float operands of ``shapes`` (the first a graph input in
    ``layout``, the others constants) and the operand arrays."""
    b = Builder(op)
    x = b.input("x", TensorType(shapes[0], layout=layout))
    consts = [rng.standard_normal(s).astype(np.float32) for s in shapes[1:]]
    getattr(b, op)(x, *(b.const(c) for c in consts), **attrs)
    return b.graph.nodes[-1], [rng.standard_normal(shapes[0]).astype(np.float32), *consts]


@pytest.mark.parametrize("op, shapes, attrs", [
    ("layer_norm", [(2, 8, 8, 16), (16,), (16,)], {"epsilon": 1e-5}),
    ("reduce_mean", [(2, 16, 8, 8)], {"axes": (1,)}),
    ("softmax", [(2, 4, 16, 16)], {"axis": -1}),
    ("matmul", [(4, 16, 32), (32, 24)], {}),
    ("silu", [(2, 16, 8, 8)], {}),
    ("gelu", [(2, 16, 8, 8)], {})], ids=lambda v: v if isinstance(v, str) else "")
def test_results_do_not_depend_on_the_operands_memory_order(op, shapes, attrs, rng):
    """A transposed or sliced view reaches a kernel C-ordered (numpy sums a strided axis,
    and BLAS a transposed matrix, in another order): the same bits either way, so a layout
    change elsewhere in the graph cannot change them (to-nhwc's claim)."""
    node, args = single_op(op, shapes, rng, **attrs)
    want = node.opdef.run(node, args)[0]
    got = node.opdef.run(node, [other_order(args[0]), *args[1:]])[0]
    assert got.tobytes() == want.tobytes()


CONV_CASES = [  # (input channels, output channels, kernel, stride, groups, activation)
    (3, 16, 3, 2, 1, None), (8, 16, 3, 1, 1, "silu"), (32, 16, 1, 1, 1, "gelu"),
    (32, 32, 3, 1, 32, "silu"), (32, 32, 7, 2, 32, None), (32, 16, 3, 1, 2, "relu")]


@pytest.mark.parametrize("layout", [Layout.nchw, Layout.nhwc], ids=str)
@pytest.mark.parametrize("case", CONV_CASES, ids=str)
def test_the_ops_that_read_any_memory_order_do(case, layout, rng):
    """conv2d and conv2d_act declare ``any_memory_order`` (their operands reach them as
    views): their kernels (channel-major stems, depthwise, grouped, FMA products) give the
    same bits for a view in another memory order as for a C-ordered x."""
    cin, cout, k, stride, groups, act = case
    shape = (1, cin, 12, 12) if layout is Layout.nchw else (1, 12, 12, cin)
    op, attrs = ("conv2d_act", {"activation": act}) if act else ("conv2d", {})
    node, args = single_op(op, [shape, (cout, cin // groups, k, k), (cout,)], rng, layout,
                           strides=(stride, stride), pads=(k // 2,) * 4, groups=groups,
                           **attrs)
    assert node.opdef.any_memory_order
    c = node.opdef.ctx(node)
    want = node.opdef.compute(c, *args)
    got = node.opdef.compute(c, other_order(args[0]), *args[1:])
    assert got.tobytes() == want.tobytes()


def test_only_data_movement_and_convolutions_read_any_memory_order():
    assert {n for n, op in OPS.items() if op.any_memory_order} == {"conv2d", "conv2d_act"}
