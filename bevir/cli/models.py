"""Model files: ``bevir import`` (ONNX), ``quantize-backbone`` (an FP32 ONNX backbone through
onnxruntime), ``quantize`` (to bevir's fixed point), ``show`` (the IR, a cost summary, the
plan or schedule for the target) and ``export`` (ONNX, quantized ops as QDQ)."""
from __future__ import annotations

from pathlib import Path

from ..passes.precision import MAX_STEPS
from .common import (check_output_dir, echo, echo_err, load_graph, planned, plugin_options,
                     read_hw, read_inputs, round_trips_note)


# ---- import ------------------------------------------------------------------------------
def add_import(sub) -> None:
    s = sub.add_parser("import", help="import an ONNX model as bevir IR")
    s.add_argument("model", help="the .onnx file")
    s.add_argument("-o", "--output", help="the .bevir file to write (default: <model>.bevir)")
    plugin_options(s)
    s.set_defaults(fn=cmd_import)


def cmd_import(args) -> int:
    import bevir
    graph = bevir.from_onnx(args.model)
    bevir.verify(graph)
    out = Path(args.output) if args.output else Path(args.model).with_suffix(".bevir")
    bevir.save(graph, out)
    echo(f"wrote {out}: {len(graph.nodes)} nodes, {graph.num_params():,} parameters")
    return 0


# ---- quantize-backbone -------------------------------------------------------------------
def add_quantize_backbone(sub) -> None:
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
    plugin_options(s)
    s.set_defaults(fn=cmd_quantize_backbone)


def cmd_quantize_backbone(args) -> int:
    from ..flows.backbone import quantize_backbone
    import bevir
    qb = quantize_backbone(args.model, args.calibration, args.output, input_name=args.input,
                           scales=args.scales, per_channel=args.per_channel,
                           format=args.format, activation_type=args.activation_type,
                           weight_type=args.weight_type, symmetric=not args.asymmetric,
                           test_inputs=args.test_inputs, name=args.name, progress=None)
    graph_file = qb.int8_onnx.with_suffix(".bevir")
    bevir.save(qb.graph, graph_file)
    echo(qb.summary())
    echo(f"wrote {graph_file}")
    return 0


# ---- quantize ----------------------------------------------------------------------------
def add_quantize(sub) -> None:
    s = sub.add_parser("quantize", help="lower a float model to fixed point by a quantization "
                       "config, or search the config a target needs")
    s.add_argument("model", help="a float .bevir or .onnx file (calibrated here unless it "
                   "carries ranges)")
    s.add_argument("--inputs", required=True, metavar="FILE.safetensors",
                   help="one frame of the model's inputs: calibrated on, and the frame "
                   "--target is measured on")
    s.add_argument("--config", default="default", metavar="PRESET|FILE.json",
                   help="the quantization config, or the search's start (default: "
                   "default: per-channel weights, 8-bit activations, 16-bit where local "
                   "error calls for them)")
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
    plugin_options(s)
    s.set_defaults(fn=cmd_quantize)


def cmd_quantize(args) -> int:
    from ..ir import save
    from ..passes import optimize
    from ..passes.calibrate import calibrate, ranges_of
    from ..passes.precision import Target, best, search, sqnr_evaluator, widen
    from ..passes.quantize import load_config, quantize
    config = load_config(args.config)
    target = Target.parse(args.target) if args.target else None   # bad input fails first
    check_output_dir(args.output)
    graph = load_graph(args.model)
    inputs = read_inputs(graph, args.inputs)
    if ranges_of(graph) is None:
        calibrate(graph, inputs, method=config.calibration, percentile=config.percentile,
                  progress=False)
    if target is not None:
        echo(f"precision search for {target} from '{args.config}'")
        steps = search(config, sqnr_evaluator(graph, inputs, read_hw(args.hw) if args.hw else None),
                       target, max_steps=args.max_steps, log=echo)
        result = best(steps, target)
        config = result.config
        echo(f"{'met' if result.met else 'not met'} after {len(steps) - 1} step(s) "
             f"(result: {result.change})")
    elif config.widen_to is not None:
        bar = config.widen_to
        config, sqnr, layers = widen(graph, inputs, config, bar)
        echo(f"16-bit activations in {layers} layer(s) of the worst local error: SQNR "
             f"{sqnr:.1f} dB against float (widen_to {bar:g})")
    if args.write_config:
        config.save(args.write_config)
        echo(f"wrote {args.write_config} (--config reproduces it)")
    stats = quantize(graph, config)
    optimize(graph, "cse,dce")
    save(graph, args.output)
    lowered = sum(v for k, v in stats.items() if k.startswith("lowered-"))
    echo(f"wrote {args.output}: {len(graph.nodes)} nodes, {lowered} ops lowered to fixed "
         f"point, {stats.get('activations-i16', 0)} at 16 bits, "
         f"{stats.get('float-left', 0)} left in float")
    echo(host_note(graph))
    note = round_trips_note(graph)
    if note:
        echo(f"note: {note}")
    return 0


def host_note(graph) -> str:
    """What of ``graph`` runs on the host (float ops, by op), as the compiled program will
    run it (with the quantizations of their results, not counted)."""
    from collections import Counter
    from ..target.schedule import host_float_op
    host = Counter(n.op for n in graph.nodes if host_float_op(n))
    ops = ", ".join(f"{op} {k}" for op, k in host.most_common(8))
    return (f"on the host (float): {sum(host.values())} node(s)"
            + (f" ({ops}{', ...' if len(host) > 8 else ''})" if host else ""))


# ---- show --------------------------------------------------------------------------------
def add_show(sub) -> None:
    s = sub.add_parser("show", help="print a model's IR and a cost summary")
    s.add_argument("model", help="a .bevir or .onnx file")
    s.add_argument("--constants", choices=("elide", "inline", "external"), default="elide",
                   help="how to print constant payloads (default: elide)")
    s.add_argument("--summary-only", action="store_true", help="print only the summary")
    s.add_argument("--partition", action="store_true", help="print the partition plan: the "
                   "model's own, or the one bevir compile makes for --hw, with the modelled "
                   "makespan bevir sim reports")
    s.add_argument("--schedule", action="store_true", help="print the schedule bevir compile "
                   "makes for --hw: layers run stripe by stripe, splits, transfers, what "
                   "bounds the steps, each with its modelled cycles")
    s.add_argument("--hw", metavar="CONFIG", help="with --partition or --schedule: the "
                   "hardware config (default: qc-u-4c)")
    s.add_argument("--cores", type=int, help="with --partition or --schedule: cores "
                   "(default: the config's)")
    s.add_argument("--plan", metavar="FILE", help="with --partition or --schedule: replay "
                   "this plan")
    s.add_argument("--plan-out", metavar="FILE", help="with --partition: write the plan (JSON)")
    plugin_options(s)
    s.set_defaults(fn=cmd_show)


def cmd_show(args) -> int:
    from ..ir import print_graph
    graph = load_graph(args.model)
    if args.schedule:
        from ..target import model
        from ..target.describe import describe_schedule
        hw, g = planned(graph, args.hw, args.cores, args.plan)
        echo(describe_schedule(g, model(g, hw)))
        return 0
    if args.partition:
        from ..passes.partition import format_plan, plan_of, save_plan
        _, g = planned(graph, args.hw, args.cores, args.plan)
        plan = plan_of(g)
        echo(format_plan(plan))
        if args.plan_out:
            save_plan(plan, args.plan_out)
            echo_err(f"wrote {args.plan_out}")
        return 0
    if not args.summary_only:
        echo(print_graph(graph, constants=args.constants))
    echo(summary(graph))
    return 0


def summary(graph) -> str:
    """A short table: node and op counts, parameters, MACs and bytes from the cost model."""
    from ..passes import CostSummary
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


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# ---- export ------------------------------------------------------------------------------
def add_export(sub) -> None:
    s = sub.add_parser("export", help="write a model as ONNX (quantized ops as QDQ)")
    s.add_argument("model", help="a .bevir file")
    s.add_argument("--onnx", required=True, metavar="FILE", help="the ONNX file to write")
    plugin_options(s)
    s.set_defaults(fn=cmd_export)


def cmd_export(args) -> int:
    from ..codegen.onnx import to_onnx
    graph = load_graph(args.model)
    model = to_onnx(graph, args.onnx)
    qdq = sum(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)
    echo(f"exported @{graph.name} to {args.onnx}: {len(model.graph.node)} ONNX nodes"
         + (f" ({qdq} QuantizeLinear/DequantizeLinear)" if qdq else "")
         + f", opset {model.opset_import[0].version}")
    return 0
