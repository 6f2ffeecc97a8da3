"""What :class:`~bevir.codegen.cprogram.CompiledProgram` checks in a compiled folder before
it runs anything (``bevir exec``): a compiled folder is code, and this is how far exec
trusts it.

- ``manifest.json`` must be a ``bevir-program`` document whose fields have the types,
  counts and ranges the run relies on: ``cores`` a count and one program, one OCM size and
  one library per core; every buffer an argument names inside its arena; one entry per
  device stage (:func:`check_manifest`). Fields it does not know are left alone.
- Each ``core<k>.so`` must be a regular file (no symbolic link) whose sha256 is the one
  the manifest records at compile time; it is read once, checked, and loaded from a private
  copy, so what runs is what was checked (:func:`open_libraries`). Each library holds the
  sha256 of the manifest it was built with (:func:`manifest_digest`): a manifest edited
  after compile does not match, and its libraries are not loaded.
- ``graph.bevir`` must have the sha256 the manifest records, and its buffers the sizes
  and offsets the plan gave them (:func:`check_layout`).

What this cannot tell: a folder written by someone who rebuilt the libraries and rewrote
the manifest to match. Loading a library runs its code; run only folders you compiled or
trust as you would trust any program.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import CodegenError
from ..ir.graph import Graph
from ..ir.serialize import check_document

FORMAT, VERSION = "bevir-program", 2
#: the fields a library's digest of its manifest leaves out (they name the libraries)
UNSIGNED = ("libraries",)
#: the symbol in every core's library holding :func:`manifest_digest` (64 hex digits)
DIGEST_SYMBOL = "bevir_manifest_sha256"
_HEX64 = re.compile(r"[0-9a-f]{64}")


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """sha256 of the manifest (canonical JSON) without the fields naming the libraries."""
    signed = {k: v for k, v in manifest.items() if k not in UNSIGNED}
    return hashlib.sha256(json.dumps(signed, sort_keys=True, separators=(",", ":"))
                          .encode()).hexdigest()


def digest_source(manifest: Mapping[str, Any]) -> str:
    """The C source that puts :func:`manifest_digest` into each core's library."""
    return f'const char {DIGEST_SYMBOL}[65] = "{manifest_digest(manifest)}";\n'


class _Checker:
    """Type and range checks of one manifest, each failure a one-line CodegenError."""

    def __init__(self, where: str):
        self.where = where

    def fail(self, message: str) -> CodegenError:
        return CodegenError(f"{self.where}: {message} (a damaged or edited manifest; "
                            "compile the program again)")

    def field(self, doc: Mapping, key: str, kind: type | tuple[type, ...], what: str = "") -> Any:
        if not isinstance(doc, Mapping) or key not in doc:
            raise self.fail(f"{what or 'the manifest'} has no '{key}'")
        v = doc[key]
        if not isinstance(v, kind) or (isinstance(v, bool) and kind is not bool):
            name = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            raise self.fail(f"'{key}' of {what or 'the manifest'} is {type(v).__name__}, "
                            f"not {name}")
        return v

    def count(self, doc: Mapping, key: str, what: str = "", low: int = 0) -> int:
        v = self.field(doc, key, int, what)
        if v < low:
            raise self.fail(f"'{key}' of {what or 'the manifest'} is {v}, below {low}")
        return v

    def items(self, doc: Mapping, key: str, kind: type, n: int | None, what: str = "") -> list:
        v = self.field(doc, key, list, what)
        if n is not None and len(v) != n:
            raise self.fail(f"'{key}' of {what or 'the manifest'} has {len(v)} entries, "
                            f"not one per core ({n})")
        for i, x in enumerate(v):
            if not isinstance(x, kind) or isinstance(x, bool):
                raise self.fail(f"'{key}'[{i}] of {what or 'the manifest'} is "
                                f"{type(x).__name__}, not {kind.__name__}")
        return v

    def offsets(self, doc: Mapping, key: str) -> dict[str, int]:
        table = self.field(doc, key, dict)
        for name, off in table.items():
            if not isinstance(off, int) or isinstance(off, bool) or off < 0:
                raise self.fail(f"'{key}' gives value '{name}' the offset {off!r}")
        return table


def check_manifest(doc: Any, out: Path) -> dict[str, Any]:
    """``doc`` (manifest.json of folder ``out``) if it has what a run relies on; else a
    one-line CodegenError saying what is wrong."""
    where = out / "manifest.json"
    check_document(doc, where, FORMAT, VERSION, CodegenError)
    c = _Checker(str(where))
    cores = c.count(doc, "cores", low=1)
    ddr_bytes = c.count(doc, "ddr_bytes")
    ocm_bytes = c.items(doc, "ocm_bytes", int, cores)
    if any(b < 0 for b in ocm_bytes):
        raise c.fail(f"'ocm_bytes' holds a negative size: {ocm_bytes}")
    c.offsets(doc, "ddr")
    flags = c.offsets(doc, "flags")
    if sorted(flags.values()) != list(range(len(flags))):
        raise c.fail("'flags' are not numbered 0, 1, ... once each")
    for i, e in enumerate(c.items(doc, "ocm", dict, None)):
        what = f"ocm[{i}]"
        c.field(e, "value", str, what)
        if c.count(e, "core", what) >= cores:
            raise c.fail(f"{what} names core {e['core']} of {cores}")
        c.count(e, "offset", what)
    device = sum(bool(c.field(s, "device", bool, f"stages[{i}]"))
                 for i, s in enumerate(c.items(doc, "stages", dict, None)))
    c.field(doc, "kernels", dict)
    for k, p in enumerate(c.items(doc, "programs", dict, cores)):
        _check_program(c, p, k, device, ddr_bytes, ocm_bytes[k])
    for k, lib in enumerate(c.items(doc, "libraries", dict, cores)):
        what = f"libraries[{k}]"
        if c.field(lib, "file", str, what) != f"core{k}.so":
            raise c.fail(f"{what} is '{lib['file']}', not 'core{k}.so'")
        if not _HEX64.fullmatch(c.field(lib, "sha256", str, what)):
            raise c.fail(f"{what} has no sha256 (64 hex digits)")
    files = c.field(doc, "files", dict)
    if not _HEX64.fullmatch(str(files.get("graph.bevir"))):
        raise c.fail("'files' has no sha256 of graph.bevir")
    return doc


def _check_program(c: _Checker, p: Mapping, k: int, device: int, ddr_bytes: int,
                   ocm_bytes: int) -> None:
    what = f"programs[{k}]"
    if c.count(p, "core", what) != k:
        raise c.fail(f"{what} is the program of core {p['core']}")
    entries = c.items(p, "entries", str, None, what)
    if len(entries) != device:
        raise c.fail(f"{what} has {len(entries)} entries, not one per device stage ({device})")
    arena = {"ddr": ddr_bytes, "ocm": ocm_bytes}
    for i, s in enumerate(c.items(p, "steps", dict, None, what)):
        step = f"{what}.steps[{i}]"
        for key in ("node", "op"):
            c.field(s, key, str, step)
        for j, a in enumerate(c.field(s, "args", list, step)):
            arg = f"{step}.args[{j}]"
            mem = c.field(a, "mem", str, arg)
            if mem not in arena:
                raise c.fail(f"{arg} is in memory '{mem}', not ddr or ocm")
            end = c.count(a, "offset", arg) + c.count(a, "bytes", arg)
            if end > arena[mem]:
                raise c.fail(f"{arg} (value '{a.get('value')}') ends at byte {end}, beyond "
                             f"the {mem} arena of core {k} ({arena[mem]} bytes)")


def check_layout(manifest: Mapping[str, Any], graph: Graph, out: Path) -> None:
    """The manifest's buffers against the graph: each value it places exists and fits its
    arena at its offset; OCM offsets are the memory plan's (``value.meta["ocm"]``)."""
    c = _Checker(str(out / "manifest.json"))
    values = {v.name: v for v in graph.values()}

    def value(name: str, where: str):
        if name not in values:
            raise c.fail(f"{where} names value '{name}', which graph.bevir lacks")
        return values[name]
    for name, off in manifest["ddr"].items():
        if off + value(name, "'ddr'").type.nbytes > manifest["ddr_bytes"]:
            raise c.fail(f"value '{name}' at DDR offset {off} ends beyond the DDR arena "
                         f"({manifest['ddr_bytes']} bytes)")
    for name in manifest["flags"]:
        value(name, "'flags'")
    for e in manifest["ocm"]:
        v, core, off = value(e["value"], "'ocm'"), e["core"], e["offset"]
        if off + v.type.nbytes > manifest["ocm_bytes"][core]:
            raise c.fail(f"value '{v.name}' at OCM offset {off} ends beyond core {core}'s "
                         f"arena ({manifest['ocm_bytes'][core]} bytes)")
        planned = {p.get("core"): p.get("offset") for p in v.meta.get("ocm") or []}
        if planned and planned.get(core) != off:
            raise c.fail(f"value '{v.name}' is at OCM offset {off} of core {core}; the "
                         f"memory plan put it at {planned.get(core)}")


def read_checked(path: Path, sha256: str) -> bytes:
    """The bytes of ``path``, a regular file (not a symbolic link) whose sha256 the
    manifest records; else a one-line CodegenError."""
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            raise CodegenError(f"{path} is a symbolic link; exec loads only the files "
                               "compile wrote")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise CodegenError(f"{path} is not a regular file")
            data = f.read()
    except OSError as e:
        raise CodegenError(f"cannot read {path}: {e.strerror or e}") from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise CodegenError(f"{path} is not the file compile wrote (its sha256 differs from "
                           "the one manifest.json records: replaced, swapped or damaged); "
                           "compile the program again")
    return data


def open_libraries(out: Path, manifest: Mapping[str, Any]) -> list[ctypes.CDLL]:
    """The cores' libraries, each checked (:func:`read_checked`) and loaded from a private
    copy of the checked bytes; each must hold the digest of this manifest."""
    want = manifest_digest(manifest)
    libs = []
    with tempfile.TemporaryDirectory(prefix="bevir-exec-") as private:
        for lib in manifest["libraries"]:
            path = out / lib["file"]
            copy = Path(private) / lib["file"]
            data = read_checked(path, lib["sha256"])
            if want.encode() not in data:           # not built with this manifest: not loaded
                raise _edited(out, path)
            copy.write_bytes(data)
            try:
                dll = ctypes.CDLL(str(copy))
                held = (ctypes.c_char * 65).in_dll(dll, DIGEST_SYMBOL).value.decode()
            except (OSError, ValueError) as e:
                raise CodegenError(f"cannot load {path}: {e}") from None
            if held != want:
                raise _edited(out, path)
            libs.append(dll)
    return libs


def _edited(out: Path, library: Path) -> CodegenError:
    return CodegenError(f"{out / 'manifest.json'} is not the manifest {library} was built "
                        "with (edited after compile?); compile the program again")
