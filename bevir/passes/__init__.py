"""Passes: the pass manager, instruments, analyses and the passes themselves.

    import bevir
    bevir.optimize(graph, "canonicalize,cse,dce")

    from bevir.passes import PassManager, Timing
    timing = Timing()
    PassManager("canonicalize{fold_limit=65536},cse,dce", instruments=[timing]).run(graph)
    print(timing.report())
"""
from .analysis import AnalysisManager, CostSummary, Liveness  # noqa: F401
from .core import (Instrument, Pass, all_passes, get_pass, make_pass, parse_pipeline,  # noqa: F401
                   pipeline_text)
from .manager import PassManager, optimize, replay  # noqa: F401
from .instruments import (DumpIR, Reproducer, Statistics, Timing, VerifyEach,  # noqa: F401
                          VerifyNumerics, probe_inputs)
from .rewrites import RewriteLog, RewriteRecord, limit_rewrites, rewrite_permitted  # noqa: F401
from . import canonicalize, cse, dce, decompose  # noqa: F401  (registers the passes)
from . import fuse  # noqa: F401  (registers fuse)
from . import fold_qdq  # noqa: F401  (registers fold-qdq)
from . import bridge, sink_dequantize  # noqa: F401  (registers insert-bridges, sink-dequantize)
from . import quantize  # noqa: F401  (registers quantize)
from . import partition, stripe  # noqa: F401  (registers partition, stripe-images)
from .quantize import float_ops_between  # noqa: F401
from .layout import ToNHWC, count_layout_transforms  # noqa: F401  (registers to-nhwc)
from .canonicalize import Canonicalize  # noqa: F401
from .cse import CSE  # noqa: F401
from .dce import DCE  # noqa: F401
from .calibrate import AttachedRanges, Calibrate, CalibrationError, Ranges  # noqa: F401
from .memory_plan import MemoryPlan, PlanMemory, memory_plan_of, verify_memory_plan  # noqa: F401  (registers plan-memory)
