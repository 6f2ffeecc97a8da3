"""The ``bevir`` command: import, quantize-backbone, quantize, show, opt, run, inputs,
compile, export, exec, sim, sweep, calibrate, evaluate, passes.

    bevir import model.onnx -o model.bevir
    bevir quantize-backbone backbone_fp32.onnx --calibration calib.safetensors -o out/
    bevir show model.bevir
    bevir opt model.bevir -p canonicalize,cse,dce -o opt.bevir --time-passes --stats
    bevir opt --reproduce opt.reproducer.bevir
    bevir inputs opt.bevir -o in.safetensors [--seed N | --zeros]
    bevir run opt.bevir --inputs in.safetensors -o out.safetensors [--cores 4] [--hw CONFIG]
    bevir show opt.bevir --partition --cores 4 --plan-out plan.json
    bevir sim opt.bevir --hw "QC-U 8MB 16MAC x4" --out perf/ [--fit profile_core0.json]
    bevir sweep opt.bevir --cores 1,2,4,8 --macs 8,16 --ocm 4MB,8MB,16MB --out sweep/ [--ray]
    bevir calibrate model.bevir --frames frames/ -o ranges.json [--method entropy] [--ray [ADDR]]
    bevir evaluate model.bevir model_int8.bevir --frames frames/ --out eval/ [--ray [ADDR]]
    bevir compile int8.bevir --hw "QC-U 8MB 16MAC x4" -o prog/
    bevir exec prog/ --inputs in.safetensors -o out.safetensors [--check] [--host]
    bevir passes

Every error prints one line ``bevir: error: <message>`` on stderr and exits with status
1: errors in the input (bevir.BevirError, unreadable or unwritable files) say what is
wrong; anything else is reported as an internal error (``BEVIR_TRACEBACK=1`` shows the
traceback). ``show``, ``run`` and ``inputs`` read ``.onnx`` files too (imported with
``from_onnx``). Every command takes ``--load FILE.py`` / ``--load-module NAME`` to register
a user's passes and ops first; an error in their code names its file and line. Inputs of
another dtype than the model's are cast as ``bevir.run`` casts them (float64 data for a
float32 input), with a note.
"""
from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from . import __version__
from .errors import BevirError, CodegenError
from .passes.precision import MAX_STEPS
from .plugins import load_plugins


class CliError(BevirError):
    """A command-line usage problem found after argument parsing."""


class ScaleFailure(BevirError):
    """Some frames of a data set failed (each reported); the rest completed."""


def _out(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _err(text: str) -> None:
    sys.stderr.write(text if text.endswith("\n") else text + "\n")


# ---- loading -----------------------------------------------------------------------------
def load_graph(path: str):
    """A model file as a Graph: a ``.bevir`` file, or an ``.onnx`` file imported (and
    verified) with ``from_onnx``."""
    import bevir
    if Path(path).suffix.lower() == ".onnx":
        graph = bevir.from_onnx(path)
        bevir.verify(graph)
        return graph
    with open(path, "rb") as f:             # FileNotFoundError: one line in main
        head = f.read(64)
    if head.startswith(b"\x08") or b"\x00" in head:
        raise CliError(f"{path} is not bevir IR text (an ONNX model? name it .onnx, or "
                       "convert it: bevir import MODEL.onnx -o MODEL.bevir)")
    return bevir.load(path)


# ---- import ------------------------------------------------------------------------------
def cmd_import(args) -> int:
    import bevir
    graph = bevir.from_onnx(args.model)
    bevir.verify(graph)
    out = Path(args.output) if args.output else Path(args.model).with_suffix(".bevir")
    bevir.save(graph, out)
    _out(f"wrote {out}: {len(graph.nodes)} nodes, {graph.num_params():,} parameters")
    return 0


# ---- quantize-backbone -------------------------------------------------------------------
def cmd_quantize_backbone(args) -> int:
    from .flows.backbone import quantize_backbone
    import bevir
    qb = quantize_backbone(args.model, args.calibration, args.output, input_name=args.input,
                           scales=args.scales, per_channel=args.per_channel,
                           format=args.format, activation_type=args.activation_type,
                           weight_type=args.weight_type, symmetric=not args.asymmetric,
                           test_inputs=args.test_inputs, name=args.name, progress=None)
    graph_file = qb.int8_onnx.with_suffix(".bevir")
    bevir.save(qb.graph, graph_file)
    _out(qb.summary())
    _out(f"wrote {graph_file}")
    return 0


# ---- show --------------------------------------------------------------------------------
def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def summary(graph) -> str:
    """A short table: node and op counts, parameters, MACs and bytes from the cost model."""
    from .passes import CostSummary
    s = CostSummary(graph)
    ops = ", ".join(f"{op} {n}" for op, n in s.op_counts.items()) or "-"
    rows = [("nodes", f"{s.nodes}"), ("ops", ops),
            ("inputs", f"{len(graph.inputs)}"), ("outputs", f"{len(graph.outputs)}"),
            ("constants", f"{len(graph.constants)}"),
            ("parameters", f"{s.params:,} ({_human_bytes(s.param_bytes)})"),
            ("MACs", f"{s.macs:,}"),
            ("bytes read", f"{s.bytes_read:,} ({_human_bytes(s.bytes_read)})"),
            ("bytes written", f"{s.bytes_written:,} ({_human_bytes(s.bytes_written)})")]
    width = max(len(k) for k, _ in rows)
    return f"summary of @{graph.name}:\n" + "".join(f"  {k.ljust(width)}  {v}\n" for k, v in rows)


def planned(graph, hw_text: str | None, cores: int | None, plan: str | None = None):
    """``graph`` planned for the target as ``bevir compile`` plans it: for ``hw_text``
    (default QC-U x4) with ``cores`` replacing its cores, a partition plan file replayed if
    given. (The config, the planned graph.)"""
    from .flows.target import hw_config
    from .passes import make_pass, optimize
    from .passes.target import plan_for_target
    hw = hw_config(_hw(hw_text or "qc-u-4c"), cores)
    if plan and "partition" not in graph.meta:
        graph = optimize(graph.clone(), [make_pass("partition", hw=hw, plan=plan)])
    return hw, plan_for_target(graph, hw)


def cmd_show(args) -> int:
    from .ir import print_graph
    graph = load_graph(args.model)
    if args.schedule:
        from .target import model
        from .target.describe import describe_schedule
        hw, g = planned(graph, args.hw, args.cores, args.plan)
        _out(describe_schedule(g, model(g, hw)))
        return 0
    if args.partition:
        from .passes.partition import format_plan, plan_of, save_plan
        _, g = planned(graph, args.hw, args.cores, args.plan)
        plan = plan_of(g)
        _out(format_plan(plan))
        if args.plan_out:
            save_plan(plan, args.plan_out)
            _err(f"wrote {args.plan_out}")
        return 0
    if not args.summary_only:
        _out(print_graph(graph, constants=args.constants))
    _out(summary(graph))
    return 0


# ---- opt ---------------------------------------------------------------------------------
def _numerics(args, graph):
    """The VerifyNumerics instrument that opt's numerics flags ask for, or None."""
    from .passes.instruments import VerifyNumerics, read_probe_inputs
    if not (args.verify_numerics or args.probe_inputs or args.numerics_atol is not None
            or args.numerics_reproducer):
        return None
    inputs = read_probe_inputs(args.probe_inputs, graph) if args.probe_inputs else None
    return VerifyNumerics(inputs, atol=args.numerics_atol or 0.0,
                          reproducer_dir=args.numerics_reproducer)


def cmd_opt(args) -> int:
    from .ir import print_graph, save
    from .passes import (DumpIR, PassManager, Reproducer, Statistics, Timing, parse_pipeline,
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
        _err(timing.report())
    if stats is not None:
        _err(stats.report())
    if numerics is not None:
        _err(numerics.summary())
    if args.output:
        save(graph, args.output)
        _err(f"wrote {args.output}: {len(graph.nodes)} nodes")
    elif args.reproduce:
        _out(f"reproducer {args.reproduce}: pipeline '{pm.pipeline}' ran without error")
    else:
        _out(print_graph(graph, constants="elide"))
    return 0


# ---- quantize ----------------------------------------------------------------------------
def cmd_quantize(args) -> int:
    from .ir import save
    from .passes import optimize
    from .passes.calibrate import calibrate, ranges_of
    from .passes.precision import Target, best, search, sqnr_evaluator
    from .passes.quantize import load_config, quantize
    config = load_config(args.config)
    target = Target.parse(args.target) if args.target else None   # bad input fails first
    _check_output_dir(args.output)
    graph = load_graph(args.model)
    inputs = read_inputs(graph, args.inputs)
    if ranges_of(graph) is None:
        calibrate(graph, inputs, method=config.calibration, percentile=config.percentile,
                  progress=False)
    if target is not None:
        _out(f"precision search for {target} from '{args.config}'")
        steps = search(config, sqnr_evaluator(graph, inputs, _hw(args.hw) if args.hw else None),
                       target, max_steps=args.max_steps, log=_out)
        result = best(steps, target)
        config = result.config
        _out(f"{'met' if result.met else 'not met'} after {len(steps) - 1} step(s) "
             f"(result: {result.change})")
    if args.write_config:
        config.save(args.write_config)
        _out(f"wrote {args.write_config} (--config reproduces it)")
    stats = quantize(graph, config)
    optimize(graph, "cse,dce")
    save(graph, args.output)
    lowered = sum(v for k, v in stats.items() if k.startswith("lowered-"))
    _out(f"wrote {args.output}: {len(graph.nodes)} nodes, {lowered} ops lowered to fixed "
         f"point, {stats.get('activations-i16', 0)} at 16 bits, "
         f"{stats.get('float-left', 0)} left in float")
    _out(host_note(graph))
    note = round_trips_note(graph)
    if note:
        _out(f"note: {note}")
    return 0


def host_note(graph) -> str:
    """What of ``graph`` runs on the host (float ops, by op), as the compiled program will
    run it."""
    from collections import Counter
    from .target.schedule import lowerable
    host = Counter(n.op for n in graph.nodes if not lowerable(n))
    ops = ", ".join(f"{op} {k}" for op, k in host.most_common(8))
    return (f"on the host (float): {sum(host.values())} node(s)"
            + (f" ({ops}{', ...' if len(host) > 8 else ''})" if host else ""))


# ---- run ---------------------------------------------------------------------------------
def _describe(a: np.ndarray) -> str:
    text = f"{a.dtype}{list(a.shape)}"
    if a.size and a.dtype.kind in "fiub":
        f = a.astype(np.float64)
        text += f" min={f.min():.6g} max={f.max():.6g} mean={f.mean():.6g}"
    return text


def check_inputs(graph, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``inputs`` for ``graph``: every input given and no other (each wrong name named); a
    shape that differs from the declared one refused; a dtype that differs cast as the
    golden model casts (``bevir.run``: float64 data for a float32 input, integers in
    range), with a note, or refused."""
    from .sim.interpreter import bind_input, check_input_names
    if inputs or not graph.inputs:
        check_input_names(graph, inputs)
    else:
        raise CliError(f"@{graph.name} takes inputs {[v.name for v in graph.inputs]}: give "
                       "--inputs FILE.safetensors (bevir inputs MODEL -o FILE.safetensors "
                       "writes some)")
    declared = {v.name: v.type for v in graph.inputs}
    checked = {}
    for name, a in inputs.items():
        t = declared[name]
        if tuple(a.shape) != tuple(t.shape):
            raise CliError(f"input '{name}' is {a.dtype}{list(a.shape)}, @{graph.name} "
                           f"declares {t}")
        checked[name] = bind_input(name, a, t.dtype)
        if a.dtype != t.dtype.np:
            _err(f"bevir: note: input '{name}' is {a.dtype}, cast to {t.dtype.np} as "
                 f"@{graph.name} declares")
    return checked


def read_inputs(graph, path: str | None) -> dict[str, np.ndarray]:
    """The graph inputs in safetensors file ``path``, checked against the graph."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file
    inputs: dict[str, np.ndarray] = {}
    if path:
        if not Path(path).exists():
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        try:
            inputs = load_file(path)
        except (SafetensorError, ValueError) as e:
            raise BevirError(f"cannot read inputs {path}: {e}") from None
        for v in graph.inputs:     # safetensors stores scalars as [1]
            if v.name in inputs and v.type.rank == 0 and inputs[v.name].size == 1:
                inputs[v.name] = inputs[v.name].reshape(())
    return check_inputs(graph, inputs)


def cmd_inputs(args) -> int:
    from .fsutil import save_arrays
    from .passes.instruments import probe_inputs
    _check_output_dir(args.output)
    graph = load_graph(args.model)
    inputs = ({v.name: np.zeros(v.type.shape, v.type.dtype.np) for v in graph.inputs}
              if args.zeros else probe_inputs(graph, args.seed))
    for name, a in inputs.items():
        _out(f"{name}: {_describe(a)}")
    save_arrays(inputs, args.output)
    _out(f"wrote {args.output}: {len(inputs)} inputs "
         f"({'zeros' if args.zeros else f'random, seed {args.seed}'})")
    return 0


def _check_output_dir(path: str | None) -> None:
    if path and not Path(path).resolve().parent.is_dir():
        raise CliError(f"cannot write {path}: no directory '{Path(path).resolve().parent}'")


def write_results(results: dict, path: str | None,
                  check: Callable[[], None] | None = None) -> None:
    """Print a line per result and write them to safetensors file ``path`` if given, whole
    or not at all; ``check()``, if given, runs between the two (a failed check leaves no
    file)."""
    from safetensors import SafetensorError
    from .fsutil import save_arrays
    for name, a in results.items():
        _out(f"{name}: {_describe(np.asarray(a))}")
    if check is not None:
        check()
    if path:
        try:
            save_arrays(results, path)
        except (SafetensorError, OSError) as e:
            raise CliError(f"cannot write {path}: {e}") from None
        _out(f"wrote {path}: {len(results)} tensors")


def cmd_run(args) -> int:
    from .sim import run
    _check_output_dir(args.output)
    graph = load_graph(args.model)
    inputs = read_inputs(graph, args.inputs)
    fetch = None
    if args.fetch:
        fetch = "all" if args.fetch == ["all"] else args.fetch
    if args.cores is not None or args.plan or args.hw:
        from .passes.partition import format_plan
        _, graph = planned(graph, args.hw, args.cores, args.plan)
        _err("\n".join(format_plan(graph.meta["partition"]).splitlines()[1:3]).strip())
    write_results(run(graph, inputs, fetch=fetch), args.output)
    return 0


# ---- code generation ---------------------------------------------------------------------
def cmd_compile(args) -> int:
    import time
    from .flows.target import compile_program
    graph = load_graph(args.model)
    t0 = time.perf_counter()
    hw = _hw(args.hw) if args.hw else None
    program = compile_program(graph, args.output, hw=hw, cores=args.cores)
    m = program.manifest
    steps = sum(len(p["steps"]) for p in m["programs"])
    stages = ", ".join(f"{'device' if st['device'] else 'host'} {st['nodes']}"
                       for st in m["stages"])
    _out(f"compiled @{graph.name} for {m['cores']} core(s) into {args.output}: "
         f"{len(m['kernels'])} kernels, {steps} program steps, DDR {m['ddr_bytes']:,} bytes, "
         f"OCM {', '.join(f'{b:,}' for b in m['ocm_bytes'])} bytes "
         f"({time.perf_counter() - t0:.1f}s); stages (nodes): {stages}")
    note = round_trips_note(program.graph)
    if note:
        _out(f"note: {note}")
    return 0


def round_trips_note(graph) -> str | None:
    """The host round trips between device stages of ``graph`` (values sent to the host
    and back through float ops a quantization left), with the first ops that make them."""
    from .target.schedule import host_round_trips
    trips = host_round_trips(graph)
    if not trips:
        return None
    ops = [n for nodes in trips for n in nodes]
    first = ", ".join(f"{n.op} '{n.loc or n.name}'" for n in ops[:3])
    return (f"{len(trips)} host round trip(s) between device stages, through float ops the "
            f"quantization left: {first}{', ...' if len(ops) > 3 else ''}")


def cmd_export(args) -> int:
    from .codegen.onnx import to_onnx
    graph = load_graph(args.model)
    model = to_onnx(graph, args.onnx)
    qdq = sum(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)
    _out(f"exported @{graph.name} to {args.onnx}: {len(model.graph.node)} ONNX nodes"
         + (f" ({qdq} QuantizeLinear/DequantizeLinear)" if qdq else "")
         + f", opset {model.opset_import[0].version}")
    return 0


def cmd_exec(args) -> int:
    from .codegen.cprogram import CompiledProgram
    from .codegen.program import Program
    from .sim import run
    _check_output_dir(args.output)
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
        _out(f"check: {differing} differing elements against the golden model")
        if differing:
            report = Program(graph, "llvm" if args.host else "c").check(inputs)
            where = report.mismatch or "every kernel agrees with its golden op"
            raise CodegenError(f"the generated program differs from the golden model; "
                               f"first differing kernel: {where}"
                               + (f" ({args.output} not written)" if args.output else ""))
    write_results(results, args.output, check if args.check else None)
    if args.counters:
        from .fsutil import write_json
        counts = program.counters()
        write_json(args.counters, counts)
        _out(f"wrote {args.counters}: {counts['ddr_bytes']:,} bytes between DDR and OCM, "
             f"{counts['transfers']:,} transfers, {counts['waits']:,} waits, "
             f"{counts['kernel_calls']:,} kernel calls")
    if args.trace:
        program.trace().write(args.trace)
        _out(f"wrote {args.trace} (open it in ui.perfetto.dev or chrome://tracing)")
    return 0


# ---- sim ---------------------------------------------------------------------------------
def _hw(text: str):
    """A HWConfig from a preset, a vendor string or a .json file of its fields (as
    ``sim --fit`` writes)."""
    from .fsutil import read_json
    from .target.hw import HWConfig, HWConfigError
    if text.endswith(".json"):
        return HWConfig(**read_json(text, HWConfigError))
    return HWConfig.from_option(text)


def cmd_sim(args) -> int:
    import json
    from .fsutil import write_json
    from .target.cycles import model
    graph = load_graph(args.model)
    hw, graph = planned(graph, args.hw, args.cores)
    if args.fit:
        from .target.fit import fit_efficiency, format_fit, load_measured
        fit = fit_efficiency(graph, hw, load_measured(args.fit))
        hw = fit.hw
        Path(args.out).mkdir(parents=True, exist_ok=True)
        write_json(Path(args.out) / "fit.json", fit.to_json())
        write_json(Path(args.out) / "hw.json", hw.model_dump())
        _out(format_fit(fit))
        _out(json.dumps(hw.model_dump(), sort_keys=True))
    profile = model(graph, hw)
    profile.write(args.out, plots=not args.no_plots)
    if args.trace:
        from .target.trace import model_trace
        model_trace(profile).write(args.trace)
    s = profile.summary()
    _out(f"{hw.option_text()} ({hw.hash[:12]}): makespan {s['makespan_cycles']:,} cycles "
         f"({s['makespan_ms']:.3f} ms), per core {s['cycles_per_core']} (waiting "
         f"{s['wait_cycles_per_core']}), utilisation {s['utilisation']:.1%}; DDR "
         f"{s['ddr_bytes']:,} bytes per frame; host: {s['host']['nodes']} nodes in "
         f"{s['host']['stages']} stage(s)")
    for r in s["top_ops"][:args.top]:
        _out(f"  {r['cycles']:>12,}  {r['bound']:<8} {r['op']:<20} {r['loc'] or r['name']}")
    _out(f"wrote {args.out}" + (f" and {args.trace} (open it in ui.perfetto.dev or "
                                "chrome://tracing)" if args.trace else ""))
    return 0


# ---- sweep -------------------------------------------------------------------------------
def _list(text: str | None, flag: str, read) -> list:
    """A comma-separated option value, each item read by ``read`` (a CliError names it)."""
    if text is None:
        return []
    items = []
    for item in text.split(","):
        try:
            items.append(read(item.strip()))
        except BevirError as e:
            raise CliError(f"{flag}: {e}") from None
        except ValueError:
            raise CliError(f"{flag}: cannot read {item.strip()!r} (expected a "
                           "comma-separated list, e.g. 1,2,4)") from None
    return items


def cmd_sweep(args) -> int:
    import bevir
    from .target.hw import parse_size
    from .flows.sweep import format_table, write
    from .scale import sweep
    base = _hw(args.hw)
    cores, macs = _list(args.cores, "--cores", int), _list(args.macs, "--macs", int)
    ocm = _list(args.ocm, "--ocm", parse_size)
    graph = bevir.load(args.model)
    points = sweep(graph, base, cores, macs, ocm, workers=_workers(args),
                   progress=lambda i, n, p: _err(f"sweep {i}/{n}: {p.label}: "
                                                 f"{p.makespan:,} cycles ({p.seconds:.2f} s)"))
    _out(format_table(points))
    for path in write(points, args.out, plot=not args.no_plots):
        _out(f"wrote {path}")
    return 0


# ---- many frames: calibrate, evaluate ----------------------------------------------------
def _workers(args):
    """Where the frames' work runs: --ray [ADDRESS] (Ray), else this process."""
    from .scale import Plugins, Workers
    if args.workers is not None and args.ray is None:
        raise CliError("--workers sets the cores of an embedded Ray: add --ray")
    return Workers(ray=args.ray, cpus=args.workers,
                   plugins=Plugins(tuple(args.load), tuple(args.load_module)))


def _indices(args, frames) -> list[int]:
    return list(range(min(len(frames), args.limit) if args.limit else len(frames)))


def _failed(failures, what: str) -> None:
    """Report each failed frame on stderr; then fail the command, naming what was kept."""
    if failures:
        for f in failures:
            _err(f"bevir: {f}")
        raise ScaleFailure(f"{len(failures)} frame(s) failed (first: {failures[0]}); {what}")


def cmd_calibrate(args) -> int:
    import time
    from .scale import Frames, calibrate
    graph = load_graph(args.model)
    frames = Frames(args.frames)
    indices = _indices(args, frames)
    ops = _list(args.ops, "--ops", str.strip)
    t = time.perf_counter()
    ranges, failures = calibrate(graph, frames, workers=_workers(args), indices=indices,
                                 progress=None, method=args.method, percentile=args.percentile,
                                 symmetric=args.symmetric, num_bins=args.num_bins,
                                 per_channel=args.per_channel, ops=ops, loc=args.loc,
                                 attach=False)
    seconds = time.perf_counter() - t
    path = ranges.save(args.output)
    done = len(indices) - len(failures)
    _out(f"wrote {path}: {len(ranges)} ranges ({args.method}) from {done} frames in "
         f"{seconds:.1f} s ({done / seconds:.2f} frames/s)")
    _failed(failures, f"the ranges over the other {done} are in {path}")
    return 0


def cmd_evaluate(args) -> int:
    from .scale import Frames, evaluate
    frames = Frames(args.frames)
    ev = evaluate(load_graph(args.reference), load_graph(args.candidate), frames, args.out,
                  workers=_workers(args), program=args.program, indices=_indices(args, frames),
                  restart=args.restart, plot=not args.no_plots)
    _out(ev.table())
    _out(f"wrote {Path(args.out) / 'frames.jsonl'}, summary.json"
         + ("" if args.no_plots else ", iou_matches.png"))
    _failed(ev.failures, f"the other frames' results are in {args.out}")
    return 0


# ---- passes ------------------------------------------------------------------------------
def cmd_passes(args) -> int:
    import dataclasses
    from .passes import all_passes
    for name, cls in all_passes().items():
        _out(f"{name:<16} {cls.description}")
        for opt, (t, default) in cls.options().items():
            d = "required" if default is dataclasses.MISSING else f"default {default!r}"
            _out(f"    {opt}: {t.__name__} ({d})")
    return 0


# ---- main --------------------------------------------------------------------------------
def _plugin_options(s: argparse.ArgumentParser) -> None:
    s.add_argument("--load", action="append", default=[], metavar="FILE.py",
                   help="import this Python file first: the passes and ops it defines "
                   "register themselves (repeatable)")
    s.add_argument("--load-module", action="append", default=[], metavar="NAME",
                   help="import this module first, like --load (repeatable)")


def _scale_options(s: argparse.ArgumentParser) -> None:
    s.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                   help="run on Ray: alone, an embedded Ray on this machine's cores; with an "
                   "address (e.g. ray://head:10001 or auto), that cluster")
    s.add_argument("--workers", type=int, metavar="N",
                   help="cores of the embedded Ray (default: all of this machine's)")
    _plugin_options(s)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bevir", description="bevir: a graph-IR compiler for an "
                                "INT8 NPU. Import, inspect, optimize and run models.")
    p.add_argument("--version", action="version", version=f"bevir {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    s = sub.add_parser("import", help="import an ONNX model as bevir IR")
    s.add_argument("model", help="the .onnx file")
    s.add_argument("-o", "--output", help="the .bevir file to write (default: <model>.bevir)")
    _plugin_options(s)
    s.set_defaults(fn=cmd_import)

    s = sub.add_parser("quantize-backbone", help="quantize an FP32 ONNX backbone with "
                       "onnxruntime, write its tranges and import it")
    s.add_argument("model", help="the FP32 .onnx file")
    s.add_argument("--calibration", required=True, metavar="FILE", help="a safetensors file "
                   "of calibration inputs (a leading axis of samples allowed)")
    s.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="where to write <name>_int8.onnx, .tranges and .bevir")
    s.add_argument("--test-inputs", metavar="FILE", help="a safetensors file of the inputs "
                   "the tranges are measured on (default: the calibration inputs)")
    s.add_argument("--scales", metavar="FILE", help="forced scales: a .json of "
                   "{tensor or '<conv module>.x_scale'/'.w_scale': scale} or a .safetensors "
                   "checkpoint")
    s.add_argument("--input", metavar="NAME", help="the image input (default: the only one)")
    s.add_argument("--per-channel", action="store_true", help="per-channel weights")
    s.add_argument("--format", choices=("qoperator", "qdq"), default="qoperator")
    s.add_argument("--activation-type", choices=("int8", "uint8"), default="int8")
    s.add_argument("--weight-type", choices=("int8", "uint8"), default="int8")
    s.add_argument("--asymmetric", action="store_true", help="asymmetric activations")
    s.add_argument("--name", default="backbone", help="the output files' stem")
    _plugin_options(s)
    s.set_defaults(fn=cmd_quantize_backbone)

    s = sub.add_parser("quantize", help="lower a float model to fixed point by a quantization "
                       "config, or search the config a target needs")
    s.add_argument("model", help="a float .bevir or .onnx file (calibrated here unless it "
                   "carries ranges)")
    s.add_argument("--inputs", required=True, metavar="FILE.safetensors",
                   help="one frame of the model's inputs: calibrated on, and the frame "
                   "--target is measured on")
    s.add_argument("--config", default="default", metavar="PRESET|FILE.json",
                   help="the quantization config, or the search's start (default: "
                   "default: per-channel weights, 8-bit activations)")
    s.add_argument("--target", metavar="METRIC>=VALUE",
                   help="search the config first: metrics sqnr (the lowest over the "
                   "outputs), OUTPUT_sqnr (dB against the float run) and cycles; the "
                   "groups with the worst local error move one notch a step")
    s.add_argument("--max-steps", type=int, default=MAX_STEPS, help="the most configs "
                   f"--target evaluates (default {MAX_STEPS})")
    s.add_argument("--hw", metavar="HW", help="the GPNPU config the cycles are modelled on")
    s.add_argument("--write-config", metavar="FILE.json", help="write the config used "
                   "(the search's result)")
    s.add_argument("-o", "--output", required=True, metavar="FILE.bevir",
                   help="the quantized model")
    _plugin_options(s)
    s.set_defaults(fn=cmd_quantize)

    s = sub.add_parser("show", help="print a model's IR and a cost summary")
    s.add_argument("model", help="a .bevir or .onnx file")
    s.add_argument("--constants", choices=("elide", "inline", "external"), default="elide",
                   help="how to print constant payloads (default: elide)")
    s.add_argument("--summary-only", action="store_true", help="print only the summary")
    s.add_argument("--partition", action="store_true", help="print the partition plan: the "
                   "model's own, or the one bevir compile makes for --hw, with the modelled "
                   "makespan bevir sim reports")
    s.add_argument("--schedule", action="store_true", help="print the schedule bevir compile "
                   "makes for --hw: layers run image by image, splits, transfers, what bounds "
                   "the steps, each with its modelled cycles")
    s.add_argument("--hw", metavar="CONFIG", help="with --partition or --schedule: the "
                   "hardware config (default: qc-u-4c)")
    s.add_argument("--cores", type=int, help="with --partition or --schedule: cores "
                   "(default: the config's)")
    s.add_argument("--plan", metavar="FILE", help="with --partition or --schedule: replay "
                   "this plan")
    s.add_argument("--plan-out", metavar="FILE", help="with --partition: write the plan (JSON)")
    _plugin_options(s)
    s.set_defaults(fn=cmd_show)

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
    _plugin_options(s)
    s.set_defaults(fn=cmd_opt)

    s = sub.add_parser("run", help="run a model with the golden interpreter")
    s.add_argument("model", help="a .bevir or .onnx file")
    s.add_argument("--inputs", metavar="FILE", help="a safetensors file of the graph inputs")
    s.add_argument("-o", "--output", metavar="FILE", help="a safetensors file for the results")
    s.add_argument("--fetch", nargs="+", metavar="NAME",
                   help="also return these values (by value name; 'all' for every value)")
    s.add_argument("--cores", type=int, help="plan for N cores first, as bevir compile does "
                   "(partition, memory plan), then run the planned graph")
    s.add_argument("--plan", metavar="FILE", help="partition by this plan (see show --partition)")
    s.add_argument("--hw", metavar="CONFIG", help="plan for this hardware config (a preset or "
                   "e.g. 'QC-U 8MB 16MAC x4'; default qc-u-4c; --cores replaces its cores)")
    _plugin_options(s)
    s.set_defaults(fn=cmd_run)

    s = sub.add_parser("inputs", help="write an inputs file for a model: seeded random "
                       "arrays (as opt --verify-numerics probes with) or zeros")
    s.add_argument("model", help="a .bevir or .onnx file")
    s.add_argument("-o", "--output", required=True, metavar="FILE.safetensors",
                   help="the inputs file (for run, exec, quantize --inputs)")
    kind = s.add_mutually_exclusive_group()
    kind.add_argument("--seed", type=int, default=0, help="the random seed (default 0): "
                      "floats standard normal, integers over their range (at most int16's)")
    kind.add_argument("--zeros", action="store_true", help="zeros instead")
    _plugin_options(s)
    s.set_defaults(fn=cmd_inputs)

    s = sub.add_parser("compile", help="generate and build per-core C programs through TVM")
    s.add_argument("model", help="a .bevir file (quantized; partitioned or not)")
    s.add_argument("-o", "--output", required=True, metavar="DIR", help="the program folder")
    s.add_argument("--hw", metavar="CONFIG", help="plan for this config (a preset or e.g. "
                   "'QC-U 8MB 16MAC x4'): partition, memory plan")
    s.add_argument("--cores", type=int, help="plan for N cores (of --hw, default qc-u)")
    _plugin_options(s)
    s.set_defaults(fn=cmd_compile)

    s = sub.add_parser("export", help="write a model as ONNX (quantized ops as QDQ)")
    s.add_argument("model", help="a .bevir file")
    s.add_argument("--onnx", required=True, metavar="FILE", help="the ONNX file to write")
    _plugin_options(s)
    s.set_defaults(fn=cmd_export)

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
    _plugin_options(s)
    s.set_defaults(fn=cmd_exec)

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
    _plugin_options(s)
    s.set_defaults(fn=cmd_sim)

    s = sub.add_parser("sweep", help="model a model on a grid of hardware configs")
    s.add_argument("model", help="a .bevir file")
    s.add_argument("--hw", default="qc-u", help="the base config (default: qc-u)")
    s.add_argument("--cores", metavar="N,...", help="core counts, e.g. 1,2,4,8")
    s.add_argument("--macs", metavar="N,...", help="MACs per PE, e.g. 8,16")
    s.add_argument("--ocm", metavar="SIZE,...", help="OCM sizes, e.g. 4MB,8MB,16MB")
    s.add_argument("--out", default="sweep", metavar="DIR", help="where to write sweep.json "
                   "and sweep.png (default: sweep/)")
    s.add_argument("--no-plots", action="store_true", help="skip sweep.png")
    _scale_options(s)
    s.set_defaults(fn=cmd_sweep)

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
    _scale_options(s)
    s.set_defaults(fn=cmd_calibrate)

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
    _scale_options(s)
    s.set_defaults(fn=cmd_evaluate)

    s = sub.add_parser("passes", help="list the registered passes and their options")
    _plugin_options(s)
    s.set_defaults(fn=cmd_passes)
    return p


def _os_message(e: OSError) -> str:
    if e.strerror and e.filename:
        return f"{e.strerror}: '{e.filename}'"
    if isinstance(e, FileNotFoundError) and e.args and not e.strerror:
        return f"No such file or directory: '{e.args[0]}'"
    return " ".join(str(e).split("\n"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:     # --help, --version and usage errors
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    try:
        load_plugins(getattr(args, "load", ()), getattr(args, "load_module", ()))
        return args.fn(args)
    except BevirError as e:
        _err("bevir: error: " + _one_line(str(e)))
    except BrokenPipeError:     # the reader stopped early (| head): nothing to report
        # stdout to /dev/null, or flushing it at exit fails once more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13         # as a process that SIGPIPE ended (the shell's convention)
    except OSError as e:
        _err(f"bevir: error: {_os_message(e)}")
    except KeyboardInterrupt:
        _err("bevir: error: interrupted")
        return 130
    except Exception as e:      # a bug, not bad input: still one line unless asked
        if os.environ.get("BEVIR_TRACEBACK"):
            raise
        _err(f"bevir: error: internal error: {type(e).__name__}: {_one_line(str(e))} "
             "(BEVIR_TRACEBACK=1 shows the traceback)")
    return 1


def _one_line(text: str) -> str:
    return " ".join(text.split("\n"))


if __name__ == "__main__":
    raise SystemExit(main())
