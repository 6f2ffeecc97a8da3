"""Building kernels with TVM: the llvm target (the host build, called through TVM's
runtime) and the C target (sources that the system C compiler builds into libraries
needing only libc), with a disk cache keyed by the kernel's TIR."""
from __future__ import annotations

import hashlib
import math
import os
import re
from pathlib import Path

import numpy as np

from ..errors import CodegenError
from ..extras import require
from ..fsutil import atomic_path, run_child, write_atomic
from ..ops.common import ArrayCache
from .lower import KernelDef, tvm_modules
from .machine import cache_dir, host_target  # noqa: F401  (re-exported)
from .micro import SOURCES as MICRO_SOURCES, objects as micro_objects


#: the code that turns TIR into a build (this file, the schedules, the micro-kernels): part
#: of every cache key
_HERE = Path(__file__).parent
_BUILDER = hashlib.sha256(b"".join(
    p.read_bytes() for p in [_HERE / "build.py", _HERE / "schedule.py",
                             *sorted((_HERE / "micro").glob("*.py")), *MICRO_SOURCES]
)).hexdigest()


def tir_hash(kd: KernelDef, target: str) -> str:
    """A digest of the kernel's TIR, its constants, the target and the build code: equal,
    one build."""
    h = hashlib.sha256(f"{_BUILDER}{target}\n{kd.func.script()}".encode())
    for c in kd.constants:
        h.update(f"{c.dtype}{c.shape}".encode() + c.tobytes())
    return h.hexdigest()[:20]


class HostKernel:
    """A kernel of the host build, callable on numpy arrays."""

    def __init__(self, kd: KernelDef, fn):
        tvm, _, _ = tvm_modules()
        self.kd, self.fn = kd, fn
        self._view, self._tensor = tvm.runtime.from_dlpack, tvm.runtime.tensor
        self._consts = [self._tensor(c) for c in kd.constants]

    def __call__(self, operands: list[np.ndarray], result_types) -> list[np.ndarray]:
        from .lower import dtype_name
        # the kernel reads and writes numpy's memory in place (DLPack views, no copies),
        # aligned as TVM's buffers assume
        outs = [aligned_empty(t.shape, dtype_name(t)) for t in result_types]
        args = [self._operand(a) for a in operands] + self._consts
        self.fn(*args, *(self._view(o) for o in outs))
        return outs

    def _operand(self, a: np.ndarray):
        if a.flags.writeable:
            return self._view(aligned(a))
        # DLPack cannot carry a read-only array (a graph constant): a TVM copy, made once
        # while the array lives
        hit = _CONSTANT_TENSORS.get(a)
        return hit if hit is not None else _CONSTANT_TENSORS.put(a, self._tensor(a))


#: TVM copies of read-only operands
_CONSTANT_TENSORS = ArrayCache()


#: the data alignment TVM's buffers assume (runtime::kAllocAlignment)
ALIGNMENT = 64


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts at an ALIGNMENT boundary."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(n + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start:start + n].view(dtype).reshape(shape)


def aligned(a: np.ndarray) -> np.ndarray:
    """``a`` itself when C-contiguous and aligned, else an aligned copy."""
    if a.flags.c_contiguous and a.ctypes.data % ALIGNMENT == 0:
        return a
    out = aligned_empty(a.shape, a.dtype)
    out[...] = a
    return out


def build_host(kds: list[KernelDef], micro: bool = False) -> dict[str, HostKernel]:
    """The kernels built together for the llvm target, as one library cached on disk by
    the hash of every kernel's TIR and constants (a rebuild of an unchanged graph loads
    it), linked with the micro-kernels where ``micro``. By kernel name."""
    tvm, _, _ = tvm_modules()
    kds = sorted({kd.name: kd for kd in kds}.values(), key=lambda kd: kd.name)
    target = host_target()
    key = hashlib.sha256("".join(tir_hash(kd, str(target)) for kd in kds).encode()
                         + bytes([micro])).hexdigest()[:20]
    lib = cache_dir() / f"host_{key}.so"
    if not lib.exists():
        from .schedule import apply
        mod = tvm.IRModule({kd.name: apply(kd.func, kd.name) for kd in kds})
        with atomic_path(lib) as tmp:
            try:
                ex = tvm.compile(mod, target=target)
                ex.export_library(str(tmp.with_suffix(".so")),
                                  addons=micro_objects() if micro else None)
                tmp.with_suffix(".so").rename(tmp)
            except Exception as e:
                tmp.with_suffix(".so").unlink(missing_ok=True)
                raise CodegenError(f"llvm build failed: {type(e).__name__}: {e}") from e
    module = tvm.runtime.load_module(str(lib))
    return {kd.name: HostKernel(kd, module[kd.name]) for kd in kds}


# ---- the C target ------------------------------------------------------------------------
#: what TVM's C output calls back into; a generated program provides it itself, so the
#: libraries need only libc (parallel loops are not scheduled for the C target)
RUNTIME_C = r"""
#include <stdint.h>
#include <stdlib.h>
void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t n) {
  (void)kind; (void)parts; (void)n;
}
void* TVMBackendAllocWorkspace(int dev_type, int dev_id, uint64_t nbytes, int code, int bits) {
  (void)dev_type; (void)dev_id; (void)code; (void)bits;
  return malloc(nbytes ? nbytes : 1);
}
int TVMBackendFreeWorkspace(int dev_type, int dev_id, void* ptr) {
  (void)dev_type; (void)dev_id; free(ptr); return 0;
}
"""

_DL_CODE = {"i": "kDLInt", "u": "kDLUInt", "f": "kDLFloat", "b": "kDLBool"}


_C_TYPE = {"int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t", "int32": "int32_t",
           "int64": "int64_t", "float32": "float", "float64": "double", "bool": "uint8_t"}


def _c_array(name: str, a: np.ndarray) -> str:
    """A constant as a static C array (floats by their exact bits, so they load unchanged)."""
    flat = a.reshape(-1)
    if a.dtype.kind == "f":
        bits = flat.view(np.uint32 if a.dtype.itemsize == 4 else np.uint64)
        ctype = "uint32_t" if a.dtype.itemsize == 4 else "uint64_t"
        values = ",".join(f"{int(b)}u" for b in bits)
    else:
        ctype = _C_TYPE[a.dtype.name]
        values = ",".join(str(int(v)) for v in flat)
    return (f"static const {ctype} {name}[{max(flat.size, 1)}] __attribute__((aligned(64))) = "
            f"{{{values or 0}}};")


_SCRIPT_FLOAT = re.compile(r"T\.float(32|64)\(([^)]*)\)")
_C_FLOAT = re.compile(r"(?<![\w.])(-?\d\.\d{6}e[+-]\d{2,3})(f?)(?![\w.])")


def exact_float_literals(c_source: str, script: str) -> str:
    """TVM's C target prints float constants with 7 significant digits (2**31 becomes
    2.147484e+09): put back the exact values, as C99 hexadecimal literals, taken from the
    kernel's TIR. Raises CodegenError where two constants print alike."""
    exact: dict[tuple[str, str], float] = {}
    for bits, text in _SCRIPT_FLOAT.findall(script):
        v = float(text)
        if not math.isfinite(v):
            continue
        v = float(np.float32(v)) if bits == "32" else v
        key = (f"{v:e}", "f" if bits == "32" else "")
        if exact.setdefault(key, v) != v:
            raise CodegenError(f"float constants {exact[key]!r} and {v!r} print alike in C")

    def put_back(m: re.Match) -> str:
        v = exact.get((m.group(1), m.group(2)))
        return m.group(0) if v is None else f"({v.hex()}{m.group(2)})"
    return _C_FLOAT.sub(put_back, c_source)


def c_kernel_source(kd: KernelDef, io_types: list[tuple[tuple[int, ...], str]]) -> str:
    """TVM's C source of the kernel, its constants as static arrays, and the entry
    ``int bevir_<name>(void** data)`` a program calls with one data pointer per operand and
    result; it lays out on the stack the DLTensors the packed function checks."""
    tvm, _, _ = tvm_modules()
    # no argument checks: the entry below builds the DLTensors from the kernel's own
    # signature, so they could not fail; without them the C compiler has half the code
    config = {"tirx.disable_vectorize": True, "tirx.disable_assert": True}
    with tvm.transform.PassContext(config=config):
        ex = tvm.compile(tvm.IRModule({kd.name: kd.func}), target="c")
    src = exact_float_literals(ex.mod.inspect_source(), kd.func.script())
    # several kernels per library and per translation unit: TVM's module-level symbols
    # private and named after the kernel
    src = src.replace("void* __tvm_ffi__library_ctx = NULL;",
                      f"static void* __tvm_ffi__library_ctx_{kd.name} = NULL;")
    src = src.replace("TVM_DLL int32_t __tvm_ffi_main(",
                      f"static int32_t __tvm_ffi_main_{kd.name}(")
    n_in = kd.operands
    args = io_types[:n_in] + [(c.shape, c.dtype.name) for c in kd.constants] + io_types[n_in:]
    data = [f"data[{k}]" for k in range(n_in)] + \
           [f"(void*){kd.name}_c{k}" for k in range(len(kd.constants))] + \
           [f"data[{n_in + k}]" for k in range(len(io_types) - n_in)]
    lines = [src, ""] + [_c_array(f"{kd.name}_c{k}", c) for k, c in enumerate(kd.constants)]
    lines += [f"int bevir_{kd.name}(void** data) {{", f"  DLTensor t[{len(args)}];",
              f"  TVMFFIAny a[{len(args)}];"]
    for k, ((shape, dtype), ptr) in enumerate(zip(args, data)):
        dt = np.dtype(dtype)
        dims = ", ".join(str(d) for d in shape) or "1"
        lines += [f"  static int64_t s{k}[] = {{{dims}}};",
                  f"  t[{k}] = (DLTensor){{{ptr}, {{kDLCPU, 0}}, {len(shape)}, "
                  f"{{{_DL_CODE[dt.kind]}, {dt.itemsize * 8}, 1}}, s{k}, NULL, 0}};",
                  f"  a[{k}].type_index = kTVMFFIDLTensorPtr; a[{k}].zero_padding = 0; "
                  f"a[{k}].v_ptr = &t[{k}];"]
    lines += [f"  return __tvm_ffi_{kd.name}(NULL, a, {len(args)}, NULL);", "}", ""]
    return "\n".join(lines)


def include_dirs() -> list[str]:
    """The headers TVM's C output includes (shipped in the wheels)."""
    tvm, tvm_ffi = require("tvm"), require("tvm_ffi")
    return [str(Path(tvm.__file__).parent / "include"),
            str(Path(tvm_ffi.__file__).parent / "include")]


#: C compiler flags: no FMA contraction (a float multiply-add rounds twice, as the golden
#: model does), no fast math
CFLAGS = ["-O2", "-std=gnu11", "-fPIC", "-ffp-contract=off", "-fno-fast-math", "-w"]


def build_shared(sources: list[Path], out: Path) -> Path:
    """Compile C ``sources`` into the shared library ``out`` with the system C compiler."""
    cc = os.environ.get("CC", "cc")
    cmd = [cc, *CFLAGS, "-shared", *(f"-I{d}" for d in include_dirs()),
           *map(str, sources), "-o", str(out)]
    done = run_child(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode
        raise CodegenError(f"C build failed ({' '.join(cmd[:2])} ...): {last}")
    return out


class CKernel:
    """A kernel built for the C target into its own shared library, called on numpy
    arrays through its ``bevir_<name>`` entry (cached on disk by TIR hash)."""

    def __init__(self, kd: KernelDef, operand_types, result_types):
        import ctypes
        from .lower import dtype_name
        self.kd = kd
        self.result_types = result_types
        args = [(t.shape, dtype_name(t)) for t in list(operand_types) + list(result_types)]
        key = tir_hash(kd, "c")
        lib = cache_dir() / f"{kd.name}_{key}.so"
        if not lib.exists():
            src = write_atomic(cache_dir() / f"{kd.name}_{key}.c",
                               c_kernel_source(kd, args) + RUNTIME_C)
            with atomic_path(lib) as tmp:
                build_shared([src], tmp)
        self._lib = ctypes.CDLL(str(lib))
        self._fn = getattr(self._lib, f"bevir_{kd.name}")
        self._fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]

    def __call__(self, operands: list[np.ndarray], result_types=None) -> list[np.ndarray]:
        import ctypes
        from .lower import dtype_name
        outs = [np.empty(t.shape, dtype_name(t)) for t in (result_types or self.result_types)]
        arrays = [np.require(a, requirements="C") for a in operands] + outs
        ptrs = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
        if self._fn(ptrs) != 0:
            raise CodegenError(f"kernel {self.kd.name} failed", op=self.kd.op)
        return outs
