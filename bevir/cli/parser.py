"""The ``bevir`` argument parser: the top-level options and a sub-parser per command, each
defined beside its command (``add_<command>`` in the command's module)."""
from __future__ import annotations

import argparse

from .. import __version__
from . import frames, golden, models, npu, opt

#: the commands, in the order ``bevir --help`` lists them
COMMANDS = (models.add_import, models.add_quantize_backbone, models.add_quantize,
            models.add_show, opt.add_opt, golden.add_run, golden.add_inputs, npu.add_compile,
            models.add_export, npu.add_exec, npu.add_sim, npu.add_sweep, frames.add_calibrate,
            frames.add_evaluate, opt.add_passes)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bevir", description="bevir: a graph-IR compiler for an "
                                "INT8 NPU. Import, inspect, optimize and run models.")
    p.add_argument("--version", action="version", version=f"bevir {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in COMMANDS:
        add(sub)
    return p
