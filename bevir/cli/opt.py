"""Pass pipelines: ``bevir opt`` (run one on a model, with its instruments, or replay a
reproducer) and ``bevir passes`` (the registered passes and their options)."""
from __future__ import annotations

from pathlib import Path

from ..errors import BevirError
from .common import CliError, echo, echo_err, load_graph, plugin_options


# ---- opt ---------------------------------------------------------------------------------
def add_opt(sub) -> None:
    s = sub.add_parser("opt", help="run a pass pipeline on a model")
    s.add_argument("model", nargs="?", help="a .bevir or .onnx file")
    s.add_argument("-p", "--pipeline", help="e.g. 'canonicalize{fold_limit=65536},cse,dce'")
    s.add_argument("-o", "--output", help="the .bevir file to write "
                   "(default: print the IR, constants elided)")
    s.add_argument("--time-passes", action="store_true", help="report the time of each pass")
    s.add_argument("--stats", action="store_true", help="report pass statistics")
    s.add_argument("--dump-ir", metavar="DIR", help="write the IR after each pass to DIR")
    s.add_argument("--dump-ir-after-change", action="store_true",
                   help="with --dump-ir: only after passes that changed the graph")
    s.add_argument("--no-verify-each", action="store_true",
                   help="do not verify the graph after each pass")
    s.add_argument("--reproducer", metavar="FILE", help="where a failing pass leaves its "
                   "reproducer (default: <output>.reproducer.bevir)")
    s.add_argument("--reproduce", metavar="FILE",
                   help="replay a reproducer: run its pipeline on its IR")
    s.add_argument("--verify-numerics", action="store_true",
                   help="check each semantics-preserving pass against the golden interpreter")
    s.add_argument("--probe-inputs", metavar="FILE", help="a safetensors file of the graph "
                   "inputs to verify with (default: seeded random inputs); implies "
                   "--verify-numerics, as do the next two")
    s.add_argument("--numerics-atol", metavar="X", type=float,
                   help="absolute difference allowed on float outputs (default 0)")
    s.add_argument("--numerics-reproducer", metavar="DIR", help="where a numeric mismatch "
                   "leaves its reproducer (default: a new temporary directory)")
    plugin_options(s)
    s.set_defaults(fn=cmd_opt)


def cmd_opt(args) -> int:
    from ..ir import print_graph, save
    from ..passes import (DumpIR, PassManager, Reproducer, Statistics, Timing, parse_pipeline,
                          replay)
    if args.dump_ir_after_change and not args.dump_ir:
        raise CliError("--dump-ir-after-change needs --dump-ir DIR")
    reproducer = None
    if args.reproduce:
        if args.model or args.pipeline:
            raise CliError("--reproduce takes the IR and pipeline from the reproducer file; "
                           "give no model or -p")
        graph, passes = replay(args.reproduce)
    else:
        if not args.model:
            raise CliError("opt needs a model (or --reproduce FILE)")
        if args.pipeline is None:
            raise CliError("opt needs a pipeline: -p PIPELINE (e.g. -p canonicalize,cse,dce)")
        passes = parse_pipeline(args.pipeline)        # bad pipelines fail before loading
        graph = load_graph(args.model)
        target = Path(args.output or args.model)
        reproducer = Reproducer(args.reproducer or target.with_suffix(".reproducer.bevir"))
    timing = Timing() if args.time_passes else None
    stats = Statistics() if args.stats else None
    instruments = [i for i in (timing, stats) if i is not None]
    if args.dump_ir:
        instruments.append(DumpIR(args.dump_ir, only_changed=args.dump_ir_after_change))
    if reproducer is not None:
        instruments.append(reproducer)
    numerics = _numerics(args, graph)
    if numerics is not None:
        instruments.append(numerics)
    pm = PassManager(passes, instruments=instruments, verify_each=not args.no_verify_each)
    try:
        pm.run(graph)
    except BevirError as e:
        if reproducer is not None and reproducer.written is not None:
            raise CliError(f"{e} (reproducer: {reproducer.written})") from e
        raise
    if timing is not None:
        echo_err(timing.report())
    if stats is not None:
        echo_err(stats.report())
    if numerics is not None:
        echo_err(numerics.summary())
    if args.output:
        save(graph, args.output)
        echo_err(f"wrote {args.output}: {len(graph.nodes)} nodes")
    elif args.reproduce:
        echo(f"reproducer {args.reproduce}: pipeline '{pm.pipeline}' ran without error")
    else:
        echo(print_graph(graph, constants="elide"))
    return 0


def _numerics(args, graph):
    """The VerifyNumerics instrument that opt's numerics flags ask for, or None."""
    from ..passes.instruments import VerifyNumerics, read_probe_inputs
    if not (args.verify_numerics or args.probe_inputs or args.numerics_atol is not None
            or args.numerics_reproducer):
        return None
    inputs = read_probe_inputs(args.probe_inputs, graph) if args.probe_inputs else None
    return VerifyNumerics(inputs, atol=args.numerics_atol or 0.0,
                          reproducer_dir=args.numerics_reproducer)


# ---- passes ------------------------------------------------------------------------------
def add_passes(sub) -> None:
    s = sub.add_parser("passes", help="list the registered passes and their options")
    plugin_options(s)
    s.set_defaults(fn=cmd_passes)


def cmd_passes(args) -> int:
    import dataclasses
    from ..passes import all_passes
    for name, cls in all_passes().items():
        echo(f"{name:<16} {cls.description}")
        for opt, (t, default) in cls.options().items():
            d = "required" if default is dataclasses.MISSING else f"default {default!r}"
            echo(f"    {opt}: {t.__name__} ({d})")
    return 0
