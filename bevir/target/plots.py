"""The cycle model's plots (matplotlib, Agg): a per-core timeline and a roofline."""
from __future__ import annotations

from pathlib import Path

from ..extras import pyplot
from ..fsutil import save_figure

plt = pyplot()

COLORS = {"compute": "tab:blue", "alu": "tab:orange", "ocm": "tab:green",
          "broadcast": "tab:olive", "ddr": "tab:red", "barrier": "tab:gray",
          "launch": "tab:purple", "wait": "#dddddd", "dma": "tab:brown", "kernel": "tab:blue",
          "host": "tab:pink"}


def timeline_plot(profile, path: Path) -> Path:
    """Per core a compute lane (each step coloured by what bounds it, waits light) and a
    DMA lanes: the modelled trace (:func:`~bevir.target.trace.model_trace`) drawn."""
    from .trace import model_trace
    return trace_plot(model_trace(profile).to_json(), path,
                      f"{profile.hw.label}: makespan {profile.makespan:,} cycles",
                      unit=("cycles", profile.hw.clock_ghz * 1e3))


def trace_plot(trace: dict, path: Path, title: str,
               unit: tuple[str, float] = ("µs", 1.0)) -> Path:
    """A Trace Event file's lanes (``bevir sim --trace`` or ``bevir exec --trace``) drawn
    as Perfetto lays them out: one row per process and lane, one bar per slice, coloured by
    category; ``unit``: the x axis's name and units per microsecond."""
    events = trace["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    procs = {e["pid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    slices = [e for e in events if e["ph"] == "X" and e["dur"] > 0]
    lanes = sorted({(e["pid"], e["tid"]) for e in slices})
    row = {lane: i for i, lane in enumerate(reversed(lanes))}
    fig, ax = plt.subplots(figsize=(12, 1.6 + 0.35 * len(lanes)))
    scale, cats = unit[1], sorted({e["cat"] for e in slices})
    for cat in cats:
        for e in (e for e in slices if e["cat"] == cat):
            ax.barh(row[e["pid"], e["tid"]], e["dur"] * scale, left=e["ts"] * scale,
                    height=0.8, color=COLORS.get(cat, "tab:cyan"))
    labels = [(procs.get(p, str(p)), names.get((p, t), str(t))) for p, t in reversed(lanes)]
    ax.set_yticks(range(len(lanes)), [a if a == b else f"{a} {b}" for a, b in labels])
    ax.set_xlabel(unit[0])
    ax.set_title(title)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS.get(c, "tab:cyan")) for c in cats]
    ax.legend(handles, cats, ncol=8, fontsize=7, loc="upper center",
              bbox_to_anchor=(0.5, -0.25))         # below the axes: no lane hidden
    fig.tight_layout()
    save_figure(fig, path, dpi=90)
    plt.close(fig)
    return path


def roofline_plot(profile, path: Path) -> Path:
    """Per op: MACs per cycle against MACs per byte moved to the array; the roofs are the
    core's peak MACs per cycle and the OCM bandwidth."""
    hw = profile.hw
    pts = [(r.macs / r.bytes["array"], r.macs / r.own_cycles, r.bound) for r in profile.records
           if r.macs and r.bytes.get("array") and r.own_cycles]
    fig, ax = plt.subplots(figsize=(7, 5))
    xs = [p[0] for p in pts] or [1.0]
    lo, hi = min(xs + [0.1]) / 2, max(xs + [hw.peak_macs_per_cycle / hw.ocm_bytes_per_cycle]) * 2
    knee = hw.peak_macs_per_cycle / hw.ocm_bytes_per_cycle
    ax.plot([lo, knee, hi], [lo * hw.ocm_bytes_per_cycle, hw.peak_macs_per_cycle,
                             hw.peak_macs_per_cycle], "k-", lw=1, label="roof (OCM, MACs)")
    for bound in COLORS:
        sel = [p for p in pts if p[2] == bound]
        if sel:
            ax.scatter([p[0] for p in sel], [p[1] for p in sel], s=12, color=COLORS[bound],
                       label=bound)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("MACs per array byte")
    ax.set_ylabel("MACs per cycle (one core)")
    ax.set_title(f"roofline: {hw.label}, utilisation {profile.utilisation:.1%}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=90)
    plt.close(fig)
    return path
