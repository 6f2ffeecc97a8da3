"""The golden interpreter: ``bevir run`` (a model, planned for the target or not) and ``bevir
inputs`` (an inputs file for a model: seeded random arrays or zeros)."""
from __future__ import annotations

import numpy as np

from .common import (check_output_dir, describe_array, echo, echo_err, load_graph, planned,
                     plugin_options, read_inputs, write_results)


# ---- run ---------------------------------------------------------------------------------
def add_run(sub) -> None:
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
    plugin_options(s)
    s.set_defaults(fn=cmd_run)


def cmd_run(args) -> int:
    from ..sim import run
    check_output_dir(args.output)
    graph = load_graph(args.model)
    inputs = read_inputs(graph, args.inputs)
    fetch = None
    if args.fetch:
        fetch = "all" if args.fetch == ["all"] else args.fetch
    if args.cores is not None or args.plan or args.hw:
        from ..passes.partition import format_plan
        _, graph = planned(graph, args.hw, args.cores, args.plan)
        echo_err("\n".join(format_plan(graph.meta["partition"]).splitlines()[1:3]).strip())
    write_results(run(graph, inputs, fetch=fetch), args.output)
    return 0


# ---- inputs ------------------------------------------------------------------------------
def add_inputs(sub) -> None:
    s = sub.add_parser("inputs", help="write an inputs file for a model: seeded random "
                       "arrays (as opt --verify-numerics probes with) or zeros")
    s.add_argument("model", help="a .bevir or .onnx file")
    s.add_argument("-o", "--output", required=True, metavar="FILE.safetensors",
                   help="the inputs file (for run, exec, quantize --inputs)")
    kind = s.add_mutually_exclusive_group()
    kind.add_argument("--seed", type=int, default=0, help="the random seed (default 0): "
                      "floats standard normal, integers over their range (at most int16's)")
    kind.add_argument("--zeros", action="store_true", help="zeros instead")
    plugin_options(s)
    s.set_defaults(fn=cmd_inputs)


def cmd_inputs(args) -> int:
    from ..fsutil import save_arrays
    from ..passes.instruments import probe_inputs
    check_output_dir(args.output)
    graph = load_graph(args.model)
    inputs = ({v.name: np.zeros(v.type.shape, v.type.dtype.np) for v in graph.inputs}
              if args.zeros else probe_inputs(graph, args.seed))
    for name, a in inputs.items():
        echo(f"{name}: {describe_array(a)}")
    save_arrays(inputs, args.output)
    echo(f"wrote {args.output}: {len(inputs)} inputs "
         f"({'zeros' if args.zeros else f'random, seed {args.seed}'})")
    return 0
