"""Many frames, in this process or on Ray: ``bevir calibrate`` (activation ranges over a frame
set) and ``bevir evaluate`` (a candidate model against its reference, frame by frame)."""
from __future__ import annotations

from pathlib import Path

from .common import ScaleFailure, echo, echo_err, load_graph, parse_list, scale_options, workers_of


# ---- calibrate ---------------------------------------------------------------------------
def add_calibrate(sub) -> None:
    s = sub.add_parser("calibrate", help="measure activation ranges over a frame set")
    s.add_argument("model", help="a .bevir or .onnx file (float)")
    s.add_argument("--frames", required=True, metavar="DIR", help="a frame set (frames.json "
                   "and its shards), keyed by the model's input names")
    s.add_argument("-o", "--output", default="ranges.json", metavar="FILE",
                   help="the ranges file (default: ranges.json, with ranges.safetensors)")
    s.add_argument("--method", default="minmax", help="minmax, percentile, mse or entropy")
    s.add_argument("--percentile", type=float, default=99.99)
    s.add_argument("--symmetric", action="store_true")
    s.add_argument("--per-channel", action="store_true")
    s.add_argument("--num-bins", type=int, default=2048)
    s.add_argument("--ops", metavar="OP,...", help="only values these ops produce")
    s.add_argument("--loc", metavar="GLOB", help="only values of nodes whose loc matches")
    s.add_argument("--limit", type=int, metavar="N", help="only the first N frames")
    scale_options(s)
    s.set_defaults(fn=cmd_calibrate)


def cmd_calibrate(args) -> int:
    import time
    from ..scale import Frames, calibrate
    graph = load_graph(args.model)
    frames = Frames(args.frames)
    indices = _indices(args, frames)
    ops = parse_list(args.ops, "--ops", str.strip)
    t = time.perf_counter()
    ranges, failures = calibrate(graph, frames, workers=workers_of(args), indices=indices,
                                 progress=None, method=args.method, percentile=args.percentile,
                                 symmetric=args.symmetric, num_bins=args.num_bins,
                                 per_channel=args.per_channel, ops=ops, loc=args.loc,
                                 attach=False)
    seconds = time.perf_counter() - t
    path = ranges.save(args.output)
    done = len(indices) - len(failures)
    echo(f"wrote {path}: {len(ranges)} ranges ({args.method}) from {done} frames in "
         f"{seconds:.1f} s ({done / seconds:.2f} frames/s)")
    _failed(failures, f"the ranges over the other {done} are in {path}")
    return 0


# ---- evaluate ----------------------------------------------------------------------------
def add_evaluate(sub) -> None:
    s = sub.add_parser("evaluate", help="compare a candidate model (INT8) with its "
                       "reference (float) frame by frame over a frame set")
    s.add_argument("reference", help="the reference model (.bevir or .onnx)")
    s.add_argument("candidate", help="the model to judge (.bevir or .onnx)")
    s.add_argument("--frames", required=True, metavar="DIR", help="a frame set")
    s.add_argument("--out", default="evaluation", metavar="DIR",
                   help="per-frame results, summary and plot (default: evaluation/); an "
                   "earlier run there of the same models and frames is resumed")
    s.add_argument("--program", metavar="DIR", help="also run this compiled program (bevir "
                   "compile) and count its differing elements against the candidate")
    s.add_argument("--restart", action="store_true", help="discard earlier results in --out")
    s.add_argument("--limit", type=int, metavar="N", help="only the first N frames")
    s.add_argument("--no-plots", action="store_true", help="skip iou_matches.png")
    scale_options(s)
    s.set_defaults(fn=cmd_evaluate)


def cmd_evaluate(args) -> int:
    from ..scale import Frames, evaluate
    frames = Frames(args.frames)
    ev = evaluate(load_graph(args.reference), load_graph(args.candidate), frames, args.out,
                  workers=workers_of(args), program=args.program, indices=_indices(args, frames),
                  restart=args.restart, plot=not args.no_plots)
    echo(ev.table())
    echo(f"wrote {Path(args.out) / 'frames.jsonl'}, summary.json"
         + ("" if args.no_plots else ", iou_matches.png"))
    _failed(ev.failures, f"the other frames' results are in {args.out}")
    return 0


def _indices(args, frames) -> list[int]:
    return list(range(min(len(frames), args.limit) if args.limit else len(frames)))


def _failed(failures, what: str) -> None:
    """Report each failed frame on stderr; then fail the command, naming what was kept."""
    if failures:
        for f in failures:
            echo_err(f"bevir: {f}")
        raise ScaleFailure(f"{len(failures)} frame(s) failed (first: {failures[0]}); {what}")
