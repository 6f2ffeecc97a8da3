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

The commands by module: :mod:`.models` (import, quantize-backbone, quantize, show, export),
:mod:`.opt` (opt, passes), :mod:`.golden` (run, inputs), :mod:`.npu` (compile, exec, sim,
sweep), :mod:`.frames` (calibrate, evaluate); each defines its options beside it
(``add_<command>``), :mod:`.parser` puts them together and :mod:`.common` holds what they
share.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from ..errors import BevirError
from ..plugins import load_plugins
from .common import (CliError, ScaleFailure, check_inputs, echo_err, load_graph, planned,
                     read_inputs, round_trips_note, write_results)
from .frames import cmd_calibrate, cmd_evaluate
from .golden import cmd_inputs, cmd_run
from .models import (cmd_export, cmd_import, cmd_quantize, cmd_quantize_backbone, cmd_show,
                     host_note, summary)
from .npu import cmd_compile, cmd_exec, cmd_sim, cmd_sweep
from .opt import cmd_opt, cmd_passes
from .parser import build_parser

__all__ = ["main", "build_parser", "CliError", "ScaleFailure", "load_graph", "planned",
           "check_inputs", "read_inputs", "write_results", "round_trips_note", "host_note",
           "summary", "cmd_import", "cmd_quantize_backbone", "cmd_quantize", "cmd_show",
           "cmd_opt", "cmd_run", "cmd_inputs", "cmd_compile", "cmd_export", "cmd_exec",
           "cmd_sim", "cmd_sweep", "cmd_calibrate", "cmd_evaluate", "cmd_passes"]


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
        echo_err("bevir: error: " + _one_line(str(e)))
    except BrokenPipeError:     # the reader stopped early (| head): nothing to report
        # stdout to /dev/null, or flushing it at exit fails once more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13         # as a process that SIGPIPE ended (the shell's convention)
    except OSError as e:
        echo_err(f"bevir: error: {_os_message(e)}")
    except KeyboardInterrupt:
        echo_err("bevir: error: interrupted")
        return 130
    except Exception as e:      # a bug, not bad input: still one line unless asked
        if os.environ.get("BEVIR_TRACEBACK"):
            raise
        echo_err(f"bevir: error: internal error: {type(e).__name__}: {_one_line(str(e))} "
                 "(BEVIR_TRACEBACK=1 shows the traceback)")
    return 1


def _one_line(text: str) -> str:
    return " ".join(text.split("\n"))
