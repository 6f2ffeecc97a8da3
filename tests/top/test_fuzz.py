"""A short run of every fuzz target of tools/fuzz.py (the long run is the script itself,
``python tools/fuzz.py 10000``): every failure is a bevir.BevirError, nothing hangs or
crashes, and what loads verifies (for from_torch: computes what the module computes; a
damaged compiled program runs bit-exact or not at all; a damaged frame set gives the
frames written or none)."""
import os
import signal

import pytest

from tools import fuzz

#: cases per target in the suite: a few seconds each
CASES = {"onnx": 400, "text": 400, "load": 300, "config": 300, "ranges": 200, "tranges": 300,
         "torch": 60, "hw": 300, "frames": 200, "manifest": 40, "program": 40}


def test_every_target_has_a_short_run():
    assert set(CASES) == set(fuzz.TARGETS)


@pytest.mark.parametrize("target", sorted(CASES))
def test_fuzz_target_raises_only_bevir_errors(target):
    r = fuzz.fuzz(target, CASES[target], seed=1)
    print(f"{target}: {r}")
    assert r["non_bevir"] == 0, r["examples"]
    assert r["hangs"] == 0 and r["crashes"] == 0, r["examples"]
    assert r["distinct_errors"] > 1 or target == "torch"      # the mutations reach the checks


def test_a_non_bevir_exception_is_counted(monkeypatch):
    """The harness itself: a target that raises something else is reported, not hidden."""
    def broken(rnd):
        raise KeyError("oops")
    monkeypatch.setitem(fuzz.TARGETS, "broken", broken)
    r = fuzz.fuzz("broken", 3)
    assert r["non_bevir"] == 3 and r["examples"][0] == "other: KeyError: 'oops'"


def crashing(rnd):
    """A case that dies as a native crash would."""
    os.kill(os.getpid(), signal.SIGSEGV)


def test_a_native_crash_in_an_isolated_case_is_counted(monkeypatch):
    """The harness itself: a case that kills its process is a crash, not the end of the run."""
    monkeypatch.setitem(fuzz.TARGETS, "crashing", crashing)
    monkeypatch.setattr(fuzz, "ISOLATED", fuzz.ISOLATED | {"crashing"})
    r = fuzz.fuzz("crashing", 2)
    assert r["crashes"] == 2 and r["examples"][0] == f"crash: exit code {-signal.SIGSEGV}"
