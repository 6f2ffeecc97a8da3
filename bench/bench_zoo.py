"""The golden model against onnxruntime on the model zoos (random weights, TorchScript
export at opset 17): seconds per run of each (best of --repeat after a warm-up), on the
imported graph and after the standard pipeline (canonicalize, fuse, to-nhwc), the
golden/onnxruntime ratio, the largest relative difference to onnxruntime, and the worst
and median ratio over the models.

    python bench/bench_zoo.py [--zoo torchvision|hub|all] [--size 160] [--repeat 3]
                              [--threads 1] [--models resnet18 timm/convnext_atto ...]
                              [--outputs DIR]

``--zoo``: bevir.testing.zoo's models at full size (torchvision's widths and depths,
1x3x224x224 by default), the timm CNNs of bevir.testing.hub_zoo (small configs,
1x3x64x64 by default), or both. ``--size``: the input's height and width for every model.
``--threads`` caps both sides alike (onnxruntime's intra-op threads, the BLAS threads of
numpy, the golden model's native kernels): on a small shared machine one thread each
gives the steadiest ratio; the machine's cores is what a user gets by default.
``--outputs DIR`` keeps the golden outputs (imported and pipelined graph) per model in DIR:
the first run writes them, later runs compare their bytes and print how many elements
differ, so a speed-up can show that it changed no bit.

Goal (issues 22 and 48): worst <= 3x, median <= 1.5x, at 1 thread and at the machine's
default threads.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path


def _threads(argv: list[str]) -> int:
    """--threads, read before numpy starts its BLAS threads."""
    for i, a in enumerate(argv):
        if a.startswith("--threads"):
            return int(a.split("=", 1)[1] if "=" in a else argv[i + 1])
    return 1


THREADS = _threads(sys.argv)
os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = str(THREADS)

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bevir  # noqa: E402
from bevir.testing import hub_zoo, zoo  # noqa: E402

PIPELINE = "canonicalize,fuse,to-nhwc,canonicalize,cse,dce"

#: the models of each zoo
ZOOS = {"torchvision": list(zoo.MODELS), "hub": list(hub_zoo.CNNS)}
ZOOS["all"] = ZOOS["torchvision"] + ZOOS["hub"]


def build(name: str, size: int | None) -> tuple[torch.nn.Module, torch.Tensor]:
    """Model ``name`` of either zoo and a seeded 1x3x``size``x``size`` input (None: the
    zoo's own input)."""
    if name in hub_zoo.MODELS:
        model, (x,) = hub_zoo.build(name)
    else:
        model, x = zoo.build(name, "full")
    if size is not None:
        x = torch.randn((1, 3, size, size), generator=torch.Generator().manual_seed(0))
    return model, x


def best_of(fn, repeat: int) -> float:
    fn()                                   # warm-up: caches, allocations, lazy imports
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bits_against(outputs: Path, name: str, results: dict[str, np.ndarray]) -> str:
    """How many elements of ``results`` differ, bit for bit, from the outputs kept in
    ``outputs`` ("new" when none are kept yet: they are written)."""
    paths = {kind: outputs / f"{name.replace('/', '_')}_{kind}.npy" for kind in results}
    if not all(p.exists() for p in paths.values()):
        for kind, got in results.items():
            np.save(paths[kind], got)
        return "new"
    differing = 0
    for kind, got in results.items():
        kept = np.load(paths[kind])
        if kept.dtype != got.dtype or kept.shape != got.shape:
            differing += got.size
            continue
        bits = f"u{got.dtype.itemsize}"
        differing += int(np.sum(kept.view(bits) != got.view(bits)))
    return str(differing)


def measure(name: str, size: int | None, folder: Path, repeat: int, threads: int,
            outputs: Path | None) -> dict:
    model, x = build(name, size)
    path = folder / f"{name.replace('/', '_')}.onnx"
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(path), input_names=["x"], opset_version=17, dynamo=False)
    feed = {"x": x.numpy()}
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    (want,) = sess.run(None, feed)
    graph = bevir.from_onnx(path)
    optimized = bevir.optimize(graph.clone(), PIPELINE)
    t_ort = best_of(lambda: sess.run(None, feed), repeat)
    t_graph = best_of(lambda: bevir.run(graph, feed), repeat)
    t_opt = best_of(lambda: bevir.run(optimized, feed), repeat)
    (got,) = bevir.run(optimized, feed).values()
    rel = float(np.abs(got - want).max() / max(float(np.abs(want).max()), 1e-12))
    bits = "" if outputs is None else bits_against(
        outputs, name, {"graph": next(iter(bevir.run(graph, feed).values())), "opt": got})
    return {"ort": t_ort, "graph": t_graph, "opt": t_opt, "rel": rel, "bits": bits,
            "nodes": len(graph.nodes), "opt_nodes": len(optimized.nodes)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--zoo", choices=list(ZOOS), default="torchvision")
    ap.add_argument("--size", type=int, help="input height and width (default: the zoo's)")
    ap.add_argument("--models", nargs="*", choices=ZOOS["all"], help="a subset of the zoos")
    ap.add_argument("--outputs", type=Path, help="keep / compare the golden outputs here")
    args = ap.parse_args()
    if args.outputs:
        args.outputs.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    print(f"onnxruntime {ort.__version__}, torch {torch.__version__}; {args.threads} thread(s) "
          f"each side; best of {args.repeat}; input {args.size or 'of each zoo'}")
    print(f"{'model':28s} {'nodes':>11s} {'ort ms':>8s} {'golden ms':>10s} {'ratio':>6s} "
          f"{'pipeline ms':>12s} {'ratio':>6s} {'rel diff':>9s}"
          f"{' bits differing' if args.outputs else ''}", flush=True)
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models or ZOOS[args.zoo]:
            try:
                r = measure(name, args.size, Path(tmp), args.repeat, args.threads, args.outputs)
            except RuntimeError as e:
                if args.size is None:
                    raise
                # a model built for one input size (a ViT's position embeddings)
                print(f"{name:28s} left out: takes no {args.size}x{args.size} input "
                      f"({str(e).splitlines()[0][:60]})", flush=True)
                continue
            ratio, ratio_opt = r["graph"] / r["ort"], r["opt"] / r["ort"]
            ratios.append(min(ratio, ratio_opt))
            print(f"{name:28s} {r['nodes']:>5d}->{r['opt_nodes']:<5d} {1e3 * r['ort']:8.1f} "
                  f"{1e3 * r['graph']:10.1f} {ratio:6.2f} {1e3 * r['opt']:12.1f} {ratio_opt:6.2f} "
                  f"{r['rel']:9.1e} {r['bits']:>15s}", flush=True)
    if not ratios:
        return
    worst, median = max(ratios), statistics.median(ratios)
    print(f"golden/onnxruntime ratio (best of imported and pipelined graph): worst {worst:.2f}x "
          f"(goal <= 3), median {median:.2f}x (goal <= 1.5)")


if __name__ == "__main__":
    main()
