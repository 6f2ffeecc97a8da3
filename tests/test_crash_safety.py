"""What bevir leaves on disk when it is killed: a writer is killed (SIGKILL) before each of
its visible writes in turn (a file renamed into place, removed, a folder swapped in, lines
appended), and after each kill the reader finds the old state, the new state, or refuses
with one line; never a mix of the two, a wrong result or a hang."""
from __future__ import annotations

import multiprocessing
import os
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_partition import GRAPHS  # noqa: E402

#: children start from a clean, single-threaded process that has imported bevir once
_CTX = multiprocessing.get_context("forkserver")
_CTX.set_forkserver_preload(["numpy", "bevir", "bevir.codegen.cprogram"])


def _visible(path) -> bool:
    """Whether a write to ``path`` changes what readers see (not inside a temporary name)."""
    return not any(p.startswith(".") and p.endswith(fsutil.TMP_SUFFIX)
                   for p in Path(os.fsdecode(path)).parts)


def _killed_at(point: int, fn: Callable, args: tuple) -> None:
    """In the child: ``fn(*args)``, killed just before its ``point``-th visible write."""
    count = 0

    def counted(f, *paths):
        def write(*a, **k):
            nonlocal count
            if any(_visible(a[i]) for i in paths if i < len(a)):
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


def kill_trials(fn: Callable, *args, limit: int = 400) -> Iterator[int]:
    """Run ``fn(*args)`` in a child killed before its 1st, 2nd, ... visible write; yield
    after each (the caller checks the state on disk) until a child finishes unkilled."""
    for point in range(1, limit):
        child = _CTX.Process(target=_killed_at, args=(point, fn, args))
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
    return graph_digest(graph), repr(doc), tuple(sorted((k, v.tobytes()) for k, v in arrays.items()))


def _save(graph, path) -> None:
    bevir.save(graph, path)


def test_a_save_killed_at_any_write_leaves_the_old_graph_the_new_one_or_one_line(tmp_path):
    a, b = _graphs()
    path = tmp_path / "m.bevir"
    states = {_state(a): "old", _state(b): "new"}
    seen = []
    bevir.save(a, path)
    for _ in kill_trials(_save, b, path):
        try:
            seen.append(states[_state(bevir.load(path))])
        except bevir.BevirError as e:
            seen.append(one_line(e))
        bevir.save(a, path)                 # the next trial starts from the old graph again
    assert seen[0] == "old" and seen[-1] == "new" and len(seen) >= 4, seen
    assert all(s in ("old", "new") or "is not the file" in s for s in seen), seen
