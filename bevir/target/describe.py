"""A planned graph's schedule as text (``bevir show --schedule``): the modelled figures,
the layers run stripe by stripe of images, the splits, what the memory plan moved, and
where the cycles go, each with its modelled cycles.

    print(describe_schedule(planned_graph, model(planned_graph, hw)))
"""
from __future__ import annotations

from collections import Counter, defaultdict

from ..ir.graph import Graph
from .cycles import Profile


def _line(label: str, cycles: Counter, counts: Counter) -> str:
    parts = ", ".join(f"{k} {counts[k]} ({cycles[k]:,} cycles)"
                      for k, _ in sorted(cycles.items(), key=lambda kv: -kv[1]))
    return f"  {label}: {parts or 'none'}"


def describe_schedule(graph: Graph, profile: Profile) -> str:
    """The schedule of ``graph`` (planned) as ``profile`` models it: one line of figures,
    then the striped groups (and the stripe widths weighed), the splits by kind, the
    memory plan's transfers, the steps by what bounds them and the costliest steps.
    Cycles are the steps' own cycles summed over the cores."""
    hw = profile.hw
    own = {(r.core, r.name): r.own_cycles for r in profile.records}
    node_cycles = defaultdict(int)
    for (_, name), c in own.items():
        node_cycles[name] += c
    lines = [f"schedule of @{graph.name} on {hw.option_text()}: makespan "
             f"{profile.makespan:,} cycles ({profile.makespan / (hw.clock_ghz * 1e6):.2f} ms), "
             f"utilisation {profile.utilisation:.1%}, DDR {profile.ddr_bytes:,} bytes",
             "  cycles per core: " + ", ".join(f"{c:,}" for c in profile.cycles_per_core)
             + "; waiting: " + ", ".join(f"{w:,}" for w in profile.wait_cycles_per_core)]
    groups: dict[int, dict] = {}
    for n in graph.nodes:
        s = n.meta.get("stripe")
        if s is not None:
            g = groups.setdefault(s["group"], {"of": [], "stripes": s["stripes"], "cycles": 0,
                                               "images": s.get("images", 1), "loc": n.loc,
                                               "cascade": s.get("cascade", s["group"])})
            if s["of"] not in g["of"]:
                g["of"].append(s["of"])
    for n in graph.nodes:                  # the pieces of striped nodes count with them
        s = n.meta.get("stripe")
        if s is not None:
            groups[s["group"]]["cycles"] += node_cycles.get(n.name, 0)
    lines.append(f"  run stripe by stripe: {len(groups)} group(s)")
    weighed = graph.meta.get("stripe_groups", [])
    for k, g in sorted(groups.items()):
        lines.append(f"    group {k} (cascade {g['cascade']}): {len(g['of'])} ops x "
                     f"{g['stripes']} stripes of {g['images']} image(s) from "
                     f"%{g['of'][0]} ({g['loc'] or '-'}) to %{g['of'][-1]}: "
                     f"{g['cycles']:,} cycles")
        widths = weighed[k].get("widths") if k < len(weighed) else None
        if widths and len(widths) > 1:
            lines.append("      images a stripe that fit, array cycles as modelled: " + ", ".join(
                f"{w}: {c:,}" + (" (chosen)" if int(w) == g["images"] else "")
                for w, c in sorted(widths.items(), key=lambda wc: int(wc[0]))))
    kinds, kind_cycles = Counter(), Counter()
    for n in graph.nodes:
        p = n.meta.get("piece") or n.meta.get("copy")
        kind = p.get("kind", "copies") if p else "none (one core)"
        kinds[kind] += 1 if not p or p["index"] == 0 else 0
        kind_cycles[kind] += node_cycles.get(n.name, 0)
    lines.append(_line("splits (ops)", kind_cycles, kinds))
    moved, moved_cycles = Counter(), Counter()
    for r in profile.records:
        n = graph.nodes[r.index]
        if n.op == "dma_copy":
            what = {"prefetch": "prefetched loads", "spill": "asynchronous stores"}.get(
                r.bound, "stores" if n.attrs["dst"] == "ddr" else "loads")
        elif "stream" in n.meta:
            what = "streamed ops"
        elif r.bound == "view":
            what = "views"
        else:
            continue
        moved[what] += 1
        moved_cycles[what] += r.own_cycles
    lines.append(_line("memory plan (steps)", moved_cycles, moved))
    bounds, bound_cycles = Counter(), Counter()
    for r in profile.records:
        bounds[r.bound] += 1
        bound_cycles[r.bound] += r.own_cycles
    lines.append(_line("steps by bound", bound_cycles, bounds))
    lines.append("  costliest steps:")
    for r in profile.top(5):
        lines.append(f"    {r.op} {r.name} ({r.loc or '-'}) core {r.core}: "
                     f"{r.own_cycles:,} cycles, {r.bound}-bound, {r.ddr_bytes:,} DDR bytes")
    return "\n".join(lines)
