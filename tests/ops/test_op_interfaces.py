"""Every op carries its own knowledge: the registry says, per op, which interfaces it
implements, and the declarations are consistent with what the passes accept."""
from __future__ import annotations

import re
from pathlib import Path

import bevir
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
