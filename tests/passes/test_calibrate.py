"""Calibration: statistics, range methods, keys across rewrites, files, seeding, the pass."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import calibrate as quant
from safetensors.numpy import save_file

import bevir
from bevir import BevirError, Builder, Layout, PassError, TensorType
from bevir.passes import AnalysisManager, Pass, PassManager, Statistics
from bevir.passes.calibrate import (AttachedRanges, Calibrate, CalibrationError, Calibrator,
                                    Histogram, RangeMethod, Ranges, Selector, TensorRange, ValueKey,
                                    channel_axis, entropy_threshold, load_inputs, mse_threshold,
                                    ranges_of)
from bevir.sim.interpreter import Interpreter


def small_graph() -> bevir.Graph:
    """conv (nchw) -> relu -> reshape to tokens -> matmul -> softmax; topk gives i64 indices."""
    rng = np.random.default_rng(0)                    # the same weights in every test
    b = Builder("small")
    x = b.input("x", TensorType((2, 3, 6, 6), layout=Layout.nchw))
    w = b.const(rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "conv.w")
    with b.loc("block1/conv"):
        y = b.conv2d(x, w, pads=(1, 1, 1, 1))
    y = b.relu(y, loc="block1/relu")
    t = b.reshape(y, shape=(2, 4, 36), loc="head/flatten")
    m = b.matmul(t, b.const(rng.normal(size=(36, 5)).astype(np.float32), "fc.w"), loc="head/fc")
    s = b.softmax(m, loc="head/softmax")
    vals, idx = b.topk(s, k=2, loc="head/topk")
    b.output("probs", s)
    b.output("top", vals)
    b.output("idx", idx)
    return b.graph


def samples(rng: np.random.Generator, n: int, graph: bevir.Graph | None = None
            ) -> list[dict[str, np.ndarray]]:
    shape = (graph or small_graph()).inputs[0].type.shape
    return [{"x": rng.normal(size=shape).astype(np.float32)} for _ in range(n)]


def float_activations(graph: bevir.Graph) -> list[bevir.Value]:
    vals = list(graph.inputs) + [o for n in graph.nodes for o in n.outputs]
    return [v for v in vals if v.type.dtype.is_float]


# ---- statistics ---------------------------------------------------------------------------
def test_minmax_equals_the_values_the_interpreter_computes(rng):
    g = small_graph()
    (inp,) = samples(rng, 1)
    ranges = bevir.calibrate(g, inp)
    fetched = bevir.run(g, inp, fetch="all")
    fetched["x"] = inp["x"]
    chosen = float_activations(g)
    assert len(ranges) == len(chosen) == 7            # x, conv, relu, reshape, matmul, softmax, top
    for v in chosen:
        e = ranges[v]
        a = fetched[v.name]
        assert (e.min, e.max) == (float(a.min()), float(a.max())), v.name
        assert e.range == (e.min, e.max) and e.count == a.size and e.samples == 1
    assert "idx" not in {e.name for e in ranges} and ranges.get("conv.w") is None
    assert ranges_of(g) is ranges                      # attached by default


def test_per_channel_statistics_follow_layout_or_last_axis(rng):
    g = small_graph()
    (inp,) = samples(rng, 1)
    ranges = bevir.calibrate(g, inp, per_channel=True)
    fetched = bevir.run(g, inp, fetch="all")
    conv = g.nodes[0].output                          # nchw: channel axis 1
    e = ranges[conv]
    assert e.axis == 1 and e.channel_min.shape == (4,)
    np.testing.assert_array_equal(e.channel_min, fetched[conv.name].min(axis=(0, 2, 3)))
    np.testing.assert_array_equal(e.channel_max, fetched[conv.name].max(axis=(0, 2, 3)))
    fc = next(n for n in g.nodes if n.op == "matmul").output   # tokens [2, 4, 5]: last axis
    assert ranges[fc].axis == 2
    np.testing.assert_array_equal(ranges[fc].channel_max, fetched[fc.name].max(axis=(0, 1)))
    assert float(e.channel_min.min()) == e.min and float(e.channel_max.max()) == e.max
    assert channel_axis(conv, "last") == 3 and channel_axis(conv, -4) == 0
    assert channel_axis(conv, 7) is None and channel_axis(conv, lambda v: 2) == 2
    first_axis = bevir.calibrate(g, inp, per_channel=True, axis=0)[conv]
    np.testing.assert_array_equal(first_axis.channel_min, fetched[conv.name].min(axis=(1, 2, 3)))


def test_several_samples_accumulate_and_iterables_stream(rng):
    g = small_graph()
    data = samples(rng, 3)
    ranges = bevir.calibrate(g, data, method="percentile")
    runs = [bevir.run(g, d, fetch="all") | d for d in data]
    for v in float_activations(g):
        e = ranges[v]
        assert e.min == min(float(r[v.name].min()) for r in runs)
        assert e.max == max(float(r[v.name].max()) for r in runs)
        assert e.samples == 3 and e.count == 3 * v.type.numel == e.histogram.total
    streamed = bevir.calibrate(g, (d for d in data), method="percentile", attach=False)
    assert streamed == ranges


def test_calibrator_snapshots_do_not_move_with_later_samples(rng):
    g = small_graph()
    cal = Calibrator(g, histogram=True)
    with pytest.raises(CalibrationError, match="feed"):
        cal.ranges()
    cal.feed(samples(rng, 1))
    before = cal.ranges("mse")
    x_max = before["x"].max
    total = before["x"].histogram.total
    cal.feed([{"x": np.full((2, 3, 6, 6), 100.0, np.float32)}])
    after = cal.ranges("mse")
    assert before["x"].max == x_max and before["x"].histogram.total == total
    assert after["x"].max == 100.0 and after["x"].histogram.total == 2 * total


@pytest.mark.parametrize("per_channel", [False, True])
def test_statistics_measured_apart_merge_into_those_of_one_pass(rng, per_channel):
    g = small_graph()
    data = samples(rng, 5)
    data[3]["x"][0, 0, 0, :2] = [np.nan, np.inf]               # non-finite values merge too
    whole = Calibrator(g, histogram=True, per_channel=per_channel)
    whole.feed(data)
    merged = Calibrator(g, histogram=True, per_channel=per_channel)
    for part in (data[3:], data[:1], data[1:3]):                # any split, any order
        other = Calibrator(g.clone(), **merged.spec())
        other.feed(part)
        merged.merge(other.statistics(), len(part))
    assert merged.samples == 5
    for method in ("minmax", "percentile", "entropy"):
        assert merged.ranges(method) == whole.ranges(method)
    with pytest.raises(CalibrationError, match="not a calibration point"):
        Calibrator(g, select=Selector(names=("x",)), histogram=True,
                   per_channel=per_channel).merge(whole.statistics(), 1)


# ---- histograms ---------------------------------------------------------------------------
def test_histogram_bins_are_a_power_of_two_and_exact(rng):
    h = Histogram(64)
    a, b = rng.normal(size=10000), rng.normal(scale=2.0, size=10000)
    h.add(a)
    assert math.frexp(h.width)[0] == 0.5 and h.threshold / 2 <= np.abs(a).max() < h.threshold
    h.add(b)
    both = np.concatenate([a, b])
    assert h.counts.size == 64 and h.total == 20000
    assert h.threshold / 2 <= np.abs(both).max() < h.threshold
    ref, _ = np.histogram(both, bins=h.edges)
    np.testing.assert_array_equal(ref, h.counts)      # every value in its exact bin
    assert h.folded().sum() == h.total


@pytest.mark.parametrize("seed", range(4))
def test_histogram_counts_do_not_depend_on_order_or_split(seed):
    rng = np.random.default_rng(seed)
    parts = [rng.normal(scale=s, size=rng.integers(1, 500)) * rng.choice([1, 1e-3, 1e3])
             for s in rng.uniform(0.1, 10, 7)] + [np.zeros(5), np.array([-0.0, 1e-42])]
    one = Histogram(32)
    for p in parts:
        one.add(p)
    shuffled = Histogram(32)
    for i in rng.permutation(len(parts)):
        shuffled.add(parts[i])
    halves = [Histogram(32), Histogram(32)]
    for i, p in enumerate(parts):
        halves[i % 2].add(p)
    assert shuffled == one
    assert halves[1].merge(halves[0]) == one
    assert Histogram(32).merge(one) == one            # merging into an empty one copies


def test_histogram_merge_needs_the_same_bins():
    with pytest.raises(CalibrationError, match="16 and 32 bins"):
        Histogram(16).merge(Histogram(32))


def test_histogram_merges_bins_when_the_range_explodes_and_counts_zeros():
    h = Histogram(16)
    h.add(np.zeros(10))
    assert h.threshold == 0.0 and h.total == 10
    h.add(np.array([0.5, -0.25]))
    assert h.threshold == 1.0 and h.counts[h.half] == 10   # zeros stay right of zero
    assert h.counts[h.half + 4] == 1 and h.counts[h.half - 2] == 1
    h.add(np.array([1e6]))
    assert h.counts.size == 16 and h.threshold > 1e6 and h.total == 13
    assert h.counts[h.half] == 11 and h.counts[h.half - 1] == 1    # 0.5 joined the zeros


# ---- range methods on a distribution with outliers ----------------------------------------
def qerror(x: np.ndarray, t: float) -> float:
    """Mean squared error of symmetric int8 quantization with threshold t."""
    s = t / 127
    return float(np.mean((x - np.clip(np.round(x / s), -128, 127) * s) ** 2))


@pytest.fixture(scope="module")
def outliers():
    rng = np.random.default_rng(0)                    # the module's fixture: its own generator
    x = np.concatenate([rng.normal(size=200_000), np.full(10, 40.0), np.full(10, -40.0)])
    b = Builder("synthetic")
    v = b.input("x", TensorType(x.shape))
    b.output("y", b.neg(v))
    g = b.graph
    return x.astype(np.float32), g, bevir.calibrate(g, {"x": x.astype(np.float32)},
                                                    method="mse", attach=False)


def test_percentile_clips_the_tails(outliers):
    x, _, ranges = outliers
    lo, hi = ranges.apply("percentile", percentile=99.9)["x"].range
    assert -4.0 < lo < -2.5 and 2.5 < hi < 4.0
    sym_lo, sym_hi = ranges.apply("percentile", percentile=99.9, symmetric=True)["x"].range
    assert sym_lo == -sym_hi and 2.5 < sym_hi < 4.0
    assert ranges.apply("percentile", percentile=100.0)["x"].range == (-40.0, 40.0)


def test_mse_beats_minmax_and_is_near_the_best_threshold(outliers):
    x, _, ranges = outliers
    lo, hi = ranges.apply("mse")["x"].range
    assert lo == -hi and hi < 40.0                    # clips the outliers
    grid = np.linspace(0.5, 40.0, 160)
    best = min(qerror(x, t) for t in grid)
    assert qerror(x, hi) < qerror(x, 40.0)
    assert qerror(x, hi) <= 1.05 * best
    assert ranges.method == RangeMethod("mse")


def test_entropy_picks_a_threshold_inside_the_outliers(outliers):
    x, _, ranges = outliers
    lo, hi = ranges.apply("entropy")["x"].range
    assert lo == -hi and 3.0 < hi < 10.0              # KL keeps the body, clips the outliers
    body = x[np.abs(x) < 3.0]
    assert qerror(body, hi) < qerror(body, 40.0) / 10
    h = ranges["x"].histogram
    assert entropy_threshold(h) == hi and mse_threshold(h) < 40.0


def test_minmax_keeps_the_outliers(outliers):
    _, _, ranges = outliers
    assert ranges.apply("minmax")["x"].range == (-40.0, 40.0)


# ---- keys ---------------------------------------------------------------------------------
def rewritable_graph() -> bevir.Graph:
    """A reshape chain, a foldable constant and a common subexpression (passes.md's sample)."""
    b = Builder("sample")
    x = b.input("x", TensorType((2, 3, 4)))
    y = b.reshape(b.reshape(x, shape=(6, 4), loc="m/r1"), shape=(2, 12), loc="m/r2")
    two = b.add(b.const(np.float32(1.0)), b.const(np.float32(1.0)), loc="m/two")
    b.output("y", b.mul(b.relu(y, loc="m/relu_a"), two, loc="m/mul_a"))
    b.output("z", b.mul(b.relu(y, loc="m/relu_b"), two, loc="m/mul_b"))
    return b.graph


def test_ranges_survive_canonicalize_cse_dce(rng):
    g = rewritable_graph()
    data = {"x": rng.normal(size=(2, 3, 4)).astype(np.float32)}
    ranges = bevir.calibrate(g, data)
    before = {e.name: e.range for e in ranges}
    bevir.optimize(g)
    assert [n.op for n in g.nodes] == ["reshape", "relu", "mul"]
    for v in float_activations(g):
        assert ranges.get(v) is not None, v.name
        assert ranges.range(v) == before[v.name]
    cal = AnalysisManager(g).get(AttachedRanges)
    assert cal.missing == [] and len(cal) == 4
    assert cal.range(g.outputs["y"]) == before[g.outputs["y"].name]


def test_lookup_falls_back_to_provenance_when_a_rewrite_renames(rng):
    g = small_graph()
    ranges = bevir.calibrate(g, samples(rng, 1))
    relu = next(n for n in g.nodes if n.op == "relu")
    old = ranges[relu.output]
    new = g.create_node("relu", [relu.inputs[0]], loc=relu.loc, names=["fresh"], before=relu)
    g.replace_node(relu, new.outputs)
    assert new.output.name == "fresh" and ranges.get("fresh") is None
    assert ranges.get(new.output) is old                # by provenance
    assert ranges.get(ValueKey("fresh", "block1/relu", 0)) is old
    assert ranges.rekey(g) == 1 and ranges.get("fresh") is old
    assert old.key == ValueKey("fresh", "block1/relu", 0)
    # a node of new provenance has no range; the analysis says which
    other = g.create_node("neg", [new.output], loc="elsewhere", before=g.nodes[2])
    g.nodes[2].set_input(0, other.output)
    cal = AttachedRanges(g)
    assert cal.missing == [other.output]
    with pytest.raises(CalibrationError, match="no calibrated range") as e:
        cal.range(other.output)
    assert (e.value.op, e.value.loc) == ("neg", "elsewhere")


def test_provenance_pairs_several_results_of_one_module_by_op_then_from_the_end():
    b = Builder("module")
    x = b.input("x", TensorType((4,)))
    with b.loc("mod"):
        a = b.exp(x)
        c = b.add(a, x)
        d = b.mul(c, x)
    b.output("d", d)
    g = b.graph
    ranges = bevir.calibrate(g, {"x": np.arange(4, dtype=np.float32)})
    by_op = {e.op: e for e in ranges}
    exp, add, mul = g.nodes
    for node in (exp, add):                             # renamed, same loc and op
        new = g.create_node(node.op, node.inputs, node.attrs, loc="mod", before=node)
        g.replace_node(node, new.outputs)
    fused = g.create_node("sub", [g.nodes[1].output, x], loc="mod", before=mul)  # a new op
    g.replace_node(mul, fused.outputs)
    assert not {o.name for n in g.nodes for o in n.outputs} & {e.name for e in ranges}
    found = ranges.resolve(g)
    assert found[g.nodes[0].output] is by_op["exp"] and found[g.nodes[1].output] is by_op["add"]
    assert found[fused.output] is by_op["mul"]         # the module's last result


def test_selector_by_op_loc_and_names(rng):
    g = small_graph()
    data = samples(rng, 1)
    only = bevir.calibrate(g, data, ops=("matmul", "conv2d"), attach=False)
    assert sorted(e.op for e in only) == ["conv2d", "matmul"]
    head = bevir.calibrate(g, data, loc="head/*", attach=False)
    assert {e.key.loc for e in head} == {"head/flatten", "head/fc", "head/softmax", "head/topk"}
    assert [e.name for e in bevir.calibrate(g, data, names=["x"], attach=False)] == ["x"]
    with pytest.raises(CalibrationError, match="unknown op"):
        Selector(ops=("matmull",))
    with pytest.raises(CalibrationError, match="chooses no float value"):
        bevir.calibrate(g, data, loc="decoder.*")
    with pytest.raises(CalibrationError, match="no value"):
        bevir.calibrate(g, data, names=["nope"])


def test_progress_bar_when_asked(capsys, rng):
    g = small_graph()
    bevir.calibrate(g, samples(rng, 2), progress=True)
    err = capsys.readouterr().err
    n = 2 * len(g.nodes)
    assert f"calibrate [{'#' * 24}] {n}/{n}" in err and err.endswith("\n")
    bevir.calibrate(g, samples(rng, 2))                     # stderr is not a terminal here
    bevir.calibrate(g, iter(samples(rng, 2)), progress=False)
    assert capsys.readouterr().err == ""


# ---- files ---------------------------------------------------------------------------------
def test_save_load_round_trip_is_exact(tmp_path, rng):
    g = small_graph()
    ranges = bevir.calibrate(g, samples(rng, 2), method="entropy", per_channel=True)
    path = ranges.save(tmp_path / "r.json")
    assert (tmp_path / "r.safetensors").exists()
    loaded = Ranges.load(path)
    assert loaded == ranges and loaded.method == RangeMethod("entropy")
    assert loaded.apply("mse") == ranges.apply("mse")  # histograms are usable after loading
    doc = json.loads(path.read_text())
    assert (doc["format"], doc["version"], doc["arrays"]) == ("bevir-ranges", 1, "r.safetensors")
    plain = bevir.calibrate(g, samples(rng, 1), attach=False)
    plain.save(tmp_path / "plain.json")
    assert not (tmp_path / "plain.safetensors").exists()
    assert Ranges.load(tmp_path / "plain.json") == plain


def _edit(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("corrupt, message", [
    (lambda p: p.write_text("{not json"), "not JSON"),
    (lambda p: p.write_text("[1, 2]"), "expected a JSON object"),
    (lambda p: p.write_text('{"format": "other"}'), "not a bevir ranges file"),
    (lambda p: p.write_text(p.read_text().replace('"version": 1', '"version": 9')), "version 9"),
    (lambda p: p.write_text(p.read_text().replace('"min"', '"minimum"')), "malformed"),
    (lambda p: p.with_suffix(".safetensors").unlink(), "array file is missing"),
    (lambda p: p.with_suffix(".safetensors").write_bytes(b"\x00" * 12),
     "array file is not the one the ranges were saved with \\(its sha256 differs"),
    (lambda p: p.unlink(), r"cannot read \S+r\.json: No such file"),
    (lambda p: _edit(p, lambda d: d["values"][0].update(range=[2.0, -2.0])),
     "range \\[2.0, -2.0\\] of value '\\S+': low above high"),
    (lambda p: _edit(p, lambda d: d["values"][0].update(range=[float("nan"), 1.0])),
     "low above high"),
    (lambda p: _edit(p, lambda d: d["method"].update(symmetric="yes")),
     "symmetric must be a boolean, got 'yes'"),
    (lambda p: p.write_text("[" * 100_000 + "]" * 100_000), "JSON nested too deeply"),
])
def test_corrupt_ranges_files_raise(tmp_path, corrupt, message, rng):
    path = bevir.calibrate(small_graph(), samples(rng, 1), per_channel=True).save(
        tmp_path / "r.json")
    corrupt(path)
    with pytest.raises(CalibrationError, match=message):
        Ranges.load(path)


# ---- seeding -------------------------------------------------------------------------------
def conv_model(path: Path) -> Path:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.normal(size=(1, 4, 1, 1)).astype(np.float32), "bias")
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["r"], name="relu"),
         helper.make_node("Add", ["r", "bias"], ["y"], name="add")],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 8, 8])], [w, bias]),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def write_tranges(path: Path, ranges: dict, **extra) -> Path:
    path.write_text(json.dumps({"format": "bevir-tranges", "version": 1, "ranges": ranges} | extra))
    return path


def test_tranges_seed_by_onnx_tensor_name(tmp_path, rng):
    g = bevir.from_onnx(conv_model(tmp_path / "m.onnx"))
    path = write_tranges(tmp_path / "m.tranges", {"c": [-3.0, 5.5], "r": [0, 5.5], "gone": [1, 2]})
    seeded = Ranges.from_tranges(path, g)
    assert seeded["c"].key == ValueKey("c", "conv", 0) and seeded["c"].op == "conv2d"
    assert seeded.range(g.value("r")) == (0.0, 5.5) and seeded["r"].source == "tranges"
    assert [e.name for e in seeded.unresolved(g)] == ["gone"]
    data = [{"x": rng.normal(size=(2, 3, 8, 8)).astype(np.float32)}]
    ranges = bevir.calibrate(g, data, seed=path)             # seeded values are kept
    assert ranges["c"].range == (-3.0, 5.5) and ranges["c"].samples == 0
    assert ranges["y"].source == "calibration" and ranges["y"].samples == 1
    assert Ranges.load(path) == Ranges.from_tranges(path)    # load() reads tranges too


@pytest.mark.parametrize("doc, message", [
    ({"format": "bevir-tranges", "version": 2, "ranges": {}}, "version 1"),
    ({"format": "bevir-ranges", "version": 1, "ranges": {}}, "not a bevir-tranges"),
    ({"format": "bevir-tranges", "version": 1, "ranges": {"a": [1]}}, r"\[min, max\]"),
    ({"format": "bevir-tranges", "version": 1, "ranges": {"a": [2, 1]}}, "min 2.0 > max 1.0"),
    ({"format": "bevir-tranges", "version": 1, "ranges": {"a": ["0", 1]}}, r"\[min, max\]"),
    ({"format": "bevir-tranges", "version": 1, "ranges": [], }, "exactly the keys"),
    ({"format": "bevir-tranges", "version": 1, "ranges": {}, "extra": 1}, "exactly the keys"),
])
def test_bad_tranges_raise(tmp_path, doc, message):
    path = tmp_path / "bad.tranges"
    path.write_text(json.dumps(doc))
    with pytest.raises(CalibrationError, match=message):
        Ranges.from_tranges(path)


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_onnxruntime_calibration_seeds_the_same_ranges(tmp_path, per_channel, rng):
    model = conv_model(tmp_path / "m.onnx")
    data = [{"x": rng.normal(size=(2, 3, 8, 8)).astype(np.float32)} for _ in range(2)]

    class Reader(quant.CalibrationDataReader):
        def __init__(self):
            self.items = iter(data)

        def get_next(self):
            return next(self.items, None)

    calibrator = quant.create_calibrator(model, augmented_model_path=str(tmp_path / "aug.onnx"),
                                         calibrate_method=quant.CalibrationMethod.MinMax,
                                         extra_options={"per_channel": per_channel})
    calibrator.collect_data(Reader())
    g = bevir.from_onnx(model)
    seeded = Ranges.from_onnxruntime(calibrator.compute_data(), g)
    ours = bevir.calibrate(g, data, per_channel=per_channel)
    assert {e.name for e in seeded} == {"x", "c", "r", "y"}
    for e in seeded:
        assert e.source == "onnxruntime" and e.key.loc == (g.value(e.name).producer.loc
                                                            if g.value(e.name).producer else "")
        np.testing.assert_allclose(e.range, ours[e.name].range, rtol=1e-5, atol=1e-6)
        if per_channel:
            np.testing.assert_allclose(e.channel_max, ours[e.name].channel_max, rtol=1e-5, atol=1e-6)
    with pytest.raises(CalibrationError, match="TensorsData"):
        Ranges.from_onnxruntime(42)


# ---- the pass and the analysis -------------------------------------------------------------
class ReadCalibration(Pass):
    """Records the range of every graph output, as a quantize pass would read them."""
    name = "test-read-calibration"
    seen = {}

    def run(self, graph, am):
        cal = am.get(AttachedRanges)
        ReadCalibration.seen = {k: cal.range(v) for k, v in graph.outputs.items()}


def test_calibrate_pass_feeds_later_passes_through_the_analysis(tmp_path, rng):
    g = rewritable_graph()
    stacked = rng.normal(size=(2, 2, 3, 4)).astype(np.float32)     # two samples
    save_file({"x": stacked}, str(tmp_path / "in.safetensors"))
    stats = Statistics()
    out = tmp_path / "r.json"
    pm = PassManager(f'calibrate{{inputs="{tmp_path / "in.safetensors"}", method=mse, '
                     f'per_channel=true, output="{out}"}},canonicalize,cse,dce,test-read-calibration',
                     instruments=[stats])
    pm.run(g)
    (counters,) = [c for text, c in stats.by_pass().items() if text.startswith("calibrate{")]
    assert counters == {"seeded": 0, "samples": 2, "measured": 8}
    expect = bevir.calibrate(rewritable_graph(), [{"x": s} for s in stacked], method="mse",
                             per_channel=True, attach=False)
    assert ReadCalibration.seen == {k: expect.range(v.name) for k, v in g.outputs.items()}
    assert Ranges.load(out) == ranges_of(g)
    g2 = rewritable_graph()                              # seed only, from the file just written
    PassManager(f'calibrate{{ranges="{out}"}},test-read-calibration').run(g2)
    assert ranges_of(g2)["x"].range == expect["x"].range


def test_calibrate_pass_refreshes_a_cached_analysis(tmp_path):
    g = rewritable_graph()
    write_tranges(tmp_path / "a.tranges", {"x": [-1, 1]})
    write_tranges(tmp_path / "b.tranges", {"x": [-2, 2]})
    am = AnalysisManager(g)
    PassManager(f'calibrate{{ranges="{tmp_path / "a.tranges"}"}}').run(g, am)
    assert am.get(AttachedRanges).range(g.inputs[0]) == (-1.0, 1.0)
    PassManager(f'calibrate{{ranges="{tmp_path / "b.tranges"}"}}').run(g, am)
    assert am.get(AttachedRanges).range(g.inputs[0]) == (-2.0, 2.0)


def test_load_inputs_one_sample_or_a_leading_sample_axis(tmp_path, rng):
    g = small_graph()
    one = rng.normal(size=(2, 3, 6, 6)).astype(np.float32)
    save_file({"x": one}, str(tmp_path / "one.safetensors"))
    save_file({"x": np.stack([one, one, one])}, str(tmp_path / "three.safetensors"))
    save_file({"x": one[:1]}, str(tmp_path / "bad.safetensors"))
    save_file({"y": one}, str(tmp_path / "other.safetensors"))
    assert len(load_inputs(tmp_path / "one.safetensors", g)) == 1
    three = load_inputs(tmp_path / "three.safetensors", g)
    assert len(three) == 3 and np.array_equal(three[2]["x"], one)
    with pytest.raises(CalibrationError, match=r"takes \[2, 3, 6, 6\]"):
        load_inputs(tmp_path / "bad.safetensors", g)
    with pytest.raises(CalibrationError, match="no tensor for graph input"):
        load_inputs(tmp_path / "other.safetensors", g)


# ---- bad input ----------------------------------------------------------------------------
def test_bad_requests_raise_bevir_errors(rng):
    g = small_graph()
    with pytest.raises(CalibrationError, match="unknown calibration method 'kl'"):
        bevir.calibrate(g, samples(rng, 1), method="kl")
    with pytest.raises(CalibrationError, match="percentile"):
        bevir.calibrate(g, samples(rng, 1), method="percentile", percentile=0.0)
    with pytest.raises(BevirError, match=r"'y' is not an input of @\w+; missing input"):
        bevir.calibrate(g, {"y": np.zeros(3)})
    with pytest.raises(CalibrationError, match="no calibration inputs"):
        bevir.calibrate(g, [])
    with pytest.raises(CalibrationError, match="no calibration inputs"):
        bevir.calibrate(g, iter([]))
    with pytest.raises(CalibrationError, match="sample 0 is a list"):
        bevir.calibrate(g, [[1, 2]])
    with pytest.raises(CalibrationError, match="got int"):
        bevir.calibrate(g, 3)
    with pytest.raises(CalibrationError, match="axis must be"):
        bevir.calibrate(g, samples(rng, 1), per_channel=True, axis="first")
    minmax = bevir.calibrate(g, samples(rng, 1))
    with pytest.raises(CalibrationError, match="needs a histogram"):
        minmax.apply("mse")
    with pytest.raises(CalibrationError, match="no calibrated range") as e:
        minmax[g.nodes[-1].outputs[1]]                   # the i64 indices of topk
    assert (e.value.op, e.value.loc) == ("topk", "head/topk")
    with pytest.raises(CalibrationError, match="has no calibration"):
        AnalysisManager(rewritable_graph()).get(AttachedRanges)
    with pytest.raises(CalibrationError, match="min 1.0 > max 0.0"):
        TensorRange.given("v", 1.0, 0.0)


def test_bad_pass_options_raise_pass_errors(tmp_path):
    with pytest.raises(PassError, match="unknown calibration method 'best'"):
        PassManager("calibrate{inputs=x.safetensors, method=best}")
    with pytest.raises(PassError, match="axis must be"):
        PassManager("calibrate{inputs=x.safetensors, per_channel=true, axis=first}")
    with pytest.raises(PassError, match="needs inputs=FILE"):
        PassManager("calibrate").run(small_graph())
    none = tmp_path / "none.safetensors"
    with pytest.raises(PassError, match=re.escape(f"{none}: the calibration inputs file is "
                                                  "missing")):
        PassManager(f'calibrate{{inputs="{none}"}}').run(small_graph())
    assert str(Calibrate(method="mse", per_channel=True)) == "calibrate{method=mse,per_channel=true}"


# ---- BEVFormer ------------------------------------------------------------------------------
def test_bevformer_test_config_calibrates_in_one_interpreter_pass(tmp_path, monkeypatch):
    """Calibration's cost is one golden run per sample: every node runs once (mse and
    per-channel statistics are gathered on the way, nothing is run again)."""
    from examples.bevformer import e2e
    from examples.bevformer.config import CONFIGS
    from examples.bevformer.inputs import make_inputs
    from examples.bevformer.weights import build_model
    cfg = CONFIGS["test"]
    inputs = make_inputs(cfg, 0, with_prev_bev=True)
    with torch.no_grad():
        g = e2e.build_graph(build_model(cfg, seed=0).eval(), inputs, tmp_path)
    data = e2e.golden_inputs(g, inputs)
    runs, real = [], Interpreter.run_node

    def counted(self, node, args):                    # the real run, recorded
        runs.append(node)
        return real(self, node, args)

    monkeypatch.setattr(Interpreter, "run_node", counted)
    ranges = bevir.calibrate(g, data, method="mse", per_channel=True, progress=False)
    assert runs == list(g.nodes)
    assert len(ranges) == len(float_activations(g))
    assert any(e.key.loc.startswith("/img_backbone/") for e in ranges)
    assert any(e.key.loc.startswith("pts_bbox_head.transformer.encoder") for e in ranges)
    bevir.optimize(g)
    assert AnalysisManager(g).get(AttachedRanges).missing == []
