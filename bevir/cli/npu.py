"""The target NPU: ``bevir compile`` (per-core C programs), ``exec`` (run one), ``sim`` (the
modelled cycles per op per core) and ``sweep`` (a model on a grid of hardware configs)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import CodegenError
from .common import (CliError, check_output_dir, echo, echo_err, load_graph, parse_list, planned,
                     plugin_options, read_hw, read_inputs, round_trips_note, scale_options,
                     workers_of, write_results)


# ---- compile -----------------------------------------------------------------------------
def add_compile(sub) -> None:
    s = sub.add_parser("compile", help="generate and build per-core C programs through TVM")
    s.add_argument("model", help="a .bevir file (quantized; partitioned or not)")
    s.add_argument("-o", "--output", required=True, metavar="DIR", help="the program folder")
    s.add_argument("--hw", metavar="CONFIG", help="plan for this config (a preset or e.g. "
                   "'QC-U 8MB 16MAC x4'): partition, memory plan")
    s.add_argument("--cores", type=int, help="plan for N cores (of --hw, default qc-u)")
    plugin_options(s)
    s.set_defaults(fn=cmd_compile)


def cmd_compile(args) -> int:
    import time
    from ..flows.target import compile_program
    graph = load_graph(args.model)
    t0 = time.perf_counter()
    hw = read_hw(args.hw) if args.hw else None
    program = compile_program(graph, args.output, hw=hw, cores=args.cores)
    m = program.manifest
    steps = sum(len(p["steps"]) for p in m["programs"])
    stages = ", ".join(f"{'device' if st['device'] else 'host'} {st['nodes']}"
                       for st in m["stages"])
    echo(f"compiled @{graph.name} for {m['cores']} core(s) into {args.output}: "
         f"{len(m['kernels'])} kernels, {steps} program steps, DDR {m['ddr_bytes']:,} bytes, "
         f"OCM {', '.join(f'{b:,}' for b in m['ocm_bytes'])} bytes "
         f"({time.perf_counter() - t0:.1f}s); stages (nodes): {stages}")
    note = round_trips_note(program.graph)
    if note:
        echo(f"note: {note}")
    return 0


# ---- exec --------------------------------------------------------------------------------
def add_exec(sub) -> None:
    s = sub.add_parser("exec", help="run a compiled program (one thread per core)")
    s.add_argument("program", help="a folder written by bevir compile")
    s.add_argument("--inputs", metavar="FILE", help="a safetensors file of the graph inputs")
    s.add_argument("-o", "--output", metavar="FILE", help="a safetensors file for the results")
    s.add_argument("--host", action="store_true", help="run the host build (TVM's llvm target) "
                   "instead of the per-core programs")
    s.add_argument("--check", action="store_true", help="compare with the golden model; on a "
                   "difference, name the first kernel that differs")
    s.add_argument("--counters", metavar="FILE.json", help="write what the programs counted "
                   "per core and node: bytes between DDR and OCM, DMA transfers, waits, "
                   "kernel calls, and the totals")
    s.add_argument("--trace", metavar="FILE.json", help="write the run as a trace (Trace Event "
                   "format: ui.perfetto.dev, chrome://tracing): per core its waits, copies "
                   "and kernels with their source layers, and the host stages, as measured")
    plugin_options(s)
    s.set_defaults(fn=cmd_exec)


def cmd_exec(args) -> int:
    from ..codegen.cprogram import CompiledProgram
    from ..codegen.program import Program
    from ..sim import run
    check_output_dir(args.output)
    program = CompiledProgram.load(args.program)
    graph = program.graph
    inputs = read_inputs(graph, args.inputs)
    for flag in ("counters", "trace"):
        if getattr(args, flag) and args.host:
            raise CliError(f"--{flag} reports what the per-core programs do: not with --host")
    if args.host:
        results = Program(graph, "llvm").run(inputs)
    else:
        results = program.run(inputs)

    def check() -> None:
        golden = run(graph, inputs)
        differing = sum(int(np.count_nonzero(results[k] != golden[k])) for k in golden)
        echo(f"check: {differing} differing elements against the golden model")
        if differing:
            report = Program(graph, "llvm" if args.host else "c").check(inputs)
            where = report.mismatch or "every kernel agrees with its golden op"
            raise CodegenError(f"the generated program differs from the golden model; "
                               f"first differing kernel: {where}"
                               + (f" ({args.output} not written)" if args.output else ""))
    write_results(results, args.output, check if args.check else None)
    if args.counters:
        from ..fsutil import write_json
        counts = program.counters()
        write_json(args.counters, counts)
        echo(f"wrote {args.counters}: {counts['ddr_bytes']:,} bytes between DDR and OCM, "
             f"{counts['transfers']:,} transfers, {counts['waits']:,} waits, "
             f"{counts['kernel_calls']:,} kernel calls")
    if args.trace:
        program.trace().write(args.trace)
        echo(f"wrote {args.trace} (open it in ui.perfetto.dev or chrome://tracing)")
    return 0


# ---- sim ---------------------------------------------------------------------------------
def add_sim(sub) -> None:
    s = sub.add_parser("sim", help="model a lowered model's cycles per op per core")
    s.add_argument("model", help="a .bevir file")
    s.add_argument("--hw", default="qc-u-4c", help="a preset or e.g. 'QC-U 8MB 16MAC x4' "
                   "(default: qc-u-4c); an unplanned model is planned as bevir compile "
                   "plans it")
    s.add_argument("--cores", type=int, help="replace the config's cores")
    s.add_argument("--out", required=True, metavar="DIR", help="where to write "
                   "profile_core{i}.json, summary.json, timeline.png and roofline.png")
    s.add_argument("--top", type=int, default=3, help="how many of the costliest ops to print")
    s.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    s.add_argument("--trace", metavar="FILE.json", help="also write the modelled run as a "
                   "trace (Trace Event format: ui.perfetto.dev, chrome://tracing): per core "
                   "its steps with their source layers, waits and DMA")
    s.add_argument("--fit", nargs="+", metavar="PROFILE", help="fit the per-op-class "
                   "efficiency factors to measured profiles (files or folders of "
                   "profile_core*.json), then model with the fitted config; writes "
                   "fit.json and hw.json too")
    plugin_options(s)
    s.set_defaults(fn=cmd_sim)


def cmd_sim(args) -> int:
    import json
    from ..fsutil import write_json
    from ..target.cycles import model
    graph = load_graph(args.model)
    hw, graph = planned(graph, args.hw, args.cores)
    if args.fit:
        from ..target.fit import fit_efficiency, format_fit, load_measured
        fit = fit_efficiency(graph, hw, load_measured(args.fit))
        hw = fit.hw
        Path(args.out).mkdir(parents=True, exist_ok=True)
        write_json(Path(args.out) / "fit.json", fit.to_json())
        write_json(Path(args.out) / "hw.json", hw.model_dump())
        echo(format_fit(fit))
        echo(json.dumps(hw.model_dump(), sort_keys=True))
    profile = model(graph, hw)
    profile.write(args.out, plots=not args.no_plots)
    if args.trace:
        from ..target.trace import model_trace
        model_trace(profile).write(args.trace)
    s = profile.summary()
    echo(f"{hw.option_text()} ({hw.hash[:12]}): makespan {s['makespan_cycles']:,} cycles "
         f"({s['makespan_ms']:.3f} ms), per core {s['cycles_per_core']} (waiting "
         f"{s['wait_cycles_per_core']}), utilisation {s['utilisation']:.1%}; DDR "
         f"{s['ddr_bytes']:,} bytes per frame; host: {s['host']['nodes']} nodes in "
         f"{s['host']['stages']} stage(s)")
    for r in s["top_ops"][:args.top]:
        echo(f"  {r['cycles']:>12,}  {r['bound']:<8} {r['op']:<20} {r['loc'] or r['name']}")
    echo(f"wrote {args.out}" + (f" and {args.trace} (open it in ui.perfetto.dev or "
                                "chrome://tracing)" if args.trace else ""))
    return 0


# ---- sweep -------------------------------------------------------------------------------
def add_sweep(sub) -> None:
    s = sub.add_parser("sweep", help="model a model on a grid of hardware configs")
    s.add_argument("model", help="a .bevir file")
    s.add_argument("--hw", default="qc-u", help="the base config (default: qc-u)")
    s.add_argument("--cores", metavar="N,...", help="core counts, e.g. 1,2,4,8")
    s.add_argument("--macs", metavar="N,...", help="MACs per PE, e.g. 8,16")
    s.add_argument("--ocm", metavar="SIZE,...", help="OCM sizes, e.g. 4MB,8MB,16MB")
    s.add_argument("--out", default="sweep", metavar="DIR", help="where to write sweep.json "
                   "and sweep.png (default: sweep/)")
    s.add_argument("--no-plots", action="store_true", help="skip sweep.png")
    scale_options(s)
    s.set_defaults(fn=cmd_sweep)


def cmd_sweep(args) -> int:
    import bevir
    from ..target.hw import parse_size
    from ..flows.sweep import format_table, write
    from ..scale import sweep
    base = read_hw(args.hw)
    cores, macs = parse_list(args.cores, "--cores", int), parse_list(args.macs, "--macs", int)
    ocm = parse_list(args.ocm, "--ocm", parse_size)
    graph = bevir.load(args.model)
    points = sweep(graph, base, cores, macs, ocm, workers=workers_of(args),
                   progress=lambda i, n, p: echo_err(f"sweep {i}/{n}: {p.label}: "
                                                     f"{p.makespan:,} cycles ({p.seconds:.2f} s)"))
    echo(format_table(points))
    for path in write(points, args.out, plot=not args.no_plots):
        echo(f"wrote {path}")
    return 0
