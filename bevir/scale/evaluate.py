"""Evaluation over a frame set: a reference model (float) against a candidate (INT8, or
any other), frame by frame, in this process or on Ray.

    ev = bevir.scale.evaluate(float_graph, int8_graph, Frames("frames/"), "eval/",
                              workers=Workers(ray="local"))
    print(ev.table()); ev.worst(5)

Per frame: the SQNR of every output the two models share (the candidate's dequantized),
and where the frame set (or ``head``) describes a detection head, the reference flow's
check both ways: top-10 label agreement, score differences, and how many of the
reference's top-10 boxes the candidate's top 10 match by rotated BEV IoU > 0.5 and vice
versa. With ``program`` (a folder from ``bevir compile``), the generated program runs too
and its differing elements against the candidate's golden outputs are counted.

Results go to ``out/frames.jsonl`` (one line per frame, written as chunks finish) under
``out/run.json`` (the contents of the models, the frame set and the program they belong
to, by sha256): a run that stops, or a worker that fails, loses only unfinished chunks
(a line cut short is dropped), and running again resumes; a frame set regenerated or a
program recompiled in the same place is another job. One evaluation writes to a folder
at a time. ``out/summary.json`` and ``out/iou_matches.png`` hold the aggregate.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..extras import pyplot
from ..fsutil import (append_lines, loads_json, locked, read_json, read_lines, save_figure,
                      sha256_file, write_json)
from ..ir.graph import Graph
from ..progress import Progress
from ..sim.compare import dequantize, layer_error
from ..sim.detections import DetectionHead, compare_both_ways
from ..sim.interpreter import Interpreter
from .calibrate import FrameFailure
from .frames import Frames
from .runner import GraphRef, ScaleError, Workers, describe

RESULTS, RUN, SUMMARY, PLOT = "frames.jsonl", "run.json", "summary.json", "iou_matches.png"
#: held while an evaluation writes to its folder: a second one there is refused
LOCK = ".lock"
#: the reference flow's check: at least this many of the top 10 matched, both ways
PASS_MATCHES = 8


@dataclass(frozen=True)
class Job:
    """What every worker needs: the two models, the frames, the head, the program."""

    reference: GraphRef
    candidate: GraphRef
    frames: Frames
    head: DetectionHead | None
    program: str | None
    program_digest: str | None = None
    top: int = 10


def _frame_metrics(job: Job, i: int) -> dict[str, Any]:
    frame = job.frames[i]
    ref = Interpreter(job.reference.graph).run(frame)
    got = Interpreter(job.candidate.graph).run(frame)
    types = {k: v.type for k, v in job.candidate.graph.outputs.items()}
    real = {k: dequantize(a, types[k]) for k, a in got.items()}
    m: dict[str, Any] = {}
    for name in (k for k in ref if k in real):
        m[f"sqnr_{name}"] = layer_error(ref[name], real[name])[0]
    if job.head is not None:
        h = job.head
        a = h.decode(ref[h.cls], ref[h.bbox])
        b = h.decode(real[h.cls], real[h.bbox])
        m.update(compare_both_ways(a, b, top=job.top))
    if job.program is not None:
        out = _program(job.program, job.program_digest).run(frame)
        m["program_differing"] = sum(int(np.count_nonzero(out[k] != got[k])) for k in got)
    return m


#: the programs this process has loaded, by folder and digest
_PROGRAMS: dict[tuple[str, str | None], Any] = {}


def _program(path: str, digest: str | None):
    """The program in folder ``path``, which must still be the one of ``digest``."""
    if (path, digest) not in _PROGRAMS:
        from ..codegen.cprogram import CompiledProgram
        if program_digest(path) != digest:
            raise ScaleError(f"the program in {path} changed while it was evaluated")
        _PROGRAMS[path, digest] = CompiledProgram.load(path)
    return _PROGRAMS[path, digest]


def program_digest(path: str | Path) -> str:
    """sha256 of a compiled folder's manifest, which names its graph and libraries by
    sha256: the program's content."""
    try:
        return sha256_file(Path(path) / "manifest.json")
    except OSError as e:
        raise ScaleError(f"{path} is not a compiled program: {e.strerror or e}") from None


def _evaluate_chunk(job: Job, indices: list[int]) -> list[dict[str, Any]]:
    rows = []
    for i in indices:
        row: dict[str, Any] = {"frame": i, "tags": job.frames.tags[i]}
        try:
            row.update(_frame_metrics(job, i))
        except Exception as e:                  # reported by index; the rest go on
            row["error"] = describe(e)
        rows.append(row)
    return rows


@dataclass
class Evaluation:
    """Per-frame results (``rows``, by frame index) and their aggregate."""

    rows: list[dict[str, Any]]
    out: Path | None = None

    def __post_init__(self):
        self.rows = sorted(self.rows, key=lambda r: r["frame"])

    @property
    def failures(self) -> list[FrameFailure]:
        """The frames that raised, with their errors."""
        return [FrameFailure(r["frame"], r["error"]) for r in self.rows if "error" in r]

    @property
    def done(self) -> list[dict[str, Any]]:
        """The rows of frames that ran."""
        return [r for r in self.rows if "error" not in r]

    def metrics(self) -> list[str]:
        """The per-frame numbers, in the order first seen (detection counts left out)."""
        keys: dict[str, None] = {}
        for r in self.done:
            keys.update((k, None) for k, v in r.items()
                        if k != "frame" and isinstance(v, (int, float)) and not isinstance(v, bool)
                        and k not in ("num_a", "num_b"))
        return list(keys)

    def column(self, metric: str) -> np.ndarray:
        return np.array([r[metric] for r in self.done if metric in r], np.float64)

    def summary(self) -> dict[str, Any]:
        """Per metric: mean, min, 5th percentile, median, max; IoU-match distributions."""
        stats = {}
        for m in self.metrics():
            c = self.column(m)
            finite = c[np.isfinite(c)]
            stats[m] = {"mean": _num(finite.mean()) if finite.size else None,
                        "min": _num(c.min()), "p5": _num(np.percentile(c, 5)),
                        "median": _num(np.median(c)), "max": _num(c.max()),
                        "inf": int(np.isinf(c).sum())}
        hist = {m: _counts(self.column(m)) for m in ("bev_iou_match", "bev_iou_match_ba")
                if m in stats}
        summary = {"frames": len(self.rows), "done": len(self.done),
                   "failed": [str(f) for f in self.failures], "metrics": stats,
                   "iou_match_counts": hist, "worst": self.worst()}
        if hist:
            summary["passing"] = {"min_matches": PASS_MATCHES, "frames": self.passing()}
        return summary

    def passing(self, min_matches: int = 0) -> int:
        """Frames that pass the reference flow's check: at least ``min_matches`` (default
        :data:`PASS_MATCHES`) of the top 10 matched by BEV IoU both ways."""
        k = min_matches or PASS_MATCHES
        return sum(1 for r in self.done
                   if min(r.get("bev_iou_match", -1), r.get("bev_iou_match_ba", -1)) >= k)

    def worst(self, n: int = 5) -> list[dict[str, Any]]:
        """The ``n`` worst frames: fewest BEV IoU matches (the lower direction), then
        lowest SQNR of the first output."""
        sqnr = next((m for m in self.metrics() if m.startswith("sqnr_")), None)

        def badness(r):
            matches = min(r.get("bev_iou_match", 0), r.get("bev_iou_match_ba", 0))
            return (matches, r.get(sqnr, 0.0) if sqnr else 0.0)
        return sorted(self.done, key=badness)[:n]

    def table(self) -> str:
        """The aggregate as text: one line per metric, the IoU-match distributions, the
        worst frames, the failures."""
        s = self.summary()
        lines = [f"{s['done']} of {s['frames']} frames evaluated",
                 f"  {'metric':<22} {'mean':>10} {'min':>10} {'p5':>10} {'median':>10} {'max':>10}"]
        for m, st in s["metrics"].items():
            cells = " ".join(f"{_fmt(st[k]):>10}" for k in ("mean", "min", "p5", "median", "max"))
            lines.append(f"  {m:<22} {cells}")
        for m, counts in s["iou_match_counts"].items():
            dist = ", ".join(f"{k}: {v}"
                             for k, v in sorted(counts.items(), key=lambda kv: int(kv[0])))
            lines.append(f"  frames by {m}: {dist}")
        if "passing" in s:
            lines.append(f"  frames passing the reference flow's check (>= {PASS_MATCHES} of "
                         f"10 both ways): {s['passing']['frames']} of {s['done']}")
        if s["worst"]:
            lines.append("  worst frames: " + "; ".join(_row_brief(r) for r in s["worst"]))
        for f in self.failures:
            lines.append(f"  failed: {f}")
        return "\n".join(lines)

    def plot(self, path: str | Path) -> Path:
        """A histogram of per-frame top-10 BEV IoU matches, both ways, beside one of the
        per-frame SQNR of each output."""
        plt = pyplot()
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        ways = [m for m in ("bev_iou_match", "bev_iou_match_ba") if m in self.metrics()]
        labels = {"bev_iou_match": "reference boxes found in candidate",
                  "bev_iou_match_ba": "candidate boxes found in reference"}
        top = 10
        for j, m in enumerate(ways):
            counts = np.bincount(self.column(m).astype(int), minlength=top + 1)
            left.bar(np.arange(counts.size) + (j - 0.5 * (len(ways) - 1)) * 0.4, counts,
                     width=0.4, label=labels[m])
        left.axvline(PASS_MATCHES - 0.5, color="grey", ls="--", lw=1)
        left.set(xlabel=f"top-{top} boxes matched (BEV IoU > 0.5); the check passes right "
                 "of the line", ylabel="frames", title=f"{len(self.done)} frames")
        if ways:
            left.legend(fontsize=8)
        for m in (m for m in self.metrics() if m.startswith("sqnr_")):
            c = self.column(m)
            right.hist(c[np.isfinite(c)], bins=30, alpha=0.6, label=m[5:])
        right.set(xlabel="SQNR (dB)", ylabel="frames", title="output SQNR per frame")
        right.legend(fontsize=8)
        fig.tight_layout()
        save_figure(fig, path, dpi=110)
        plt.close(fig)
        return Path(path)


def _num(x: Any) -> float | None:
    x = float(x)
    return None if math.isnan(x) else x


def _counts(c: np.ndarray) -> dict[str, int]:
    values, counts = np.unique(c.astype(int), return_counts=True)
    return {str(v): int(n) for v, n in zip(values, counts)}


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def _row_brief(r: Mapping[str, Any]) -> str:
    tags = ",".join(f"{k}={v}" for k, v in r.get("tags", {}).items())
    iou = "/".join(str(r[k]) for k in ("bev_iou_match", "bev_iou_match_ba") if k in r)
    return f"#{r['frame']}" + (f" ({tags})" if tags else "") + (f" iou {iou}" if iou else "")


def evaluate(reference: Graph, candidate: Graph, frames: Frames | str, out: str | Path, *,
             workers: Workers | None = None, head: DetectionHead | None = None,
             program: str | Path | None = None, indices: Sequence[int] | None = None,
             restart: bool = False, progress: bool | None = None, plot: bool = True
             ) -> Evaluation:
    """Evaluate ``candidate`` against ``reference`` on the frames ``indices`` (default
    all) of ``frames`` with ``workers`` (default: this process); see the module docstring.
    ``head``: the detection head (default: the frame set's ``meta["detections"]``, if
    any). Frames already in ``out`` from an earlier run of the same models and frames are
    kept (``restart``: start over)."""
    frames = Frames(frames) if isinstance(frames, (str, os.PathLike)) else frames
    if head is None and "detections" in frames.meta:
        head = DetectionHead.from_json(frames.meta["detections"])
    folder = None if program is None else str(Path(program).resolve())
    job = Job(GraphRef(reference), GraphRef(candidate), frames, head, folder,
              None if folder is None else program_digest(folder))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with locked(out / LOCK, f"evaluation folder {out}", ScaleError):
        rows = _resume(out, job, restart)
        indices = list(range(len(frames))) if indices is None else \
            [frames.index_of(i) for i in indices]
        todo = [i for i in indices if i not in rows]
        workers = workers or Workers()
        with Progress(len(indices), "evaluate", progress, unit="frames") as bar:
            bar.update(len(indices) - len(todo))
            for _, chunk_rows in workers.map(_evaluate_chunk, job, workers.chunks(todo, 8)):
                rows.update((r["frame"], r) for r in chunk_rows)
                append_lines(out / RESULTS, [json.dumps(r) for r in chunk_rows])
                bar.update(len(chunk_rows))
        ev = Evaluation([rows[i] for i in indices], out)
        write_json(out / SUMMARY, ev.summary())
        if plot:
            ev.plot(out / PLOT)
    return ev


def _fingerprint(job: Job) -> dict[str, Any]:
    """What the results in a folder belong to: the contents of the models, the frame set
    and the program (not their paths), the head."""
    return {"reference": job.reference.digest, "candidate": job.candidate.digest,
            "frames": job.frames.digest, "count": len(job.frames),
            "head": None if job.head is None else job.head.to_json(),
            "program": job.program_digest}


def _resume(out: Path, job: Job, restart: bool) -> dict[int, dict[str, Any]]:
    """The rows of frames that ran in an earlier run of the same job (none if
    ``restart``); writes ``run.json`` for this one. A last line cut short by a run that
    stopped is dropped (its frame runs again)."""
    run, results = out / RUN, out / RESULTS
    mine = _fingerprint(job)
    if restart or not run.exists():
        results.unlink(missing_ok=True)         # first: never new run.json, old rows
        write_json(run, mine)
        return {}
    try:
        theirs = read_json(run, ScaleError)
    except ScaleError:
        theirs = None
    if theirs != mine:
        raise ScaleError(f"{out} holds results of other models, frames or program ({RUN} "
                         "differs); evaluate into another folder, or restart")
    rows: dict[int, dict[str, Any]] = {}
    for line in read_lines(results):
        try:
            r = loads_json(line, str(results), ScaleError)
        except ScaleError:                      # a damaged line: its frame runs again
            continue
        if isinstance(r, dict) and "error" not in r and isinstance(r.get("frame"), int):
            rows[r["frame"]] = r
    return rows
