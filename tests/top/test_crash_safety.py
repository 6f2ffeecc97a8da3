"""What bevir leaves on disk when it is killed: a writer is killed (SIGKILL) before each of
its visible writes in turn (a file renamed into place, removed, a folder swapped in, lines
appended), and after each kill the reader finds the old state, the new state, or refuses
with one line; never a mix of the two, a wrong result or a hang."""
from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import bevir
from bevir import fsutil
from bevir.ir.serialize import graph_digest, meta_document
from bevir.passes import make_pass

from tests.shared import GRAPHS

#: children start from a clean, single-threaded process that has imported bevir once
_CTX = multiprocessing.get_context("forkserver")
_CTX.set_forkserver_preload(["numpy", "bevir", "bevir.codegen.cprogram"])


def _visible(path, root: Path) -> bool:
    """Whether a write to ``path`` changes what readers of ``root`` see (a path under it,
    not inside a temporary name)."""
    path = Path(os.fsdecode(path))
    return path.is_relative_to(root) and not any(
        p.startswith(".") and p.endswith(fsutil.TMP_SUFFIX) for p in path.parts)


def _killed_at(point: int, root: Path, fn: Callable, args: tuple) -> None:
    """In the child: ``fn(*args)``, killed just before its ``point``-th visible write
    under ``root``."""
    count = 0

    def counted(f, *paths):
        def write(*a, **k):
            nonlocal count
            if any(_visible(a[i], root) for i in paths if i < len(a)):
                count += 1
                if count == point:
                    os.kill(os.getpid(), signal.SIGKILL)
            return f(*a, **k)
        return write
    os.replace, os.rename = counted(os.replace, 1), counted(os.rename, 0, 1)
    os.unlink, os.truncate = counted(os.unlink, 0), counted(os.truncate, 0)
    fsutil.append_lines = counted(fsutil.append_lines, 0)
    fsutil._exchange = counted(fsutil._exchange, 0)
    fn(*args)


def kill_trials(root: Path, fn: Callable, *args, limit: int = 400) -> Iterator[int]:
    """Run ``fn(*args)`` in a child killed before its 1st, 2nd, ... visible write under
    ``root``; yield after each (the caller checks the state on disk) until a child
    finishes unkilled."""
    for point in range(1, limit):
        child = _CTX.Process(target=_killed_at, args=(point, root, fn, args))
        child.start()
        child.join(120)
        assert child.exitcode is not None, f"the writer hung (killed at write {point})"
        assert child.exitcode in (0, -signal.SIGKILL), f"the writer failed: {child.exitcode}"
        yield point
        if child.exitcode == 0:
            return
    raise AssertionError(f"the writer made more than {limit} writes")


def one_line(e: BaseException) -> str:
    assert isinstance(e, bevir.BevirError) and "\n" not in str(e), repr(e)
    return str(e)


# ---- saved graphs ------------------------------------------------------------------------
def _graphs():
    """Two graphs with the same constant names and shapes but other ops and meta: a's text
    with b's constants (or meta) would load, and compute something else."""
    a, _ = GRAPHS["chain"](np.random.default_rng(1))
    bevir.optimize(a, [make_pass("partition", cores=2)])
    b, _ = GRAPHS["chain"](np.random.default_rng(2))
    text = bevir.print_graph(b, constants="inline").replace(
        'out_frac_bits = 3} : tensor<12x16xi8, fixed<frac_bits=3>> loc("c/residual")',
        'out_frac_bits = 2} : tensor<12x16xi8, fixed<frac_bits=2>> loc("c/residual")')
    b = bevir.parse(text)
    b.meta["test.note"] = "b"
    return a, b


def _state(graph) -> tuple:
    doc, arrays = meta_document(graph)
    return (graph_digest(graph), repr(doc),
            tuple(sorted((k, v.tobytes()) for k, v in arrays.items())))


def _save(graph, path) -> None:
    bevir.save(graph, path)


def test_a_save_killed_at_any_write_leaves_the_old_graph_the_new_one_or_one_line(tmp_path):
    a, b = _graphs()
    path = tmp_path / "m.bevir"
    states = {_state(a): "old", _state(b): "new"}
    seen = []
    bevir.save(a, path)
    for _ in kill_trials(tmp_path, _save, b, path):
        try:
            seen.append(states[_state(bevir.load(path))])
        except bevir.BevirError as e:
            seen.append(one_line(e))
        bevir.save(a, path)                 # the next trial starts from the old graph again
    assert seen[0] == "old" and seen[-1] == "new" and len(seen) >= 4, seen
    assert all(s in ("old", "new") or "is not the file" in s for s in seen), seen


# ---- compiled programs -------------------------------------------------------------------
HW = "QC-U 8MB 16MAC x2"


def _compile(graph_path: Path, out: Path, cache: Path) -> None:
    os.environ["BEVIR_CACHE"] = str(cache)
    from bevir.flows.target import compile_program
    compile_program(bevir.load(graph_path), out, hw=HW)


def _exec(prog: Path, inputs: Path, result: Path) -> None:
    """In a child: the program's outputs to ``result``, or its error to ``result.err``."""
    from safetensors.numpy import load_file, save_file
    from bevir.codegen.cprogram import CompiledProgram
    try:
        save_file(CompiledProgram.load(prog).run(load_file(str(inputs))), str(result))
    except bevir.BevirError as e:
        result.with_suffix(".err").write_text(str(e))


def exec_outcome(prog: Path, inputs: Path, goldens: dict[str, dict]) -> str:
    """What exec of ``prog`` gives, in a child: the name of the golden outputs it matches,
    or its one-line error; a crash, a hang or other outputs fail the test."""
    from safetensors.numpy import load_file
    result = prog.parent / "result.safetensors"
    for p in (result, result.with_suffix(".err")):
        p.unlink(missing_ok=True)
    child = _CTX.Process(target=_exec, args=(prog, inputs, result))
    child.start()
    child.join(60)
    assert child.exitcode == 0, f"exec crashed or hung: exit code {child.exitcode}"
    if result.with_suffix(".err").exists():
        message = result.with_suffix(".err").read_text()
        assert "\n" not in message
        return message
    got = load_file(str(result))
    for name, golden in goldens.items():
        if set(got) == set(golden) and all(np.array_equal(got[k], golden[k]) for k in got):
            return name
    raise AssertionError("exec gave outputs of neither program")


def _small(frac: int):
    """A graph of a few kernels (quick to build): a residual add and a relu."""
    from tests.shared import fx, ints
    b = bevir.Builder("small")
    x = b.input("x", fx((16, 32), 5))
    w = b.const(ints(np.random.default_rng(0), (32,)), "w", fx((32,), 3))
    b.output("y", b.fx_relu(b.fx_add(x, w, out_frac_bits=frac, loc="s/add"), loc="s/relu"))
    return b.graph


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Graphs a and b saved with inputs and golden outputs, and a cache holding the
    kernels of both (but not their plans and programs)."""
    from safetensors.numpy import save_file
    d = tmp_path_factory.mktemp("built")
    inputs = {"x": np.random.default_rng(3).integers(-128, 128, (16, 32)).astype(np.int8)}
    save_file(inputs, str(d / "in.safetensors"))
    goldens = {}
    for name, frac, state in (("a", 4, "old"), ("b", 2, "new")):
        bevir.save(_small(frac), d / f"{name}.bevir")
        goldens[state] = bevir.run(_small(frac), inputs)
        _compile(d / f"{name}.bevir", d / f"prog_{name}", d / "kernels")
    for made in ("plans", "programs"):
        shutil.rmtree(d / "kernels" / made)
    return d, goldens


@pytest.fixture
def programs(tmp_path, built):
    """In ``tmp_path``: a.bevir, b.bevir, in.safetensors, a's program in ``prog`` (built
    with its own cache, cache_a); the golden outputs of a ("old") and b ("new")."""
    d, goldens = built
    for f in ("a.bevir", "a.safetensors", "b.bevir", "b.safetensors", "in.safetensors"):
        shutil.copy(d / f, tmp_path / f)
    shutil.copytree(d / "kernels", tmp_path / "cache_a")
    _compile(tmp_path / "a.bevir", tmp_path / "prog", tmp_path / "cache_a")
    return tmp_path / "prog", goldens


def _compile_trials(tmp_path: Path, prog: Path, cache: Path, goldens: dict,
                    restore: Callable[[], None]) -> list[str]:
    """What exec of ``prog`` gives after each kill of b's compile (``restore`` runs
    before each trial); a's program is put back after a trial that swapped b's in."""
    seen = []
    restore()
    for _ in kill_trials(tmp_path, _compile, tmp_path / "b.bevir", prog, cache):
        seen.append(exec_outcome(prog, tmp_path / "in.safetensors", goldens))
        if seen[-1] == "new":
            _compile(tmp_path / "a.bevir", prog, tmp_path / "cache_a")
        restore()
    assert seen[0] == "old" and seen[-1] == "new", seen
    assert set(seen) <= {"old", "new"}, seen       # the folder is swapped whole: never none
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    return seen


def test_a_compile_killed_between_any_two_writes_leaves_the_old_program_or_the_new(
        tmp_path, programs, built):
    """From the same start each time (b's kernels built, its plan and program not), b's
    compile over a's program is killed before each of its writes in turn: the plan and the
    program published in the cache, the folder swapped in."""
    prog, goldens = programs
    cache = tmp_path / "cache"

    def restore():
        shutil.rmtree(cache, ignore_errors=True)
        shutil.copytree(built[0] / "kernels", cache)
    assert len(_compile_trials(tmp_path, prog, cache, goldens, restore)) >= 4


def test_compiles_killed_in_turn_with_a_cold_cache_finish_from_what_they_left(
        tmp_path, programs):
    """b's compile with a cold cache, killed before its 1st write, then again before its
    2nd, ... (each run goes on from the cache entries the ones before left: kernel
    sources, objects, plan, program); every kill leaves a's program or b's, and the last
    run's program is b's."""
    prog, goldens = programs
    seen = _compile_trials(tmp_path, prog, tmp_path / "cache", goldens, lambda: None)
    assert len(seen) >= 5


# ---- concurrent writers --------------------------------------------------------------------
def together(*calls: tuple) -> None:
    """Run each (fn, *args) in its own child at the same time; each must finish."""
    children = [_CTX.Process(target=fn, args=args) for fn, *args in calls]
    for c in children:
        c.start()
    for c in children:
        c.join(300)
        assert c.exitcode == 0, f"a writer failed or hung: exit code {c.exitcode}"


def test_two_compiles_into_one_cache_and_one_folder(tmp_path, programs):
    """The same graph twice, then two graphs, compiled at the same time into one folder
    with one cold cache: both finish, and the folder holds one whole program."""
    prog, goldens = programs
    cache, b = tmp_path / "cache", tmp_path / "b.bevir"
    together((_compile, b, prog, cache), (_compile, b, prog, cache))
    assert exec_outcome(prog, tmp_path / "in.safetensors", goldens) == "new"
    shutil.rmtree(cache)
    together((_compile, tmp_path / "a.bevir", prog, cache), (_compile, b, prog, cache))
    assert exec_outcome(prog, tmp_path / "in.safetensors", goldens) in ("old", "new")
    for g in ("a", "b"):                    # the cache serves each graph's program whole
        _compile(tmp_path / f"{g}.bevir", tmp_path / f"prog_{g}", cache)
        assert exec_outcome(tmp_path / f"prog_{g}", tmp_path / "in.safetensors",
                            goldens) == {"a": "old", "b": "new"}[g]
    assert not [p.name for p in tmp_path.rglob(".*")]       # no temporary left anywhere


def _compile_with(cc: Path, *args) -> None:
    os.environ["CC"] = str(cc)
    _compile(*args)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"   # not a zombie


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_c_compiler_dies_with_bevir(tmp_path, programs):
    """A compile killed while its C compiler runs: the compiler is killed too, instead of
    going on writing."""
    import time
    started = tmp_path / "cc.pid"
    cc = tmp_path / "slow-cc"
    cc.write_text(f"#!/bin/sh\necho $$ >> {started}\nexec sleep 60\n")
    cc.chmod(0o755)
    child = _CTX.Process(target=_compile_with, args=(cc, tmp_path / "b.bevir",
                                                     tmp_path / "prog", tmp_path / "cache"))
    child.start()
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = [int(p) for p in started.read_text().split()]
    assert pids and all(_alive(p) for p in pids)
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = [p for p in pids if _alive(p)]
    for p in survivors:                     # not left behind when the test fails
        os.kill(p, signal.SIGKILL)
    assert not survivors, "the C compiler outlived bevir"


# ---- evaluations -----------------------------------------------------------------------------
@pytest.fixture
def evaluation(tmp_path):
    """Graphs a (reference) and b (candidate) saved, 10 frames, and the rows of an
    evaluation that was not interrupted."""
    from bevir.scale import FrameWriter, evaluate
    a, b = _graphs()
    for name, g in (("a", a), ("b", b)):
        bevir.save(g, tmp_path / f"{name}.bevir")
    rng = np.random.default_rng(5)
    with FrameWriter(tmp_path / "frames", frames_per_shard=4) as w:
        for _ in range(10):
            w.add({"x": rng.integers(-128, 128, (1, 12, 8, 4)).astype(np.int8)})
    whole = evaluate(a, b, tmp_path / "frames", tmp_path / "whole", plot=False)
    return tmp_path, whole.rows


def _evaluate(folder: Path, out: Path, messages: Path | None = None) -> None:
    """Evaluate b against a over the frames into ``out`` (in a child: a BevirError is
    written to ``messages``)."""
    from bevir.scale import evaluate
    try:
        evaluate(bevir.load(folder / "a.bevir"), bevir.load(folder / "b.bevir"),
                 folder / "frames", out, plot=False)
    except bevir.BevirError as e:
        if messages is None:
            raise
        with open(messages, "a") as f:
            f.write(str(e) + "\n")


def test_an_evaluation_killed_at_any_write_resumes_to_the_same_rows(evaluation):
    """Killed before each of its writes in turn (run.json, each chunk's rows, the summary),
    then resumed: the same rows as a run that was never stopped."""
    from bevir.scale import evaluate
    folder, rows = evaluation
    out = folder / "e"
    resumed = []
    for _ in kill_trials(folder, _evaluate, folder, out):
        ev = evaluate(bevir.load(folder / "a.bevir"), bevir.load(folder / "b.bevir"),
                      folder / "frames", out, plot=False)
        resumed.append(len((out / "frames.jsonl").read_text().splitlines()))
        assert ev.rows == rows
        shutil.rmtree(out)
    assert len(resumed) >= 4 and all(n == 10 for n in resumed), resumed


def test_two_evaluations_into_one_folder(evaluation):
    """Two evaluations at once into one folder: one runs, the other is refused in one line
    (or runs after it, resuming every row); the rows are whole, once each, and the same as
    an uninterrupted run's."""
    from bevir.scale import evaluate
    folder, rows = evaluation
    out, messages = folder / "e", folder / "messages"
    together((_evaluate, folder, out, messages), (_evaluate, folder, out, messages))
    refused = messages.read_text().splitlines() if messages.exists() else []
    assert len(refused) <= 1 and all("is in use by another process" in m for m in refused)
    lines = (out / "frames.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["frame"] for line in lines) == list(range(10))
    again = evaluate(bevir.load(folder / "a.bevir"), bevir.load(folder / "b.bevir"),
                     folder / "frames", out, plot=False)
    assert again.rows == rows


# ---- the other writers: ranges, frame sets, configs ------------------------------------------
def _ranges(scale: float):
    from bevir.passes.calibrate import Ranges, TensorRange
    entry = TensorRange.given("x", -scale, scale, channel_min=np.full(3, -scale),
                              channel_max=np.full(3, scale), axis=1)
    return Ranges([entry, TensorRange.given("y", 0.0, 2 * scale)])


def _save_ranges(scale: float, path: Path) -> None:
    _ranges(scale).save(path)


def _load_ranges(path: Path):
    from bevir.passes.calibrate import Ranges
    r = Ranges.load(path)
    return [(e.name, e.lo, e.hi, None if e.channel_min is None else e.channel_min.tobytes())
            for e in r]


def _save_config(exclude: bool, path: Path) -> None:
    import examples.bevformer.quant  # noqa: F401  (registers the reference-flow preset)
    from bevir.passes.quant_config import QuantConfig
    QuantConfig.preset("reference-flow").override("other", exclude=exclude).save(path)


def _load_config(path: Path):
    from bevir.passes.quant_config import QuantConfig
    return QuantConfig.load(path).group("other").exclude


def _write_frames(value: float | None, path: Path) -> None:
    """A frame set of 5 frames in 3 shards (None: none; a frame set is written into a
    folder without one)."""
    from bevir.scale import FrameWriter
    shutil.rmtree(path, ignore_errors=True)
    if value is not None:
        with FrameWriter(path, frames_per_shard=2) as w:
            for i in range(5):
                w.add({"x": np.full(3, value + i, np.float32)})


def _read_frames(path: Path):
    from bevir.scale import Frames
    return [f["x"].tobytes() for f in Frames(path)]


@pytest.mark.parametrize("write, read, old, new, name", [
    (_save_ranges, _load_ranges, 1.0, 2.0, "r.json"),
    (_save_config, _load_config, False, True, "q.json"),
    (_write_frames, _read_frames, None, 10.0, "frames"),
])
def test_other_writers_killed_at_any_write_leave_old_new_or_one_line(tmp_path, write, read,
                                                                     old, new, name):
    """Ranges (arrays, then the JSON naming their sha256), a config, a frame set (shards,
    then the index): killed before each write, read back as before, as after, or refused
    in one line (a frame set half written: "not a frame set")."""
    path = tmp_path / name
    write(new, path)
    states = {repr(read(path)): "new"}
    write(old, path)                                   # the trials start from the old
    if old is not None:
        states[repr(read(path))] = "old"
    seen = []
    for _ in kill_trials(tmp_path, write, new, path):
        try:
            seen.append(states[repr(read(path))])
        except bevir.BevirError as e:
            seen.append(one_line(e))
        write(old, path)
    assert len(seen) >= 2 and seen[-1] == "new", seen
    assert "old" in seen or old is None, seen


# ---- writes that fail (an exception, not a kill) -------------------------------------------
def test_a_save_whose_nth_rename_fails_leaves_old_new_or_one_line_and_no_temporaries(
        tmp_path, monkeypatch):
    """os.replace raising at each of a save's renames in turn (a full disk, a permission):
    the error reaches the caller, the graph loads as before, after or not at all (one
    line), and no temporary file is left beside it."""
    a, b = _graphs()
    path = tmp_path / "m.bevir"
    states = {_state(a): "old", _state(b): "new"}
    replace, seen = os.replace, []
    for n in range(1, 10):
        bevir.save(a, path)
        calls = 0

        def failing(src, dst):
            nonlocal calls
            calls += 1
            if calls == n:
                raise OSError(28, "No space left on device", str(dst))
            return replace(src, dst)
        monkeypatch.setattr(os, "replace", failing)
        try:
            bevir.save(b, path)
            failed = False
        except OSError:
            failed = True
        monkeypatch.setattr(os, "replace", replace)
        try:
            seen.append(states[_state(bevir.load(path))])
        except bevir.BevirError as e:
            seen.append(one_line(e))
        assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
        if not failed:
            break
    assert seen[0] == "old" and seen[-1] == "new" and len(seen) >= 3, seen
