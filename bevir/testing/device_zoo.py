"""The zoos on the GPNPU: each model as a user takes it there with the CLI (``from_torch``
import, ``bevir quantize`` with the default config, ``bevir compile --hw``, ``bevir exec
--check``), through the library calls those commands make, measured as one row::

    from bevir.testing.device_zoo import device_row
    row = device_row("timm/resnet26d")          # or "tv/resnet18" (bevir.testing.zoo)
    print(row.line())

A row holds the compiled program's stages (device and host), the elements of its outputs
that differ from the golden model, the INT8 vs float SQNR of the outputs (dB, the lowest
over them) on the example input and on a held-out one, the layers the config's
``widen_to`` moved to 16-bit activations (measured on the example input, as ``bevir
quantize --inputs`` does), and the first failure (the step, op and node) where a step
fails, or what runs on the host. Calibration: the example input and ``CALIBRATION - 1``
more drawn as the zoo draws its inputs (seeds 1, 2, ...); the held-out input is the next
seed. ``bench/bench_zoo_device.py`` prints the table over the zoos.
"""
from __future__ import annotations

import contextlib
import io
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..extras import require

__all__ = ["DeviceRow", "device_row", "names", "HW", "CALIBRATION", "HEADER"]

#: the hardware the issue's table is measured on (``bevir compile --hw``)
HW = "QC-U 8MB 16MAC x4"
#: calibration frames (the example input first)
CALIBRATION = 4


@dataclass
class DeviceRow:
    """One model on the device: see the module's docstring."""

    name: str
    family: str = ""
    device_stages: int = 0
    host_stages: int = 0
    differing: int | None = None
    sqnr: float | None = None
    sqnr_heldout: float | None = None
    widened: int = 0
    float_left: dict[str, int] = field(default_factory=dict)
    failure: str = ""
    seconds: float = 0.0

    @property
    def one_device_stage(self) -> bool:
        return self.device_stages == 1 and self.host_stages == 0

    def line(self) -> str:
        def db(x: float | None) -> str:
            return "-" if x is None else f"{x:.1f}"
        stages = f"{self.device_stages}d+{self.host_stages}h"
        diff = "-" if self.differing is None else str(self.differing)
        return (f"{self.name:28} {self.family:18} {stages:>7} {diff:>5} {db(self.sqnr):>6} "
                f"{db(self.sqnr_heldout):>6} {self.widened:>5} {self.seconds:5.0f}s  "
                f"{self.failure}")


HEADER = (f"{'model':28} {'family':18} {'stages':>7} {'diff':>5} {'SQNR':>6} {'held':>6} "
          f"{'i16':>5} {'time':>6}  first failure")


def names() -> list[str]:
    """Every model of both zoos: ``tv/<name>`` (bevir.testing.zoo) and the hub zoo's."""
    from .hub_zoo import MODELS as HUB
    from .zoo import MODELS as TV
    return [f"tv/{n}" for n in TV] + list(HUB)


def _model_and_frames(name: str, frames: int):
    """The model, its family and ``frames`` input tuples (the example input first)."""
    torch = require("torch")
    if name.startswith("tv/"):
        from . import zoo
        tv = name[3:]
        model, x = zoo.build(tv)
        shape = zoo.input_shape(tv)
        extra = [(torch.randn(shape, generator=torch.Generator().manual_seed(s)),)
                 for s in range(1, frames)]
        return model, tv, [(x,), *extra]
    from . import hub_zoo
    model, inputs = hub_zoo.build(name)
    draw = hub_zoo.INPUTS[hub_zoo.MODELS[name].inputs]
    extra = [draw(torch.Generator().manual_seed(s)) for s in range(1, frames)]
    return model, hub_zoo.MODELS[name].family, [inputs, *extra]


def _sqnr(graph, q, feed) -> float:
    from ..sim import run
    want, got = run(graph, feed), run(q, feed)
    worst = float("inf")
    for k, ref in want.items():
        ref = np.asarray(ref, np.float64)
        err = np.asarray(got[k], np.float64) - ref
        noise = float(np.sum(err * err))
        worst = min(worst, float("inf") if noise == 0 else
                    10 * np.log10(max(float(np.sum(ref * ref)), 1e-30) / noise))
    return worst


def _failure(step: str, e: Exception) -> str:
    text = " ".join(str(e).split())
    return f"{step}: {type(e).__name__}: {text[:300]}"


def device_row(name: str, hw: str = HW, frames: int = CALIBRATION,
               config: str = "default") -> DeviceRow:
    """Measure zoo model ``name`` (see :func:`names`) on ``hw``: a :class:`DeviceRow`."""
    from ..codegen.program import Program
    from ..errors import BevirError
    from ..flows.target import compile_program
    from ..passes import optimize
    from ..passes.calibrate import calibrate
    from ..passes.precision import widen
    from ..passes.quantize import load_config, quantize
    from ..sim import run
    t0 = time.perf_counter()
    torch = require("torch")
    model, family, inputs = _model_and_frames(name, frames + 1)
    row = DeviceRow(name, family)
    step = "import"
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            graph = _from_torch(model, list(inputs[0]))
        feeds = [{v.name: a.numpy() for v, a in zip(graph.inputs, x)} for x in inputs]
        step = "quantize"
        calibrate(graph, feeds[:frames], progress=False)
        cfg = load_config(config)
        if cfg.widen_to is not None:          # as bevir quantize does, on the example input
            cfg, _, row.widened = widen(graph, feeds[0], cfg, cfg.widen_to)
        q = graph.clone()
        quantize(q, cfg)
        optimize(q, "cse,dce")
        row.float_left = _float_ops(q)
        row.sqnr, row.sqnr_heldout = _sqnr(graph, q, feeds[0]), _sqnr(graph, q, feeds[-1])
        step = "compile"
        with tempfile.TemporaryDirectory() as tmp:
            program = compile_program(q, f"{tmp}/prog", hw=hw)
            stages = program.manifest["stages"]
            row.device_stages = sum(1 for s in stages if s["device"])
            row.host_stages = len(stages) - row.device_stages
            step = "exec"
            got, golden = program.run(feeds[0]), run(program.graph, feeds[0])
            row.differing = sum(int(np.count_nonzero(got[k] != golden[k])) for k in golden)
            if row.differing:
                report = Program(program.graph, "c").check(feeds[0])
                row.failure = f"exec: first differing kernel: {report.mismatch}"
        if not row.failure and not row.one_device_stage:
            row.failure = f"host: {_host_summary(q)}"
    except Exception as e:    # noqa: BLE001  (the table records it)
        row.failure = _failure(step, e)
        if not isinstance(e, BevirError):
            row.failure += " @ " + traceback.extract_tb(e.__traceback__)[-1].name
    del torch
    row.seconds = time.perf_counter() - t0
    return row


def _from_torch(model, inputs):
    from ..frontends.torch import from_torch
    return from_torch(model, inputs)


def _float_ops(q) -> dict[str, int]:
    from collections import Counter
    from ..target.schedule import lowerable
    return dict(Counter(n.op for n in q.nodes if not lowerable(n)).most_common())


def _host_summary(q) -> str:
    from ..target.schedule import lowerable
    host = [n for n in q.nodes if not lowerable(n)]
    ops = _float_ops(q)
    first = host[0] if host else None
    where = f" (first: {first.op} '{first.name}' at {first.loc or '?'})" if first else ""
    return ", ".join(f"{op} {k}" for op, k in list(ops.items())[:6]) + where
