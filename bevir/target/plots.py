"""The cycle model's plots (matplotlib, Agg): a per-core timeline and a roofline."""
from __future__ import annotations

from pathlib import Path

from ..extras import pyplot

plt = pyplot()

from ..fsutil import save_figure  # noqa: E402

COLORS = {"compute": "tab:blue", "alu": "tab:orange", "ocm": "tab:green",
          "broadcast": "tab:olive", "ddr": "tab:red", "barrier": "tab:gray",
          "launch": "tab:purple"}


def timeline_plot(profile, path: Path) -> Path:
    """One row per core, one bar per op from its start, coloured by what bounds it."""
    fig, ax = plt.subplots(figsize=(12, 1.8 + 0.6 * profile.hw.cores))
    for r in profile.records:
        if r.own_cycles:
            ax.barh(r.core, r.own_cycles, left=r.start, color=COLORS[r.bound], height=0.8)
    ax.set_yticks(range(profile.hw.cores), [f"core {i}" for i in range(profile.hw.cores)])
    ax.set_xlabel("cycles")
    ax.set_title(f"{profile.hw.label}: makespan {profile.makespan:,} cycles")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax.legend(handles, list(COLORS), ncol=7, fontsize=7, loc="upper center",
              bbox_to_anchor=(0.5, -0.25))         # below the axes: no core hidden
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
