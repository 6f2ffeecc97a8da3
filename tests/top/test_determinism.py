"""Determinism across processes: two interpreters with different hash seeds (so different
set and str-keyed dict orders wherever those leak) take one ONNX model through import,
the optimize pipeline, calibration, quantization, partitioning and memory planning for 2
cores and code generation, and write byte-identical IR text, constants, ranges, outputs,
the planned graph, the generated C programs and kernels, and the manifest.

Run as a script (``python tests/top/test_determinism.py MODEL OUT``), this file is the flow
each process runs.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
SEEDS = ("1", "2")
ARTIFACTS = ("float.bevir", "float.safetensors", "q.bevir", "q.safetensors", "ranges.json",
             "ranges.safetensors", "outputs.safetensors", "prog/graph.bevir",
             "prog/graph.safetensors", "prog/manifest.json", "prog/core0.c")


def build_model(path: Path) -> Path:
    """conv + batch norm + relu, a residual conv, a pooled classifier (gemm, softmax) and a
    token branch (transpose, matmul, a spelled-out layer norm, a repeated subexpression)."""
    rng = np.random.default_rng(0)
    f32 = lambda *s, scale=0.3: numpy_helper.from_array(  # noqa: E731
        (rng.standard_normal(s) * scale).astype(np.float32))
    inits = {"w1": f32(8, 3, 3, 3), "b1": f32(8), "bn_s": f32(8, scale=0.1), "bn_b": f32(8),
             "bn_m": f32(8), "w2": f32(8, 8, 3, 3), "w3": f32(10, 8), "b3": f32(10),
             "w4": f32(8, 8), "b4": f32(8), "gamma": f32(8), "beta": f32(8)}
    inits["bn_v"] = numpy_helper.from_array(rng.uniform(0.5, 2, 8).astype(np.float32))
    inits["bn_s"] = numpy_helper.from_array(1 + numpy_helper.to_array(inits["bn_s"]))
    inits["shape"] = numpy_helper.from_array(np.array([2, 8, 256], np.int64))
    inits["eps"] = numpy_helper.from_array(np.float32(1e-5))
    inits["half"] = numpy_helper.from_array(np.float32(0.5))
    for name, t in inits.items():
        t.name = name
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1] * 4, name="stem/conv"),
        n("BatchNormalization", ["c1", "bn_s", "bn_b", "bn_m", "bn_v"], ["bn"], name="stem/bn"),
        n("Relu", ["bn"], ["r1"], name="stem/relu"),
        n("Conv", ["r1", "w2"], ["c2"], pads=[1] * 4, name="block/conv"),
        n("Add", ["c2", "r1"], ["res"], name="block/add"),
        n("Relu", ["res"], ["r2"], name="block/relu"),
        n("GlobalAveragePool", ["r2"], ["gp"], name="head/pool"),
        n("Flatten", ["gp"], ["flat"], name="head/flatten"),
        n("Gemm", ["flat", "w3", "b3"], ["logits"], transB=1, name="head/fc"),
        n("Softmax", ["logits"], ["probs"], axis=-1, name="head/softmax"),
        n("Reshape", ["r2", "shape"], ["t0"], name="tokens/reshape"),
        n("Transpose", ["t0"], ["t1"], perm=[0, 2, 1], name="tokens/transpose"),
        n("MatMul", ["t1", "w4"], ["t2"], name="tokens/proj"),
        n("Add", ["t2", "b4"], ["t3"], name="tokens/bias"),
        n("ReduceMean", ["t3"], ["mu"], axes=[-1], name="tokens/norm/mean"),
        n("Sub", ["t3", "mu"], ["d"], name="tokens/norm/sub"),
        n("Mul", ["d", "d"], ["d2"], name="tokens/norm/square"),
        n("ReduceMean", ["d2"], ["var"], axes=[-1], name="tokens/norm/var"),
        n("Add", ["var", "eps"], ["ve"], name="tokens/norm/add_eps"),
        n("Sqrt", ["ve"], ["sd"], name="tokens/norm/sqrt"),
        n("Div", ["d", "sd"], ["nd"], name="tokens/norm/div"),
        n("Mul", ["nd", "gamma"], ["g1"], name="tokens/norm/scale"),
        n("Add", ["g1", "beta"], ["tokens"], name="tokens/norm/shift"),
        n("Mul", ["nd", "gamma"], ["g2"], name="gate/scale"),            # same as g1: cse
        n("Mul", ["g2", "half"], ["g3"], name="gate/half"),
        n("Sigmoid", ["g3"], ["gate"], name="gate/sigmoid"),
    ]
    graph = helper.make_graph(
        nodes, "determinism", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                             [2, 3, 16, 16])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, shape)
         for o, shape in (("probs", [2, 10]), ("tokens", [2, 256, 8]), ("gate", [2, 256, 8]))],
        list(inits.values()))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def flow(model: Path, out: Path) -> None:
    """import -> optimize -> calibrate -> quantize -> save, and run what was saved."""
    import bevir
    from safetensors.numpy import save_file

    from bevir.passes.calibrate import ranges_of
    from bevir.passes.quant_config import QuantConfig
    from bevir.passes.quantize import quantize
    g = bevir.from_onnx(model)
    bevir.optimize(g, "canonicalize,fuse,cse,dce")
    bevir.save(g, out / "float.bevir")
    rng = np.random.default_rng(0)
    data = [{"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)} for _ in range(3)]
    bevir.calibrate(g, data, method="mse", per_channel=True, progress=False)
    ranges_of(g).save(out / "ranges.json")
    quantize(g, QuantConfig.build({"default": {"name": "all", "weights": "per_channel"}}))
    bevir.optimize(g, "sink-dequantize,cse,dce")
    bevir.save(g, out / "q.bevir")
    feed = {"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)}
    got = bevir.run(bevir.load(out / "q.bevir"), feed)
    float_out = bevir.run(bevir.load(out / "float.bevir"), feed)
    save_file(got | {f"float.{k}": v for k, v in float_out.items()},
              str(out / "outputs.safetensors"))
    bevir.compile(g, out / "prog", hw="QC-U 8MB 16MAC x2", progress=False)
    print(json.dumps({"hash": hash("bevir"), "ops": sorted(set(g.op_counts()))}))


def _run_flow(model: Path, out: Path, seed: str) -> dict:
    out.mkdir()
    env = os.environ | {"PYTHONHASHSEED": seed,
                        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH",
                                                                                 "")])}
    r = subprocess.run([sys.executable, __file__, str(model), str(out)], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_two_hash_seeds_give_byte_identical_ir_and_outputs(tmp_path):
    model = build_model(tmp_path / "model.onnx")
    runs = {s: _run_flow(model, tmp_path / f"seed{s}", s) for s in SEEDS}
    a, b = (runs[s] for s in SEEDS)
    assert a["hash"] != b["hash"]                        # the seeds did take effect
    assert any(op.startswith("fx_") for op in a["ops"])  # the quantized program ran
    kernels = sorted(p.relative_to(tmp_path / f"seed{SEEDS[0]}").as_posix()
                     for p in (tmp_path / f"seed{SEEDS[0]}" / "prog" / "kernels").glob("*.c"))
    assert len(kernels) > 5
    differ = [f for f in ARTIFACTS + tuple(kernels)
              if (tmp_path / f"seed{SEEDS[0]}" / f).read_bytes()
              != (tmp_path / f"seed{SEEDS[1]}" / f).read_bytes()]
    assert differ == [], f"differ between PYTHONHASHSEED={SEEDS[0]} and {SEEDS[1]}: {differ}"


if __name__ == "__main__":
    flow(Path(sys.argv[1]), Path(sys.argv[2]))
