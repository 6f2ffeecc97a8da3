"""Fuzz the importers and loaders: every failure must be a bevir.BevirError.

Targets (each takes one random byte string and derives its case from it):

* ``onnx``: a small valid ONNX model, serialized, then bytes flipped / truncated / spliced,
  or one structural change: an attribute's value, a declared shape or dtype, a dangling or
  duplicated name;
* ``text``: a printed IR text with characters mutated, deleted or duplicated;
* ``load``: a saved graph whose constants file is corrupted or truncated;
* ``config``: a QuantConfig JSON file (the BEVFormer example's reference-flow preset) mutated;
* ``ranges``: a saved calibration (ranges JSON + safetensors) with either file mutated;
* ``tranges``: a ``bevir-tranges`` file mutated;
* ``torch``: a small random torch module (layers, widths and an input shape drawn at
  random, sometimes mismatched) through ``bevir.from_torch``.

A graph that loads must also verify and, for ``torch``, compute what the module computes
(no silently wrong graph). Each case runs under a
time bound (a case over it counts as a hang). ``python tools/fuzz.py [CASES]`` runs
CASES (default 10,000) per target and prints, per target: cases, distinct error messages,
non-bevir exceptions and hangs; it exits non-zero when any of the last two is not zero.
"""
from __future__ import annotations

import random
import re
import signal
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # this checkout's bevir
import bevir  # noqa: E402

CASE_SECONDS = 5


def seed_model() -> bytes:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    nodes = [oh.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 4, name="conv"),
             oh.make_node("Clip", ["c", "lo", "hi"], ["r"], name="clip"),
             oh.make_node("Reshape", ["r", "shape"], ["y"], name="reshape")]
    g = oh.make_graph(nodes, "fuzz", [oh.make_tensor_value_info("x", TP.FLOAT, [1, 3, 6, 6]),
                                      oh.make_tensor_value_info("lo", TP.FLOAT, []),
                                      oh.make_tensor_value_info("hi", TP.FLOAT, [])],
                      [oh.make_tensor_value_info("y", TP.FLOAT, [1, 144])], [w, shape])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def _seed_graph():
    return bevir.from_onnx(onnx.load_model_from_string(seed_model()))


_SEED_TEXT = None


def mutate(data: bytes, rnd: random.Random) -> bytes:
    """Flip, delete, duplicate or truncate a few bytes."""
    b = bytearray(data)
    for _ in range(rnd.randint(1, 4)):
        if not b:
            break
        i = rnd.randrange(len(b))
        kind = rnd.randrange(4)
        if kind == 0:
            b[i] ^= 1 << rnd.randrange(8)
        elif kind == 1:
            del b[i:i + rnd.randint(1, 8)]
        elif kind == 2:
            b[i:i] = b[i:i + rnd.randint(1, 8)]
        else:
            del b[i:]
    return bytes(b)


def mutate_proto(data: bytes, rnd: random.Random) -> bytes:
    """The model with one structural change: an attribute's value, a declared shape or
    dtype, a dangling or duplicated name."""
    m = onnx.load_model_from_string(data)
    g = m.graph
    kind = rnd.randrange(5)
    if kind == 0:                                     # an attribute gets a random value
        node = rnd.choice(list(g.node))
        value = rnd.choice([rnd.randint(-3, 9), rnd.uniform(-2, 2), [rnd.randint(-2, 5)] * rnd.randint(1, 6),
                            "NOTSET", "bogus"])
        name = rnd.choice(["pads", "strides", "dilations", "group", "kernel_shape", "auto_pad",
                           "allowzero", "axis"])
        keep = [a for a in node.attribute if a.name != name]
        del node.attribute[:]
        node.attribute.extend(keep + [oh.make_attribute(name, value)])
    elif kind == 1:                                   # a declared shape changes
        vi = rnd.choice(list(g.input) + list(g.output))
        dims = vi.type.tensor_type.shape.dim
        if len(dims):
            dims[rnd.randrange(len(dims))].dim_value = rnd.choice([0, 1, 7, 1 << 40])
    elif kind == 2:                                   # a declared or stored dtype changes
        target = rnd.choice(list(g.input) + list(g.initializer))
        dtype = rnd.choice([TP.INT8, TP.DOUBLE, TP.STRING, TP.BOOL, TP.FLOAT16, 99])
        if hasattr(target, "data_type"):
            target.data_type = dtype
        else:
            target.type.tensor_type.elem_type = dtype
    elif kind == 3:                                   # an input nobody makes
        node = rnd.choice(list(g.node))
        node.input[rnd.randrange(len(node.input))] = "dangling"
    else:                                             # a name made twice
        a, b = rnd.sample(list(g.node), 2)
        b.output[0] = a.output[0]
    return m.SerializeToString()


def target_onnx(rnd: random.Random) -> None:
    """Bytes flipped / truncated / spliced, or one structural change of the proto."""
    data = seed_model()
    data = mutate(data, rnd) if rnd.random() < 0.5 else mutate_proto(data, rnd)
    g = bevir.from_onnx(data)
    bevir.verify(g)


def target_text(rnd: random.Random) -> None:
    global _SEED_TEXT
    if _SEED_TEXT is None:
        _SEED_TEXT = bevir.print_graph(_seed_graph(), constants="inline")
    text = mutate(_SEED_TEXT.encode(), rnd).decode("utf-8", errors="replace")
    bevir.verify(bevir.parse(text))


def target_load(rnd: random.Random) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = bevir.save(_seed_graph(), Path(d) / "g.bevir")
        which = path if rnd.random() < 0.3 else path.with_suffix(".safetensors")
        which.write_bytes(mutate(which.read_bytes(), rnd))
        bevir.verify(bevir.load(path))


def _mutated_file(path: Path, rnd: random.Random) -> Path:
    path.write_bytes(mutate(path.read_bytes(), rnd))
    return path


def target_config(rnd: random.Random) -> None:
    import examples.bevformer.quant  # noqa: F401  (registers the reference-flow preset)
    from bevir.passes.quant_config import QuantConfig
    with tempfile.TemporaryDirectory() as d:
        path = QuantConfig.preset("reference-flow").save(Path(d) / "q.json")
        QuantConfig.load(_mutated_file(path, rnd))


def _seed_ranges(folder: Path) -> Path:
    g = _seed_graph()
    rng = np.random.default_rng(0)
    samples = [{"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32),
                "lo": np.float32(-1), "hi": np.float32(1)} for _ in range(2)]
    ranges = bevir.calibrate(g, samples, method="percentile", per_channel=True, progress=False)
    return ranges.save(folder / "ranges.json")


def target_ranges(rnd: random.Random) -> None:
    from bevir.passes.calibrate import Ranges
    with tempfile.TemporaryDirectory() as d:
        path = _seed_ranges(Path(d))
        _mutated_file(path if rnd.random() < 0.5 else path.with_suffix(".safetensors"), rnd)
        Ranges.load(path)


def target_tranges(rnd: random.Random) -> None:
    from bevir.flows.backbone import write_tranges
    from bevir.passes.calibrate import Ranges
    with tempfile.TemporaryDirectory() as d:
        path = write_tranges(Path(d) / "t.tranges", {"x": (-1.0, 1.0), "c": (-3.5, 2.25),
                                                     "r": (0.0, 6.0)})
        Ranges.from_tranges(_mutated_file(path, rnd), _seed_graph())


def target_torch(rnd: random.Random) -> None:
    """A random stack of layers on a random input shape; shapes may not fit (the error
    must then be a bevir one); a graph that imports must match torch."""
    import torch
    from torch import nn
    torch.manual_seed(rnd.randrange(1 << 30))
    c, layers = rnd.choice([1, 3, 4]), []
    for _ in range(rnd.randint(1, 4)):
        kind = rnd.choice(["conv", "relu", "bn", "pool", "linear", "gelu", "flatten", "ln"])
        out = rnd.choice([2, 4, 8])
        layers.append({"conv": lambda: nn.Conv2d(c, out, rnd.choice([1, 3]), padding=rnd.choice([0, 1])),
                       "relu": nn.ReLU, "gelu": nn.GELU, "bn": lambda: nn.BatchNorm2d(c),
                       "pool": lambda: nn.MaxPool2d(2), "flatten": nn.Flatten,
                       "linear": lambda: nn.Linear(rnd.choice([c, 8, 16]), out),
                       "ln": lambda: nn.LayerNorm(rnd.choice([c, 8]))}[kind]())
        if kind in ("conv", "linear"):
            c = out
    model = nn.Sequential(*layers).eval()
    x = torch.randn(rnd.choice([(1, c if rnd.random() < 0.8 else c + 1, 8, 8), (2, 8), (2, 3, 8)]))
    try:
        with torch.no_grad():
            ref = model(x)
    except (RuntimeError, ValueError):
        return                    # torch itself refuses the shapes: nothing to import
    g = bevir.from_torch(model, (x,))
    bevir.verify(g)
    out = next(iter(bevir.run(g, {g.inputs[0].name: x.numpy()}).values()))
    if not np.allclose(out, ref.numpy(), rtol=1e-4, atol=1e-5):
        raise AssertionError("from_torch imported a graph that computes something else")


TARGETS = {"onnx": target_onnx, "text": target_text, "load": target_load,
           "config": target_config, "ranges": target_ranges, "tranges": target_tranges,
           "torch": target_torch}


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


def run_case(target, rnd: random.Random) -> tuple[str, str]:
    """('ok' | 'bevir' | 'other' | 'hang', message) of one case."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_SECONDS)
    try:
        target(rnd)
        return "ok", ""
    except _Hang:
        return "hang", ""
    except bevir.BevirError as e:      # temporary paths differ per case: not the message
        text = re.sub(re.escape(tempfile.gettempdir()) + r"/\S+", "<file>", str(e))
        return "bevir", f"{type(e).__name__}: {text[:80]}"
    except Exception as e:   # noqa: BLE001  (what the fuzzing looks for)
        return "other", f"{type(e).__name__}: {e}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def fuzz(name: str, cases: int, seed: int = 0) -> dict:
    rnd = random.Random(seed)
    kinds, errors, others = Counter(), set(), []
    for _ in range(cases):
        kind, msg = run_case(TARGETS[name], rnd)
        kinds[kind] += 1
        if kind == "bevir":
            errors.add(msg)
        elif kind == "other":
            others.append(msg)
    return {"cases": cases, "loaded": kinds["ok"], "distinct_errors": len(errors),
            "non_bevir": kinds["other"], "hangs": kinds["hang"], "examples": others[:5]}


def main(argv: list[str]) -> int:
    """``fuzz.py [CASES] [TARGET ...]``"""
    cases = int(argv[1]) if len(argv) > 1 else 10_000
    bad = 0
    for name in argv[2:] or TARGETS:
        r = fuzz(name, cases)
        print(f"{name}: {r['cases']} cases, {r['loaded']} loaded and verified, "
              f"{r['distinct_errors']} distinct error messages, {r['non_bevir']} non-bevir "
              f"exceptions, {r['hangs']} hangs", flush=True)
        for ex in r["examples"]:
            print(f"    {ex}")
        bad += r["non_bevir"] + r["hangs"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
