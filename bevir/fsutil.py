"""Files as bevir writes and reads them: whole or not at all.

Every file bevir writes goes to a temporary name in its folder, is flushed to disk and
renamed over its target (:func:`write_atomic`, :func:`atomic_path`), so a reader, or a
run killed at any point, sees the old file or the new one, never a part of one. A folder
(a compiled program) is built beside its target and swapped in (:func:`building_folder`).
JSON is read with one-line errors (:func:`read_json`); child processes die with bevir
(:func:`run_child`).
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .errors import BevirError

#: how a temporary name ends; :func:`remove_stale` finds leftovers of killed writers by it
TMP_SUFFIX = ".tmp"


def temporary_name(path: Path) -> Path:
    """A fresh name beside ``path`` (same folder, so a rename is atomic) naming this process."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{TMP_SUFFIX}")


def fsync_path(path: Path) -> None:
    """Flush a written file (or a folder's entries) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):   # a file system that cannot
            raise
    finally:
        os.close(fd)


def commit(tmp: Path, path: Path) -> None:
    """Flush the finished file ``tmp`` and rename it over ``path``."""
    fsync_path(tmp)
    os.replace(tmp, path)
    fsync_path(path.parent)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path to write ``path``'s new content to (for writers that take a path):
    renamed over ``path`` when the block ends without error, removed otherwise."""
    path = Path(path)
    if not path.parent.is_dir():            # say so with the name given, not the temporary
        raise FileNotFoundError(errno.ENOENT, "No such directory", str(path.parent))
    tmp = temporary_name(path)
    try:
        yield tmp
        commit(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: str | os.PathLike, data: bytes | str) -> Path:
    """Write ``data`` (text is UTF-8) to ``path`` whole or not at all; returns ``path``."""
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def write_json(path: str | os.PathLike, doc: Any) -> Path:
    """``doc`` as indented JSON (one trailing newline), written whole or not at all."""
    return write_atomic(path, json.dumps(doc, indent=1) + "\n")


def append_lines(path: str | os.PathLike, lines: list[str]) -> None:
    """Append whole lines to ``path`` in one write, then flush them to disk. A run killed
    during the write leaves at most a last line without its newline, which
    :func:`read_lines` drops."""
    if not lines:
        return
    data = "".join(line + "\n" for line in lines).encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def read_lines(path: str | os.PathLike) -> list[str]:
    """The whole lines of ``path`` (none if it is missing). A last line without its newline
    (a writer killed mid-line) is cut off the file, so the next append starts a line."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    whole = data[:data.rfind(b"\n") + 1]
    if len(whole) != len(data):
        os.truncate(path, len(whole))
    return whole.decode(errors="replace").splitlines()


def sha256_file(path: str | os.PathLike) -> str:
    """The sha256 (hex) of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def loads_json(text: str | bytes, where: str, error: type[BevirError]) -> Any:
    """Parse JSON ``text`` (read from ``where``), any failure ``error`` in one line."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{where}: not JSON: {e}") from None
    except UnicodeDecodeError as e:
        raise error(f"{where}: not UTF-8 text: {e}") from None
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply") from None


def read_json(path: str | os.PathLike, error: type[BevirError], kind: type | None = dict) -> Any:
    """The JSON document in file ``path``; ``error`` (one line) when it cannot be read, is
    not JSON, or (``kind``) is not of that type."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise error(f"cannot read {path}: {e.strerror or e}") from None
    doc = loads_json(data, str(path), error)
    if kind is not None and not isinstance(doc, kind):
        what = {dict: "object", list: "array"}.get(kind, kind.__name__)
        raise error(f"{path}: expected a JSON {what}, got {type(doc).__name__}")
    return doc


# ---- folders ----------------------------------------------------------------------------
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(path: Path) -> None:
    """Remove what writers of ``path`` killed before they finished left beside it."""
    for p in path.parent.glob(f".{path.name}.*{TMP_SUFFIX}"):
        pid = p.name[len(path.name) + 2:].split(".")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where the
    system cannot."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def swap_in(built: Path, target: Path, replace: bool = True) -> None:
    """Put folder ``built`` in ``target``'s place: a reader sees the old folder or the new
    one (where the system cannot exchange two names in one step, for a moment neither).
    Without ``replace``, a ``target`` that exists stays and ``built`` is removed."""
    try:
        built.rename(target)                    # no target yet (or an empty folder)
        fsync_path(target.parent)
        return
    except OSError as e:
        if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
    if not replace:
        shutil.rmtree(built, ignore_errors=True)
        return
    if not _exchange(built, target):
        old = temporary_name(target)
        target.rename(old)
        built.rename(target)
        built = old
    fsync_path(target.parent)
    shutil.rmtree(built, ignore_errors=True)    # the old folder, now under the built name


@contextlib.contextmanager
def building_folder(target: str | os.PathLike, replace: bool = True) -> Iterator[Path]:
    """An empty folder beside ``target`` to build its new content in: swapped in for
    ``target`` (:func:`swap_in`; ``replace``: as there) when the block ends without error,
    removed otherwise."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(target)
    tmp = temporary_name(target)
    tmp.mkdir()
    try:
        yield tmp
        for p in tmp.rglob("*"):
            if p.is_file() and not p.is_symlink():
                fsync_path(p)
        swap_in(tmp, target, replace)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def locked(path: str | os.PathLike, what: str, error: type[BevirError]) -> Iterator[None]:
    """Hold an exclusive lock on file ``path`` for the block; ``error`` at once (one line)
    when another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise error(f"{what} is in use by another process ({path} is locked)") from None
        yield
    finally:
        os.close(fd)


# ---- child processes --------------------------------------------------------------------
_PR_SET_PDEATHSIG = 1
_prctl = getattr(ctypes.CDLL(None), "prctl", None) if sys.platform == "linux" else None


def _die_with_parent() -> None:          # runs in the child between fork and exec
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def run_child(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, **kwargs)`` whose child is killed when the thread that started
    it ends (on Linux): a compiler does not go on writing after bevir was killed."""
    if _prctl is not None:
        kwargs.setdefault("preexec_fn", _die_with_parent)
    return subprocess.run(cmd, **kwargs)


# ---- writers of other libraries' formats --------------------------------------------------
def save_arrays(arrays: Mapping[str, Any], path: str | os.PathLike,
                metadata: Mapping[str, str] | None = None) -> str:
    """Write numpy ``arrays`` as a safetensors file, whole or not at all, its mode following
    the umask as other files' do (safetensors' own ``save_file`` makes it readable by its
    owner only); returns the file's sha256."""
    from safetensors.numpy import save
    data = save({k: np.ascontiguousarray(v) for k, v in arrays.items()},
                metadata=dict(metadata) if metadata else None)
    write_atomic(path, data)
    return hashlib.sha256(data).hexdigest()


def save_figure(fig: Any, path: str | os.PathLike, **kwargs: Any) -> Path:
    """A matplotlib figure saved to ``path`` (format by its suffix), whole or not at all."""
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=path.suffix[1:] or "png", **kwargs)
    return path
