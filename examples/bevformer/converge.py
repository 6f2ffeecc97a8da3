"""A decoder whose box refinements converge on objects, built into synthetic weights.

A trained BEVFormer decoder refines each reference point towards the object its BEV features
show, so an error in one layer's reference point (the INT8 grid of the normalized points is
0.8 m) is corrected by the next layers instead of adding up; and one query per object scores
high. Without this, tiny's INT8 detections drift from the float ones by the grid's rounding
summed over six layers. The construction (for BEV grids that resolve objects, MAX_CELL_M):

- **Objects.** OBJECTS_PER_100_CELLS synthetic objects, at the initial reference points of
  as many queries (the object queries, well apart). The BEV queries carry a potential ``U``
  (minus a Gaussian well of OBJECT_WELL_CELLS at each object) along a direction that no
  encoder layer writes into; the object queries carry a gate along another.
- **Gradient heads.** In each decoder cross attention, heads 0-3 sample the BEV features one
  cell right, left, front and back of the reference point (all their points at one fixed
  offset); U_CHANNELS value channels of each read ``U``. The output projection writes the central
  differences (the gradient) and their mean (the depth) along directions of the layer's own,
  which nothing else writes into.
- **Pull.** Each reg branch spends four hidden units on ``relu(+-gain * gradient + level)``:
  the reference point moves down the gradient, REFINEMENT_PULL of the way to a well's
  centre per layer (all the way in the last layer, whose box is the output).
- **Scores.** Each cls branch spends SCORE_UNITS hidden units on ``relu(depth + gate - 1.5)``:
  an object query on its object gains up to SCORE_BOOST logits; the others stay as they were.

Each piece is spread over several weak channels or units where one strong one would set the
per-tensor (or per-channel) INT8 weight grid of the whole layer.

Directions are pairs of channels, ``(e_a - e_b) / sqrt(2)``, and every LayerNorm gives both
channels of a pair one weight and one bias, so normalization scales a direction without
mixing anything into it. The gains are fitted on a float64 forward of the calibration frame.
"""
from __future__ import annotations

import copy
import math

import torch
from torch import nn

from .config import BEVFormerConfig
from .weights import _round_bits, _run_hooked

#: BEV cells no larger than this resolve an object's well (``tiny``: 2.05 m; ``test``'s
#: 10 m cells do not, and its decoder keeps the plain refinement)
MAX_CELL_M = 4.0
#: synthetic objects per 100 BEV cells (25 on tiny's 50x50, as nuScenes scenes hold)
OBJECTS_PER_100_CELLS = 1.0
#: the width (sigma) of each object's potential well, in BEV cells
OBJECT_WELL_CELLS = 1.5
#: the gradient heads' sampling offset, in BEV cells
GRADIENT_STEP_CELLS = 1.0
#: the fraction of the way to a well's centre that each refinement moves a reference point
REFINEMENT_PULL = 0.5
#: how strongly the BEV features carry U: its read along its direction at a well's centre,
#: in units of the encoder output's per-channel rms
U_IN_BEV = 2.0
#: the value channels of each gradient head that read U, and U's range in them (a fraction
#: of the value tensor's): many weak channels, so that no weight sets a per-tensor INT8
#: weight grid far coarser than the others'
U_CHANNELS = 8
VALUE_RANGE = 0.33
#: the gradient's size in the decoder's stream (a well's steepest is about 0.8 of U)
GRADIENT_IN_STREAM = 0.4
#: the pull's hidden units in each reg branch: relu(+-gain * gradient + level)
_PULL_GAIN, _PULL_LEVEL = 2.0, 2.0
#: the logit a query on an object's centre gains over one far from objects, and the cls
#: branch's hidden units that carry it
SCORE_BOOST = 4.0
SCORE_UNITS = 8


def _sig(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


def resolves_objects(cfg: BEVFormerConfig) -> bool:
    """Whether ``cfg``'s BEV grid is fine enough for the construction (MAX_CELL_M)."""
    return max(cfg.grid_length) <= MAX_CELL_M


def initial_anchors(head) -> torch.Tensor:
    """(Nq, 2) float64: each query's initial reference point (x, y), normalized, as the
    transformer computes it from the query embedding's positional half."""
    lin, c = head.transformer.reference_points, head.cfg.embed_dims
    pos = head.query_embedding.weight.data.double()[:, :c]
    return torch.sigmoid(pos @ lin.weight.data.double().T + lin.bias.data.double())[:, :2]


def object_queries(cfg: BEVFormerConfig, anchors: torch.Tensor) -> torch.Tensor:
    """Indices of the queries that sit on the synthetic objects: in query order, those whose
    initial reference point (``anchors`` (Nq, 2) normalized) is two cells inside the BEV
    and three well widths from the objects taken before, OBJECTS_PER_100_CELLS of them (at
    least 12)."""
    n = max(12, round(OBJECTS_PER_100_CELLS * cfg.num_bev / 100))
    size = torch.tensor([cfg.bev_w, cfg.bev_h], dtype=torch.float64)
    cells = anchors.double() * size
    margin = min(2.0, float(size.min()) / 4)
    taken: list[int] = []
    for q, p in enumerate(cells):
        if len(taken) == n:
            break
        inside = bool(((p >= margin) & (p <= size - margin)).all())
        if inside and all(float((p - cells[t]).norm()) >= 3 * OBJECT_WELL_CELLS for t in taken):
            taken.append(q)
    return torch.tensor(taken, dtype=torch.long)


def potential(cfg: BEVFormerConfig, centres: torch.Tensor) -> torch.Tensor:
    """(bev_h, bev_w) potential at the cell centres: minus a unit Gaussian well per object."""
    ys, xs = torch.meshgrid(torch.arange(cfg.bev_h, dtype=torch.float64) + 0.5,
                            torch.arange(cfg.bev_w, dtype=torch.float64) + 0.5, indexing="ij")
    d2 = (xs[..., None] - centres[:, 0]) ** 2 + (ys[..., None] - centres[:, 1]) ** 2
    return -torch.exp(-d2 / (2 * OBJECT_WELL_CELLS ** 2)).sum(-1)


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


def _fit(y: torch.Tensor, x: torch.Tensor) -> tuple[float, float]:
    """Least squares y ~ a * x + b, rounded."""
    xm, ym = x.mean(), y.mean()
    a = ((x - xm) * (y - ym)).sum() / (x - xm).pow(2).sum()
    return _sig(a.item()), _sig((ym - a * xm).item())


#: (dx, dy) in cells of the four gradient heads: right, left, front, back
_STEPS = ((1, 0), (-1, 0), (0, 1), (0, -1))


def build(model, feats: torch.Tensor, inp: dict, seed: int) -> None:
    """Make ``model``'s decoder converge on synthetic objects (see the module docstring).
    ``feats``: the float64 neck output of the calibration frame ``inp`` (with prev_bev)."""
    cfg, head = model.cfg, model.pts_bbox_head
    tr, c, layers = head.transformer, cfg.embed_dims, cfg.decoder_layers
    dirs, pairs = _pair_directions(c, 2 + 3 * layers, seed)
    u_dir, gate_dir = dirs[0], dirs[1]
    layer_dirs = dirs[2:].view(layers, 3, c)                        # (gx, gy, depth) per layer
    for m in list(tr.encoder.modules()) + list(tr.decoder.modules()):
        if isinstance(m, nn.LayerNorm):
            _tie_pairs(m, pairs)
    for layer in tr.encoder.layers:
        for lin in (layer.attentions[0].output_proj, layer.attentions[1].output_proj,
                    layer.ffns[0].layers[1]):
            _write_outside(lin, dirs)
    for layer in tr.decoder.layers:
        for lin in (layer.attentions[0].attn.out_proj, layer.attentions[1].output_proj,
                    layer.ffns[0].layers[1]):
            _write_outside(lin, dirs)
    embed = head.query_embedding.weight.data.double()                    # [pos | content]
    embed[:, c:] -= embed[:, c:] @ dirs.T @ dirs
    anchors = initial_anchors(head)
    chosen = object_queries(cfg, anchors)
    size = torch.tensor([cfg.bev_w, cfg.bev_h], dtype=torch.float64)
    embed[chosen, c:] += _sig(4 * embed[:, c:].std().item(), 3) * math.sqrt(2) * gate_dir
    head.query_embedding.weight.data = _round_bits(embed).float()

    u = potential(cfg, anchors[chosen].double() * size)
    work = copy.deepcopy(head).double().eval()

    def carry_u(amp: float) -> tuple[torch.Tensor, tuple[float, float]]:
        """The BEV queries carry ``amp * U`` along u_dir: the encoder's output, and its
        read along u_dir fitted to U (a, b)."""
        bev = head.bev_embedding.weight.data.double()
        bev = bev + (amp * u.reshape(-1, 1) - bev @ u_dir[:, None]) @ u_dir[None]
        head.bev_embedding.weight.data = _round_bits(bev).float()
        work.bev_embedding.weight.data = head.bev_embedding.weight.data.double()
        with torch.no_grad():
            out = work.transformer.get_bev_features(
                feats, work.bev_embedding.weight, work.positional_encoding(),
                inp["lidar2img"].double(), inp["can_bus"].double(), inp["prev_bev"].double())[0]
        return out, _fit(out @ u_dir, u.reshape(-1))
    # a first guess (as strong as the embedding's largest values), then U_IN_BEV after the
    # encoder, whose LayerNorms scale it
    amp = _sig((4 * math.sqrt(2) * head.bev_embedding.weight.data.double().std()).item(), 3)
    bev_embed, (read_a, _) = carry_u(amp)
    bev_embed, (read_a, read_b) = carry_u(
        _sig(amp * U_IN_BEV * float(bev_embed.std()) / abs(read_a), 3))
    _gradient_heads(cfg, work, head, bev_embed, u_dir, layer_dirs, (read_a, read_b))
    _pull_and_score(cfg, work, head, feats, inp, u, layer_dirs, gate_dir, chosen)


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
                col = (layer_dirs[k, 0] * sx + layer_dirs[k, 1] * sy
                       + layer_dirs[k, 2] / len(_STEPS)) * out_gain
                op.weight.data[:, chans] = col.to(op.weight.dtype)[:, None]


def _pull_and_score(cfg, work, head, feats, inp, u, layer_dirs, gate_dir, chosen) -> None:
    """Calibrate each layer's reg branch (pull) and cls branch (score) on a forward pass:
    the directions are read against the true gradient and depth at the reference points."""
    grid = u[None, None]                                            # (1, 1, H, W)
    size = torch.tensor([cfg.bev_w, cfg.bev_h], dtype=torch.float64)
    gate = torch.zeros(cfg.num_query, dtype=torch.float64)       # 1 on the object queries
    gate[chosen] = 1
    truth: dict[int, torch.Tensor] = {}
    done: set[int] = set()

    def sample(loc):                                   # loc (Nq, 2) normalized -> U there
        g = (loc * 2 - 1)[None, :, None, :]
        return nn.functional.grid_sample(grid, g, align_corners=False)[0, 0, :, 0]

    def record(k):
        def hook(mod, args):
            if k in truth:
                return
            ref = args[3][0, :, 0, :].double()                     # (Nq, 2)
            s = [sample(ref + torch.tensor(d, dtype=torch.float64) * GRADIENT_STEP_CELLS / size)
                 for d in _STEPS]
            truth[k] = torch.stack([s[0] - s[1], s[2] - s[3], sum(s)], -1)
        return hook

    # logit change that moves a point at the BEV centre REFINEMENT_PULL of the way to a
    # well's centre: gradient ~ 2 * step * r / sigma^2 (cells) near it; d(cells)/d(logit) = W/4
    def pull_gain(k, axis):
        pull = 1.0 if k == cfg.decoder_layers - 1 else REFINEMENT_PULL
        cells = float(size[axis])
        return pull * OBJECT_WELL_CELLS ** 2 / (2 * GRADIENT_STEP_CELLS) * 4 / cells

    def branch(k):
        def hook(br, args):
            if k in done:
                return
            done.add(k)
            x = args[0][0]                                                  # (Nq, c)
            fits = [_fit(x @ layer_dirs[k, i], truth[k][:, i]) for i in range(3)]
            _pull(br, head.reg_branches[k], x, fits[:2], [pull_gain(k, i) for i in range(2)],
                  layer_dirs[k])
            _score(work.cls_branches[k], head.cls_branches[k], x, fits[2], layer_dirs[k, 2],
                   _fit(x @ gate_dir, gate), gate_dir)
        return hook
    hooks = [layer.register_forward_pre_hook(record(k))
             for k, layer in enumerate(work.transformer.decoder.layers)]
    hooks += [br.register_forward_pre_hook(branch(k)) for k, br in enumerate(work.reg_branches)]
    _run_hooked(work, feats, inp, hooks)


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


def _score(br, orig, x, fit, depth_dir, gate_fit, gate_dir) -> None:
    """Hidden units 0..SCORE_UNITS-1 of cls branch ``br`` carry relu(depth + gate - 1.5): the
    depth (0 far from objects, about 1 on one's centre) of the queries that carry the gate
    (the objects' own queries; a trained detector's other queries on an object stay low),
    through both LayerNorms; together they add up to SCORE_BOOST to every class logit (many
    units, so that no class weight sets a per-channel INT8 grid far coarser than the
    others'). The other units no longer read them."""
    a, b = fit
    ga, gb = gate_fit
    n = SCORE_UNITS
    for ln, o in ((br[1], orig[1]), (br[4], orig[4])):
        ln.weight.data[:n], ln.bias.data[:n] = 1.0, 0.0
        o.weight.data[:n], o.bias.data[:n] = 1.0, 0.0
    w0, b0 = br[0].weight.data.clone(), br[0].bias.data.clone()
    sd = _sig(br[0](x).std().item(), 3)
    # the depth (truth: the sum of four samples, -4 at most) plus the gate, less 1.5: a query
    # without the gate stays below 0 with a margin, deep in a well or not
    w0[:n] = (-depth_dir / a / 4 + gate_dir / ga) * 2 * sd
    b0[:n] = (b / a / 4 - gb / ga - 1.5) * 2 * sd
    _store(br[0], orig[0], w0, b0)
    h1 = torch.relu(br[1](br[0](x)))
    w3, b3 = br[3].weight.data.clone(), br[3].bias.data.clone()
    b3 += w3[:, :n] @ h1[:, :n].mean(0)
    w3[:, :n] = 0
    w3[:n] = 0
    w3[:n, :n] = torch.eye(n, dtype=w3.dtype) * _sig(br[3](h1).std().item(), 3)
    b3[:n] = 0
    _store(br[3], orig[3], w3, b3)
    h2 = torch.relu(br[4](br[3](h1)))[:, :n]
    w6, b6 = br[6].weight.data.clone(), br[6].bias.data.clone()
    b6 += w6[:, :n] @ h2.mean(0)
    w6[:, :n] = SCORE_BOOST / n / max(_sig(h2.max().item(), 3), 1e-6)
    b6 -= w6[:, :n] @ h2.mean(0)
    _store(br[6], orig[6], w6, b6)
