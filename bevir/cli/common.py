"""What the commands share: their errors, output lines, reading models, inputs and hardware
configs, planning as ``bevir compile`` plans, writing results, the notes after a
quantization or a compilation, and the options every command (or every command over many
frames) takes."""
from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..errors import BevirError


class CliError(BevirError):
    """A command-line usage problem found after argument parsing."""


class ScaleFailure(BevirError):
    """Some frames of a data set failed (each reported); the rest completed."""


def echo(text: str) -> None:
    """Write a line to stdout."""
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def echo_err(text: str) -> None:
    """Write a line to stderr."""
    sys.stderr.write(text if text.endswith("\n") else text + "\n")


# ---- options ---------------------------------------------------------------------------
def plugin_options(s: argparse.ArgumentParser) -> None:
    s.add_argument("--load", action="append", default=[], metavar="FILE.py",
                   help="import this Python file first: the passes and ops it defines "
                   "register themselves (repeatable)")
    s.add_argument("--load-module", action="append", default=[], metavar="NAME",
                   help="import this module first, like --load (repeatable)")


def scale_options(s: argparse.ArgumentParser) -> None:
    s.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                   help="run on Ray: alone, an embedded Ray on this machine's cores; with an "
                   "address (e.g. ray://head:10001 or auto), that cluster")
    s.add_argument("--workers", type=int, metavar="N",
                   help="cores of the embedded Ray (default: all of this machine's)")
    plugin_options(s)


def parse_list(text: str | None, flag: str, read) -> list:
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


# ---- models, hardware, plans -------------------------------------------------------------
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


def read_hw(text: str):
    """A HWConfig from a preset, a vendor string or a .json file of its fields (as
    ``sim --fit`` writes)."""
    from ..fsutil import read_json
    from ..target.hw import HWConfig, HWConfigError
    if text.endswith(".json"):
        return HWConfig(**read_json(text, HWConfigError))
    return HWConfig.from_option(text)


def planned(graph, hw_text: str | None, cores: int | None, plan: str | None = None):
    """``graph`` planned for the target as ``bevir compile`` plans it: for ``hw_text``
    (default QC-U x4) with ``cores`` replacing its cores, a partition plan file replayed if
    given. (The config, the planned graph.)"""
    from ..flows.target import hw_config
    from ..passes import make_pass, optimize
    from ..passes.target import plan_for_target
    hw = hw_config(read_hw(hw_text or "qc-u-4c"), cores)
    if plan and "partition" not in graph.meta:
        graph = optimize(graph.clone(), [make_pass("partition", hw=hw, plan=plan)])
    return hw, plan_for_target(graph, hw)


def round_trips_note(graph) -> str | None:
    """The host round trips between device stages of ``graph`` (values sent to the host
    and back through float ops a quantization left), with the first ops that make them."""
    from ..target.schedule import host_float_op, host_round_trips
    trips = host_round_trips(graph)
    if not trips:
        return None
    ops = [n for nodes in trips for n in nodes if host_float_op(n)]
    first = ", ".join(f"{n.op} '{n.loc or n.name}'" for n in ops[:3])
    return (f"{len(trips)} host round trip(s) between device stages, through float ops the "
            f"quantization left: {first}{', ...' if len(ops) > 3 else ''}")


# ---- inputs and results ----------------------------------------------------------------
def describe_array(a: np.ndarray) -> str:
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
    from ..sim.interpreter import bind_input, check_input_names
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
            echo_err(f"bevir: note: input '{name}' is {a.dtype}, cast to {t.dtype.np} as "
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


def check_output_dir(path: str | None) -> None:
    if path and not Path(path).resolve().parent.is_dir():
        raise CliError(f"cannot write {path}: no directory '{Path(path).resolve().parent}'")


def write_results(results: dict, path: str | None,
                  check: Callable[[], None] | None = None) -> None:
    """Print a line per result and write them to safetensors file ``path`` if given, whole
    or not at all; ``check()``, if given, runs between the two (a failed check leaves no
    file)."""
    from safetensors import SafetensorError
    from ..fsutil import save_arrays
    for name, a in results.items():
        echo(f"{name}: {describe_array(np.asarray(a))}")
    if check is not None:
        check()
    if path:
        try:
            save_arrays(results, path)
        except (SafetensorError, OSError) as e:
            raise CliError(f"cannot write {path}: {e}") from None
        echo(f"wrote {path}: {len(results)} tensors")


# ---- many frames -------------------------------------------------------------------------
def workers_of(args):
    """Where the frames' work runs: --ray [ADDRESS] (Ray), else this process."""
    from ..scale import Plugins, Workers
    if args.workers is not None and args.ray is None:
        raise CliError("--workers sets the cores of an embedded Ray: add --ray")
    return Workers(ray=args.ray, cpus=args.workers,
                   plugins=Plugins(tuple(args.load), tuple(args.load_module)))
