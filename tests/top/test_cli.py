"""The bevir command, run in-process through bevir.cli.main (plus one subprocess check)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import onnx
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import load_file, save_file

import bevir
from bevir import Builder, TensorType
from bevir.cli import main
from bevir.passes import Pass
from bevir.passes.quant_config import QuantConfig
from bevir.sim.compare import layer_error


class CliExplode(Pass):
    """Fails on any graph that still holds an ``add``."""
    name = "test-cli-explode"

    def run(self, graph, am):
        if any(n.op == "add" for n in graph.nodes):
            raise ValueError("add is not allowed here")


def _line_of(text: str) -> int:
    """The line of this file that holds ``text`` (the first)."""
    return next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1)
                if text in line)


def small_model(tmp_path: Path) -> Path:
    b = Builder("net")
    x = b.input("x", TensorType((1, 3, 6, 6)))
    rng = np.random.default_rng(0)
    w = b.const(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    scale = b.const(np.full((1, 4, 1, 1), 0.5, np.float32), "scale")
    y = b.relu(b.conv2d(x, w, pads=(1, 1, 1, 1), loc="conv1"), loc="relu1")
    y = b.add(y, b.mul(scale, b.const(np.float32(2.0), "two")), loc="add1")   # foldable
    b.neg(x)                                                                    # dead
    b.output("y", y)
    path = tmp_path / "model.bevir"
    bevir.save(b.graph, path)
    return path


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("bevir: error: ")
    assert "Traceback" not in err
    return lines[0]


def test_show(tmp_path, capsys):
    path = small_model(tmp_path)
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "graph @net" in out and "dense<...>" in out and 'loc("conv1")' in out
    assert "nodes          5" in out
    assert "conv2d 1" in out and "relu 1" in out
    assert f"{4 * 3 * 3 * 3 + 4 + 1:,}" in out                  # parameters
    assert f"{1 * 4 * 6 * 6 * 3 * 3 * 3:,}" in out             # MACs of the conv
    assert main(["show", str(path), "--summary-only"]) == 0
    assert "graph @net" not in capsys.readouterr().out


def test_opt_writes_an_optimized_model(tmp_path, capsys):
    path = small_model(tmp_path)
    out = tmp_path / "opt.bevir"
    dump = tmp_path / "dump"
    rc = main(["opt", str(path), "-p", "canonicalize,cse,dce", "-o", str(out),
               "--time-passes", "--stats", "--dump-ir", str(dump)])
    assert rc == 0
    err = capsys.readouterr().err
    assert "Execution time report" in err and "Total" in err
    for name in ("canonicalize", "cse", "dce", "fold-constants"):
        assert name in err
    assert len(list(dump.iterdir())) == 4                      # input + one per pass
    g = bevir.load(out)
    assert g.op_counts() == {"add": 1, "conv2d": 1, "relu": 1}
    x = np.random.default_rng(1).standard_normal((1, 3, 6, 6)).astype(np.float32)
    ref = bevir.run(bevir.load(path), {"x": x})["y"]
    assert np.array_equal(bevir.run(g, {"x": x})["y"], ref)


def test_opt_dump_ir_after_change(tmp_path, capsys):
    path = small_model(tmp_path)
    dump = tmp_path / "dump"
    assert main(["opt", str(path), "-p", "dce,dce,cse", "-o", str(tmp_path / "o.bevir"),
                 "--dump-ir", str(dump), "--dump-ir-after-change", "--no-verify-each"]) == 0
    assert sorted(p.name for p in dump.iterdir()) == ["00_input.bevir", "01_dce.bevir"]


def test_opt_prints_the_ir_without_output(tmp_path, capsys):
    path = small_model(tmp_path)
    assert main(["opt", str(path), "-p", "dce"]) == 0
    out = capsys.readouterr().out
    assert "graph @net" in out and "neg(" not in out


def test_failing_pass_leaves_a_reproducer(tmp_path, capsys):
    path = small_model(tmp_path)
    out = tmp_path / "opt.bevir"
    rc = main(["opt", str(path), "-p", "canonicalize,test-cli-explode,dce", "-o", str(out)])
    assert rc == 1
    line = one_line_error(capsys)
    repro = tmp_path / "opt.reproducer.bevir"
    assert "pass 'test-cli-explode' failed: ValueError: add is not allowed here" in line
    assert str(repro) in line and not out.exists()
    assert repro.read_text().startswith('// bevir-reproducer: pipeline="test-cli-explode"\n')

    assert main(["opt", "--reproduce", str(repro)]) == 1
    line = one_line_error(capsys)
    assert line == ("bevir: error: pass 'test-cli-explode' failed: ValueError: add is not "
                    f"allowed here (at {__file__}:{_line_of('add is not allowed here')})")

    custom = tmp_path / "custom.bevir"
    assert main(["opt", str(path), "-p", "test-cli-explode", "--reproducer", str(custom)]) == 1
    one_line_error(capsys)
    assert custom.exists()


def test_reproduce_that_passes(tmp_path, capsys):
    path = small_model(tmp_path)
    main(["opt", str(path), "-p", "test-cli-explode", "-o", str(tmp_path / "o.bevir")])
    capsys.readouterr()
    repro = tmp_path / "o.reproducer.bevir"
    # edit the recorded IR so that the failing pass no longer finds an add: it passes
    text = repro.read_text().replace('add(', 'sub(')
    repro.write_text(text)
    assert main(["opt", "--reproduce", str(repro)]) == 0
    assert "ran without error" in capsys.readouterr().out


def test_run_with_safetensors(tmp_path, capsys):
    path = small_model(tmp_path)
    x = np.random.default_rng(2).standard_normal((1, 3, 6, 6)).astype(np.float32)
    save_file({"x": x}, str(tmp_path / "in.safetensors"))
    out = tmp_path / "out.safetensors"
    g = bevir.load(path)
    conv = next(n for n in g.nodes if n.op == "conv2d").output.name
    rc = main(["run", str(path), "--inputs", str(tmp_path / "in.safetensors"), "-o", str(out),
               "--fetch", conv])
    assert rc == 0
    stdout = capsys.readouterr().out
    assert "y: float32[1, 4, 6, 6]" in stdout
    got = load_file(str(out))
    ref = bevir.run(g, {"x": x}, fetch=[conv])
    assert set(got) == {"y", conv}
    assert np.array_equal(got["y"], ref["y"]) and np.array_equal(got[conv], ref[conv])


def test_bad_inputs_give_one_line_errors(tmp_path, capsys):
    assert main(["show", str(tmp_path / "missing.bevir")]) == 1
    assert "missing.bevir" in one_line_error(capsys)

    bad = tmp_path / "bad.bevir"
    bad.write_text("graph @g(%x: tensor<2xf32>) {\n  %y = relu(%x) : tensor<2xf32\n  return %y\n}\n")
    assert main(["show", str(bad)]) == 1
    line = one_line_error(capsys)
    # the missing '>' closes line 2's type: found at the first token after it, line 3 column 3
    assert line == f"bevir: error: {bad}:3:3: expected '>', found 'return %y'"

    path = small_model(tmp_path)
    assert main(["run", str(path), "--inputs", str(tmp_path / "nope.safetensors")]) == 1
    assert "nope.safetensors" in one_line_error(capsys)
    assert main(["run", str(path)]) == 1                        # no inputs given
    assert "give --inputs FILE.safetensors (bevir inputs MODEL -o FILE.safetensors " \
        "writes some)" in one_line_error(capsys)
    assert main(["opt", str(path), "-p", "no-such-pass"]) == 1
    assert "unknown pass 'no-such-pass'" in one_line_error(capsys)
    assert main(["opt", str(path), "-p", "canonicalize{fold_limit=x}"]) == 1
    assert "fold_limit" in one_line_error(capsys)
    notrepro = tmp_path / "plain.bevir"
    notrepro.write_text("graph @g() {\n  return\n}\n")
    assert main(["opt", "--reproduce", str(notrepro)]) == 1
    assert "not a bevir reproducer" in one_line_error(capsys)


def test_usage_errors_do_not_raise(capsys):
    assert main([]) == 2
    assert main(["--version"]) == 0
    assert "bevir 0.1.0" in capsys.readouterr().out


def _onnx_model(path: Path) -> None:
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "B")
    s = numpy_helper.from_array(rng.standard_normal((1, 4, 1, 1)).astype(np.float32), "S")
    nodes = [helper.make_node("Conv", ["X", "W", "B"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "S"], ["Y"], name="add")]
    graph = helper.make_graph(nodes, "tiny",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 4, 8, 8])],
                              initializer=[w, b, s])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def test_import_onnx(tmp_path, capsys):
    src = tmp_path / "tiny.onnx"
    _onnx_model(src)
    out = tmp_path / "tiny.bevir"
    assert main(["import", str(src), "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    g = bevir.load(out)
    bevir.verify(g)
    assert {"conv2d", "relu", "add"} <= set(g.op_counts())
    assert main(["show", str(out)]) == 0
    assert "conv2d" in capsys.readouterr().out
    x = np.random.default_rng(4).standard_normal((1, 3, 8, 8)).astype(np.float32)
    y = next(iter(bevir.run(g, {next(v.name for v in g.inputs): x}).values()))
    assert y.shape == (1, 4, 8, 8)

    assert main(["import", str(tmp_path / "absent.onnx")]) == 1
    assert "absent.onnx" in one_line_error(capsys)


def test_entry_point_subprocess():
    exe = Path(sys.executable).with_name("bevir")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "bevir"]
    r = subprocess.run(cmd + ["--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "opt" in r.stdout and "import" in r.stdout


def test_a_reader_that_stops_early_is_no_error(tmp_path):
    """``bevir show big.bevir | head``: the closed pipe ends the command silently."""
    b = Builder("long")
    y = b.input("x", TensorType((4,)))
    for i in range(3000):
        y = b.neg(y, loc=f"n{i}")
    b.output("y", y)
    path = tmp_path / "long.bevir"
    bevir.save(b.graph, path)
    exe = Path(sys.executable).with_name("bevir")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "bevir"]
    p = subprocess.Popen(cmd + ["show", str(path)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    assert p.stdout.readline().startswith(b"graph @long")
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141 and err == "", err


# ---- every error path is one line --------------------------------------------------------
def test_run_error_paths_are_one_line(tmp_path, capsys):
    path = small_model(tmp_path)
    x = np.zeros((1, 3, 6, 6), np.float32)
    good = tmp_path / "in.safetensors"
    save_file({"x": x}, str(good))
    assert main(["run", str(path), "--inputs", str(good), "--fetch", "nosuchvalue"]) == 1
    assert "no value %nosuchvalue" in one_line_error(capsys)
    assert main(["run", str(path), "--inputs", str(good), "-o", "/nonexistent/x.safetensors"]) == 1
    assert "cannot write /nonexistent/x.safetensors" in one_line_error(capsys)
    assert not capsys.readouterr().out          # refused before running
    for name, arrays, words in [
            ("i64", {"x": np.full((1, 3, 6, 6), 300, np.int64)}, ["%x", "int64", "f32"]),
            ("big", {"x": np.full((1, 3, 6, 6), 1e300)}, ["%x", "1e+300 overflows f32"]),
            ("shape", {"x": np.zeros((1, 3, 5, 6), np.float32)}, ["'x'", "[1, 3, 5, 6]"]),
            ("extra", {"x": x, "extra": x}, ["'extra' is not an input", "its inputs: ['x']"]),
            ("name", {"X": x}, ["'X' is not an input of @net (did you mean 'x'?)",
                                "missing input(s) ['x']"])]:
        f = tmp_path / f"{name}.safetensors"
        save_file(arrays, str(f))
        assert main(["run", str(path), "--inputs", str(f)]) == 1
        line = one_line_error(capsys)
        assert all(w in line for w in words), line
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x00" * 16)
    assert main(["run", str(path), "--inputs", str(garbage)]) == 1
    assert "cannot read inputs" in one_line_error(capsys)


def test_float64_inputs_are_cast_with_a_note(tmp_path, capsys):
    """As bevir.run casts them: float64 data for a float32 input."""
    path = small_model(tmp_path)
    x = np.random.default_rng(1).standard_normal((1, 3, 6, 6))
    f = tmp_path / "f64.safetensors"
    save_file({"x": x}, str(f))
    assert main(["run", str(path), "--inputs", str(f), "-o", str(tmp_path / "y.safetensors")]) == 0
    assert capsys.readouterr().err == ("bevir: note: input 'x' is float64, cast to float32 as "
                                       "@net declares\n")
    expected = bevir.run(bevir.load(path), {"x": x.astype(np.float32)})["y"]
    assert np.array_equal(load_file(str(tmp_path / "y.safetensors"))["y"], expected)


def test_interpreter_refuses_unknown_inputs_and_wrap_around(tmp_path):
    g = bevir.load(small_model(tmp_path))
    x = np.zeros((1, 3, 6, 6), np.float32)
    with pytest.raises(bevir.InterpreterError, match=r"'z' is not an input of @net; its"):
        bevir.run(g, {"x": x, "z": x})
    b = Builder("codes")
    c = b.input("c", TensorType((2,), bevir.DType.i8))
    b.output("y", b.reshape(c, shape=(1, 2)))
    with pytest.raises(bevir.InterpreterError, match="300 is outside the i8 range"):
        bevir.run(b.graph, {"c": np.array([1, 300], np.int64)})


def test_show_and_run_read_onnx(tmp_path, capsys):
    src = tmp_path / "tiny.onnx"
    _onnx_model(src)
    assert main(["show", str(src), "--summary-only"]) == 0
    assert "conv2d 1" in capsys.readouterr().out
    x = np.random.default_rng(5).standard_normal((1, 3, 8, 8)).astype(np.float32)
    save_file({"X": x}, str(tmp_path / "in.safetensors"))
    out = tmp_path / "out.safetensors"
    assert main(["run", str(src), "--inputs", str(tmp_path / "in.safetensors"), "-o", str(out)]) == 0
    import onnxruntime as ort
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]
    assert np.abs(load_file(str(out))["Y"] - ref).max() <= 1e-5 * np.abs(ref).max()
    disguised = tmp_path / "tiny.bevir"
    disguised.write_bytes(src.read_bytes())
    assert main(["show", str(disguised)]) == 1
    assert "not bevir IR text" in one_line_error(capsys)


def test_pass_option_typos_are_refused_while_parsing(tmp_path, capsys):
    path = small_model(tmp_path)
    assert main(["opt", str(path), "-p", "fuse{disable=typo}", "-o", str(tmp_path / "o.bevir")]) == 1
    line = one_line_error(capsys)
    assert "has no pattern 'typo' (option 'disable')" in line and "fuse-conv-activation" in line
    assert "failed" not in line and not list(tmp_path.glob("*reproducer*"))
    assert main(["opt", str(path), "-p", "fuse{disabel=x}"]) == 1
    assert "no option 'disabel' (options: enable, disable, max_rewrites)" in one_line_error(capsys)


def test_large_reproducer_keeps_constants_beside_it(tmp_path, capsys):
    b = Builder("big")
    x = b.input("x", TensorType((512, 1024)))
    w = b.const(np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32), "w")
    b.output("y", b.add(x, w))
    path = tmp_path / "big.bevir"
    bevir.save(b.graph, path)
    assert main(["opt", str(path), "-p", "test-cli-explode"]) == 1
    one_line_error(capsys)
    repro = tmp_path / "big.reproducer.bevir"
    assert repro.stat().st_size < 4096                          # 2 MiB of weights not in the text
    assert (tmp_path / "big.reproducer.safetensors").exists()
    assert main(["opt", "--reproduce", str(repro)]) == 1
    assert "add is not allowed here" in one_line_error(capsys)
    graph, _ = bevir.passes.replay(repro)
    assert np.array_equal(graph.constants["w"].const, b.graph.constants["w"].const)


def test_internal_errors_are_one_line(tmp_path, capsys, monkeypatch):
    path = small_model(tmp_path)
    import bevir.cli.models as cli
    monkeypatch.setattr(cli, "summary", lambda graph: {}["boom"])
    assert main(["show", str(path), "--summary-only"]) == 1
    line = one_line_error(capsys)
    assert "internal error: KeyError: 'boom'" in line and "BEVIR_TRACEBACK=1" in line


PLUGIN = '''
import numpy as np
import pytest
from bevir.passes import Pass
from bevir.passes.quant_config import QuantConfig
from bevir.sim.compare import layer_error
from bevir import OpDef


class NegToSub(Pass):
    name = "test-neg-to-sub"
    description = "neg(x) -> sub(0, x)"

    def run(self, graph, am):
        for n in list(graph.nodes):
            if n.op == "neg":
                self.stat("seen")


class Twice(OpDef):
    name = "test-plugin-twice"

    def infer(self, c, x):
        return x

    def compute(self, c, x):
        return x * np.asarray(2, x.dtype)
'''


def test_load_plugins(tmp_path, capsys, monkeypatch):
    plugin = tmp_path / "myplugin.py"
    plugin.write_text(PLUGIN)
    path = small_model(tmp_path)
    for _ in range(2):                               # a second load in one process is a no-op
        assert main(["opt", str(path), "--load", str(plugin), "-p", "test-neg-to-sub", "--stats",
                     "-o", str(tmp_path / "o.bevir")]) == 0
        assert "seen" in capsys.readouterr().err
    mod = tmp_path / "mods"
    mod.mkdir()
    (mod / "bevir_test_mod_plugin.py").write_text(PLUGIN.replace("test-neg-to-sub", "test-mod-pass")
                                                  .replace("test-plugin-twice", "test-mod-twice"))
    monkeypatch.syspath_prepend(str(mod))
    assert main(["passes", "--load-module", "bevir_test_mod_plugin"]) == 0
    assert "test-mod-pass" in capsys.readouterr().out
    assert main(["passes", "--load-module", "no_such_module_xyz"]) == 1
    assert "--load-module no_such_module_xyz failed: ModuleNotFoundError" in one_line_error(capsys)
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('plugin says no')\n")
    assert main(["passes", "--load", str(broken)]) == 1
    assert f"RuntimeError: plugin says no (at {broken}:1)" in one_line_error(capsys)
    assert main(["passes", "--load", str(tmp_path / "absent.py")]) == 1
    assert "no such file" in one_line_error(capsys)


def mlp_model(tmp_path: Path) -> tuple[Path, Path]:
    """A three-layer MLP (one rule group per layer in mlp_config) and one input frame."""
    rng = np.random.default_rng(5)
    b = Builder("mlp")
    h = b.input("x", TensorType((32, 16)))
    for k in range(3):
        w = (rng.standard_normal((16, 16)) / 4).astype(np.float32)
        w[:, 0] *= 30 if k == 1 else 1        # per-tensor weights cannot hold this layer
        h = b.relu(b.matmul(h, b.const(w, f"w{k}"), loc=f"layer{k}"), loc=f"layer{k}")
    b.output("y", h)
    bevir.save(b.graph, tmp_path / "mlp.bevir")
    save_file({"x": rng.standard_normal((32, 16)).astype(np.float32)}, tmp_path / "in.safetensors")
    cfg = QuantConfig.build({"rules": [{"name": f"layer{k}", "where": [f"layer{k}"]}
                                             for k in range(3)]})
    cfg.save(tmp_path / "start.json")
    return tmp_path / "mlp.bevir", tmp_path / "in.safetensors"


def test_quantize_and_search_a_target(tmp_path, capsys):
    model, inputs = mlp_model(tmp_path)
    q = tmp_path / "q.bevir"
    args = ["quantize", str(model), "--inputs", str(inputs), "-o", str(q)]
    assert main(args + ["--config", str(tmp_path / "start.json")]) == 0
    out = capsys.readouterr().out
    assert f"wrote {q}" in out and "6 ops lowered to fixed point" in out
    feed = load_file(inputs)
    ref = bevir.run(bevir.load(model), feed)["y"]
    start_sqnr = layer_error(ref, bevir.run(bevir.load(q), feed)["y"])[0]
    target = f"sqnr>={start_sqnr + 3:.1f}"
    assert main(args + ["--config", str(tmp_path / "start.json"), "--target", target,
                        "--write-config", str(tmp_path / "found.json")]) == 0
    out = capsys.readouterr().out
    assert f"precision search for {target}" in out and "start " in out
    assert "met after" in out and "not met after" not in out and "cycles" in out
    found = QuantConfig.load(tmp_path / "found.json")
    assert found != QuantConfig.load(tmp_path / "start.json")
    got = bevir.run(bevir.load(q), feed)["y"]
    assert layer_error(ref, got)[0] >= start_sqnr + 3
    # the written config reproduces the model
    again = tmp_path / "again.bevir"
    assert main(["quantize", str(model), "--inputs", str(inputs), "-o", str(again),
                 "--config", str(tmp_path / "found.json")]) == 0
    assert np.array_equal(bevir.run(bevir.load(again), feed)["y"], got)


def test_quantize_with_the_default_config_widens_to_30_db_and_writes_what_it_did(tmp_path,
                                                                               capsys):
    """The default config's widen_to: bevir quantize says how many layers it moved to 16
    bits and the SQNR reached; the config it writes has no widen_to and reproduces the
    model bit for bit."""
    model, inputs = mlp_model(tmp_path)
    q, again, written = tmp_path / "q.bevir", tmp_path / "again.bevir", tmp_path / "w.json"
    assert main(["quantize", str(model), "--inputs", str(inputs), "-o", str(q),
                 "--write-config", str(written)]) == 0
    out = capsys.readouterr().out
    assert "layer(s) of the worst local error: SQNR " in out and "(widen_to 30)" in out
    cfg = QuantConfig.load(written)
    assert cfg.widen_to is None
    assert main(["quantize", str(model), "--inputs", str(inputs), "-o", str(again),
                 "--config", str(written)]) == 0
    assert "worst local error" not in capsys.readouterr().out
    feed = load_file(inputs)
    assert np.array_equal(bevir.run(bevir.load(q), feed)["y"],
                          bevir.run(bevir.load(again), feed)["y"])


def test_quantize_says_what_stays_on_the_host(tmp_path, capsys):
    """The middle layer excluded: quantize names the host's float nodes and the round trip
    they make between the device's stages, and compile says the same."""
    model, inputs = mlp_model(tmp_path)
    cfg = QuantConfig.build({"rules": [{"name": f"layer{k}", "where": [f"layer{k}"],
                                        "exclude": k == 1} for k in range(3)]})
    cfg.save(tmp_path / "mid.json")
    q = tmp_path / "q.bevir"
    assert main(["quantize", str(model), "--inputs", str(inputs), "-o", str(q),
                 "--config", str(tmp_path / "mid.json")]) == 0
    out = capsys.readouterr().out
    assert "on the host (float): 2 node(s) (matmul 1, relu 1)" in out
    assert "note: 1 host round trip(s) between device stages, through float ops the " \
           "quantization left: matmul 'layer1', relu 'layer1'" in out
    assert main(["quantize", str(model), "--inputs", str(inputs), "-o", str(q),
                 "--config", str(tmp_path / "start.json")]) == 0
    out = capsys.readouterr().out
    assert "on the host (float): 0 node(s)" in out and "round trip" not in out


@pytest.mark.parametrize("extra, problem", [
    (["--target", "sqnr=>3"], "expected METRIC>=VALUE"),
    (["--target", "nosuch_sqnr>=3"], "target metric 'nosuch_sqnr' is not measured"),
    (["--config", "nosuch"], "no preset 'nosuch'")])
def test_quantize_errors_are_one_line(tmp_path, capsys, extra, problem):
    model, inputs = mlp_model(tmp_path)
    assert main(["quantize", str(model), "--inputs", str(inputs), "-o",
                 str(tmp_path / "q.bevir")] + extra) != 0
    assert problem in one_line_error(capsys)


CUSTOM_OP_PLUGIN = '''
import numpy as np
from bevir.ops import OpDef
from bevir.passes import Pass


class Halve(OpDef):
    name = "cli_test.halve"
    operands = ("x",)

    def infer(self, c, x):
        return x

    def compute(self, c, x):
        return x * np.asarray(0.5, x.dtype)


class Broken(Pass):
    name = "cli-test-broken"
    description = "reads a field nodes do not have"

    def run(self, graph, am):
        for node in graph.nodes:
            node.type
'''

CUSTOM_OP_GRAPH = """graph @g(%x: tensor<2x4xf32>) {
  %h = cli_test.halve(%x) : tensor<2x4xf32>
  %y = relu(%h) : tensor<2x4xf32>
  %q = fx_quantize(%y) {out_frac_bits = 4} : tensor<2x4xi8, fixed<frac_bits=4>>
  %z = fx_relu(%q) {out_frac_bits = 4} : tensor<2x4xi8, fixed<frac_bits=4>>
  return %y as "y", %z as "z"
}
"""


def test_every_command_that_reads_a_graph_takes_load(tmp_path, capsys):
    """A graph with a plugin's op: inputs, run, sim, compile and exec load the plugin first
    (without it: unknown op); a plugin pass that raises names the plugin's file and line."""
    plugin, model = tmp_path / "plug.py", tmp_path / "m.bevir"
    plugin.write_text(CUSTOM_OP_PLUGIN)
    model.write_text(CUSTOM_OP_GRAPH)
    inputs, load = tmp_path / "in.safetensors", ["--load", str(plugin)]
    assert main(["inputs", str(model), "-o", str(inputs)]) == 1
    assert "unknown op 'cli_test.halve'" in one_line_error(capsys)
    assert main(["inputs", str(model), "-o", str(inputs), "--seed", "3"] + load) == 0
    x = load_file(str(inputs))["x"]
    assert x.dtype == np.float32 and x.shape == (2, 4)
    assert main(["run", str(model), "--inputs", str(inputs), "-o",
                 str(tmp_path / "y.safetensors")] + load) == 0
    assert np.array_equal(load_file(str(tmp_path / "y.safetensors"))["y"], np.maximum(x / 2, 0))
    assert main(["sim", str(model), "--out", str(tmp_path / "sim"), "--no-plots"] + load) == 0
    prog = tmp_path / "prog"
    assert main(["compile", str(model), "-o", str(prog)] + load) == 0
    assert main(["exec", str(prog), "--inputs", str(inputs), "--check"] + load) == 0
    assert "check: 0 differing elements" in capsys.readouterr().out
    assert main(["export", str(model), "--onnx", str(tmp_path / "m.onnx")] + load) == 1
    assert "'cli_test.halve' has no ONNX export" in one_line_error(capsys)
    assert main(["opt", str(model), "-p", "cli-test-broken"] + load) == 1
    assert ("pass 'cli-test-broken' failed: AttributeError: 'Node' object has no attribute "
            f"'type' (at {plugin}:{CUSTOM_OP_PLUGIN.splitlines().index('            node.type') + 1})"
            ) in one_line_error(capsys)


def test_inputs_writes_zeros_or_seeded_random_arrays(tmp_path, capsys):
    path = small_model(tmp_path)
    out = tmp_path / "in.safetensors"
    assert main(["inputs", str(path), "-o", str(out), "--zeros"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert np.array_equal(load_file(str(out))["x"], np.zeros((1, 3, 6, 6), np.float32))
    from bevir.passes.instruments import probe_inputs
    for seed in (0, 7):
        assert main(["inputs", str(path), "-o", str(out), "--seed", str(seed)]) == 0
        assert np.array_equal(load_file(str(out))["x"], probe_inputs(bevir.load(path), seed)["x"])
    assert main(["run", str(path), "--inputs", str(out)]) == 0
    assert main(["inputs", str(path), "-o", str(out), "--zeros", "--seed", "1"]) == 2
