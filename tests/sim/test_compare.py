"""Per-layer error reports between a reference and a quantized candidate graph."""
import json
import math

import numpy as np

from bevir import Builder, DType, FixedPointQuant, TensorType
from bevir.sim.compare import compare_graphs, dequantize, layer_error

X = TensorType((4, 16), DType.f32)


def _reference():
    b = Builder("ref")
    x = b.input("x", X)
    with b.loc("block.scale"):
        h = b.mul(x, b.const(np.float32(2.0)), name="h")
    with b.loc("block.act"):
        b.output("y", b.relu(h, name="y"))
    return b.graph


def _candidate(scale=0.25):
    b = Builder("cand")
    x = b.input("x", X)
    with b.loc("block.scale"):
        h = b.quantize(b.mul(x, b.const(np.float32(2.0))), scale=(scale,), zero_point=(0,),
                       dtype="i8", name="h")
    with b.loc("block.act"):
        b.output("y", b.relu(b.dequantize(h), name="y"))
    return b.graph


def test_errors_per_layer():
    x = np.random.default_rng(0).uniform(-4, 4, X.shape).astype(np.float32)
    report = compare_graphs(_reference(), _candidate(), {"x": x})
    assert [e.value for e in report.layers] == ["h", "y"]
    h = report["h"]
    assert h.layer == "block.scale" and h.op == "quantize"
    assert 0 < h.max_abs <= 0.125 + 1e-6 and 20 < h.sqnr_db < 60 and h.cosine > 0.99
    assert report.worst(1)[0].value in ("h", "y")
    assert [e.value for e in report.worst(2, skip_ops=["quantize"])] == ["y"]   # not ranked
    assert "block.scale" in report.table()
    finer = compare_graphs(_reference(), _candidate(0.0625), {"x": x})
    assert finer["h"].sqnr_db > h.sqnr_db + 6          # 2 bits more, ~12 dB better
    only = compare_graphs(_reference(), _candidate(), {"x": x}, select=["block.act"])
    assert [e.value for e in only.layers] == ["y"]


def test_equal_values_and_files(tmp_path):
    x = np.ones(X.shape, np.float32)
    report = compare_graphs(_reference(), _reference(), {"x": x})
    assert all(math.isinf(e.sqnr_db) and e.max_abs == 0 and e.cosine == 1 for e in report.layers)
    report.save_json(tmp_path / "e.json")
    data = json.loads((tmp_path / "e.json").read_text())
    assert data["format"] == "bevir-layer-errors" and data["layers"][0]["sqnr_db"] is None
    report.plot(tmp_path / "e.png")
    assert (tmp_path / "e.png").stat().st_size > 1000
    report.plot(tmp_path / "skipped.png", skip_ops=["quantize"])
    assert (tmp_path / "skipped.png").stat().st_size > 1000


def test_dequantize_fixed_point_per_channel():
    t = TensorType((2, 3), DType.i8, quant=FixedPointQuant((1, 2, 3), axis=1))
    got = dequantize(np.full((2, 3), 8, np.int8), t)
    assert np.array_equal(got, np.tile([4.0, 2.0, 1.0], (2, 1)))
    assert layer_error(np.ones(4), np.ones(4))[0] == math.inf


def _mlp(layers: int = 6, width: int = 32) -> "Graph":  # noqa: F821
    rng = np.random.default_rng(1)
    b = Builder("mlp")
    h = b.input("x", TensorType((16, width), DType.f32))
    for k in range(layers):
        with b.loc(f"layer{k}"):
            w = b.const((rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32))
            h = b.relu(b.matmul(h, w, name=f"mm{k}"), name=f"act{k}")
    b.output("y", h)
    return b.graph


def test_a_broken_layer_stands_out_in_the_local_error_only():
    """Teacher-forced (local) error: a layer whose weights are broken is the one worst
    local layer, by a wide margin, while the accumulated error carries it on to every
    layer after it (the accumulated ranking cannot tell which layer broke)."""
    import bevir
    from bevir.passes.quant_config import QuantConfig
    from bevir.passes.quantize import quantize
    rng = np.random.default_rng(2)
    samples = [{"x": rng.standard_normal((16, 32)).astype(np.float32)} for _ in range(4)]
    reference = _mlp()
    q = reference.clone()
    bevir.calibrate(q, samples, progress=False)
    quantize(q, QuantConfig.build({"default": {"name": "all", "weights": "per_channel"}}))
    bevir.optimize(q, "cse,dce")
    healthy = compare_graphs(reference, q, samples[0])
    # break layer 2: its integer weights lose a quarter of their value
    broken = next(n for n in q.nodes if n.loc == "layer2" and n.op.startswith("fx_"))
    w = next(v for v in broken.inputs if v is not None and v.is_const)
    q.replace_all_uses(w, q.add_const((w.const * 3 // 4).astype(w.const.dtype), type=w.type))
    report = compare_graphs(reference, q, samples[0])
    acts = [e for e in report.layers if e.value.startswith("mm")]      # the products
    assert all(e.local_sqnr_db is not None for e in acts)
    local = {e.layer: e.local_sqnr_db for e in acts}
    accumulated = {e.layer: e.sqnr_db for e in acts}
    print({k: (round(local[k], 1), round(accumulated[k], 1)) for k in local})
    assert report.worst(1)[0].layer == "layer2"
    assert local["layer2"] < min(v for k, v in local.items() if k != "layer2") - 10
    assert min(local[k] for k in local if k != "layer2") > min(
        e.local_sqnr_db for e in healthy.layers if e.value.startswith("mm")) - 1    # others keep theirs
    # accumulated: every later layer is about as bad, so the broken one is not singled out
    assert all(accumulated[f"layer{k}"] < accumulated["layer2"] + 3 for k in (3, 4, 5))
