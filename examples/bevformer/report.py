"""report.html: the e2e flow's figures (report.json) and pictures on one page."""
from __future__ import annotations

import html
from pathlib import Path


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _comparison(cmp: dict, a: str, b: str) -> list:
    return [f"{a} vs {b}", f"{cmp['num_a']} / {cmp['num_b']}",
            f"{cmp['top10_label_match']}/10", f"{cmp['bev_iou_match']}/10",
            f"{cmp['mean_iou']:.3f}", f"{cmp['score_diff_max']:.6f}"]


def _figure(src: str, caption: str) -> str:
    return (f'<figure><img src="{html.escape(src)}"><figcaption>{html.escape(caption)}'
            "</figcaption></figure>")


def sections(report: dict) -> list[str]:
    """The page's sections, in order: steps, detections, validation, cycles, pictures."""
    steps = [[name, f"{t:.2f} s", "-"] for name, t in report["steps_s"].items()]
    steps.append(["total", f"{sum(report['steps_s'].values()):.2f} s", "-"])
    steps += [[r["what"], f"{r['bevir_s']:.2f} s", reference_note(r)]
              for r in report.get("against_reference_flow", [])]
    out = ["<h2>Steps</h2>", _table(["step", "bevir", "reference flow"], steps)]

    scene = report.get("scene_objects")
    if scene:
        out += ["<h2>Detections</h2>",
                f"<p>The synthetic scene holds {scene['objects']} objects. A model finds one "
                f"with a box of its class, score at least {scene['threshold']}, whose centre "
                f"lies within {scene['within_m']:g} m of the object's. "
                f"{html.escape(threshold_note(scene))}.</p>",
                _table(["model", "objects found", "other boxes above the threshold",
                        "scores of the boxes that found one", "best other score"],
                       [[name, f"{f['found']}/{f['objects']}", f["extra"],
                         ", ".join(f"{v:.2f}" for v in f["scores"]) or "-",
                         f"{f['best_other']:.2f}"] for name, f in scene["found"].items()])]

    rows = [_comparison(report["comparison"], "float golden", "PyTorch"),
            _comparison(report["int8"]["comparison"], "INT8 golden", "float golden"),
            _comparison(report["int8"]["comparison_float_first"], "float golden", "INT8 golden")]
    dev = report.get("device")
    if dev:
        rows.append(_comparison(dev["comparison"], "program", "INT8 golden"))
    out += ["<h2>Validation</h2>",
            _table(["pair", "detections", "top-10 labels", "top-10 BEV IoU > 0.5", "mean IoU",
                    "max score diff"], rows)]
    facts = [["float golden vs PyTorch, max |diff|",
              ", ".join(f"{k} {v:.2e}" for k, v in report["max_abs_diff"].items())],
             ["INT8 golden vs float, SQNR",
              ", ".join(f"{k} {v:.1f} dB" for k, v in report["int8"]["sqnr_db"].items())],
             ["the reference flow's check (top-10 BEV IoU, the stricter way round)",
              "{bev_iou_match_both_ways}/10, threshold {min_iou_match}: {verdict}".format(
                  **report["int8"]["check"],
                  verdict="pass" if report["int8"]["check"]["passed"] else "fail")]]
    if dev:
        facts.append(["program vs INT8 golden, differing elements",
                      ", ".join(f"{k} {v}" for k, v in dev["differing"].items())])
    out.append(_table(["check", "result"], facts))

    if dev:
        c = dev["cycles"]
        out += ["<h2>Cycles</h2>",
                f"<p>{html.escape(dev['hw'])}: makespan {c['makespan_cycles']:,} cycles "
                f"({c['makespan_ms']:.2f} ms), utilisation {c['utilisation']:.1%}, "
                f"{dev['kernels']} kernels.</p>",
                _table(["core", "cycles"], [[k, f"{v:,}"] for k, v in
                                            enumerate(c["cycles_per_core"])]),
                _table(["cycles", "core", "op", "layer", "bound"],
                       [[f"{r['cycles']:,}", r["core"], r["op"], r["loc"], r["bound"]]
                        for r in c["top_ops"][:10]]),
                "<p>Traces to open in <a href='https://ui.perfetto.dev'>Perfetto</a> or "
                "chrome://tracing: <a href='cycles/trace.json'>the modelled run</a> (cycles), "
                "<a href='cycles/exec_trace.json'>the program's run on this host</a> "
                "(measured).</p>"]

    out.append("<h2>Pictures</h2>")
    out += [_figure(f, caption) for f, caption in report.get("pictures", [])]
    out.append(_figure("int8_layers.png", "INT8 against float, SQNR per layer"))
    if dev:
        out += [_figure("cycles/timeline.png",
                        "per-core cycle timeline (colour: what bounds each op)"),
                _figure("cycles/roofline.png", "roofline: each op's MACs per cycle")]
    return out


def reference_note(row: dict) -> str:
    """The reference flow's time for ``row``'s work, and how this run compares."""
    ref = f"reference flow ~{row['reference_s'] / 60:.0f} min on {row['reference_config']}"
    if row["ratio"] is None:
        return f"{ref} (this run is {row['config']}: not the same work, no ratio)"
    return f"{ref}: {row['ratio']:.4f}x"


def threshold_note(figures: dict) -> str:
    """What the score threshold separates, in the main model's scores."""
    main = "program" if "program" in figures["found"] else "INT8 golden"
    f = figures["found"][main]
    scores = f"{min(f['scores']):.2f}-{max(f['scores']):.2f}" if f["scores"] else "none"
    return (f"the threshold ({figures['threshold']}, --score-threshold) picks the boxes the "
            f"model believes from the {figures['kept']} it always keeps: the {main}'s boxes on the "
            f"scene's objects score {scores}, its best other box {f['best_other']:.2f}")


def weights_text(weights: dict) -> str:
    """The weights of report.json's ``weights`` in words."""
    if weights.get("synthetic") == "true":
        return f"synthetic, preset {weights['preset']}, seed {weights['seed']}"
    return f"checkpoint {weights['source']}"


def write_html(path: str | Path, report: dict) -> Path:
    """One self-contained page (pictures linked relative to it) of ``report``."""
    title = f"bevir: BEVFormer ({report['config']}) end to end"
    style = ("body{font-family:sans-serif;margin:2em;max-width:1500px}"
             "table{border-collapse:collapse;margin:0.6em 0}"
             "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;font-size:13px}"
             "img{max-width:100%;border:1px solid #ddd}figure{margin:1em 0}")
    page = ["<!doctype html>", "<html><head><meta charset='utf-8'>",
            f"<title>{html.escape(title)}</title><style>{style}</style></head><body>",
            f"<h1>{html.escape(title)}</h1>",
            f"<p>weights: {html.escape(weights_text(report['weights']))}; {report['nodes']} "
            "nodes in the "
            f"float graph, {report['int8']['nodes']} in the INT8 graph. "
            "All figures: <a href='report.json'>report.json</a>.</p>"]
    page += sections(report)
    page.append("</body></html>")
    path = Path(path)
    path.write_text("\n".join(page) + "\n")
    return path
