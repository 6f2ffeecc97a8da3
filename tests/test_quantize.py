"""The quantize pass: calibrated float ops lowered to fx_* ops by a QuantConfig."""
from __future__ import annotations

import numpy as np
import pytest

import bevir
from bevir import Builder, PassError, TensorType
from bevir.ir.types import AffineQuant, FixedPointQuant
from bevir.passes.quant_config import QuantConfig
from bevir.passes.quantize import frac_bits_for, quantize, quantize_weight
from bevir.sim.compare import layer_error


def _mlp(seed=0):
    rng = np.random.default_rng(seed)
    w = lambda *s: (rng.standard_normal(s) / np.sqrt(s[-1])).astype(np.float32)  # noqa: E731
    b = Builder("mlp")
    x = b.input("x", TensorType((16, 32)))
    with b.loc("enc.fc1"):
        h = b.relu(b.gemm(x, b.const(w(64, 32), "w1"), b.const(w(64) * 0.1, "b1"), trans_b=True))
    with b.loc("dec.fc2"):
        y = b.matmul(h, b.const(w(32, 64).T.copy(), "w2"))
    with b.loc("dec.res"):
        y = b.add(y, x)
    with b.loc("dec.norm"):
        y = b.layer_norm(y, b.const((1 + 0.2 * rng.standard_normal(32)).astype(np.float32), "g"),
                         b.const((0.1 * rng.standard_normal(32)).astype(np.float32), "beta"))
    b.output("p", b.softmax(y, axis=-1))
    b.output("y", b.sigmoid(y))
    b.output("h", h)
    return b.graph


def _inputs(n, seed=1):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((16, 32)).astype(np.float32)} for _ in range(n)]


def _config(**per_rule):
    return QuantConfig.build({"rules": [{"name": "enc", "where": ["enc.*"], **per_rule},
                                        {"name": "dec", "where": ["dec.*"]}]})


@pytest.mark.parametrize("weights", ["per_tensor", "per_channel"])
def test_mlp_is_integer_between_input_and_outputs_and_close_to_float(weights):
    g = _mlp()
    ref = g.clone()
    bevir.calibrate(g, _inputs(4))
    stats = quantize(g, _config(weights=weights))
    bevir.verify(g)
    assert stats == {"lowered-gemm": 1, "lowered-relu": 1, "lowered-matmul": 1,
                     "lowered-add": 1, "lowered-layer_norm": 1, "lowered-softmax": 1,
                     "lowered-sigmoid": 1}
    ops = [n.op for n in g.nodes]
    assert ops.count("fx_quantize") == 1                       # the input, once
    assert {o for o in ops if not o.startswith("fx_")} == set()
    w1 = next(n for n in g.nodes if n.op == "fx_linear").inputs[1].type.quant
    assert isinstance(w1, AffineQuant) and (w1.axis == 0) == (weights == "per_channel")
    x = _inputs(1, seed=9)[0]
    got, want = bevir.run(g, x), bevir.run(ref, x)
    for name in ("y", "h", "p"):
        sqnr, _, cos = layer_error(want[name], got[name])
        assert sqnr > 20 and cos > 0.99, (name, sqnr, cos)
    again = bevir.run(g, x)
    assert all(np.array_equal(got[k], again[k]) for k in got)   # deterministic


def test_excluded_group_stays_float_and_the_graph_still_runs():
    g = _mlp()
    bevir.calibrate(g, _inputs(2))
    cfg = _config().override("dec", exclude=True)
    stats = quantize(g, cfg)
    assert stats["float-left"] == 3 and "lowered-matmul" not in stats     # matmul, add, norm
    ops = [n.op for n in g.nodes]
    assert "matmul" in ops and "add" in ops and "fx_dequantize" in ops
    out = bevir.run(g, _inputs(1)[0])
    assert np.isfinite(out["y"]).all()


def test_pass_from_a_pipeline_with_a_config_file(tmp_path):
    g = _mlp()
    bevir.calibrate(g, _inputs(2))
    path = _config(weights="per_channel").save(tmp_path / "q.json")
    bevir.optimize(g, f"quantize{{config={path}}},dce")
    assert sum(n.op.startswith("fx_") for n in g.nodes) >= 6


def test_quantize_needs_ranges():
    with pytest.raises(PassError, match="calibrated ranges"):
        quantize(_mlp())


def test_frac_bits_and_weight_codes():
    assert frac_bits_for(-1.0, 0.99) == 6                       # 127 / 1 -> 2**6
    assert frac_bits_for(0.0, 0.0) == 7 and frac_bits_for(-300, 3) == -2
    w = np.array([[0.5, -1.0], [0.25, 0.125]], np.float32)
    codes, q = quantize_weight(w, per_channel=True)
    assert codes.tolist() == [[64, -127], [127, 64]] and q.axis == 0   # 63.5 -> 64 (even)
    codes, q = quantize_weight(w, per_channel=False)
    assert codes.tolist() == [[64, -127], [32, 16]] and q.axis is None
    assert isinstance(FixedPointQuant((3,)), FixedPointQuant)


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_fused_linear_and_conv_with_activations(act):
    rng = np.random.default_rng(4)
    b = Builder("cnn")
    x = b.input("x", TensorType((2, 3, 8, 8)))
    w = b.const((rng.standard_normal((8, 3, 3, 3)) / 5).astype(np.float32), "w")
    c = b.conv2d_act(x, w, b.const(np.full(8, 0.1, np.float32), "cb"), pads=[1, 1, 1, 1],
                     activation="relu")
    f = b.reshape(c, shape=[2, 8 * 64])
    y = b.linear(f, b.const((rng.standard_normal((512, 16)) / 20).astype(np.float32), "lw"),
                 activation=act)
    b.output("y", y)
    g = b.graph
    ref = g.clone()
    feeds = [{"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32)} for _ in range(3)]
    bevir.calibrate(g, feeds)
    stats = quantize(g, QuantConfig.build({"default": {"name": "all", "weights": "per_channel"}}))
    assert stats == {"lowered-conv2d_act": 1, "lowered-linear": 1}
    ops = [n.op for n in g.nodes]
    assert ops[:3] == ["fx_quantize", "fx_conv2d", "fx_relu"] and f"fx_{act}" in ops
    sqnr, _, cos = layer_error(bevir.run(ref, feeds[0])["y"], bevir.run(g, feeds[0])["y"])
    assert sqnr > 20 and cos > 0.99, (sqnr, cos)


def test_affine_rules_are_left_to_the_int8_import():
    g = _mlp()
    bevir.calibrate(g, _inputs(2))
    cfg = QuantConfig.build({"rules": [{"name": "enc", "where": ["enc.*"],
                                        "activations": "affine"}]})
    stats = quantize(g, cfg)
    assert stats["affine-left"] == 2                           # the gemm and its relu
    assert [n.op for n in g.nodes][:2] == ["gemm", "relu"]
