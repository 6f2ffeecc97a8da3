"""Native kernels of the golden model: loops that numpy can only run as many passes over
memory (a depthwise convolution is a multiply and an add per tap, each a pass), written in C
(``kernels.c``), built once per machine by the system C compiler and cached beside the
codegen's kernels.

A native kernel performs the IEEE operations of the numpy code it stands in for, in the same
order, built without FMA contraction or fast math: the bits are the same (tests/test_native.py
holds both paths to that). Where no C compiler works, or with ``BEVIR_NATIVE=0``, the numpy
code runs.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import subprocess
import warnings
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).with_name("kernels.c")

#: -march=native: the build is this machine's (its key names the processor); no FMA
#: contraction and no fast math keep every multiply and add rounded as numpy rounds them
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared"]


def cache_dir() -> Path:
    """Where built kernels are kept (these and the codegen's): $BEVIR_CACHE, else
    ~/.cache/bevir/kernels."""
    root = os.environ.get("BEVIR_CACHE") or Path.home() / ".cache" / "bevir"
    path = Path(root) / "kernels"
    path.mkdir(parents=True, exist_ok=True)
    return path


def enabled() -> bool:
    """Native kernels run unless ``BEVIR_NATIVE=0`` (read at each call) or the build failed."""
    return os.environ.get("BEVIR_NATIVE", "1") != "0" and library() is not None


def _processor() -> str:
    """What -march=native builds for: the processor's model and feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    keys = ("model name", "flags", "Features", "CPU part")
    seen = {ln.split(":")[0].strip(): ln for ln in lines if ln.split(":")[0].strip() in keys}
    return platform.machine() + platform.processor() + "".join(sorted(seen.values()))


@functools.cache
def library() -> ctypes.CDLL | None:
    """The built kernels (built on first use), or None, with one warning, where the build
    fails."""
    cc = os.environ.get("CC", "cc")
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join([cc, *FLAGS]).encode()
                         + _processor().encode()).hexdigest()[:20]
    lib = cache_dir() / f"golden_native_{key}.so"
    if not lib.exists():
        tmp = lib.with_suffix(f".{os.getpid()}.tmp")
        try:
            done = subprocess.run([cc, *FLAGS, str(SOURCE), "-o", str(tmp)],
                                  capture_output=True, text=True)
        except OSError as e:
            done = subprocess.CompletedProcess([], 1, "", str(e))
        if done.returncode != 0:
            warnings.warn(f"the golden model's native kernels did not build ({cc}: "
                          f"{(done.stderr.strip().splitlines() or ['failed'])[-1]}); "
                          "running numpy code instead", RuntimeWarning, stacklevel=2)
            return None
        tmp.replace(lib)
    return ctypes.CDLL(str(lib))


#: the C type of each kernel's arrays, by numpy dtype
_SUFFIX = {np.dtype(t): name for t, name in [
    (np.float32, "f32"), (np.float64, "f64"), (np.int8, "i8"), (np.uint8, "u8"),
    (np.int16, "i16"), (np.int32, "i32")]}


def _window_kernel(name: str, arrays: list[np.ndarray], out: np.ndarray, kernel, strides,
                   dilations, dtypes=tuple(_SUFFIX)) -> bool:
    """Run ``bevir_<name>_<type>`` on the C-contiguous ``arrays`` (padded NHWC input first)
    and ``out`` [N, OH, OW, C], over ``kernel`` windows: False, running nothing, where no
    native kernel takes ``out``'s dtype or the kernels are off."""
    xp = arrays[0]
    if (out.dtype not in dtypes or xp.dtype != out.dtype or not out.flags.c_contiguous
            or not enabled()):
        return False
    fn = getattr(library(), f"bevir_{name}_{_SUFFIX[out.dtype]}")
    arrays = [np.ascontiguousarray(a, out.dtype) for a in arrays]
    n, hp, wp, c = xp.shape
    dims = (ctypes.c_long * 12)(n, hp, wp, c, *out.shape[1:3], *kernel, *strides, *dilations)
    fn(*(ctypes.c_void_p(a.ctypes.data) for a in (*arrays, out)), dims)
    return True


def depthwise(xp: np.ndarray, wt: np.ndarray, out: np.ndarray, kernel, strides,
              dilations) -> bool:
    """``out`` [N, OH, OW, C] = the depthwise convolution of padded NHWC ``xp`` with the
    tap-major weights ``wt`` [KH*KW, C], summed tap by tap (linalg.depthwise_conv_nhwc).
    Returns False, writing nothing, where no native kernel takes these dtypes."""
    return _window_kernel("depthwise", [xp, wt], out, kernel, strides, dilations,
                          dtypes=(np.dtype(np.float32), np.dtype(np.float64)))


def maxpool(xp: np.ndarray, out: np.ndarray, kernel, strides, dilations) -> bool:
    """``out`` [N, OH, OW, C] = the window maxima of NHWC ``xp`` (padded with its dtype's
    lowest value), tap by tap as numpy's maximum takes them (nn.MaxPool2d). Returns False,
    writing nothing, where no native kernel takes the dtype."""
    return _window_kernel("maxpool", [xp], out, kernel, strides, dilations)
