"""The quantize pass: calibrated float ops lowered to fx_* ops by a QuantConfig."""
from __future__ import annotations

import numpy as np
import pytest

import bevir
from bevir import Builder, PassError, TensorType
from bevir.codegen.program import Program
from bevir.ir.types import AffineQuant
from bevir.passes.quant_config import QuantConfig
from bevir.passes.quantize import frac_bits_for, quantize, quantize_weight
from bevir.sim.compare import layer_error
from examples.bevformer import quant as bevformer_quant  # noqa: F401  (its inverse_sigmoid pattern)


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
                     "lowered-sigmoid": 1, "norm-input-i16": 1}   # the residual sum
    ops = [n.op for n in g.nodes]
    widths = sorted(n.output.type.dtype.value for n in g.nodes if n.op == "fx_quantize")
    assert widths == ["i16", "i8"]        # the input: for the product, for the normed sum
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


def test_16bit_activations_where_the_rule_asks_and_requantized_at_the_border():
    """enc at fixed16: its product and relu run on i16 codes (i8 weights); dec reads them
    requantized to i8 (never through float); the enc result gains precision."""
    x = _inputs(1, seed=9)[0]
    sqnr = {}
    for acts in ("fixed", "fixed16"):
        g = _mlp()
        ref = g.clone()
        bevir.calibrate(g, _inputs(4))
        stats = quantize(g, _config(weights="per_channel", activations=acts))
        bevir.verify(g)
        assert stats.get("activations-i16", 0) == (2 if acts == "fixed16" else 0)
        assert "float-left" not in stats
        got, want = bevir.run(g, x), bevir.run(ref, x)
        sqnr[acts] = {k: layer_error(want[k], got[k])[0] for k in ("h", "y")}
    dtype = {n.op: n.outputs[0].type.dtype.value for n in g.nodes}
    assert dtype["fx_linear"] == "i8" and dtype["fx_relu"] == "i16"     # dec's, enc's
    wide = [n for n in g.nodes if n.op == "fx_linear" and n.inputs[0].type.dtype.value == "i16"]
    assert len(wide) == 1 and wide[0].outputs[0].type.dtype.value == "i16"
    border = next(n for n in g.nodes if n.op == "fx_requantize")
    assert border.inputs[0].producer.op == "fx_relu" and dtype["fx_requantize"] == "i8"
    assert border.attrs["out_frac_bits"] == border.inputs[0].type.quant.frac_bits[0] - 8
    assert sqnr["fixed16"]["h"] > sqnr["fixed"]["h"] + 8, sqnr
    assert sqnr["fixed16"]["y"] >= sqnr["fixed"]["y"], sqnr
    # both groups at 16 bits: the norm too, and the softmax reads its i16 codes
    g = _mlp()
    bevir.calibrate(g, _inputs(4))
    quantize(g, _config(activations="fixed16").override("dec", activations="fixed16"))
    bevir.verify(g)
    ops = {n.op: n for n in g.nodes}
    assert ops["fx_layer_norm"].inputs[0].type.dtype.value == "i16"
    assert ops["fx_layer_norm"].outputs[0].type.dtype.value == "i16"
    assert ops["fx_softmax"].inputs[0].producer.op == "fx_layer_norm"
    assert ops["fx_sigmoid"].outputs[0].type.dtype.value == "i8"     # no loc: the default


def test_fixed16_norm_of_long_rows_stays_8_bit():
    # an i16 row's exact variance fits int64 up to 512 channels: a longer norm of a
    # fixed16 group reads i8 codes (the op says so through takes_x), a shorter one i16
    from bevir.ops import get_op
    norm = get_op("fx_layer_norm")
    assert norm.takes_x(bevir.DType.i16, (4, 512)) and not norm.takes_x(bevir.DType.i16, (4, 513))
    assert norm.takes_x(bevir.DType.i8, (4, 4096))
    rng = np.random.default_rng(0)
    for ch, want in ((512, "i16"), (600, "i8")):
        b = Builder("norm")
        x = b.input("x", TensorType((4, ch)))
        with b.loc("enc.norm"):
            b.output("y", b.layer_norm(x, b.const(np.ones(ch, np.float32), "g"),
                                       b.const(np.zeros(ch, np.float32), "beta")))
        g = b.graph
        bevir.calibrate(g, [{"x": rng.standard_normal((4, ch)).astype(np.float32)}])
        quantize(g, _config(activations="fixed16"))
        bevir.verify(g)
        ln = next(n for n in g.nodes if n.op == "fx_layer_norm")
        assert ln.inputs[0].type.dtype.value == want, ch
        bevir.run(g, {"x": rng.standard_normal((4, ch)).astype(np.float32)})


def test_pass_from_a_pipeline_with_a_config_file(tmp_path):
    g = _mlp()
    bevir.calibrate(g, _inputs(2))
    path = _config(weights="per_channel").save(tmp_path / "q.json")
    bevir.optimize(g, f"lower-to-fixed-point{{config={path}}},dce")
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
    assert q.scale == (float(np.float32(1.0) / 127), float(np.float32(0.25) / 127))
    assert q.zero_point == (0, 0)                                      # symmetric
    codes, q = quantize_weight(w, per_channel=False)
    assert codes.tolist() == [[64, -127], [32, 16]] and q.axis is None
    assert q.scale == (float(np.float32(1.0) / 127),) and q.zero_point == (0,)


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_fused_linear_and_conv_with_activations(act):
    rng = np.random.default_rng(4)
    b = Builder("cnn")
    x = b.input("x", TensorType((2, 3, 8, 8)))
    w = b.const((rng.standard_normal((8, 3, 3, 3)) / 5).astype(np.float32), "w")
    c = b.conv2d_act(x, w, b.const(np.full(8, 0.1, np.float32), "cb"), pads=[1, 1, 1, 1],
                     activation="relu")
    f = b.reshape(c, shape=[2, 8 * 64])
    y = b.matmul_act(f, b.const((rng.standard_normal((512, 16)) / 20).astype(np.float32), "lw"),
                 activation=act)
    b.output("y", y)
    g = b.graph
    ref = g.clone()
    feeds = [{"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32)} for _ in range(3)]
    bevir.calibrate(g, feeds)
    stats = quantize(g, QuantConfig.build({"default": {"name": "all", "weights": "per_channel"}}))
    assert stats == {"lowered-conv2d_act": 1, "lowered-reshape": 1, "lowered-matmul_act": 1}
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


def _attention_block(seed=0):
    """Deformable sampling with offsets added to float geometry, a camera mean divided by a
    count, elementwise arithmetic, inverse_sigmoid and a softmax attention: every lowering."""
    rng = np.random.default_rng(seed)
    w = lambda k, n: (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)  # noqa: E731
    b = Builder("block")
    x = b.input("x", TensorType((2, 24, 8)))                 # image features, 2 cameras
    q = b.input("q", TensorType((2, 10, 8)))                 # queries
    ref = b.input("ref", TensorType((2, 10, 1, 1, 1, 2)))    # geometry: not a source
    mask = b.input("mask", TensorType((2, 10, 1), "bool"))
    with b.loc("blk.attn/value_proj"):
        value = b.reshape(b.matmul_act(x, b.const(w(8, 8), "wv")), shape=[2, 24, 2, 4])
    with b.loc("blk.attn/sampling_offsets"):
        off = b.reshape(b.matmul_act(q, b.const(w(8, 16) * 0.5, "wo")), shape=[2, 10, 2, 1, 4, 2])
        off = b.div(off, b.const(np.array([6, 4], np.float32), "level_sizes"))
    with b.loc("blk.attn/attention_weights"):
        aw = b.softmax(b.reshape(b.matmul_act(q, b.const(w(8, 8), "wa")), shape=[2, 10, 2, 4]))
    with b.loc("blk.attn/sampling"):
        s = b.ms_deform_attn(value, b.add(ref, off), b.reshape(aw, shape=[2, 10, 2, 1, 4]),
                             spatial_shapes=[4, 6])
    with b.loc("blk.attn/camera_mean"):
        seen = b.cast(mask, to="f32")
        total = b.reduce_sum(b.mul(s, seen), axes=[0], keepdims=True)
        count = b.max(b.reduce_sum(seen, axes=[0], keepdims=True), b.const(np.float32(1), "one"))
        y = b.div(total, count)                                          # [1, 10, 8]
    with b.loc("blk.tail"):
        t = b.clip(b.mul(b.sub(y, b.const(np.float32(0.1), "c")), b.const(np.float32(0.5), "h")),
                   min=-0.3, max=0.3)
        b.output("m", b.reduce_mean(b.concat(t, y, axis=-1), axes=[-1], keepdims=True))
        x1 = b.clip(b.sigmoid(y), min=0.0, max=1.0)
        num = b.clip(x1, min=1e-5)
        den = b.clip(b.sub(b.const(np.float32(1), "one_"), x1), min=1e-5)
        b.output("inv", b.log(b.div(num, den)))
        k = b.matmul_act(q, b.const(w(8, 8), "wk"))                         # [2, 10, 8]
        scores = b.matmul(b.mul(k, b.const(np.float32(0.35), "scale")), b.transpose(k, perm=[0, 2, 1]))
        b.output("att", b.matmul(b.softmax(scores), k))
    return b.graph


def _block_inputs(n, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        out.append({"x": rng.standard_normal((2, 24, 8)).astype(np.float32),
                    "q": rng.standard_normal((2, 10, 8)).astype(np.float32),
                    # in-view points near the maps, and some far out of view
                    "ref": np.where(rng.random((2, 10, 1, 1, 1, 2)) < 0.8,
                                    rng.random((2, 10, 1, 1, 1, 2)),
                                    rng.choice([-1e6, 5e5], (2, 10, 1, 1, 1, 2))).astype(np.float32),
                    "mask": rng.random((2, 10, 1)) < 0.7})
    return out


def test_every_op_of_an_attention_block_is_lowered_between_the_sources_and_outputs():
    g = _attention_block()
    ref = g.clone()
    bevir.calibrate(g, _block_inputs(3))
    cfg = QuantConfig.build({"sources": ["x", "q"], "default": {"name": "all"}})
    stats = quantize(g, cfg)
    bevir.optimize(g, "sink-dequantize,cse,dce")
    bevir.verify(g)
    for op in ("ms_deform_attn", "div", "mul", "sub", "clip", "concat", "reduce_sum",
               "reduce_mean", "log", "matmul", "softmax", "sigmoid", "matmul_act"):
        assert stats.get(f"lowered-{op}", 0) >= 1, op
    assert stats["geometry-left"] == 1                  # the camera count (a sum of the mask)
    assert len(bevir.passes.float_ops_between(g, ["x", "q"])) == 0
    ops = {n.op: n for n in g.nodes}
    assert ops["fx_ms_deform_attn"].inputs[1].type.dtype.value == "i32"   # the locations
    assert ops["fx_inverse_sigmoid"].attrs["eps"] == pytest.approx(1e-5)
    assert "fx_div" in ops and ops["fx_div"].inputs[1].producer.op == "cast"
    soft = [n for n in g.nodes if n.op == "fx_softmax"]
    assert all(n.inputs[0].type.dtype.value == "i16" for n in soft)   # scores from products
    probs = next(n for n in g.nodes if n.op == "fx_matmul" and n.inputs[0].producer.op == "fx_softmax")
    assert probs.inputs[0].type.dtype.value == "i16"     # attention probabilities for a matmul
    feed = _block_inputs(1, seed=7)[0]
    got, want = bevir.run(g, feed), bevir.run(ref, feed)
    for name in ("m", "inv", "att"):
        sqnr, _, _ = layer_error(want[name], got[name])
        assert sqnr > 20, (name, sqnr)
    again = bevir.run(g, feed)
    assert all(np.array_equal(got[k], again[k]) for k in got)


def _refinement_loop(layers=5, n=4096, seed=0):
    """The decoder's box refinement: ref <- sigmoid(delta + inverse_sigmoid(ref)), delta a
    small product of the query (finer frac bits than the logits)."""
    rng = np.random.default_rng(seed)
    b = Builder("refine")
    q = b.input("q", TensorType((n, 8)))
    ref = b.sigmoid(b.input("r", TensorType((n, 2))))
    for i in range(layers):
        with b.loc(f"dec.{i}"):
            delta = b.matmul(q, b.const((0.03 * rng.standard_normal((8, 2))).astype(np.float32), f"w{i}"))
            x1 = b.clip(ref, min=0.0, max=1.0)
            num, den = b.clip(x1, min=1e-5), b.clip(b.sub(b.const(np.float32(1), f"one{i}"), x1), min=1e-5)
            ref = b.sigmoid(b.concat(b.add(delta, b.log(b.div(num, den))), axis=-1))
    b.output("ref", ref)
    return b.graph


def test_a_refinement_loop_keeps_16_bits_between_its_tables_and_does_not_drift():
    g = _refinement_loop()
    ref = g.clone()
    rng = np.random.default_rng(1)
    feeds = [{"q": rng.standard_normal((4096, 8)).astype(np.float32),
              "r": rng.standard_normal((4096, 2)).astype(np.float32)} for _ in range(2)]
    bevir.calibrate(g, feeds)
    stats = quantize(g, QuantConfig.build({"sources": ["q", "r"], "default": {"name": "all"}}))
    bevir.verify(g)
    assert stats["exact-i16"] == 15     # 5 sums, the concats they feed, the tables they read
    assert all(n.output.type.dtype.value == "i16" for n in g.nodes if n.op == "fx_inverse_sigmoid")
    for add in (n for n in g.nodes if n.op == "fx_add"):
        fracs = [v.type.quant.frac_bits[0] for v in add.inputs]
        assert add.output.type.dtype.value == "i16"
        assert add.attrs["out_frac_bits"] == max(fracs) > min(fracs)   # no rounding
    assert all(n.inputs[0].type.dtype.value == "i16" for n in g.nodes if n.op == "fx_sigmoid"
               and n.inputs[0].producer.op != "fx_quantize")
    got, want = bevir.run(g, feeds[0])["ref"], bevir.run(ref, feeds[0])["ref"]
    # rounding the sums half up would add a quarter of a logit step per layer (~1/350 of
    # the range); exact sums leave the tables' rounding, which is unbiased
    assert abs(float(np.mean(got - want))) < 1 / 1024
    assert layer_error(want, got)[0] > 30


def test_sampling_offsets_beyond_the_location_bound_stay_float():
    g = _attention_block()
    feeds = _block_inputs(2)
    for f in feeds:
        f["q"] = f["q"] * 1e4                     # offsets of ~1000 map widths
    bevir.calibrate(g, feeds)
    stats = quantize(g, QuantConfig.build({"sources": ["x", "q"], "default": {"name": "all"}}))
    assert "lowered-ms_deform_attn" not in stats and stats["float-left"] >= 1
    assert any(n.op == "ms_deform_attn" for n in g.nodes)


def test_float_ops_between_counts_what_stays_float():
    g = _mlp()
    bevir.calibrate(g, _inputs(2))
    quantize(g, _config().override("dec", exclude=True))
    left = bevir.passes.float_ops_between(g, ["x"])
    assert left.counts() == {"matmul": 1, "add": 1, "layer_norm": 1}
    assert "dec.norm" in left.table()
    assert len(bevir.passes.float_ops_between(g, ["nothing"])) == 0


def test_accumulators_are_bounded_statically_and_overflow_is_reported():
    from bevir.passes.accumulators import accumulator_bounds, check_accumulators
    g = _mlp()
    bevir.calibrate(g, _inputs(2))
    quantize(g, _config())
    bounds = check_accumulators(g)                       # fits: no error
    gemm = next(b for b in bounds if b.node.loc == "enc.fc1")
    w, bias = gemm.node.inputs[1].const, gemm.node.inputs[2].const
    assert gemm.bound == int((128 * np.abs(w.astype(np.int64)).sum(1) + np.abs(bias)).max())
    assert all(b.safe for b in bounds) and len(bounds) == 2

    # i8 products of a reduction <= 2**16 stay below 2**30; a bias far larger than the
    # weights' products (its int32 codes saturate) is what can overflow
    b = Builder("wide")
    x = b.input("x", TensorType((2, 64)))
    with b.loc("wide.fc"):
        b.output("y", b.matmul_act(x, b.const(np.full((64, 2), 1e-6, np.float32), "w"),
                               b.const(np.full(2, 10.0, np.float32), "b")))
    g = b.graph
    bevir.calibrate(g, {"x": np.full((2, 64), 1.0, np.float32)})
    with pytest.warns(UserWarning, match="wide.fc.*can overflow int32"):
        stats = quantize(g, QuantConfig.build({"default": {"name": "all"}}))
    assert stats["accumulator-overflow-risk"] == 1
    assert not accumulator_bounds(g)[0].safe
    with pytest.raises(PassError, match="1 accumulator") as e:
        check_accumulators(g)
    assert e.value.op == "fx_linear" and e.value.loc == "wide.fc"


def _mobile_cnn(seed=0):
    """A small CNN of the zoo's ops: fused SiLU and ReLU6 convolutions, a batch norm left
    unfused, a residual add_relu, a channel shuffle (split, concat), max, average and global
    average pooling, hard-swish, tanh, a flatten and a classifier."""
    rng = np.random.default_rng(seed)
    b = Builder("mobile")

    def const(shape, scale, name):
        return b.const((rng.standard_normal(shape) * scale).astype(np.float32), name)
    x = b.input("x", TensorType((1, 3, 16, 16)))
    c1 = b.conv2d_act(x, const((8, 3, 3, 3), 0.3, "w1"), const(8, 0.1, "b1"), pads=[1, 1, 1, 1],
                      activation="silu")
    c2 = b.conv2d_act(c1, const((8, 8, 3, 3), 0.15, "w2"), None, pads=[1, 1, 1, 1],
                      activation="clip", clip_min=0.0, clip_max=6.0)
    bn = b.batch_norm(c2, *(b.const(v.astype(np.float32), f"bn{i}") for i, v in enumerate((
        rng.uniform(0.5, 1.5, 8), rng.standard_normal(8) * 0.1, rng.standard_normal(8) * 0.1,
        rng.uniform(0.5, 1.5, 8)))))
    lo, hi = b.split(b.add_relu(bn, c1), axis=1, sizes=(3, 5))
    p = b.maxpool2d(b.concat(hi, lo, axis=1), kernel=[2, 2], strides=[2, 2])
    a = b.avgpool2d(b.hardswish(p), kernel=[3, 3], pads=[1, 1, 1, 1])
    g = b.global_avgpool(b.tanh(a))
    f = b.reshape(g, shape=[1, 8])
    b.output("y", b.matmul(f, const((8, 10), 0.3, "fc")))
    return b.graph


def test_every_op_of_a_mobile_cnn_lowers_with_the_default_config():
    """The default config (naming no model) lowers each op of _mobile_cnn: nothing float
    between the input and the output, close to float, and the kernels generated for it
    agree with the golden model bit for bit."""
    g = _mobile_cnn()
    ref = g.clone()
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(4)]
    bevir.calibrate(g, feeds)
    stats = quantize(g, QuantConfig())
    for op in ("batch_norm", "add_relu", "split", "concat", "maxpool2d", "avgpool2d",
               "hardswish", "tanh", "global_avgpool", "reshape", "matmul"):
        assert stats.get(f"lowered-{op}", 0) == 1, (op, stats)
    assert stats["lowered-conv2d_act"] == 2
    assert "float-left" not in stats, stats
    bevir.verify(g)
    assert len(bevir.passes.float_ops_between(g, ["x"])) == 0
    assert {"fx_silu", "fx_hardswish", "fx_tanh", "fx_avgpool2d", "clip"} <= set(g.op_counts())
    feed = {"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)}
    sqnr, _, _ = layer_error(bevir.run(ref, feed)["y"], bevir.run(g, feed)["y"])
    print(f"mobile CNN INT8 vs float: SQNR {sqnr:.1f} dB")
    assert sqnr > 25, sqnr
    report = Program(g, "llvm").check(feed)
    assert report.ok and report.checked >= 10, report.mismatch


def _scores_quantized(g, rng):
    """(a float copy of g, four frames of q [1,2,8,16] and k [1,2,16,8], the stats of
    quantizing g in place with the default config, calibrated on them)."""
    ref = g.clone()
    feeds = [{"q": rng.standard_normal((1, 2, 8, 16)).astype(np.float32),
              "k": rng.standard_normal((1, 2, 16, 8)).astype(np.float32)} for _ in range(4)]
    bevir.calibrate(g, feeds)
    return ref, feeds, quantize(g, QuantConfig())


def test_attention_scores_with_a_constant_mask_lower_to_a_product_and_an_add():
    """matmul_act(q, k^T, mask) (an encoder's scores plus its attention mask, as fuse makes
    them): fx_matmul, then fx_add of the mask's codes, 16 bits for the softmax; nothing
    left in float, close to float."""
    rng = np.random.default_rng(6)
    b = Builder("scores")
    q = b.input("q", TensorType((1, 2, 8, 16)))
    k = b.input("k", TensorType((1, 2, 16, 8)))
    mask = np.zeros((1, 1, 8, 8), np.float32)
    mask[..., -2:] = -4.0                                  # the last two keys masked
    s = b.matmul_act(q, k, b.const(mask, "mask"), activation="none")
    b.output("p", b.softmax(s, axis=-1))
    g = b.graph
    ref, feeds, stats = _scores_quantized(g, rng)
    assert stats.get("lowered-matmul_act") == 1 and "float-left" not in stats, stats
    assert len(bevir.passes.float_ops_between(g, ["q", "k"])) == 0
    add = next(n for n in g.nodes if n.op == "fx_add")
    assert add.inputs[0].producer.op == "fx_matmul" and add.output.type.dtype.value == "i16"
    sqnr, _, _ = layer_error(bevir.run(ref, feeds[0])["p"], bevir.run(g, feeds[0])["p"])
    assert sqnr > 25, sqnr


def test_a_mask_computed_from_constants_is_folded_not_left_on_the_host():
    """where(mask, 0, -inf-like) of constants only (an encoder's attention mask when no
    mask is given) is folded before lowering: nothing float between the inputs and the
    output, the mask added to the scores' codes."""
    rng = np.random.default_rng(7)
    b = Builder("masked")
    q = b.input("q", TensorType((1, 2, 8, 16)))
    k = b.input("k", TensorType((1, 2, 16, 8)))
    keep = b.const(np.tril(np.ones((1, 1, 8, 8), bool)), "keep")
    mask = b.where(keep, b.const(np.float32(0.0), "zero"), b.const(np.float32(-8.0), "low"))
    b.output("p", b.softmax(b.add(b.matmul(q, k), mask), axis=-1))
    g = b.graph
    ref, feeds, stats = _scores_quantized(g, rng)
    assert "float-left" not in stats and "where" not in g.op_counts(), stats
    assert len(bevir.passes.float_ops_between(g, ["q", "k"])) == 0
    sqnr, _, _ = layer_error(bevir.run(ref, feeds[0])["p"], bevir.run(g, feeds[0])["p"])
    assert sqnr > 25, sqnr          # 8-bit softmax probabilities: well above 25 dB


def test_a_constant_left_operand_of_a_product_is_quantized_as_codes():
    """matmul(constant queries, activation) (learned queries against an encoder's keys):
    one fx_matmul on the constant's codes, nothing left in float."""
    rng = np.random.default_rng(8)
    b = Builder("queries")
    k = b.input("k", TensorType((1, 2, 16, 6)))
    queries = (rng.standard_normal((1, 2, 4, 16)) * 0.5).astype(np.float32)
    b.output("s", b.matmul(b.const(queries, "queries"), k))
    g = b.graph
    ref = g.clone()
    feeds = [{"k": rng.standard_normal((1, 2, 16, 6)).astype(np.float32)} for _ in range(4)]
    bevir.calibrate(g, feeds)
    stats = quantize(g, QuantConfig())
    assert stats.get("lowered-matmul") == 1 and "float-left" not in stats, stats
    assert len(bevir.passes.float_ops_between(g, ["k"])) == 0
    mm = next(n for n in g.nodes if n.op == "fx_matmul")
    assert mm.inputs[0].is_const and mm.inputs[0].type.dtype.value == "i8"
    sqnr, _, _ = layer_error(bevir.run(ref, feeds[0])["s"], bevir.run(g, feeds[0])["s"])
    assert sqnr > 30, sqnr          # two 8-bit operands, one rounding: about 40 dB


def _token_stream(seed=0):
    """A class token far smaller than the patch tokens (as a ViT's is before training),
    concatenated with them, position embeddings added, a layer norm: the norm divides the
    class token's row by its own small spread."""
    rng = np.random.default_rng(seed)
    b = Builder("tokens")
    x = b.input("x", TensorType((1, 8, 32)))
    cls = b.const((rng.standard_normal((1, 1, 32)) * 1e-3).astype(np.float32), "cls")
    pos = b.const((rng.standard_normal((1, 9, 32)) * 0.02).astype(np.float32), "pos")
    s = b.add(b.concat(cls, x, axis=1), pos)
    ones, zeros = np.ones(32, np.float32), np.zeros(32, np.float32)
    b.output("y", b.layer_norm(s, b.const(ones, "g"), b.const(zeros, "beta")))
    return b.graph


def test_a_sum_a_layer_norm_reads_keeps_16_bits_and_its_small_rows():
    """The tokens a layer norm reads (concat and add) keep 16 bits, the norm reads them:
    the class token's normalized row stays close to float; in 8 bits it would be noise."""
    g = _token_stream()
    ref = g.clone()
    rng = np.random.default_rng(9)
    feeds = [{"x": rng.standard_normal((1, 8, 32)).astype(np.float32)} for _ in range(4)]
    bevir.calibrate(g, feeds)
    stats = quantize(g, QuantConfig())
    assert "float-left" not in stats and stats.get("norm-input-i16") == 1, stats
    ln = next(n for n in g.nodes if n.op == "fx_layer_norm")
    assert ln.inputs[0].type.dtype.value == "i16"
    assert ln.inputs[0].producer.inputs[0].producer.op == "concat"
    assert ln.inputs[0].producer.inputs[0].type.dtype.value == "i16"
    want, got = bevir.run(ref, feeds[0])["y"], bevir.run(g, feeds[0])["y"]
    sqnr, _, _ = layer_error(want[:, :1], got[:, :1])
    assert sqnr > 30, sqnr          # the 8-bit output's own rounding: about 40 dB


def test_a_causal_mask_of_infinities_saturates_the_masked_scores():
    """scores + where(causal, 0, -inf) folded to a constant: its codes are int32 at the
    sum's frac bits, -inf the lowest; the sum's 16 bits reach MASK_MARGIN below the
    scores (small ones here, as an untrained model's), so the masked probabilities are
    exactly 0 and the others close to float."""
    rng = np.random.default_rng(10)
    b = Builder("causal")
    q = b.input("q", TensorType((1, 2, 8, 16)))
    k = b.input("k", TensorType((1, 2, 16, 8)))
    keep = b.const(np.tril(np.ones((1, 1, 8, 8), bool)), "keep")
    mask = b.where(keep, b.const(np.float32(0.0), "zero"), b.const(np.float32(-np.inf), "ninf"))
    b.output("p", b.softmax(b.add(b.matmul(q, k), mask), axis=-1))
    g = b.graph
    ref = g.clone()
    feeds = [{"q": rng.standard_normal((1, 2, 8, 16)).astype(np.float32) * 0.05,
              "k": rng.standard_normal((1, 2, 16, 8)).astype(np.float32)} for _ in range(4)]
    bevir.calibrate(g, feeds)
    stats = quantize(g, QuantConfig())
    assert "float-left" not in stats, stats
    add = next(n for n in g.nodes if n.op == "fx_add")
    assert add.output.type.dtype.value == "i16"
    codes = add.inputs[1]
    assert codes.is_const and codes.type.dtype.value == "i32"
    assert codes.type.quant.frac_bits[0] == add.attrs["out_frac_bits"]
    assert codes.const.min() == np.iinfo(np.int32).min
    p = bevir.run(g, feeds[0])["p"]
    assert (p[..., ~np.tril(np.ones((8, 8), bool))] == 0).all()
    sqnr, _, _ = layer_error(bevir.run(ref, feeds[0])["p"], p)
    assert sqnr > 30, sqnr          # 8-bit probabilities of 16-bit scores: about 40 dB


@pytest.mark.parametrize("mode", ["constant", "edge"])
def test_padding_runs_on_the_codes(mode):
    """conv, pad, conv (a window partition's padding): the pad moves codes (zero is code
    0), nothing float between the input and the output, the kernels bit-exact."""
    rng = np.random.default_rng(11)
    b = Builder("padded")
    x = b.input("x", TensorType((1, 4, 6, 6)))
    w = lambda o, i: b.const((rng.standard_normal((o, i, 1, 1)) * 0.5).astype(np.float32))  # noqa: E731
    p = b.pad(b.conv2d(x, w(8, 4), None), pads=[0, 0, 1, 0, 0, 0, 1, 2], mode=mode)
    b.output("y", b.conv2d(p, w(4, 8), None))
    g = b.graph
    feeds = [{"x": rng.standard_normal((1, 4, 6, 6)).astype(np.float32)} for _ in range(3)]
    bevir.calibrate(g, feeds)
    stats = quantize(g, QuantConfig())
    assert stats.get("lowered-pad") == 1 and "float-left" not in stats, stats
    assert len(bevir.passes.float_ops_between(g, ["x"])) == 0
    report = Program(g, "c").check(feeds[0])
    assert report.ok and report.checked >= 3, report.mismatch


def _feeds(shape, n=4, seed=12):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(n)]


def _lowered(g, feeds, output="y"):
    """Quantize g (default config) on feeds: (stats, SQNR of output on feeds[0] in dB);
    nothing may stay float between the input and the outputs."""
    ref = g.clone()
    bevir.calibrate(g, feeds)
    stats = quantize(g, QuantConfig())
    bevir.verify(g)
    assert "float-left" not in stats and len(bevir.passes.float_ops_between(g, ["x"])) == 0, stats
    sqnr, _, _ = layer_error(bevir.run(ref, feeds[0])[output], bevir.run(g, feeds[0])[output])
    return stats, sqnr


def test_squares_and_cubes_are_products_of_the_codes():
    """relu(x)**2 (a squared ReLU) and x**3: fx_mul of the codes (the cube's square in 16
    bits); close to float."""
    b = Builder("powers")
    x = b.input("x", TensorType((4, 64)))
    sq = b.pow(b.relu(x), b.const(np.float32(2.0), "two"))
    b.output("y", b.add(sq, b.pow(x, b.const(np.float32(3.0), "three"))))
    rng = np.random.default_rng(15)
    feeds = [{"x": rng.uniform(-1, 1, (4, 64)).astype(np.float32)} for _ in range(4)]
    stats, sqnr = _lowered(b.graph, feeds)
    assert stats["lowered-pow"] == 2 and "pow" not in b.graph.op_counts(), stats
    assert sqnr > 30, sqnr          # values in [-1, 1], 8-bit codes, a few roundings: ~40 dB


def test_a_decomposed_tanh_gelu_is_one_table():
    """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3))) as a GPT-2 writes it is
    recognized before lowering: one fx_gelu (tanh) table, no product chain."""
    b = Builder("gelu_new")
    x = b.input("x", TensorType((4, 64)))
    c = lambda v, n: b.const(np.float32(v), n)  # noqa: E731
    cube = b.mul(b.pow(x, c(3.0, "three")), c(0.044715, "c"))
    t = b.tanh(b.mul(b.add(x, cube), c(np.sqrt(2 / np.pi), "k")))
    b.output("y", b.mul(b.mul(x, c(0.5, "half")), b.add(t, c(1.0, "one"))))
    stats, sqnr = _lowered(b.graph, _feeds((4, 64)))
    gelu = [n for n in b.graph.nodes if n.op == "fx_gelu"]
    assert len(gelu) == 1 and gelu[0].attrs["approximate"] == "tanh", b.graph.op_counts()
    assert "fx_mul" not in b.graph.op_counts()
    assert sqnr > 30, sqnr          # one table on 8-bit codes: about 40 dB


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsampling_runs_on_the_codes(mode):
    """conv, 2x upsampling, conv (a segmentation head, a feature pyramid): the resize on
    the codes (linear: the golden model's 8-bit bilinear kernel), the kernels bit-exact."""
    rng = np.random.default_rng(13)
    b = Builder("upsample")
    x = b.input("x", TensorType((1, 4, 5, 6)))
    w = lambda o, i: b.const((rng.standard_normal((o, i, 1, 1)) * 0.5).astype(np.float32))  # noqa: E731
    up = b.resize(b.conv2d(x, w(8, 4), None), size=[1, 8, 10, 12], mode=mode)
    b.output("y", b.conv2d(up, w(4, 8), None))
    feeds = _feeds((1, 4, 5, 6))
    stats, sqnr = _lowered(b.graph, feeds)
    assert stats.get("lowered-resize") == 1 and sqnr > 25, (stats, sqnr)
    report = Program(b.graph, "c").check(feeds[0])
    assert report.ok and report.checked >= 4, report.mismatch


def test_a_graph_input_is_quantized_before_it_moves():
    """unsqueeze(x) before a convolution (a 1-D conv as torch exports it): the input is
    quantized first and the unsqueeze moves codes, so nothing runs on the host."""
    rng = np.random.default_rng(14)
    b = Builder("conv1d")
    x = b.input("x", TensorType((1, 4, 16)))
    w = b.const((rng.standard_normal((8, 4, 1, 3)) * 0.5).astype(np.float32), "w")
    y = b.conv2d(b.unsqueeze(x, axes=[2]), w, None, pads=[0, 1, 0, 1])
    b.output("y", b.squeeze(y, axes=[2]))
    stats, sqnr = _lowered(b.graph, _feeds((1, 4, 16)))
    first = b.graph.nodes[0]
    assert first.op == "fx_quantize" and first.inputs[0].name == "x", b.graph.op_counts()
    assert sqnr > 30, sqnr          # one 8-bit convolution: about 40 dB


def test_a_graph_input_a_float_op_reads_after_its_moves_stays_float():
    """transpose(reshape(x)) read by grid_sample (no integer form; BEVFormer's previous
    BEV aligned to the ego motion): quantizing x before the moves would only take its codes
    back to float on the host after a device stage (a round trip, and x's quantization
    error for nothing), so the moves stay float with their reader."""
    b = Builder("align")
    x = b.input("x", TensorType((16, 8)))
    grid = b.input("grid", TensorType((1, 4, 4, 2)))
    bev = b.transpose(b.reshape(x, shape=[1, 4, 4, 8]), perm=[0, 3, 1, 2])
    b.output("y", b.grid_sample(bev, grid))
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.standard_normal((16, 8)).astype(np.float32),
              "grid": rng.uniform(-1, 1, (1, 4, 4, 2)).astype(np.float32)} for _ in range(2)]
    reference = bevir.run(b.graph, feeds[0])["y"]
    bevir.calibrate(b.graph, feeds)
    quantize(b.graph, QuantConfig())
    counts = b.graph.op_counts()
    assert "fx_quantize" not in counts and "fx_dequantize" not in counts, counts
    assert np.array_equal(bevir.run(b.graph, feeds[0])["y"], reference)     # all float
    assert counts["reshape"] == counts["transpose"] == counts["grid_sample"] == 1


def test_rms_norm_and_l2_normalize_lower_through_tables():
    """x * reciprocal(sqrt(mean(x**2) + eps)) (T5's RMS norm) and x / max(norm, eps)
    (an L2 normalize): squares as products, fx_sqrt and fx_reciprocal tables, the
    division as a product by a 16-bit reciprocal; nothing float, close to float."""
    b = Builder("norms")
    x = b.input("x", TensorType((4, 32)))
    ms = b.reduce_mean(b.pow(x, b.const(np.float32(2.0), "two")), axes=[1], keepdims=True)
    rms = b.reciprocal(b.sqrt(b.add(ms, b.const(np.float32(1e-6), "eps"))))
    y = b.mul(x, rms)
    norm = b.sqrt(b.reduce_sum(b.mul(y, y), axes=[1], keepdims=True))
    b.output("y", b.div(y, b.clip(norm, min=1e-12)))
    g = b.graph
    rng = np.random.default_rng(16)
    feeds = [{"x": (rng.standard_normal((4, 32)) * rng.uniform(0.5, 2, (4, 1))).astype(np.float32)}
             for _ in range(4)]
    stats, sqnr = _lowered(g, feeds)
    ops = g.op_counts()
    assert ops.get("fx_sqrt") == 2 and ops.get("fx_reciprocal") == 2, ops
    assert sqnr > 25, sqnr          # five 8-bit steps of values of unit scale: about 30 dB


def test_an_unfused_batch_norm_of_a_fixed16_group_keeps_16_bits():
    """conv, batch norm (a re-parameterizable block's branch) in a fixed16 group: the norm
    reads the conv's 16-bit codes and gives 16 bits; closer to float than in 8 bits."""
    rng = np.random.default_rng(17)
    b = Builder("bn")
    x = b.input("x", TensorType((1, 4, 6, 6)))
    w = b.const((rng.standard_normal((8, 4, 3, 3)) * 0.3).astype(np.float32), "w")
    bn = [b.const(v.astype(np.float32), f"bn{i}") for i, v in enumerate((
        rng.uniform(0.5, 1.5, 8), rng.standard_normal(8) * 0.1, rng.standard_normal(8) * 0.1,
        rng.uniform(0.5, 1.5, 8)))]
    b.output("y", b.batch_norm(b.conv2d(x, w, None, pads=[1, 1, 1, 1]), *bn))
    feeds = _feeds((1, 4, 6, 6))
    results = {}
    for acts in ("fixed", "fixed16"):
        g = b.graph.clone()
        bevir.calibrate(g, feeds)
        stats = quantize(g, QuantConfig.build({"default": {"name": "d", "activations": acts}}))
        assert stats.get("lowered-batch_norm") == 1, stats
        add = next(n for n in g.nodes if n.op == "fx_add")
        results[acts] = (add.output.type.dtype.value, layer_error(
            bevir.run(b.graph, feeds[0])["y"], bevir.run(g, feeds[0])["y"])[0])
    assert results["fixed"][0] == "i8" and results["fixed16"][0] == "i16", results
    assert results["fixed16"][1] > results["fixed"][1] + 10, results   # 8 more bits: ~48 dB
