"""Stored digests of the BEVFormer e2e (``test`` config) outputs, and how to regenerate them.

    python -m tests.e2e_digests [--check]      # from the repository root

Runs ``examples/bevformer/e2e.py`` exactly as ``tests/e2e/test_bevformer_e2e.py`` does (the
seed-0 synthetic weights as a .pth checkpoint) and writes ``tests/data/e2e_digests.json``:
per output file, the sha256 of each array's dtype, shape and bytes, with the commit and the
library versions they were made from, under the platform they were made on. Float results
depend on the SIMD kernels numpy, OpenBLAS and torch pick for the processor (e.g. numpy's
float32 transcendentals differ between its AVX512_SKX and AVX512_SPR targets), so the
digests are kept per :func:`platform_key`; a platform without stored digests is reported
(the test skips, naming the key and this command). A refactor that must not change numerics (moving op
definitions, renaming) keeps these identical; regenerate only for an intended numerics
change, and say so in the commit. ``--check`` compares instead of writing.
"""
from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DIGESTS = ROOT / "tests" / "data" / "e2e_digests.json"
#: the e2e output files the digests cover
OUTPUT_FILES = ("golden_outputs.safetensors", "int8_outputs.safetensors")


def digest(a: np.ndarray) -> str:
    """sha256 over dtype (with byte order), shape and the C-order bytes of ``a``."""
    a = np.ascontiguousarray(a)
    h = hashlib.sha256(f"{a.dtype.str}{tuple(a.shape)}".encode())
    h.update(a.tobytes())
    return h.hexdigest()


def output_digests(out: Path) -> dict[str, dict[str, str]]:
    """{file: {array: digest}} for the e2e output files in directory ``out``."""
    from safetensors.numpy import load_file
    return {f: {k: digest(v) for k, v in sorted(load_file(str(out / f)).items())}
            for f in OUTPUT_FILES}


def e2e_argv(out: Path) -> list[str]:
    """Writes the seed-0 checkpoint into ``out`` and returns the e2e CLI arguments the test uses."""
    from examples.bevformer.config import CONFIGS
    from examples.bevformer.weights import make_checkpoint, save_checkpoint
    pth = out / "weights.pth"
    save_checkpoint(pth, make_checkpoint(CONFIGS["test"], seed=0))
    return ["--config", "test", "--checkpoint", str(pth), "--out", str(out)]


def platform_key() -> str:
    """The kernels that decide float rounding here: numpy's best dispatch target, the
    OpenBLAS core and torch's CPU capability, e.g. 'numpy AVX512_SPR, openblas SkylakeX,
    torch AVX512'."""
    import ctypes
    import torch
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    targets = [t for t in __cpu_dispatch__ if __cpu_features__.get(t)]
    libs = sorted((Path(np.__file__).parent.parent / "numpy.libs").glob("libscipy_openblas*"))
    core = "?"
    for lib in libs:
        fn = getattr(ctypes.CDLL(str(lib)), "scipy_openblas_get_corename64_", None)
        if fn is not None:
            fn.restype = ctypes.c_char_p
            core = fn().decode()
    amx = "amx_tile" in Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else False
    return (f"numpy {targets[-1] if targets else 'baseline'}, openblas {core}, "
            f"torch {torch.backends.cpu.get_cpu_capability()}{' amx' if amx else ''}")


def _all_stored() -> dict:
    return json.loads(DIGESTS.read_text())["platforms"]


def stored() -> dict[str, dict[str, str]] | None:
    """The digests stored for this platform, or None."""
    entry = _all_stored().get(platform_key())
    return None if entry is None else entry["outputs"]


def _provenance() -> dict[str, str]:
    import onnxruntime
    import torch
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(git + ["status", "--porcelain", "bevir", "examples"],
                           capture_output=True, text=True).stdout.strip()
    return {"commit": commit + ("+uncommitted changes in bevir/ or examples/" if dirty else ""),
            "python": platform.python_version(), "numpy": np.__version__,
            "torch": torch.__version__, "onnxruntime": onnxruntime.__version__,
            "machine": platform.machine()}


def main(argv: list[str] | None = None) -> int:
    from examples.bevformer import e2e
    check = "--check" in (argv if argv is not None else sys.argv[1:])
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        if e2e.main(e2e_argv(out)) != 0:
            return 2
        got = output_digests(out)
    if check:
        same = got == stored()
        print("e2e outputs match the stored digests" if same else
              f"e2e outputs differ from the stored digests:\n{json.dumps(got, indent=1)}")
        return 0 if same else 1
    platforms = _all_stored() if DIGESTS.exists() else {}
    platforms[platform_key()] = {"made_from": _provenance(), "outputs": got}
    DIGESTS.parent.mkdir(parents=True, exist_ok=True)
    DIGESTS.write_text(json.dumps({"platforms": platforms}, indent=1) + "\n")
    print(f"wrote {DIGESTS} for {platform_key()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
