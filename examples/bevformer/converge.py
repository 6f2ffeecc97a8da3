"""Synthetic weights that detect the synthetic scene's objects, and, on BEV grids that
resolve objects (``tiny``), a decoder whose box refinements converge on them.

The scene and the weights share the config's SLOTS (inputs.py): the places where scenes put
objects, each of one kind. A scene holds an object at some of them; the weights find which
from the images, as a trained detector would, and draw each object's box at its slot:

- **Object queries.** One query per slot (the one whose initial reference point lies
  nearest) has its positional embedding moved so that its reference point is the slot's
  centre, at the height of its kind's box centre; its content carries its kind's *gate*, a
  direction that no layer writes into.
- **Objectness.** The backbone carries where the cameras show objects to the neck's output
  (objectness.py). In the last encoder layer's spatial cross attention, one head (its
  points at each BEV cell's pillar anchors, its weights uniform) writes it into the BEV
  queries along O_DIR; in each decoder layer's cross attention one head (its points at the
  reference point) reads it into a direction of the layer's own.
- **Scores.** Each cls branch spends SCORE_UNITS hidden units per kind on
  ``relu(gate + objectness (+ depth) - 1.5 (2.5))``: a query on a slot where the cameras
  show an object of its kind gains about SCORE_BOOST on that class's logit; a query
  without the gate, or on an empty slot, gains nothing.
- **Sizes.** Each reg branch spends a hidden unit per kind on ``relu(gate)``, which moves
  the box's log width, length and height from a car's to the kind's.

On grids whose cells are at most MAX_CELL_M, the refinements converge on the slots too: a
trained decoder refines each reference point towards the object its BEV features show, so an
error in one layer's reference point (the INT8 grid of the normalized points is 0.8 m) is
corrected by the next layers instead of adding up. Without this, ``tiny``'s INT8 detections
drift from the float ones by the grid's rounding summed over six layers:

- **Potential.** The BEV queries carry a potential ``U`` (minus a Gaussian well of
  OBJECT_WELL_CELLS at each slot) along a direction that no encoder layer writes into.
- **Gradient heads.** In each decoder cross attention, heads 0-3 sample the BEV features one
  cell right, left, front and back of the reference point (all their points at one fixed
  offset); U_CHANNELS value channels of each read ``U``. The output projection writes the
  central differences (the gradient) and their mean (the depth) along directions of the
  layer's own.
- **Pull.** Each reg branch spends four hidden units on ``relu(+-gain * gradient + level)``:
  the reference point moves down the gradient, REFINEMENT_PULL of the way to a well's
  centre per layer (all the way in the last layer, whose box is the output).

Each piece is spread over several weak channels or units where one strong one would set the
per-tensor (or per-channel) INT8 weight grid of the whole layer.

Directions are pairs of channels, ``(e_a - e_b) / sqrt(2)``, and every LayerNorm gives both
channels of a pair one weight and one bias, so normalization scales a direction without
mixing anything into it. The gains are fitted on a float64 forward of a calibration frame
whose scene holds an object at every other slot.
"""
from __future__ import annotations

import copy
import math

import torch
from torch import nn

from .config import BEVFormerConfig
from .inputs import GROUND_Z, _BOX_TYPES, make_inputs, make_scene, slots
from .weights import _round_bits

#: BEV cells no larger than this resolve an object's well (``tiny``: 2.05 m; ``test``'s
#: 10 m cells do not, and its decoder keeps the plain refinement)
MAX_CELL_M = 4.0
#: the width (sigma) of each object's potential well, in BEV cells
OBJECT_WELL_CELLS = 1.5
#: the gradient heads' sampling offset, in BEV cells
GRADIENT_STEP_CELLS = 1.0
#: the fraction of the way to a well's centre that each refinement moves a reference point
REFINEMENT_PULL = 0.5
#: how strongly the BEV features carry U: its read along its direction at a well's centre,
#: in units of the encoder output's per-channel rms
U_IN_BEV = 2.0
#: the attention logit of the points at the pillar anchor nearest the ground, where the
#: objectness head of the encoder looks (the others': 0)
FOOT_WEIGHT = 4.0
#: how strongly they carry the objectness: its read on an occupied slot's cell, in the same
#: units (where it dominates a token, the LayerNorms after it saturate it)
OBJECTNESS_IN_BEV = 1.0
#: the value channels of each gradient (or objectness) head that read U (the objectness),
#: and its range in them (a fraction of the value tensor's): many weak channels, so that no
#: weight sets a per-tensor INT8 weight grid far coarser than the others'
U_CHANNELS = 8
VALUE_RANGE = 0.33
#: the gradient's (and the objectness') size in the decoder's stream
GRADIENT_IN_STREAM = 0.4
#: the pull's hidden units in each reg branch: relu(+-gain * gradient + level)
_PULL_GAIN, _PULL_LEVEL = 2.0, 2.0
#: the logit a query gains on a slot whose object the cameras show, and the cls branch's
#: hidden units per kind that carry it (at most: see units_per_kind)
SCORE_BOOST = 5.0
SCORE_UNITS = 2
#: the objectness (read so that an empty slot's is 0 and an occupied one's 1 on average on
#: the calibration frames) from which a slot query's score rises, and at which its score
#: units stop growing (an empty slot's is 0 +- 0.1, the scenes' objects' 0.4 to 1.5)
SCORE_FROM, SCORE_FULL = 0.5, 1.5
#: how much the gate counts in a score unit: a query without it stays far below 0
GATE_WEIGHT = 3.0
#: the score units' second layer, in units of that layer's spread: large, so that they
#: dominate its LayerNorm where they hold, and the class weights that read them stay as
#: small as the others (per-channel INT8 grids)
SCORE_SPREAD = 12.0
#: the kinds of object the scenes hold, in the order of their gates
KINDS = ("car", "truck", "pedestrian", "traffic_cone")


def _sig(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


def kinds_of(cfg: BEVFormerConfig) -> list[str]:
    """The kinds of ``cfg``'s slots, in the order of KINDS."""
    return [k for k in KINDS if any(kind == k for _, _, kind in slots(cfg))]


def units_per_kind(hidden: int, kinds: int) -> int:
    """The score units per kind of a cls branch of ``hidden`` units: SCORE_UNITS, fewer
    where they, the excess units and their mirrors would take more than a quarter of it."""
    return max(1, min(SCORE_UNITS, hidden // (16 * kinds)))


def score_units(cfg: BEVFormerConfig) -> int:
    """How many of each cls branch's second-layer hidden units (the first ones) the scores
    take, with their mirrors; they read twice as many first-layer units (_score)."""
    kinds = len(kinds_of(cfg))
    return 2 * units_per_kind(cfg.embed_dims, kinds) * kinds          # the second layer's


def resolves_objects(cfg: BEVFormerConfig) -> bool:
    """Whether ``cfg``'s BEV grid is fine enough for the converging refinement (MAX_CELL_M)."""
    return max(cfg.grid_length) <= MAX_CELL_M


def initial_anchors(head) -> torch.Tensor:
    """(Nq, 2) float64: each query's initial reference point (x, y), normalized, as the
    transformer computes it from the query embedding's positional half."""
    return _reference_points(head)[:, :2]


def _reference_points(head) -> torch.Tensor:
    lin, c = head.transformer.reference_points, head.cfg.embed_dims
    pos = head.query_embedding.weight.data.double()[:, :c]
    return torch.sigmoid(pos @ lin.weight.data.double().T + lin.bias.data.double())


def slot_targets(cfg: BEVFormerConfig) -> torch.Tensor:
    """(slots, 3) float64: each slot's reference point (x, y, z normalized to pc_range), z at
    the centre of its kind's box."""
    pc = cfg.pc_range
    points = [(x, y, GROUND_Z + _BOX_TYPES[kind][0][2] / 2) for x, y, kind in slots(cfg)]
    lo, size = torch.tensor(pc[:3], dtype=torch.float64), torch.tensor(
        [pc[3] - pc[0], pc[4] - pc[1], pc[5] - pc[2]], dtype=torch.float64)
    return (torch.tensor(points, dtype=torch.float64) - lo) / size


def slot_queries(head) -> torch.Tensor:
    """The object queries: for each slot in order, the query whose initial reference point
    lies nearest among those not taken."""
    anchors, targets = initial_anchors(head), slot_targets(head.cfg)[:, :2]
    taken: list[int] = []
    for t in targets:
        d = (anchors - t).norm(dim=-1)
        d[taken] = math.inf
        taken.append(int(d.argmin()))
    return torch.tensor(taken, dtype=torch.long)


def potential(cfg: BEVFormerConfig, centres: torch.Tensor) -> torch.Tensor:
    """(bev_h, bev_w) potential at the cell centres: minus a unit Gaussian well per object."""
    ys, xs = torch.meshgrid(torch.arange(cfg.bev_h, dtype=torch.float64) + 0.5,
                            torch.arange(cfg.bev_w, dtype=torch.float64) + 0.5, indexing="ij")
    d2 = (xs[..., None] - centres[:, 0]) ** 2 + (ys[..., None] - centres[:, 1]) ** 2
    return -torch.exp(-d2 / (2 * OBJECT_WELL_CELLS ** 2)).sum(-1)


def calibration_inputs(cfg: BEVFormerConfig, seed: int) -> list[dict]:
    """The two frames the gains are fitted on: frame seed + 12345 with an object at every
    other slot of each kind (the first one's, the third one's, ...), and with an object at
    each of the others; ``occupied``: 1 or 0 per slot. Every slot is empty in one and
    occupied in the other, and each frame has both."""
    from .inputs import make_images
    kinds = [kind for _, _, kind in slots(cfg)]
    first = [kinds[:i].count(kind) % 2 == 0 for i, kind in enumerate(kinds)]
    frames = []
    for occupied in (first, [not o for o in first]):
        inp = make_inputs(cfg, seed + 12345, with_prev_bev=True)
        inp["img"] = make_images(cfg, seed + 12345, inp["lidar2img"].double().numpy(),
                                 make_scene(seed + 12345, cfg, occupied=occupied))
        inp["occupied"] = torch.tensor(occupied, dtype=torch.float64)
        frames.append(inp)
    return frames


def _pair_directions(c: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n directions (e_a - e_b)/sqrt(2) on distinct channel pairs: ([n, c], pairs [n, 2])."""
    g = torch.Generator().manual_seed(seed + 4242)
    pairs = torch.randperm(c, generator=g)[:2 * n].view(n, 2)
    dirs = torch.zeros(n, c, dtype=torch.float64)
    dirs[torch.arange(n), pairs[:, 0]] = 1 / math.sqrt(2)
    dirs[torch.arange(n), pairs[:, 1]] = -1 / math.sqrt(2)
    return dirs, pairs


def _tie_pairs(ln: nn.LayerNorm, pairs: torch.Tensor) -> None:
    """Both channels of each pair get one weight and one bias (their means)."""
    for p in (ln.weight, ln.bias):
        mean = p.data[pairs].mean(1, keepdim=True)
        p.data[pairs] = mean.expand(-1, 2).to(p.dtype)


def _write_outside(lin: nn.Linear, dirs: torch.Tensor) -> None:
    """``lin`` no longer writes along ``dirs`` (orthonormal rows)."""
    keep = torch.eye(dirs.shape[1], dtype=torch.float64) - dirs.T @ dirs
    lin.weight.data = _round_bits(keep @ lin.weight.data.double()).to(lin.weight.dtype)
    lin.bias.data = _round_bits(keep @ lin.bias.data.double()).to(lin.bias.dtype)


def _read_outside(lin: nn.Linear, dirs: torch.Tensor) -> None:
    """``lin`` no longer reads along ``dirs`` (orthonormal rows)."""
    keep = torch.eye(dirs.shape[1], dtype=torch.float64) - dirs.T @ dirs
    lin.weight.data = _round_bits(lin.weight.data.double() @ keep).to(lin.weight.dtype)


def _fit(y: torch.Tensor, x: torch.Tensor) -> tuple[float, float]:
    """Least squares y ~ a * x + b, rounded."""
    xm, ym = x.mean(), y.mean()
    a = ((x - xm) * (y - ym)).sum() / (x - xm).pow(2).sum()
    return _sig(a.item()), _sig((ym - a * xm).item())


class _Directions:
    """The build's directions: O (objectness in the BEV), a gate per kind of the config's
    slots, U (converging only), and per decoder layer: objectness (and gradient x, y and
    depth, converging only)."""

    def __init__(self, cfg: BEVFormerConfig, converging: bool, seed: int):
        self.kinds = kinds_of(cfg)
        per_layer = 4 if converging else 1
        n = 1 + len(self.kinds) + int(converging) + per_layer * cfg.decoder_layers
        self.all, self.pairs = _pair_directions(cfg.embed_dims, n, seed)
        self.o = self.all[0]
        self.gates = self.all[1:1 + len(self.kinds)]
        rest = self.all[1 + len(self.kinds):]
        self.u = rest[0] if converging else None
        self.layers = rest[int(converging):].view(cfg.decoder_layers, per_layer, -1)


def build(model, pair: tuple[int, int], seed: int) -> None:
    """Make ``model``'s head detect the scene's objects (see the module docstring); ``pair``:
    the neck's objectness channels (objectness.install_neck)."""
    cfg, head = model.cfg, model.pts_bbox_head
    tr = head.transformer
    converging = resolves_objects(cfg)
    dirs = _Directions(cfg, converging, seed)
    for m in list(tr.encoder.modules()) + list(tr.decoder.modules()) + [tr.can_bus_mlp.norm]:
        if isinstance(m, nn.LayerNorm):
            _tie_pairs(m, dirs.pairs)
    tr.can_bus_mlp.norm.weight.data[dirs.pairs.flatten()] = 0      # ego motion: not along them
    for layer in tr.encoder.layers:
        for lin in (layer.attentions[0].output_proj, layer.attentions[1].output_proj,
                    layer.ffns[0].layers[1]):
            _write_outside(lin, dirs.all)
    for layer in tr.decoder.layers:
        for lin in (layer.attentions[0].attn.out_proj, layer.attentions[1].output_proj,
                    layer.ffns[0].layers[1]):
            _write_outside(lin, dirs.all)
    for br in list(head.cls_branches) + list(head.reg_branches):
        _read_outside(br[0], dirs.all)                 # but through the units built below
    bev = head.bev_embedding.weight.data.double()
    head.bev_embedding.weight.data = _round_bits(bev - bev @ dirs.all.T @ dirs.all).float()
    for embeds in (tr.cams_embeds, tr.level_embeds):   # added to the image features: cancel
        embeds.data[:, list(pair)] = embeds.data[:, list(pair)].mean(-1, keepdim=True)
    queries = _object_queries(cfg, head, dirs)

    frames = calibration_inputs(cfg, seed)
    for inp in frames:
        inp["feats"] = _neck_features(model, inp["img"])
    work = copy.deepcopy(head).double().eval()
    targets = slot_targets(cfg)
    size = torch.tensor([cfg.bev_w, cfg.bev_h], dtype=torch.float64)
    tokens = _tokens(cfg, targets[:, :2])

    def encode(inp):
        with torch.no_grad():
            return work.transformer.get_bev_features(
                inp["feats"], work.bev_embedding.weight, work.positional_encoding(),
                inp["lidar2img"].double(), inp["can_bus"].double(), inp["prev_bev"].double())[0]
    u = potential(cfg, targets[:, :2] * size) if converging else None
    if converging:
        _carry_u(head, work, u, dirs.u, lambda: encode(frames[0]))
    _objectness_into_bev(cfg, head, work, frames[0], pair, dirs.o, tokens, encode)
    for inp in frames:
        inp["bev"] = encode(inp)
    bev = torch.cat([inp["bev"] for inp in frames])
    o_read = _fit(torch.cat([inp["bev"][tokens] for inp in frames]) @ dirs.o,
                  torch.cat([inp["occupied"] for inp in frames]))
    for k, (layer, orig) in enumerate(zip(work.transformer.decoder.layers,
                                          tr.decoder.layers)):
        _objectness_head(cfg, layer.attentions[1], orig.attentions[1], bev, dirs.o,
                         o_read, dirs.layers[k, 0])
    if converging:
        _gradient_heads(cfg, work, head, frames[0]["bev"], dirs.u, dirs.layers,
                        _fit(frames[0]["bev"] @ dirs.u, u.reshape(-1)))
    _branches(cfg, work, head, frames, dirs, queries, u)


def _tokens(cfg: BEVFormerConfig, points: torch.Tensor) -> torch.Tensor:
    """The BEV token (y * W + x) of each normalized point (x, y)."""
    cells = (points * torch.tensor([cfg.bev_w, cfg.bev_h], dtype=torch.float64)).floor().long()
    return cells[:, 1] * cfg.bev_w + cells[:, 0]


def _neck_features(model, img: torch.Tensor) -> torch.Tensor:
    """The float64 neck output of ``img``."""
    with torch.no_grad():
        return copy.deepcopy(model).double().eval().backbone(img.double())


def _object_queries(cfg: BEVFormerConfig, head, dirs: _Directions) -> dict:
    """Move the slot queries' reference points onto the slots and give them their kind's gate
    (as strong as four times the content's spread); every query's content leaves the build's
    directions. Returns {"index": the slot queries, "kind": each one's gate index}."""
    c, lin = cfg.embed_dims, head.transformer.reference_points
    queries = slot_queries(head)
    embed = head.query_embedding.weight.data.double()                    # [pos | content]
    embed[:, c:] -= embed[:, c:] @ dirs.all.T @ dirs.all
    w, b = lin.weight.data.double(), lin.bias.data.double()
    targets = slot_targets(cfg)
    logits = torch.log(targets / (1 - targets))
    embed[queries, :c] += (logits - embed[queries, :c] @ w.T - b) @ torch.linalg.pinv(w).T
    kinds = torch.tensor([dirs.kinds.index(kind) for _, _, kind in slots(cfg)])
    strength = _sig(4 * embed[:, c:].std().item(), 3) * math.sqrt(2)
    embed[queries, c:] += strength * dirs.gates[kinds]
    head.query_embedding.weight.data = _round_bits(embed).float()
    return {"index": queries, "kind": kinds}


def _carry_u(head, work, u: torch.Tensor, u_dir: torch.Tensor, encode) -> None:
    """The BEV queries carry ``amp * U`` along u_dir, amp such that the encoder's output
    reads U at U_IN_BEV times its rms (its LayerNorms scale it): a first guess (as strong
    as the embedding's largest values), then the one its read asks for."""
    bev = head.bev_embedding.weight.data.double()

    def carry(amp: float) -> tuple[float, float]:
        head.bev_embedding.weight.data = _round_bits(bev + amp * u.reshape(-1, 1) * u_dir).float()
        work.bev_embedding.weight.data = head.bev_embedding.weight.data.double()
        out = encode()
        return _fit(out @ u_dir, u.reshape(-1))[0], float(out.std())
    first = _sig((4 * math.sqrt(2) * bev.std()).item(), 3)
    read, rms = carry(first)
    carry(_sig(first * U_IN_BEV * rms / abs(read), 3))


def _objectness_into_bev(cfg, head, work, inp, pair, o_dir, tokens, encode) -> None:
    """The last encoder layer's spatial cross attention: its last head samples each BEV
    cell's pillar anchors, those nearest the ground weighing most (FOOT_WEIGHT), U_CHANNELS
    of its value channels read the
    neck's objectness pair, and the output projection writes them along o_dir, so that an
    occupied slot's cell of frame ``inp`` reads OBJECTNESS_IN_BEV times the output's rms."""
    h, dh = cfg.num_heads - 1, cfg.embed_dims // cfg.num_heads
    lp, n = cfg.num_levels * cfg.sca_points, min(U_CHANNELS, dh)
    chans = slice(h * dh, h * dh + n)
    a, b = pair
    with torch.no_grad():
        reads = torch.zeros(cfg.embed_dims, dtype=torch.float64)
        reads[a], reads[b] = 1 / math.sqrt(2), -1 / math.sqrt(2)
        m = work.transformer.encoder.layers[-1].attentions[1].deformable_attention
        feats = inp["feats"].flatten(2).transpose(1, 2)
        value_gain = _sig(m.value_proj(feats).abs().amax(-1).mean().item() * VALUE_RANGE, 3)
        objectness = (feats @ reads).amax().item()
        value_gain /= _sig(max(objectness, 1e-6), 3)

    # the points of the pillar anchor nearest the ground (the objects' foot) weigh most
    span = cfg.pc_range[5] - cfg.pc_range[2]                    # as the encoder places them
    anchors = torch.linspace(0.5, span - 0.5, cfg.pillar_points) + cfg.pc_range[2]
    foot = int((anchors - GROUND_Z).abs().argmin())
    focus = torch.tensor([FOOT_WEIGHT if p % cfg.pillar_points == foot else 0.0 for p in range(lp)])

    def set_gain(out_gain: float) -> None:
        for sca in (work.transformer.encoder.layers[-1].attentions[1],
                    head.transformer.encoder.layers[-1].attentions[1]):
            m = sca.deformable_attention
            for lin, rows in ((m.sampling_offsets, slice(h * lp * 2, (h + 1) * lp * 2)),
                              (m.attention_weights, slice(h * lp, (h + 1) * lp))):
                lin.weight.data[rows], lin.bias.data[rows] = 0, 0
            m.attention_weights.bias.data[h * lp:(h + 1) * lp] = focus.to(
                m.attention_weights.bias.dtype)
            m.value_proj.weight.data[chans] = (reads * value_gain).to(m.value_proj.weight.dtype)
            m.value_proj.bias.data[chans] = 0
            sca.output_proj.weight.data[:, chans] = (o_dir * out_gain).to(
                sca.output_proj.weight.dtype)[:, None]
    first = 1.0 / n
    set_gain(first)
    out = encode(inp)
    full = float((out[tokens] @ o_dir)[inp["occupied"] > 0].median())
    set_gain(_sig(first * OBJECTNESS_IN_BEV * float(out.std()) / max(abs(full), 1e-9), 3))


def _objectness_head(cfg, m, orig, bev_embed, o_dir, o_read, out_dir) -> None:
    """A decoder cross attention's last head: its points at the reference point, uniform
    weights; U_CHANNELS value channels read the objectness (0 on an empty cell, VALUE_RANGE
    of the value range on an occupied one) and the output projection writes it along
    out_dir (GRADIENT_IN_STREAM on an occupied cell)."""
    h, dh = cfg.num_heads - 1, cfg.embed_dims // cfg.num_heads
    lp, n = cfg.num_levels * cfg.decoder_points, min(U_CHANNELS, dh)
    chans = slice(h * dh, h * dh + n)
    value_gain = _sig(m.value_proj(bev_embed).abs().amax(-1).mean().item(), 3) * VALUE_RANGE
    out_gain = _sig(GRADIENT_IN_STREAM / (n * value_gain), 3)
    a, b = o_read
    for mod in (m, orig):
        for lin, rows in ((mod.sampling_offsets, slice(h * lp * 2, (h + 1) * lp * 2)),
                          (mod.attention_weights, slice(h * lp, (h + 1) * lp))):
            lin.weight.data[rows], lin.bias.data[rows] = 0, 0
        vp, op = mod.value_proj, mod.output_proj
        vp.weight.data[chans] = (o_dir * value_gain / a).to(vp.weight.dtype)
        vp.bias.data[chans] = -b * value_gain / a
        op.weight.data[:, chans] = (out_dir * out_gain).to(op.weight.dtype)[:, None]


#: (dx, dy) in cells of the four gradient heads: right, left, front, back
_STEPS = ((1, 0), (-1, 0), (0, 1), (0, -1))


def _gradient_heads(cfg, work, head, bev_embed, u_dir, layer_dirs, read) -> None:
    """Heads 0-3 of each decoder cross attention sample one cell right, left, front, back;
    U_CHANNELS value channels of each read U, and the output projection writes the
    differences and the mean along the layer's directions (see the gains' constants)."""
    dh, lp = cfg.embed_dims // cfg.num_heads, cfg.num_levels * cfg.decoder_points
    step = GRADIENT_STEP_CELLS
    for k, (layer, orig) in enumerate(zip(work.transformer.decoder.layers,
                                          head.transformer.decoder.layers)):
        m = layer.attentions[1]
        value_max = _sig(m.value_proj(bev_embed).abs().amax(-1).mean().item(), 3)
        value_gain = value_max * VALUE_RANGE
        out_gain = _sig(GRADIENT_IN_STREAM / (U_CHANNELS * value_gain), 3)
        for mod in (m, orig.attentions[1]):
            so, vp, op = mod.sampling_offsets, mod.value_proj, mod.output_proj
            for i, (sx, sy) in enumerate(_STEPS):
                rows = slice(i * lp * 2, (i + 1) * lp * 2)
                so.weight.data[rows] = 0
                so.bias.data[rows] = torch.tensor([sx * step, sy * step] * lp, dtype=so.bias.dtype)
                chans = slice(i * dh, i * dh + U_CHANNELS)
                vp.weight.data[chans] = (u_dir * value_gain / read[0]).to(vp.weight.dtype)
                vp.bias.data[chans] = -read[1] * value_gain / read[0]
                col = (layer_dirs[k, 1] * sx + layer_dirs[k, 2] * sy
                       + layer_dirs[k, 3] / len(_STEPS)) * out_gain
                op.weight.data[:, chans] = col.to(op.weight.dtype)[:, None]


def _branches(cfg, work, head, frames: list[dict], dirs: _Directions, queries: dict,
              u) -> None:
    """Calibrate each layer's reg branch (pull, sizes) and cls branch (scores), one layer at
    a time, on the decoder's states of the calibration ``frames`` (their queries side by
    side): the directions are read against the truth at the reference points (the
    gradient and depth of U, the gates, the slots' occupancy)."""
    converging = u is not None
    size = torch.tensor([cfg.bev_w, cfg.bev_h], dtype=torch.float64)
    nq, n = cfg.num_query, len(frames)
    index = torch.cat([queries["index"] + f * nq for f in range(n)])
    kinds = queries["kind"].repeat(n)
    gate = torch.zeros(n * nq, len(dirs.kinds), dtype=torch.float64)
    gate[index, kinds] = 1
    occupied = torch.zeros(n * nq, dtype=torch.float64)
    occupied[index] = torch.cat([inp["occupied"] for inp in frames])

    def sample(loc):                                   # loc (Nq, 2) normalized -> U there
        g = (loc * 2 - 1)[None, :, None, :]
        return nn.functional.grid_sample(u[None, None], g, align_corners=False)[0, 0, :, 0]

    # logit change that moves a point at a slot REFINEMENT_PULL of the way to a well's centre:
    # gradient ~ 2 * step * r / sigma^2 (cells) near it; d(cells)/d(logit) = W p (1 - p) at
    # normalized position p, taken at its mean over the slots (W/4 at the BEV's centre)
    targets = slot_targets(cfg)[:, :2]
    slope = (targets * (1 - targets)).mean(0)

    def pull_gain(k, axis):
        pull = 1.0 if k == cfg.decoder_layers - 1 else REFINEMENT_PULL
        return pull * OBJECT_WELL_CELLS ** 2 / (2 * GRADIENT_STEP_CELLS) / float(
            slope[axis] * size[axis])

    for k, br in enumerate(work.reg_branches):
        states = [_decoder_state(work, inp["bev"], k) for inp in frames]
        x = torch.cat([s for s, _ in states])                               # (n Nq, c)
        obj = x[index] @ dirs.layers[k, 0]
        empty = _sig(float(obj[occupied[index] == 0].mean()))
        reads = {"objectness": ([(_sig(float(obj[(kinds == i) & (occupied[index] > 0)].mean())
                                       - empty), empty) for i in range(len(dirs.kinds))],
                                dirs.layers[k, 0]),
                 "gates": [(_fit(x @ g, gate[:, i]), g) for i, g in enumerate(dirs.gates)]}
        units = 0
        if converging:
            ref = torch.cat([r for _, r in states])
            s = [sample(ref + torch.tensor(d, dtype=torch.float64) * GRADIENT_STEP_CELLS / size)
                 for d in _STEPS]
            truth = torch.stack([s[0] - s[1], s[2] - s[3], sum(s)], -1)
            fits = [_fit(x @ dirs.layers[k, i + 1], truth[:, i]) for i in range(3)]
            _pull(br, head.reg_branches[k], x, fits[:2], [pull_gain(k, i) for i in range(2)],
                  dirs.layers[k, 1:3])
            reads["depth"] = (fits[2], dirs.layers[k, 3])
            units = 4
        _sizes(br, head.reg_branches[k], x, reads["gates"], dirs.kinds,
               [index[kinds == i] for i in range(len(dirs.kinds))], units)
        _score(work.cls_branches[k], head.cls_branches[k], x, reads, dirs.kinds,
               [index[(kinds == i) & (occupied[index] > 0)] for i in range(len(dirs.kinds))])


def _decoder_state(work, bev_embed: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(decoder layer ``k``'s output (Nq, c), the reference points (Nq, 2) it read) of the
    float64 head ``work`` on ``bev_embed``."""
    c = work.cfg.embed_dims
    with torch.no_grad():
        query_pos, query = torch.split(work.query_embedding.weight, c, dim=1)
        init = work.transformer.reference_points(query_pos[None]).sigmoid()
        hs, refs = work.transformer.decoder(query[None], query_pos[None], bev_embed[None], init,
                                            work.reg_branches)
    return hs[k][0], refs[k][0, :, :2]


def _store(work_lin: nn.Linear, lin: nn.Linear, w: torch.Tensor, b: torch.Tensor) -> None:
    work_lin.weight.data, work_lin.bias.data = _round_bits(w), _round_bits(b)
    lin.weight.data = work_lin.weight.data.float()
    lin.bias.data = work_lin.bias.data.float()


def _pull(br, orig, x, fits, gains, dirs) -> None:
    """Hidden units 0-3 of reg branch ``br`` carry +-gradient (x, y); outputs 0 and 1 (the
    position refinement) move down the gradient by ``gains``; the other units and outputs
    keep their mean without them."""
    units = torch.relu(br[0](x))
    mean_units = units[:, :4].mean(0)
    mean_hidden = torch.relu(br[2](units))[:, :4].mean(0)
    w0, b0, w2, b2, w4, b4 = (t.data.clone() for t in (br[0].weight, br[0].bias, br[2].weight,
                                                        br[2].bias, br[4].weight, br[4].bias))
    for i, (a, b) in enumerate(fits):
        for j, sign in enumerate((1.0, -1.0)):
            w0[2 * i + j] = sign * _PULL_GAIN * dirs[i] / a
            b0[2 * i + j] = -sign * _PULL_GAIN * b / a + _PULL_LEVEL
    b2 += w2[:, :4] @ mean_units
    b4 += w4[:, :4] @ mean_hidden
    w2[:, :4] = 0
    w4[:, :4] = 0
    w2[:4] = 0
    w2[:4, :4] = torch.eye(4, dtype=w2.dtype)
    b2[:4] = 0
    for i in range(2):
        w4[i, 2 * i] = -gains[i] / (2 * _PULL_GAIN)
        w4[i, 2 * i + 1] = gains[i] / (2 * _PULL_GAIN)
    for idx, w, b in ((0, w0, b0), (2, w2, b2), (4, w4, b4)):
        _store(br[idx], orig[idx], w, b)


#: the box code's log-size outputs (log w, log l, log h) and the sizes the preset's biases give
_LOG_SIZE_ROWS = (2, 3, 5)


#: the box code's position outputs (dx, dy, dz): the refinement of the reference point
_POSITION_ROWS = (0, 1, 4)


def _sizes(br, orig, x, gates, kinds, members: list[torch.Tensor], first: int) -> None:
    """Hidden units ``first``.. of reg branch ``br``, one per kind, carry relu(gate) (about
    1 on the kind's object queries, ``members``); each moves the log width, length and
    height from a car's to its kind's, and takes back the kind's queries' mean position
    refinement, so that they keep to their slots. The other units and outputs keep their
    mean without them."""
    n = len(kinds)
    units = slice(first, first + n)
    w0, b0, w2, b2, w4, b4 = (t.data.clone() for t in (br[0].weight, br[0].bias, br[2].weight,
                                                        br[2].bias, br[4].weight, br[4].bias))
    hidden = torch.relu(br[0](x))
    b2 += w2[:, units] @ hidden[:, units].mean(0)
    w2[:, units] = 0
    second = torch.relu(br[2](hidden))
    b4 += w4[:, units] @ second[:, units].mean(0)
    w4[:, units] = 0
    car = torch.tensor(_BOX_TYPES["car"][0], dtype=torch.float64).log()
    for i, ((a, b), g) in enumerate(gates):
        u = first + i
        w0[u], b0[u] = g / a, -b / a                      # relu(gate): 1 on its queries
        w2[u], b2[u] = 0, 0
        w2[u, u] = 1
        delta = torch.tensor(_BOX_TYPES[kinds[i]][0], dtype=torch.float64).log() - car
        w4[list(_LOG_SIZE_ROWS), u] = delta
    for idx, w, b in ((0, w0, b0), (2, w2, b2), (4, w4, b4)):
        _store(br[idx], orig[idx], w, b)
    out, unit = br(x), torch.relu(br[0](x))
    for i in range(n):
        q = members[i]
        w4[list(_POSITION_ROWS), first + i] = -out[q][:, list(_POSITION_ROWS)].mean(0) / \
            unit[q, first + i].mean().clamp(min=1e-6)
    _store(br[4], orig[4], w4, b4)


def _mirror_rest(w: torch.Tensor, b: torch.Tensor, first: int) -> None:
    """Rows ``first``.. of a layer become pairs of opposite signs (the second half the
    first's negatives; an odd one out 0), so that with the score units' mirrors every
    query's hidden units average exactly 0 and the LayerNorm after them subtracts
    nothing: a score unit that is off stays 0."""
    rest = list(range(first, w.shape[0]))
    half = len(rest) // 2
    w[rest[half:2 * half]], b[rest[half:2 * half]] = -w[rest[:half]], -b[rest[:half]]
    w[rest[2 * half:]], b[rest[2 * half:]] = 0, 0


def _score(br, orig, x, reads, kinds, occupied: list[torch.Tensor]) -> None:
    """The class logits of cls branch ``br`` are its biases (their former means), plus
    SCORE_BOOST (on average over its ``occupied`` queries) on a kind's class where its
    hidden units see its gate and the objectness (and the depth) hold, each term read so
    that it is about 1 where it holds: every other query scores its class's prior,
    whatever INT8 rounds (a trained detector's empty queries score near it):

    - first layer, units_per_kind of each: ``relu(GATE_WEIGHT * (gate - 1) + objectness
      (+ depth - 1) - SCORE_FROM)`` and ``relu(objectness - SCORE_FULL)`` (the objectness
      beyond what the first needs);
    - second layer: their difference, ``min(objectness - SCORE_FROM, SCORE_FULL -
      SCORE_FROM)`` where the gate holds, 0 without it however strong an object's cell
      (and on an empty slot).

    Each unit has a mirror of the opposite sign, and so have the branch's other units
    (_mirror_rest): the LayerNorms' mean is 0 for every query, so they only scale the units
    (a unit that is off stays off). Several units, so
    that no class weight sets a per-channel INT8 grid far coarser than the others'. The
    other units no longer read them."""
    from .config import CLASS_NAMES
    n = units_per_kind(br[0].out_features, len(kinds))
    first, second = 4 * n * len(kinds), 2 * n * len(kinds)
    objectness, o_dir = reads["objectness"]
    for ln, o, count in ((br[1], orig[1], first), (br[4], orig[4], second)):
        ln.weight.data[:count], ln.bias.data[:count] = 1.0, 0.0
        o.weight.data[:count], o.bias.data[:count] = 1.0, 0.0
    w0, b0 = br[0].weight.data.clone(), br[0].bias.data.clone()
    sd = _sig(br[0](x).std().item(), 3)
    extra_w, extra_b = torch.zeros_like(o_dir), -SCORE_FROM - GATE_WEIGHT
    if "depth" in reads:         # the depth: the sum of four samples of U, -4 at most
        (da, db), d_dir = reads["depth"]
        extra_w, extra_b = -d_dir / da / 4, extra_b + db / da / 4 - 1
    rows = [[list(range(i * 4 * n + j * n, i * 4 * n + (j + 1) * n)) for j in range(4)]
            for i in range(len(kinds))]          # per kind: on, its mirror, excess, mirror
    for i, (((ga, gb), g), (oa, ob)) in enumerate(zip(reads["gates"], objectness)):
        on_w = (extra_w + o_dir / oa + GATE_WEIGHT * g / ga) * 2 * sd
        on_b = (extra_b - ob / oa - GATE_WEIGHT * gb / ga) * 2 * sd
        ex_w, ex_b = o_dir / oa * 2 * sd, (-ob / oa - SCORE_FULL) * 2 * sd
        for r, (w, b) in zip(rows[i], ((on_w, on_b), (-on_w, -on_b), (ex_w, ex_b),
                                       (-ex_w, -ex_b))):
            w0[r], b0[r] = w, b
    _mirror_rest(w0, b0, first)
    _store(br[0], orig[0], w0, b0)
    h1 = torch.relu(br[1](br[0](x)))
    w3, b3 = br[3].weight.data.clone(), br[3].bias.data.clone()
    b3 += w3[:, :first] @ h1[:, :first].mean(0)
    w3[:, :first] = 0
    w3[:second], b3[:second] = 0, 0
    scale = _sig(br[3](h1).std().item(), 3) * SCORE_SPREAD
    main = [list(range(i * 2 * n, i * 2 * n + n)) for i in range(len(kinds))]
    for i, (on, _, excess, _) in enumerate(rows):
        for sign, r in ((1, main[i]), (-1, [u + n for u in main[i]])):
            w3[r, on], w3[r, excess] = sign * scale, -sign * scale
    _mirror_rest(w3, b3, second)
    _store(br[3], orig[3], w3, b3)
    h2 = torch.relu(br[4](br[3](h1)))
    w6, b6 = br[6].weight.data.clone(), br[6].bias.data.clone()
    b6 += w6 @ h2.mean(0)                 # the class logits read the score units only
    w6[:] = 0
    h2 = h2[:, :second]
    found = [float(h2[q][:, main[i]].sum(-1).mean()) for i, q in enumerate(occupied) if len(q)]
    typical = sorted(found)[len(found) // 2]
    for i, kind in enumerate(kinds):      # a kind whose objects barely fired takes the median
        on = float(h2[occupied[i]][:, main[i]].sum(-1).mean()) if len(occupied[i]) else 0.0
        w6[CLASS_NAMES.index(kind), main[i]] = SCORE_BOOST / _sig(
            on if on > 0.25 * typical else typical, 3)
    b6 -= w6[:, :second] @ h2.mean(0)
    _store(br[6], orig[6], w6, b6)
