"""The BEVFormer sequence generator: a frame set of consecutive frames whose images follow
the ego's motion, whose can_bus agrees with it and whose prev_bev is the previous frame's
bev_embed of the float model."""
import math

import numpy as np
import pytest
import torch

from examples.bevformer import sequence
from examples.bevformer.config import CONFIGS
from examples.bevformer.decode import detection_head
from examples.bevformer.inputs import make_images, make_scene
from examples.bevformer.weights import build_model

CFG = CONFIGS["test"]
SCENES, STEPS = 2, 3


@pytest.fixture(scope="module")
def frames(tmp_path_factory):
    return sequence.write_sequence("test", tmp_path_factory.mktemp("seq") / "a", SCENES, STEPS,
                                   seed=0, model_seed=0, frames_per_shard=4, progress=False)


def by_tag(frames) -> dict[tuple[int, int], dict[str, np.ndarray]]:
    return {(tag["scene"], tag["t"]): frames[i] for i, tag in enumerate(frames.tags)}


def test_layout(frames):
    c = CFG
    shapes = {"img": (c.num_cams, 3, c.img_h, c.img_w), "lidar2img": (c.num_cams, 4, 4),
              "can_bus": (18,), "prev_bev": (c.num_bev, c.embed_dims)}
    assert len(frames) == SCENES * STEPS
    assert frames.tags == [{"scene": s, "t": t} for s in range(SCENES) for t in range(STEPS)]
    for f in frames:
        assert {k: (a.shape, a.dtype) for k, a in f.items()} == \
            {k: (s, np.dtype(np.float32)) for k, s in shapes.items()}
    meta = frames.meta
    assert meta["detections"] == detection_head(CFG).to_json()
    assert (meta["config"], meta["scenes"], meta["frames_per_scene"]) == ("test", SCENES, STEPS)
    assert meta["config_dict"] == CFG.to_dict()


def test_prev_bev_is_previous_bev_embed(frames):
    """Recomputed through the transformer's get_bev_features (not the generator's full
    forward) from the stored inputs of the frame before: bit for bit."""
    model = build_model(CFG, 0)
    head = model.pts_bbox_head
    seq = by_tag(frames)
    for s in range(SCENES):
        for t in range(1, STEPS):
            f = {k: torch.from_numpy(a) for k, a in seq[s, t - 1].items()}
            with torch.no_grad():
                bev = head.transformer.get_bev_features(
                    model.backbone(f["img"]), head.bev_embedding.weight, head.positional_encoding(),
                    f["lidar2img"], f["can_bus"], f["prev_bev"])
            np.testing.assert_array_equal(bev[0].numpy(), seq[s, t]["prev_bev"])
    assert not np.array_equal(seq[0, 0]["prev_bev"], seq[1, 0]["prev_bev"])


def test_can_bus_follows_the_poses(frames):
    seq = by_tag(frames)
    for s in range(SCENES):
        for t in range(STEPS):
            cb = seq[s, t]["can_bus"].astype(np.float64)
            speed = cb[13]
            assert 3.0 <= speed <= 10.0
            assert math.hypot(cb[0], cb[1]) == pytest.approx(speed * 0.5, abs=1e-5)
            assert cb[2] == 0.0
            # the quaternion is the absolute yaw's
            assert cb[3:7] == pytest.approx([math.cos(cb[16] / 2), 0, 0, math.sin(cb[16] / 2)], abs=1e-6)
            # the ego moves along its heading (chord of the bend: half-way heading)
            turn = math.remainder(math.radians(cb[17]), 2 * math.pi)     # [17] may wrap by 360
            heading = math.atan2(cb[1], cb[0])
            assert math.remainder(heading - cb[16] + turn / 2, 2 * math.pi) == pytest.approx(0, abs=1e-5)
            # rotation rate (with sensor noise) agrees with the turn per 0.5 s
            assert cb[12] * 0.5 == pytest.approx(turn, abs=0.01)
            if t > 0:
                prev = seq[s, t - 1]["can_bus"].astype(np.float64)
                assert cb[17] == pytest.approx(math.degrees(cb[16]) - math.degrees(prev[16]), abs=1e-3)
                prev_turn = math.remainder(math.radians(prev[17]), 2 * math.pi)
                assert turn == pytest.approx(prev_turn, abs=1e-5)         # a constant yaw rate


def test_delta_yaw_wraps_like_nuscenes():
    """[17] is the difference of the [0, 360) yaws, as forward_test computes it: crossing
    yaw 0 gives about -360 + the turn."""
    rng = np.random.default_rng(0)
    cb = sequence.can_bus_for(sequence.se2(1, 0, 0.01), sequence.se2(0, 0, -0.01), 2.0, 0.04, rng)
    assert cb[17] == pytest.approx(math.degrees(0.02) - 360, abs=1e-4)
    assert cb[16] == pytest.approx(0.01)


def test_images_move(frames):
    seq = by_tag(frames)
    for s in range(SCENES):
        for t in range(1, STEPS):
            assert not np.array_equal(seq[s, t]["img"], seq[s, t - 1]["img"])
        np.testing.assert_array_equal(seq[s, 0]["lidar2img"], sequence.lidar2img_for(CFG).astype(np.float32))
    assert not np.array_equal(seq[0, 0]["img"], seq[1, 0]["img"])
    assert not np.array_equal(seq[0, 0]["can_bus"], seq[1, 0]["can_bus"])


def test_deterministic(frames, tmp_path):
    again = sequence.write_sequence(CFG, tmp_path / "b", SCENES, STEPS, frames_per_shard=4,
                                    progress=False)
    names = sorted(p.name for p in frames.path.iterdir())
    assert names == sorted(p.name for p in again.path.iterdir())
    assert len([n for n in names if n.endswith(".safetensors")]) == 2
    for n in names:
        assert (frames.path / n).read_bytes() == (again.path / n).read_bytes(), n


def test_make_images_default_boxes():
    np.testing.assert_array_equal(make_images(CFG, 5).numpy(),
                                  make_images(CFG, 5, boxes=make_scene(5, CFG)).numpy())


def test_move_boxes_round_trip():
    boxes = make_scene(1, CFG)
    T = sequence.se2(3.0, -2.0, 0.3)
    back = sequence.move_boxes(sequence.move_boxes(boxes, T), np.linalg.inv(T))
    for a, b in zip(boxes, back):
        assert [a[k] for k in ("cx", "cy", "yaw")] == pytest.approx([b[k] for k in ("cx", "cy", "yaw")])


@pytest.mark.parametrize("args, message", [
    (["--scenes", "0", "--frames", "2"], "scenes must be"),
    (["--scenes", "1", "--frames", "0"], "frames must be"),
    (["--scenes", "1", "--frames", "1", "--seed", "-1"], "seed must be"),
])
def test_cli_errors(args, message, tmp_path, capsys):
    assert sequence.main(["--config", "test", "--out", str(tmp_path / "o"), *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_cli_used_folder(frames, capsys):
    argv = ["--config", "test", "--scenes", "1", "--frames", "1", "--out", str(frames.path)]
    assert sequence.main(argv) == 1
    assert "already holds a frame set" in capsys.readouterr().err


def test_cli_writes(tmp_path, capsys):
    out = tmp_path / "c"
    assert sequence.main(["--config", "test", "--scenes", "1", "--frames", "2", "--out", str(out)]) == 0
    line = capsys.readouterr().out
    assert line.startswith("wrote 2 frames") and line.count("\n") == 1
    assert len(sequence.Frames(out)) == 2
