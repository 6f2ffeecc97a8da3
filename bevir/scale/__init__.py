"""Work over many frames, in this process or on Ray: frame sets, calibration, evaluation,
design-space sweeps.

    from bevir.scale import Frames, Workers
    frames = Frames("frames/")                          # safetensors shards + frames.json
    workers = Workers(ray="local")                      # or a cluster address, or None
    ranges, failed = bevir.scale.calibrate(graph, frames, workers=workers, method="entropy")
    report = bevir.scale.evaluate(float_graph, int8_graph, frames, "eval/", workers=workers)

Results do not depend on where the work ran: the same task code runs in this process and
in Ray's workers, statistics merge exactly, per-frame results are kept per frame. See
docs/scale.md.
"""
from .calibrate import FrameFailure, FrameFeed, calibrate
from .frames import FrameIndexError, Frames, FrameSetError, FrameWriter
from .evaluate import Evaluation, evaluate
from .runner import GraphRef, Plugins, ScaleError, Workers
from .sweep import sweep

__all__ = ["Evaluation", "FrameFailure", "FrameFeed", "FrameIndexError", "FrameSetError",
           "FrameWriter", "Frames", "GraphRef", "Plugins", "ScaleError", "Workers", "calibrate",
           "evaluate", "sweep"]
