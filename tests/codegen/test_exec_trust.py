"""`bevir exec` trusts nothing in a compiled folder: an edited or malformed manifest, a
library swapped, truncated, foreign or linked in by a symbolic link is refused in one line
before any library is loaded (a foreign library's constructor never runs) and no output is
written; a core that fails or never arrives ends the run with an error naming it, within
the wait limit; compile replaces a folder whole, and only a compiled program's."""
from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import bevir
from bevir.cli import main
from bevir.codegen.build import RUNTIME_C, build_shared
from bevir.codegen.cprogram import RUNTIME_SYNC, CompiledProgram
from bevir.codegen.verify import check_manifest
from bevir.errors import CodegenError
from bevir.flows.target import compile_program

from tests.shared import FREE_SYNC, GRAPHS

#: splits pay on this machine: the chain graph compiles to a 2-core program
HW = FREE_SYNC.with_cores(2)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """A 2-core program of the chain graph, its graph, inputs and golden outputs."""
    d = tmp_path_factory.mktemp("compiled")
    graph, inputs = GRAPHS["chain"](np.random.default_rng(7))
    compile_program(graph, d / "prog", hw=HW)
    save_file(inputs, str(d / "in.safetensors"))
    return d, graph, inputs, bevir.run(graph, inputs)


@pytest.fixture
def folder(compiled, tmp_path):
    """A copy of the compiled program to damage."""
    shutil.copytree(compiled[0] / "prog", tmp_path / "prog")
    return tmp_path / "prog"


def exec_one_line(folder: Path, compiled, capsys) -> str:
    """``bevir exec --check -o`` on ``folder``: it must fail with one line and write nothing."""
    out = folder.parent / "out.safetensors"
    code = main(["exec", str(folder), "--inputs", str(compiled[0] / "in.safetensors"),
                 "-o", str(out), "--check"])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("bevir: error: ") and err.count("\n") == 1, err
    assert "internal error" not in err and not out.exists()
    return err


def edit_manifest(folder: Path, change) -> None:
    m = json.loads((folder / "manifest.json").read_text())
    change(m)
    (folder / "manifest.json").write_text(json.dumps(m))


def test_the_intact_program_runs_bit_exact(folder, compiled, capsys):
    out = folder.parent / "out.safetensors"
    assert main(["exec", str(folder), "--inputs", str(compiled[0] / "in.safetensors"),
                 "-o", str(out), "--check"]) == 0
    got = load_file(str(out))
    assert all(np.array_equal(got[k], compiled[3][k]) for k in compiled[3])


EDITS = {
    "cores 0": (lambda m: m.update(cores=0), "'cores' of the manifest is 0, below 1"),
    "cores -1": (lambda m: m.update(cores=-1), "'cores' of the manifest is -1, below 1"),
    "cores 1 of 2": (lambda m: m.update(cores=1), "has 2 entries, not one per core \\(1\\)"),
    "cores a string": (lambda m: m.update(cores="2"), "'cores' of the manifest is str, not int"),
    "cores true": (lambda m: m.update(cores=True), "'cores' of the manifest is bool"),
    "OCM of 1 byte": (lambda m: m.update(ocm_bytes=[1, 1]), "beyond the ocm arena of core 0"),
    "DDR of 0 bytes": (lambda m: m.update(ddr_bytes=0), "beyond the ddr arena of core 0"),
    "flags emptied": (lambda m: m.update(flags={}), "is not the manifest .*core0.so was built"),
    "a key added": (lambda m: m.update(note="hi"), "is not the manifest .*core0.so was built with"),
    "no programs": (lambda m: m.pop("programs"), "the manifest has no 'programs'"),
    "no libraries": (lambda m: m.pop("libraries"), "the manifest has no 'libraries'"),
    "a library renamed": (lambda m: m["libraries"][1].update(file="core0.so"),
                          "libraries\\[1\\] is 'core0.so', not 'core1.so'"),
    "a step out of its arena": (lambda m: m["programs"][1]["steps"][0]["args"][0].update(
        offset=1 << 40), "ends at byte .* beyond the"),
    "graph.bevir of another sha256": (lambda m: m["files"].update({"graph.bevir": "0" * 64}),
                                      "is not the manifest .*was built with"),
    "another format": (lambda m: m.update(format="bevir-frames"), "not a bevir-program file"),
}


@pytest.mark.parametrize("edit", EDITS)
def test_an_edited_manifest_is_refused_in_one_line(folder, compiled, capsys, edit):
    change, message = EDITS[edit]
    edit_manifest(folder, change)
    assert re.search(message, exec_one_line(folder, compiled, capsys))


@pytest.mark.parametrize("text, message", [
    ('{"format": ', "manifest.json: not JSON: Expecting value"),
    ("[" * 100_000 + "]" * 100_000, "manifest.json: JSON nested too deeply"),
    ("[]", "not a bevir-program file"),
    ("\xff\xfe", "manifest.json: not"),
])
def test_a_malformed_manifest_is_refused_in_one_line(folder, compiled, capsys, text, message):
    (folder / "manifest.json").write_text(text, errors="surrogateescape")
    assert message in exec_one_line(folder, compiled, capsys)


def test_a_missing_manifest_is_one_line(folder, compiled, capsys):
    (folder / "manifest.json").unlink()
    assert "cannot read" in exec_one_line(folder, compiled, capsys)


FOREIGN = r"""
#include <stdio.h>
__attribute__((constructor)) static void hello(void) {
  FILE* f = fopen(MARKER, "w"); if (f) { fputs("ran", f); fclose(f); }
}
int bevir_core1_stage0(void) { return 0; }
"""


def _foreign(tmp_path: Path) -> tuple[Path, Path]:
    """A library whose constructor writes a marker file when it is loaded."""
    marker = tmp_path / "foreign_ran"
    src = tmp_path / "foreign.c"
    src.write_text(FOREIGN.replace("MARKER", json.dumps(str(marker))))
    lib = tmp_path / "foreign.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    return lib, marker


def _swap(folder: Path, tmp_path: Path) -> None:
    a, b = folder / "core0.so", folder / "core1.so"
    a.rename(tmp_path / "t.so")
    b.rename(a)
    (tmp_path / "t.so").rename(b)


def _truncate(folder: Path, tmp_path: Path) -> None:
    lib = folder / "core1.so"
    lib.write_bytes(lib.read_bytes()[:lib.stat().st_size // 2])


def _replace_foreign(folder: Path, tmp_path: Path) -> None:
    shutil.copy(_foreign(tmp_path)[0], folder / "core1.so")


def _link_foreign(folder: Path, tmp_path: Path) -> None:
    (folder / "core1.so").unlink()
    os.symlink(_foreign(tmp_path)[0], folder / "core1.so")


def _link_own(folder: Path, tmp_path: Path) -> None:
    """Even a link to the right bytes: exec loads only files compile wrote."""
    shutil.move(folder / "core1.so", tmp_path / "elsewhere.so")
    os.symlink(tmp_path / "elsewhere.so", folder / "core1.so")


def _remove(folder: Path, tmp_path: Path) -> None:
    (folder / "core1.so").unlink()


def _directory(folder: Path, tmp_path: Path) -> None:
    (folder / "core1.so").unlink()
    (folder / "core1.so").mkdir()


@pytest.mark.parametrize("damage, message", [
    (_swap, "core0.so is not the file compile wrote"),
    (_truncate, "core1.so is not the file compile wrote"),
    (_replace_foreign, "core1.so is not the file compile wrote"),
    (_link_foreign, "core1.so is a symbolic link"),
    (_link_own, "core1.so is a symbolic link"),
    (_remove, "cannot read .*core1.so: No such file"),
    (_directory, "core1.so is not a regular file|cannot read"),
])
def test_a_library_compile_did_not_write_is_never_loaded(folder, compiled, capsys, tmp_path,
                                                         damage, message):
    damage(folder, tmp_path)
    err = exec_one_line(folder, compiled, capsys)
    assert re.search(message, err), err
    assert not (tmp_path / "foreign_ran").exists()          # its constructor never ran


def test_the_foreign_library_does_run_its_constructor_when_loaded(tmp_path):
    """The control: the marker appears when the library is loaded as it is."""
    lib, marker = _foreign(tmp_path)
    ctypes.CDLL(str(lib))
    assert marker.exists()


def test_the_schema_check_leaves_fields_it_does_not_know_alone(compiled):
    manifest = json.loads((compiled[0] / "prog" / "manifest.json").read_text())
    manifest["counters"] = {"steps": [1, 2, 3]}
    manifest["programs"][0]["note"] = "later work"
    assert check_manifest(manifest, compiled[0] / "prog") is manifest


# ---- failures while running ----------------------------------------------------------------
def _core1_stand_in(tmp_path: Path, program: CompiledProgram, code: int) -> ctypes.CDLL:
    """A library standing in for core 1: the runtime, and entries that return ``code`` at
    once (0: as if done, having stored nothing and reached no barrier)."""
    entries = "".join(f"int bevir_core1_stage{s}(void* a, void* b, void* c, long d, void* e) "
                      f"{{ return {code}; }}\n"
                      for s in range(len(program.manifest["programs"][1]["entries"])))
    src = tmp_path / "stand_in.c"
    src.write_text(RUNTIME_C + RUNTIME_SYNC + entries)
    return ctypes.CDLL(str(build_shared([src], tmp_path / "stand_in.so")))


def test_a_failing_core_ends_the_run_with_an_error_naming_it(compiled, tmp_path):
    program = CompiledProgram.load(compiled[0] / "prog")
    program.libs[1] = _core1_stand_in(tmp_path, program, 1)
    step = program.manifest["programs"][1]["steps"][0]
    t0 = time.perf_counter()
    with pytest.raises(CodegenError, match=f"core 1: kernel {step['kernel']} failed") as e:
        program.run(compiled[2])
    assert time.perf_counter() - t0 < 10 and "core 0" not in str(e.value)   # core 0 stopped
    assert_one_line(e.value)


def test_a_core_that_never_arrives_ends_the_run_after_the_wait_limit(compiled, tmp_path):
    program = CompiledProgram.load(compiled[0] / "prog")
    program.libs[1] = _core1_stand_in(tmp_path, program, 0)
    program.wait_seconds = 0.5
    t0 = time.perf_counter()
    with pytest.raises(CodegenError, match="core 0 waited 0.5 s (for value %\\S+ from core 1, "
                                           "which never stored it|at barrier 1 for core\\(s\\) "
                                           "\\[1\\], which never reached it)") as e:
        program.run(compiled[2])
    assert 0.5 <= time.perf_counter() - t0 < 10
    assert_one_line(e.value)


def test_an_exception_in_a_core_thread_is_collected_and_stops_the_others(compiled):
    program = CompiledProgram.load(compiled[0] / "prog")
    program.libs[1] = program.libs[0]           # core 0's library has no entry of core 1
    t0 = time.perf_counter()
    with pytest.raises(CodegenError, match="core 1: AttributeError: .*bevir_core1_stage0"):
        program.run(compiled[2])
    assert time.perf_counter() - t0 < 10
    # and the same program runs right afterwards
    program = CompiledProgram.load(compiled[0] / "prog")
    assert all(np.array_equal(a, compiled[3][k]) for k, a in program.run(compiled[2]).items())


def assert_one_line(e: BaseException) -> None:
    assert isinstance(e, bevir.BevirError) and "\n" not in str(e)


# ---- compiling over a folder ---------------------------------------------------------------
def test_compile_replaces_a_program_whole_and_refuses_other_folders(compiled, tmp_path):
    graph, inputs, golden = compiled[1:]
    prog = tmp_path / "prog"
    compile_program(graph, prog, hw=FREE_SYNC.with_cores(4))
    assert (prog / "core3.so").exists()
    program = compile_program(graph, prog, hw=HW)                  # over it, for 2 cores
    assert sorted(p.name for p in prog.glob("core*.so")) == ["core0.so", "core1.so"]
    assert all(np.array_equal(a, golden[k]) for k, a in program.run(inputs).items())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]   # nothing left beside
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(CodegenError, match="holds files that are not a compiled program's "
                                           "\\(notes.txt\\)"):
        compile_program(graph, mine, hw=HW)
    assert (mine / "notes.txt").read_text() == "keep me"
    with pytest.raises(CodegenError, match="not a folder"):
        compile_program(graph, mine / "notes.txt", hw=HW)
