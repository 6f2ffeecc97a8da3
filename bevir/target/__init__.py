"""The target: the GPNPU's description (HWConfig), the schedule of a lowered graph (where
each value lives, what each core does step by step) and the cycle model that costs it.

    from bevir.target import HWConfig, model, schedule_of
    hw = HWConfig.parse("QC-U 8MB 16MAC x4")
    profile = model(planned_graph, hw)            # cycles, DDR bytes, waits per core

The layer sits between the ops and the passes: passes (partition, plan-memory) and code
generation read its vocabulary; it imports neither.
"""
from .check import check_schedule  # noqa: F401
from .cycles import OpCost, OpRecord, Profile, model, op_cost, simulate  # noqa: F401
from .hw import GB, KB, MB, HWConfig, HWConfigError, format_size, parse_size  # noqa: F401
from .schedule import (MemoryMap, Schedule, ScheduleError, Step, Transfer, core_of,  # noqa: F401
                       lowerable, run_order, schedule_of, stages)
