"""bevir.scale on a local Ray with 2 CPUs: frame sets, distributed calibration and
evaluation equal to single-process, the sweep equal to the local sweep, a killed worker
and a failing frame, resuming, and the CLI."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import bevir
from bevir import Builder, TensorType
from bevir.cli import main
from bevir.scale import (FrameIndexError, Frames, FrameSetError, FrameWriter, Plugins,
                         ScaleError, Workers, calibrate, evaluate)

ray = pytest.importorskip("ray")

#: a plugin op: raises on a frame whose first element is 666; while ``armed`` exists in
#: its folder, kills the Ray worker running it once (writing ``killed``), never the test
#: process itself
FAULTY = '''
import os
from pathlib import Path
import numpy as np
from bevir import OpDef

FOLDER, DRIVER = Path({folder!r}), {driver}


class Faulty(OpDef):
    name = "test_scale_faulty"
    operands = ("x",)

    def infer(self, c, x):
        return x

    def compute(self, c, x):
        if x.flat[0] == 666.0:
            raise ValueError("this frame says no")
        armed, killed = FOLDER / "armed", FOLDER / "killed"
        if os.getpid() != DRIVER and armed.exists() and not killed.exists():
            killed.touch()
            os._exit(1)                 # the worker dies mid-task
        return x
'''


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray with 2 CPUs for the module (started here, stopped after)."""
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield Workers(ray="local")
    ray.shutdown()


def small_graph(extra: str | None = None) -> bevir.Graph:
    """(the ``extra`` op ->) conv -> relu -> matmul: float outputs ``y`` and ``z``."""
    rng = np.random.default_rng(0)
    b = Builder("small")
    x = b.input("x", TensorType((1, 3, 8, 8)))
    if extra:
        x = b.op(extra, x, loc="extra")
    y = b.relu(b.conv2d(x, b.const(rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "w"),
                        pads=(1, 1, 1, 1), loc="conv"), loc="relu")
    b.output("y", y)
    t = b.reshape(y, shape=(4, 64), loc="flat")
    b.output("z", b.matmul(t, b.const(rng.normal(size=(64, 5)).astype(np.float32), "fc"),
                           loc="fc"))
    return b.graph


def noisy(graph: bevir.Graph, seed: int = 1) -> bevir.Graph:
    """A candidate: ``graph`` with its weights perturbed (a stand-in for quantization)."""
    g = graph.clone()
    rng = np.random.default_rng(seed)
    for v in g.constants.values():
        v.const = (v.const + rng.normal(scale=0.02, size=v.const.shape)).astype(v.const.dtype)
    return g


def write_frames(path: Path, n: int = 12, per_shard: int = 5, poison: int | None = None) -> Frames:
    rng = np.random.default_rng(7)
    with FrameWriter(path, frames_per_shard=per_shard, meta={"what": "test"}) as w:
        for i in range(n):
            x = (rng.normal(size=(1, 3, 8, 8)) * (1 + i % 3)).astype(np.float32)
            if i == poison:
                x.flat[0] = 666.0
            w.add({"x": x}, scene=i // 4, t=i % 4)
    return Frames(path)


@pytest.fixture(scope="module")
def faulty_plugin(tmp_path_factory) -> Plugins:
    folder = tmp_path_factory.mktemp("faulty")
    plugin = folder / "faulty_plugin.py"
    plugin.write_text(FAULTY.format(folder=str(folder), driver=os.getpid()))
    plugins = Plugins((str(plugin),))
    plugins.load()
    return plugins


# ---- frame sets ---------------------------------------------------------------------------
def test_frame_sets_round_trip_one_frame_at_a_time(tmp_path):
    frames = write_frames(tmp_path / "f", n=12, per_shard=5)
    assert len(frames) == 12 and len(frames.shards) == 3 and frames.meta == {"what": "test"}
    assert frames.tags[6] == {"scene": 1, "t": 2}
    again = write_frames(tmp_path / "g", n=12, per_shard=12)
    for a, b in zip(frames, again):
        np.testing.assert_array_equal(a["x"], b["x"])
    assert frames[-1]["x"].shape == (1, 3, 8, 8)
    with pytest.raises(IndexError):
        frames[12]


def test_frame_set_errors_say_what_is_wrong(tmp_path):
    with pytest.raises(FrameSetError, match="not a frame set"):
        Frames(tmp_path)
    w = FrameWriter(tmp_path / "f")
    w.add({"x": np.zeros((2, 2), np.float32)})
    with pytest.raises(FrameSetError, match="frame 1 has inputs"):
        w.add({"x": np.zeros((2, 3), np.float32)})
    w.close()
    with pytest.raises(FrameSetError, match="already holds a frame set"):
        FrameWriter(tmp_path / "f")
    (tmp_path / "f" / "shard-00000.safetensors").unlink()
    with pytest.raises(FrameSetError, match="cannot read shard"):
        Frames(tmp_path / "f")[0]
    index = tmp_path / "f" / "frames.json"
    index.write_text(index.read_text().replace('"version": 1', '"version": 9'))
    with pytest.raises(FrameSetError, match="version 9"):
        Frames(tmp_path / "f")


def _edit_index(folder: Path, change) -> Path:
    doc = json.loads((folder / "frames.json").read_text())
    change(doc)
    (folder / "frames.json").write_text(json.dumps(doc))
    return folder


@pytest.mark.parametrize("change, message", [
    (lambda d: d["shards"][1].update(first=7), "holds frames 7 to 11; the shards before it "
                                               "end at 4"),
    (lambda d: d["shards"][1].update(first=-5), "malformed index .*-5 is not a count"),
    (lambda d: d["shards"][1].update(first=5.0), "malformed index .*5.0 is not a count"),
    (lambda d: d["shards"][1].update(first=True), "malformed index .*True is not a count"),
    (lambda d: d["shards"][0].update(frames=0), "holds frames 0 to -1"),
    (lambda d: d.update(frames=13), "its shards hold 12 frames, not 13"),
    (lambda d: d["shards"].pop(), "its shards hold 10 frames, not 12"),
    (lambda d: d["shards"][0].update(file="../x"), "not a plain file name"),
    (lambda d: d.update(inputs={"x": {"shape": [1, "3"], "dtype": "float32"}}),
     "malformed index"),
    (lambda d: d.pop("shards"), "malformed index \\(KeyError"),
])
def test_a_damaged_index_is_one_line_never_a_wrong_frame(tmp_path, change, message):
    write_frames(tmp_path / "f")
    with pytest.raises(FrameSetError, match=message) as e:
        Frames(_edit_index(tmp_path / "f", change))
    assert "\n" not in str(e.value)


def test_shards_are_checked_against_the_index(tmp_path):
    """A shard of another frame set, or one whose frame count the index misstates, is
    refused when read; frame indices out of range are FrameSetErrors (and IndexErrors)."""
    frames = write_frames(tmp_path / "f")
    other = write_frames(tmp_path / "g", per_shard=5)
    with pytest.raises(FrameIndexError, match="frame 12 out of range"):
        frames[12]
    with pytest.raises(IndexError):
        frames[-13]
    with pytest.raises(FrameSetError, match="frame indices are integers, got str"):
        frames["1"]
    (tmp_path / "f" / "shard-00001.safetensors").write_bytes(
        (tmp_path / "g" / "shard-00002.safetensors").read_bytes())
    with pytest.raises(FrameSetError, match="shard-00001.safetensors: not the shard the "
                                            "index names"):
        Frames(tmp_path / "f")[5]
    assert Frames(tmp_path / "f")[0]["x"].tobytes() == other[0]["x"].tobytes()

    def misstated(d):               # no digests (an older frame set), counts moved
        for s in d["shards"]:
            s.pop("sha256")
        d["shards"][0]["frames"], d["shards"][1]["first"] = 4, 4
        d["shards"][1]["frames"] = 6
    with pytest.raises(FrameSetError, match="holds \\{'x': 5\\} frames per input; the index "
                                            "says 4"):
        Frames(_edit_index(tmp_path / "g", misstated))[0]
    more = lambda d: d["inputs"].update(y=d["inputs"]["x"])      # noqa: E731
    with pytest.raises(FrameSetError, match="holds inputs \\['x'\\]; the index says "
                                            "\\['x', 'y'\\]"):
        Frames(_edit_index(write_frames(tmp_path / "h").path, more))[0]


def test_a_ray_dataset_reads_a_frame_set(tmp_path, local_ray):
    pytest.importorskip("pyarrow")
    frames = write_frames(tmp_path / "f", n=6, per_shard=4)
    rows = sorted(frames.to_ray_dataset().take_all(), key=lambda r: r["frame"])
    assert [r["frame"] for r in rows] == list(range(6))
    for r in rows:
        np.testing.assert_array_equal(r["x"], frames[r["frame"]]["x"])


# ---- calibration --------------------------------------------------------------------------
@pytest.mark.parametrize("options", [dict(method="minmax", per_channel=True),
                                     dict(method="entropy"), dict(method="percentile")])
def test_distributed_calibration_is_bit_identical(tmp_path, local_ray, options):
    g, frames = small_graph(), write_frames(tmp_path / "f")
    single = bevir.calibrate(g, list(frames), attach=False, **options)
    ranges, failed = calibrate(g, frames, workers=local_ray, attach=False, **options)
    assert failed == [] and ranges == single
    assert all(e.samples == 12 for e in ranges)
    local, _ = calibrate(g, frames, attach=False, **options)       # this process, same code
    assert local == single


def test_a_killed_worker_is_retried_and_changes_nothing(tmp_path, local_ray, faulty_plugin):
    g, frames = small_graph("test_scale_faulty"), write_frames(tmp_path / "f")
    single = bevir.calibrate(g, list(frames), method="entropy", attach=False)
    workers = Workers(ray="local", plugins=faulty_plugin)
    folder = Path(faulty_plugin.files[0]).parent
    (folder / "armed").touch()
    try:
        ranges, failed = calibrate(g, frames, workers=workers, method="entropy", attach=False)
    finally:
        (folder / "armed").unlink()
    assert (folder / "killed").exists()                            # a worker did die
    assert failed == [] and ranges == single


def test_a_failing_frame_is_reported_and_the_rest_complete(tmp_path, local_ray, faulty_plugin):
    g, frames = small_graph("test_scale_faulty"), write_frames(tmp_path / "f", poison=5)
    workers = Workers(ray="local", plugins=faulty_plugin)
    ranges, failed = calibrate(g, frames, workers=workers, attach=False)
    assert [f.frame for f in failed] == [5] and "this frame says no" in failed[0].error
    others = [frames[i] for i in range(12) if i != 5]
    assert ranges == bevir.calibrate(g, others, attach=False)
    ev = evaluate(g, noisy(g), frames, tmp_path / "eval", workers=workers, plot=False)
    assert [f.frame for f in ev.failures] == [5] and len(ev.done) == 11


# ---- evaluation ---------------------------------------------------------------------------
def test_distributed_evaluation_equals_single_process(tmp_path, local_ray):
    g, frames = small_graph(), write_frames(tmp_path / "f")
    cand = noisy(g)
    single = evaluate(g, cand, frames, tmp_path / "one")
    dist = evaluate(g, cand, frames, tmp_path / "ray", workers=local_ray)
    assert dist.rows == single.rows and len(dist.rows) == 12
    assert set(dist.metrics()) == {"sqnr_y", "sqnr_z"}
    assert all(10 < r["sqnr_z"] < 80 for r in dist.rows)
    assert (tmp_path / "ray" / "iou_matches.png").stat().st_size > 10_000
    summary = json.loads((tmp_path / "ray" / "summary.json").read_text())
    assert summary["done"] == 12 and summary["metrics"]["sqnr_y"]["min"] == min(
        r["sqnr_y"] for r in single.rows)
    assert "12 of 12 frames evaluated" in dist.table()


def test_evaluation_resumes_and_refuses_other_models(tmp_path):
    g, frames = small_graph(), write_frames(tmp_path / "f")
    cand = noisy(g)
    first = evaluate(g, cand, frames, tmp_path / "e", indices=range(6), plot=False)
    results = tmp_path / "e" / "frames.jsonl"
    lines = results.read_text().splitlines()
    marked = json.loads(lines[2]) | {"sqnr_y": -1.0}               # not recomputed on resume
    results.write_text("\n".join(lines[:2] + [json.dumps(marked)]) + "\n{\"frame\": 3, \"sq")
    again = evaluate(g, cand, frames, tmp_path / "e", plot=False)
    assert len(again.rows) == 12 and again.rows[2]["sqnr_y"] == -1.0
    assert again.rows[3:6] == first.rows[3:6]                      # a cut line is redone
    rows = [json.loads(line) for line in results.read_text().splitlines()]   # and dropped,
    assert sorted(r["frame"] for r in rows) == list(range(12))    # not joined to the next
    with pytest.raises(ScaleError, match="other models, frames or program"):
        evaluate(g, noisy(g, seed=2), frames, tmp_path / "e", plot=False)
    fresh = evaluate(g, noisy(g, seed=2), frames, tmp_path / "e", restart=True, plot=False)
    assert len(fresh.rows) == 12 and fresh.rows[2]["sqnr_y"] != -1.0


def test_a_frame_set_regenerated_in_place_is_another_job(tmp_path):
    """The results belong to the frame set's content, not its folder: regenerated with
    other frames, it is refused (one line) instead of resumed; with the same frames, it
    resumes and recomputes nothing."""
    import shutil
    g, cand = small_graph(), noisy(small_graph())
    evaluate(g, cand, write_frames(tmp_path / "f"), tmp_path / "e", plot=False)
    results = (tmp_path / "e" / "frames.jsonl").read_text()
    shutil.rmtree(tmp_path / "f")
    write_frames(tmp_path / "f")                            # the same frames again
    evaluate(g, cand, Frames(tmp_path / "f"), tmp_path / "e", plot=False)
    assert (tmp_path / "e" / "frames.jsonl").read_text() == results
    shutil.rmtree(tmp_path / "f")
    with FrameWriter(tmp_path / "f") as w:                  # other frames, same shapes
        for _ in range(12):
            w.add({"x": np.ones((1, 3, 8, 8), np.float32)})
    with pytest.raises(ScaleError, match="holds results of other models, frames or program"):
        evaluate(g, cand, Frames(tmp_path / "f"), tmp_path / "e", plot=False)
    with pytest.raises(FrameIndexError, match="frame 12 out of range"):
        evaluate(g, cand, Frames(tmp_path / "f"), tmp_path / "x", indices=[0, 12], plot=False)


# ---- sweep and the CLI --------------------------------------------------------------------
def test_distributed_sweep_equals_the_local_sweep(local_ray):
    from bevir.flows.sweep import sweep as local_sweep
    from bevir.target import HWConfig
    from bevir.scale import sweep
    g = small_graph()
    base = HWConfig.preset("qc-u")
    grid = dict(cores=[1, 2, 4], macs=[8, 16])
    here = local_sweep(g, base, **grid)
    there = sweep(g, base, **grid, workers=local_ray)
    strip = [{k: v for k, v in p.to_json().items() if k != "model_seconds"}
             for p in here]
    assert [{k: v for k, v in p.to_json().items() if k != "model_seconds"}
            for p in there] == strip and len(strip) == 6


def test_cli_calibrate_evaluate_and_sweep_on_ray(tmp_path, local_ray, capsys):
    g = small_graph()
    bevir.save(g, tmp_path / "m.bevir")
    bevir.save(noisy(g), tmp_path / "q.bevir")
    frames = write_frames(tmp_path / "f")
    assert main(["calibrate", str(tmp_path / "m.bevir"), "--frames", str(frames.path),
                 "-o", str(tmp_path / "r.json"), "--method", "mse", "--ray"]) == 0
    assert "frames/s" in capsys.readouterr().out
    saved = bevir.passes.calibrate.Ranges.load(tmp_path / "r.json")
    assert saved == bevir.calibrate(g, list(frames), method="mse", attach=False)
    assert main(["evaluate", str(tmp_path / "m.bevir"), str(tmp_path / "q.bevir"), "--frames",
                 str(frames.path), "--out", str(tmp_path / "e"), "--ray", "--limit", "4"]) == 0
    assert "4 of 4 frames evaluated" in capsys.readouterr().out
    assert main(["sweep", str(tmp_path / "m.bevir"), "--cores", "1,2", "--out",
                 str(tmp_path / "s"), "--no-plots", "--ray"]) == 0
    assert len(json.loads((tmp_path / "s" / "sweep.json").read_text())["points"]) == 2


def test_cli_reports_failed_frames_one_line_each(tmp_path, capsys, faulty_plugin):
    g = small_graph("test_scale_faulty")
    bevir.save(g, tmp_path / "m.bevir")
    frames = write_frames(tmp_path / "f", poison=3)
    assert main(["calibrate", str(tmp_path / "m.bevir"), "--frames", str(frames.path), "-o",
                 str(tmp_path / "r.json"), "--load", faulty_plugin.files[0]]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    line = next(i for i, text in enumerate(FAULTY.splitlines(), 1) if "frame says no" in text)
    assert err[0] == ("bevir: frame 3: op 'test_scale_faulty' node %0 from 'extra': "
                      f"ValueError: this frame says no (at {faulty_plugin.files[0]}:{line})")
    assert err[-1].startswith("bevir: error: 1 frame(s) failed") and "r.json" in err[-1]
    assert (tmp_path / "r.json").exists()
    assert main(["calibrate", str(tmp_path / "m.bevir"), "--frames", str(tmp_path)]) == 1
    assert "not a frame set" in capsys.readouterr().err
    assert main(["calibrate", str(tmp_path / "m.bevir"), "--frames", str(frames.path),
                 "--workers", "2"]) == 1
    assert "add --ray" in capsys.readouterr().err


# ---- the BEVFormer test config ------------------------------------------------------------
def test_bevformer_signoff_on_ray_equals_one_process(tmp_path, local_ray):
    """The INT8 model calibrated on 4 frames of a sequence on Ray is the one calibrated in
    this process (same digest), and so are the per-frame metrics of the evaluation."""
    from examples.bevformer.sequence import write_sequence
    from examples.bevformer.signoff import models
    from bevir.ir.serialize import graph_digest
    frames = write_sequence("test", tmp_path / "frames", scenes=2, frames=3, progress=False)
    here = models(frames, tmp_path / "here", Workers(), calibration_frames=4)
    there = models(frames, tmp_path / "there", local_ray, calibration_frames=4)
    assert graph_digest(here[1]) == graph_digest(there[1])
    one = evaluate(here[0], here[1], frames, tmp_path / "e1", plot=False)
    two = evaluate(there[0], there[1], frames, tmp_path / "e2", workers=local_ray, plot=False)
    assert one.rows == two.rows and len(one.done) == 6
    assert {"sqnr_cls_scores", "sqnr_bbox_preds", "bev_iou_match", "bev_iou_match_ba",
            "top10_label_match"} <= set(one.metrics())
    assert all(r["sqnr_bbox_preds"] > 20 and 0 <= r["bev_iou_match"] <= 10 for r in one.rows)


def test_evaluation_runs_the_generated_program_too(tmp_path, local_ray):
    """With ``program``, every frame also runs the compiled per-core program: 0 differing
    elements against the golden model on every frame, on Ray."""
    from bevir.flows.target import compile_program
    from tests.shared import chain, ints
    graph, _ = chain(np.random.default_rng(0))
    compile_program(graph, tmp_path / "prog", hw="QC-U 8MB 16MAC x2")
    rng = np.random.default_rng(3)
    with FrameWriter(tmp_path / "f") as w:
        for _ in range(6):
            w.add({"x": ints(rng, (1, 12, 8, 4))})
    ev = evaluate(graph, graph, Frames(tmp_path / "f"), tmp_path / "e", workers=local_ray,
                  program=tmp_path / "prog", plot=False)
    assert len(ev.done) == 6 and all(r["program_differing"] == 0 for r in ev.done)
    assert all(r["sqnr_f"] == float("inf") for r in ev.done)
    # a program recompiled in place (another graph) is another job, not resumed
    compile_program(chain(np.random.default_rng(1))[0], tmp_path / "prog", hw="QC-U 8MB 16MAC x2")
    with pytest.raises(ScaleError, match="holds results of other models, frames or program"):
        evaluate(graph, graph, Frames(tmp_path / "f"), tmp_path / "e", workers=local_ray,
                 program=tmp_path / "prog", plot=False)
