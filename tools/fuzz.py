"""Fuzz the importers and loaders: every failure must be a bevir.BevirError.

Targets (each takes one random byte string and derives its case from it):

* ``onnx``: a small valid ONNX model, serialized, then bytes flipped / truncated / spliced,
  or one structural change: an attribute's value, a declared shape or dtype, a dangling or
  duplicated name;
* ``text``: a printed IR text with characters mutated, deleted or duplicated;
* ``load``: a saved graph whose constants file is corrupted or truncated;
* ``config``: a QuantConfig JSON file (the BEVFormer example's reference-flow preset) with
  its bytes mutated or one structural change (a value of another type, a key removed or
  added); a config that loads holds every value as the file gave it (no "yes" for true);
* ``ranges``: a saved calibration (ranges JSON + safetensors) with either file mutated
  (the JSON also structurally); ranges that load have low <= high;
* ``tranges``: a ``bevir-tranges`` file mutated;
* ``torch``: a small random torch module (layers, widths and an input shape drawn at
  random, sometimes mismatched) through ``bevir.from_torch``;
* ``hw``: a vendor hardware string of random tokens (sometimes a field twice), or
  mutated; a config that parses took each field from one token;
* ``frames``: a frame set whose index (bytes or one structural change) or shards are
  damaged, read whole and at random indices (ints out of range, bools, strings, numpy
  ints): every frame read is the frame written;
* ``manifest``: a compiled 2-core program whose manifest.json is mutated (bytes or one
  structural change), loaded and run;
* ``program``: a compiled program with a file damaged (libraries swapped, truncated,
  flipped, foreign, symbolic links, missing; graph files or the manifest of another
  program; as a control, a C source), loaded and run: the golden outputs bit for bit
  or a bevir error, and no foreign library's constructor run.

A graph that loads must also verify and, for ``torch``, compute what the module computes
(no silently wrong graph). Each case runs under a time bound (a case over it counts as a
hang); ``manifest`` and ``program`` cases run each in a child process, so that a native
crash is counted rather than fatal. ``python tools/fuzz.py [CASES] [TARGET ...]`` runs
CASES (default 10,000) per target and prints, per target: cases, distinct error
messages, non-bevir exceptions, hangs and native crashes; it exits non-zero when any of
the last three is not zero.
"""
from __future__ import annotations

import json
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
        value = rnd.choice([rnd.randint(-3, 9), rnd.uniform(-2, 2),
                            [rnd.randint(-2, 5)] * rnd.randint(1, 6), "NOTSET", "bogus"])
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


#: values a structural mutation puts into a JSON document
JSON_VALUES = [0, 1, -1, 2, 3, 7, 2**31, 2**63, -2**63, 0.5, 1.5, -0.0, float("nan"),
               float("inf"), True, False, None, "", "x", "yes", "core0.so", "1", [], [1, 2], {},
               {"a": 1}, [[[]]]]


def json_paths(doc, path=()):
    """Every (path, container, key) inside a JSON document."""
    items = doc.items() if isinstance(doc, dict) else \
        enumerate(doc) if isinstance(doc, list) else ()
    for k, v in list(items):
        yield path + (k,), doc, k
        yield from json_paths(v, path + (k,))


def mutate_json(doc, rnd: random.Random) -> tuple[tuple, object]:
    """One structural change of a JSON document: a value replaced (by another type, a
    nearby number, a deep nesting), a key removed or added, an entry duplicated. Returns
    (the path changed, its new value; None when removed or not a plain value)."""
    places = list(json_paths(doc))
    if not places:
        return (), None
    path, parent, key = rnd.choice(places)
    old, kind = parent[key], rnd.randrange(5)
    if kind == 0 and isinstance(old, (int, float)) and not isinstance(old, bool):
        parent[key] = old + rnd.choice([-1, 1, -old - 1, old * 1000])
    elif kind == 1:
        del parent[key]
        return path, None
    elif kind == 2 and isinstance(parent, dict):
        parent[f"extra{rnd.randrange(3)}"] = rnd.choice(JSON_VALUES)
        return path, None
    elif kind == 3 and isinstance(parent, list):
        parent.insert(rnd.randrange(len(parent) + 1), old)
        return path, None
    else:
        parent[key] = json.loads("[" * 50 + "]" * 50) if rnd.random() < 0.05 else \
            rnd.choice(JSON_VALUES)
    return path, parent[key]


def _mutated_json(path: Path, rnd: random.Random) -> tuple[tuple, object] | None:
    """``path``'s bytes mutated, or one structural change of its JSON (see
    :func:`mutate_json`; returned)."""
    if rnd.random() < 0.4:
        _mutated_file(path, rnd)
        return None
    doc = json.loads(path.read_text())
    change = mutate_json(doc, rnd)
    path.write_text(json.dumps(doc))
    return change


def target_config(rnd: random.Random) -> None:
    """A config's bytes mutated, or one structural change; a config that loads holds each
    value as the file gave it (no "yes" taken for true, no "1" for 1)."""
    import examples.bevformer.quant  # noqa: F401  (registers the reference-flow preset)
    from bevir.passes.quant_config import QuantConfig
    with tempfile.TemporaryDirectory() as d:
        path = QuantConfig.preset("reference-flow").save(Path(d) / "q.json")
        change = _mutated_json(path, rnd)
        cfg = QuantConfig.load(path)
        if change is None or change[1] is None or isinstance(change[1], (dict, list)):
            return
        held = json.loads(cfg.model_dump_json())
        try:
            for k in change[0]:
                held = held[k]
        except (KeyError, IndexError, TypeError):
            return                                      # not a field of the config
        if held != change[1] and not (held != held and change[1] != change[1]):   # NaN
            raise AssertionError(f"config took {change[1]!r} at {change[0]} as {held!r}")


def _seed_ranges(folder: Path) -> Path:
    g = _seed_graph()
    rng = np.random.default_rng(0)
    samples = [{"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32),
                "lo": np.float32(-1), "hi": np.float32(1)} for _ in range(2)]
    ranges = bevir.calibrate(g, samples, method="percentile", per_channel=True, progress=False)
    return ranges.save(folder / "ranges.json")


def target_ranges(rnd: random.Random) -> None:
    """A ranges file's JSON (bytes, or one structural change) or arrays mutated; ranges
    that load have low <= high everywhere."""
    from bevir.passes.calibrate import Ranges
    with tempfile.TemporaryDirectory() as d:
        path = _seed_ranges(Path(d))
        if rnd.random() < 0.5:
            _mutated_json(path, rnd)
        else:
            _mutated_file(path.with_suffix(".safetensors"), rnd)
        for e in Ranges.load(path):
            if not e.lo <= e.hi:
                raise AssertionError(f"ranges loaded with low {e.lo} above high {e.hi}")


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
        layers.append({"conv": lambda: nn.Conv2d(c, out, rnd.choice([1, 3]),
                                                 padding=rnd.choice([0, 1])),
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


# ---- hardware strings ----------------------------------------------------------------------
HW_TOKENS = ["QC-U", "qc-ultra", "chimera", "8MB", "512KB", "1.5M", "16MB", "16MAC", "8MACs",
             "x1", "x4", "x 3", "x0", "x65", "32x32", "16 x 16", "0x8", "1.2GHz", "800MHz",
             "0GHz", "shared", "SHARED", "bogus", "4QB", "-1MB", "x-2", "99999999999MB"]


def target_hw(rnd: random.Random) -> None:
    """A vendor string of random tokens (sometimes a field given twice), or one mutated; a
    config that parses took each field from exactly one token."""
    from bevir.target.hw import _TOKEN, FAMILIES, HWConfig, _read_token
    tokens = rnd.sample(HW_TOKENS, rnd.randint(1, 5))
    if rnd.random() < 0.3:
        tokens.append(rnd.choice(tokens))
    text = " ".join(tokens)
    if rnd.random() < 0.3:
        text = mutate(text.encode(), rnd).decode("utf-8", errors="replace")
    config = HWConfig.parse(text)
    fields: Counter = Counter()
    for i, token in enumerate(t.strip() for t in _TOKEN.findall(text.strip())):
        if not (i == 0 and token.lower() in FAMILIES):
            fields.update(_read_token(token, text).keys())
    if any(n > 1 for n in fields.values()):
        raise AssertionError(f"{text!r} gives a field twice, parsed as {config.describe()}")


# ---- frame sets ----------------------------------------------------------------------------
_SEED_FRAMES: dict = {}


def _seed_frames() -> tuple[Path, list[dict]]:
    """A frame set of 10 frames in 3 shards (written once per process) and its frames."""
    if not _SEED_FRAMES:
        from bevir.scale import FrameWriter
        folder = Path(tempfile.mkdtemp(prefix="bevir-fuzz-frames-"))
        rng = np.random.default_rng(0)
        frames = [{"x": rng.standard_normal((2, 3)).astype(np.float32),
                   "i": rng.integers(-9, 9, 4).astype(np.int8)} for _ in range(10)]
        with FrameWriter(folder, frames_per_shard=4) as w:
            for k, f in enumerate(frames):
                w.add(f, t=k)
        _SEED_FRAMES.update(folder=folder, frames=frames)
    return _SEED_FRAMES["folder"], _SEED_FRAMES["frames"]


def _copy(src: Path, dst: Path, link: tuple[str, ...] = ()) -> Path:
    """``src`` copied to ``dst``; files named in ``link`` hard-linked (not to be written)."""
    import os
    import shutil
    dst.mkdir()
    for p in src.iterdir():
        if p.is_dir():
            shutil.copytree(p, dst / p.name)
        elif p.name in link:
            os.link(p, dst / p.name)
        else:
            shutil.copy(p, dst / p.name)
    return dst


FRAME_INDICES = [0, 3, 9, -1, -10, 10, -11, 2**40, True, 1.0, "1", None, np.int64(4),
                 np.int8(-2), np.uint64(2**63)]


def target_frames(rnd: random.Random) -> None:
    """A frame set whose index (bytes or one structural change: a shard's first frame or
    count, a file name, a digest, a shape...) or a shard is damaged, read whole and at
    random indices: each frame is the one written, or the error a bevir one."""
    from bevir.scale import Frames
    seed, frames = _seed_frames()
    with tempfile.TemporaryDirectory() as d:
        folder = _copy(seed, Path(d) / "f")
        which = rnd.random()
        if which < 0.6:
            _mutated_json(folder / "frames.json", rnd)
        elif which < 0.8:
            _mutated_file(folder / f"shard-{rnd.randrange(3):05d}.safetensors", rnd)
        else:                                           # two shards swapped
            a, b = (folder / f"shard-{k:05d}.safetensors" for k in rnd.sample(range(3), 2))
            a.rename(folder / "t")
            b.rename(a)
            (folder / "t").rename(b)
        got = Frames(folder)
        if len(got) != len(frames):
            raise AssertionError(f"a frame set of {len(frames)} frames read as {len(got)}")
        for i in [rnd.randrange(len(frames)) for _ in range(3)] + [rnd.choice(FRAME_INDICES)]:
            frame = got[i]
            want = frames[int(i) % len(frames)]
            if set(frame) != set(want) or any(frame[k].tobytes() != want[k].tobytes()
                                              or frame[k].dtype != want[k].dtype for k in want):
                raise AssertionError(f"frame {i!r} is not the frame written")


# ---- compiled programs (cases run in a child process: a native crash is counted) ----------
_SEED_PROGRAMS: dict = {}

FOREIGN_C = """#include <stdio.h>
__attribute__((constructor)) static void ran(void) {
  FILE* f = fopen(MARKER, "w"); if (f) { fputs("ran", f); fclose(f); }
}
int bevir_core0_stage0(void) { return 0; }
"""


def _seed_programs() -> dict:
    """Two compiled programs of small INT8 graphs (2 and 3 cores), their inputs and golden
    outputs, and a foreign library whose constructor writes a marker (once per process)."""
    if not _SEED_PROGRAMS:
        import subprocess
        from bevir.flows.target import compile_program
        from tests.shared import FREE_SYNC, GRAPHS        # splits pay: 2 and 3 cores
        root = Path(tempfile.mkdtemp(prefix="bevir-fuzz-programs-"))
        graph, inputs = GRAPHS["chain"](np.random.default_rng(0))
        other, _ = GRAPHS["chain"](np.random.default_rng(1))
        compile_program(graph, root / "a", hw=FREE_SYNC.with_cores(2))
        compile_program(other, root / "b", hw=FREE_SYNC.with_cores(3))
        marker = root / "foreign_ran"
        (root / "foreign.c").write_text(FOREIGN_C.replace("MARKER", json.dumps(str(marker))))
        subprocess.run(["cc", "-shared", "-fPIC", str(root / "foreign.c"), "-o",
                        str(root / "foreign.so")], check=True)
        _SEED_PROGRAMS.update(root=root, a=root / "a", b=root / "b", inputs=inputs,
                              golden=bevir.run(graph, inputs), marker=marker,
                              foreign=root / "foreign.so")
    return _SEED_PROGRAMS


def _run_program(folder: Path, seed: dict) -> None:
    """Load and run ``folder``: its outputs must be the golden ones (or the error a bevir
    one), and no foreign code may have run."""
    from bevir.codegen.cprogram import CompiledProgram
    try:
        program = CompiledProgram.load(folder)
        program.wait_seconds = 1.0
        out = program.run(seed["inputs"])
    finally:
        if seed["marker"].exists():
            raise AssertionError("a library compile did not write was loaded")
    want = seed["golden"]
    if set(out) != set(want) or any(out[k].tobytes() != want[k].tobytes() for k in want):
        raise AssertionError("exec gave a wrong result")


def target_manifest(rnd: random.Random) -> None:
    """A compiled program whose manifest.json has its bytes mutated or one structural
    change (cores, sizes, offsets, flags, steps, libraries...), loaded and run."""
    seed = _seed_programs()
    with tempfile.TemporaryDirectory() as d:
        folder = _copy(seed["a"], Path(d) / "p", link=("core0.so", "core1.so"))
        _mutated_json(folder / "manifest.json", rnd)
        _run_program(folder, seed)


def _swap(folder, a, b):
    (folder / a).rename(folder / "swap.tmp")
    (folder / b).rename(folder / a)
    (folder / "swap.tmp").rename(folder / b)


def target_program(rnd: random.Random) -> None:
    """A compiled program with a file damaged: libraries swapped, truncated, flipped,
    foreign, linked, missing; graph files or the manifest of another program (or, as a
    control, a C source exec does not read). Loaded and run: the golden outputs or a bevir
    error, and no foreign code run."""
    import os
    import shutil
    seed = _seed_programs()
    with tempfile.TemporaryDirectory() as d:
        folder = _copy(seed["a"], Path(d) / "p")
        lib = folder / f"core{rnd.randrange(2)}.so"
        kind = rnd.randrange(11)
        if kind == 10:                          # the control: a source exec does not read
            _mutated_file(rnd.choice(sorted(folder.glob("*.c")) + sorted(folder.glob("kernels/*"))),
                          rnd)
        elif kind == 0:
            _swap(folder, "core0.so", "core1.so")
        elif kind == 1:
            data = lib.read_bytes()
            lib.write_bytes(data[:rnd.randrange(len(data))])
        elif kind == 2:
            _mutated_file(lib, rnd)
        elif kind == 3:
            shutil.copy(seed["foreign"], lib)
        elif kind == 4:
            lib.unlink()
            os.symlink(seed["foreign"] if rnd.random() < 0.5 else seed["a"] / lib.name, lib)
        elif kind == 5:
            lib.unlink()
            if rnd.random() < 0.5:
                lib.mkdir()
        elif kind == 6:
            name = rnd.choice(["manifest.json", "graph.bevir", "graph.safetensors",
                               "graph.meta.json", "core0.so"])
            if (seed["b"] / name).exists():
                shutil.copy(seed["b"] / name, folder / name)
        elif kind == 7:
            victim = folder / rnd.choice(["graph.bevir", "graph.safetensors", "graph.meta.json"])
            if victim.exists():
                _mutated_file(victim, rnd)
        elif kind == 8:
            victim = folder / rnd.choice(["graph.bevir", "graph.safetensors", "manifest.json"])
            victim.unlink()
        else:
            _swap(folder, "graph.bevir", "manifest.json")
        _run_program(folder, seed)


TARGETS = {"onnx": target_onnx, "text": target_text, "load": target_load,
           "config": target_config, "ranges": target_ranges, "tranges": target_tranges,
           "torch": target_torch, "hw": target_hw, "frames": target_frames,
           "manifest": target_manifest, "program": target_program}
#: targets whose cases load native code: each runs in a child process, so that a native
#: crash is counted (not fatal to the run), and a hang is ended by killing the child
ISOLATED = {"manifest", "program"}


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


def _isolated_case(target, case_seed: int, seeds: dict, conn) -> None:
    """In a child: one case of ``target``, its outcome sent back on ``conn``."""
    _SEED_PROGRAMS.update(seeds)
    conn.send(run_case(target, random.Random(case_seed)))


_CHILDREN = None


def run_isolated(name: str, rnd: random.Random) -> tuple[str, str]:
    """One case in a child process (started from a clean server): a child killed by a
    signal is a 'crash', one still running after the case time a 'hang'."""
    import multiprocessing
    global _CHILDREN
    if _CHILDREN is None:
        _CHILDREN = multiprocessing.get_context("forkserver")
        _CHILDREN.set_forkserver_preload(["numpy", "bevir", "bevir.codegen.cprogram"])
    receive, send = _CHILDREN.Pipe(duplex=False)
    child = _CHILDREN.Process(target=_isolated_case,
                              args=(TARGETS[name], rnd.randrange(1 << 62), _seed_programs(), send))
    child.start()
    send.close()
    try:
        outcome = receive.recv() if receive.poll(CASE_SECONDS + 5) else None
    except EOFError:                        # the child died before it answered
        outcome = None
    child.join(5)
    if child.exitcode is None:
        child.kill()
        child.join()
        return outcome or ("hang", "")
    if outcome is None:
        return "crash", f"exit code {child.exitcode}"
    return outcome


def fuzz(name: str, cases: int, seed: int = 0) -> dict:
    rnd = random.Random(seed)
    kinds, errors, others = Counter(), set(), []
    for _ in range(cases):
        kind, msg = run_isolated(name, rnd) if name in ISOLATED else run_case(TARGETS[name], rnd)
        kinds[kind] += 1
        if kind == "bevir":
            errors.add(msg)
        elif kind in ("other", "crash"):
            others.append(f"{kind}: {msg}")
    return {"cases": cases, "loaded": kinds["ok"], "distinct_errors": len(errors),
            "non_bevir": kinds["other"], "hangs": kinds["hang"], "crashes": kinds["crash"],
            "examples": others[:5]}


def main(argv: list[str]) -> int:
    """``fuzz.py [CASES] [TARGET ...]``"""
    cases = int(argv[1]) if len(argv) > 1 else 10_000
    bad = 0
    for name in argv[2:] or TARGETS:
        r = fuzz(name, cases)
        print(f"{name}: {r['cases']} cases, {r['loaded']} loaded and verified, "
              f"{r['distinct_errors']} distinct error messages, {r['non_bevir']} non-bevir "
              f"exceptions, {r['hangs']} hangs, {r['crashes']} native crashes", flush=True)
        for ex in r["examples"]:
            print(f"    {ex}")
        bad += r["non_bevir"] + r["hangs"] + r["crashes"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
