"""Fuzz the importers and loaders: every failure must be a bevir.BevirError.

Targets (each takes one random byte string and derives its case from it):

* ``onnx``: a small valid ONNX model, serialized, then bytes flipped / truncated / spliced;
* ``text``: a printed IR text with characters mutated, deleted or duplicated;
* ``load``: a saved graph whose constants file is corrupted or truncated.

A graph that loads must also verify (no silently wrong graph). Each case runs under a
time bound (a case over it counts as a hang). ``python tools/fuzz.py [CASES]`` runs
CASES (default 10,000) per target and prints, per target: cases, distinct error messages,
non-bevir exceptions and hangs; it exits non-zero when any of the last two is not zero.
"""
from __future__ import annotations

import random
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


def target_onnx(rnd: random.Random) -> None:
    g = bevir.from_onnx(mutate(seed_model(), rnd))
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


TARGETS = {"onnx": target_onnx, "text": target_text, "load": target_load}


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
    except bevir.BevirError as e:
        return "bevir", f"{type(e).__name__}: {str(e)[:80]}"
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
    cases = int(argv[1]) if len(argv) > 1 else 10_000
    bad = 0
    for name in TARGETS:
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
