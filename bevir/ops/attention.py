"""BEVFormer's attention modules as ops: multi-scale deformable attention and the modules
built on it (temporal self-attention, spatial cross-attention, decoder cross-attention),
mmcv's multi-head attention and FFN. Float semantics are those of the PyTorch modules in
examples/bevformer/model.py (mmcv 1.4 / BEVFormer). Each module op also defines
``decompose``: the same computation in primitive ops (linear layers as gemm, softmax,
one ms_deform_attn), which the ``decompose`` pass uses before quantization.
"""
from __future__ import annotations

import numpy as np

from ..ir.types import TensorType
from .common import float_operands, level_shapes, require
from .kernels import kernel_for
from .nn import softmax_np
from ..ir.opdef import FixedLowering, Int, Ints, OpDef, Str
from .cost import sampling_work
from .elementwise import relu_values
from .onnx_export import ms_deform_attn


def _linear(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    lead = x.shape[:-1]
    return (x.reshape(-1, x.shape[-1]) @ w.T + b).reshape(*lead, w.shape[0])


# ---- decompositions into primitive ops (the decompose pass; see bevir/passes/decompose.py)
def _part(b, node, part: str):
    """Builder context giving a part of a decomposed module its own provenance."""
    return b.loc(f"{node.loc}/{part}" if node.loc else part)


def _linear_ir(b, x, w, bias):
    """x @ w.T + bias over the last axis, as gemm on the flattened tokens (what _linear
    computes)."""
    shape = x.type.shape
    flat = x if len(shape) == 2 else b.reshape(x, shape=(int(np.prod(shape[:-1])), shape[-1]))
    y = b.gemm(flat, w, bias, trans_b=True)
    return y if len(shape) == 2 else b.reshape(y, shape=(*shape[:-1], w.type.shape[0]))


def _rows(b, w, start: int, stop: int):
    """Rows start:stop of a weight (a slice; canonicalize folds it on constants)."""
    return b.slice(w, starts=(start,), ends=(stop,), axes=(0,), steps=(1,))


def _deform_sample_ir(b, node, c, query, value, place, so_w, so_b, aw_w, aw_b, vp_w, vp_b,
                      groups: int = 1):
    """_deform_sample in primitive ops: projections, softmaxed weights, placed locations,
    one ms_deform_attn."""
    heads, levels, points = c.num_heads, c.num_levels, c.num_points
    bs, nq = query.type.shape[:2]
    with _part(b, node, "value_proj"):
        v = _linear_ir(b, value, vp_w, vp_b)
        v = b.reshape(v, shape=(*value.type.shape[:2], heads, value.type.shape[2] // heads))
    with _part(b, node, "sampling_offsets"):
        off = b.reshape(_linear_ir(b, query, so_w, so_b),
                        shape=(bs, nq, heads, groups, levels, points, 2))
        sizes = np.array([[w, h] for h, w in level_shapes(c.spatial_shapes)], np.float32)
        off = b.div(off, b.const(sizes[:, None, :], "level_sizes"))
    with _part(b, node, "attention_weights"):
        aw = b.reshape(_linear_ir(b, query, aw_w, aw_b),
                       shape=(bs, nq, heads, groups, levels * points))
        aw = b.reshape(b.softmax(aw, axis=-1), shape=(bs, nq, heads, groups, levels, points))
    with _part(b, node, "sampling"):
        loc, aw = place(off, aw)
        return b.ms_deform_attn(v, loc, aw, spatial_shapes=c.spatial_shapes)


def _project_out(b, node, x, op_w, op_b, residual):
    with _part(b, node, "output_proj"):
        return b.add(_linear_ir(b, x, op_w, op_b), residual)


def _deform_sample(c, query, value, ref_fn, so_w, so_b, aw_w, aw_b, vp_w, vp_b, groups=1):
    """The shared core: project the value, compute offsets and softmaxed weights from the
    query, place the sampling locations with ``ref_fn(offsets / size)`` and sample.

    ``groups`` splits the offset/weight heads into (groups) x (heads) (TSA's queue)."""
    heads, levels, points = c.num_heads, c.num_levels, c.num_points
    bs, nq = query.shape[:2]
    v = _linear(value, vp_w, vp_b)
    v = v.reshape(v.shape[0], v.shape[1], heads, -1)
    off = _linear(query, so_w, so_b).reshape(bs, nq, heads, groups, levels, points, 2)
    aw = softmax_np(_linear(query, aw_w, aw_b).reshape(bs, nq, heads, groups, levels * points), -1)
    aw = aw.reshape(bs, nq, heads, groups, levels, points)
    sizes = np.array([[w, h] for h, w in level_shapes(c.spatial_shapes)], query.dtype)
    loc, aw = ref_fn(off / sizes[:, None, :], aw)
    return kernel_for("ms_deform_attn")(c, v, loc, aw)      # the node's spatial_shapes


class _DeformOp(OpDef):
    attrs = {"num_heads": Int(), "num_levels": Int(1), "num_points": Int(),
             "spatial_shapes": Ints()}

    def check(self, c, query, value):
        float_operands(query, value)
        require(len(c.spatial_shapes) == 2 * c.num_levels, "spatial_shapes needs (h, w) per level")
        require(query.rank == 3 and value.rank == 3 and query.shape[-1] == value.shape[-1],
                f"query {query} and value {value} must be (batch, tokens, channels)")
        require(value.shape[1] == sum(h * w for h, w in level_shapes(c.spatial_shapes)),
                f"value has {value.shape[1]} tokens, spatial_shapes {list(c.spatial_shapes)} need "
                f"{sum(h * w for h, w in level_shapes(c.spatial_shapes))}")
        require(query.shape[-1] % c.num_heads == 0, "channels must divide by num_heads")

    def macs(self, c):
        """The linear layers plus 4 bilinear taps per sample and channel (approximate: SCA
        samples once per camera)."""
        q, v = c.in_types[0], c.in_types[1] or c.in_types[0]
        so, aw, vp, op = (c.in_types[i] for i in (4, 6, 8, 10))
        tq, tv = q.numel // q.shape[-1], v.numel // v.shape[-1]
        samples = tq * c.num_heads * c.num_levels * c.num_points * (q.shape[-1] // c.num_heads)
        return tq * (so.numel + aw.numel + op.numel) + tv * vp.numel + 4 * samples


class TemporalSelfAttention(_DeformOp):
    """BEVFormer TemporalSelfAttention: deformable self-attention over [prev_bev, query]
    (value omitted: [query, query]), offsets from [value[0], query+pos], averaged over the
    queue, output projection and residual. query (bs, Q, C); reference_points
    (bs*queue, Q, L, 2)."""

    name = "temporal_self_attention"
    operands = ("query", "value?", "query_pos", "reference_points",
                "so_w", "so_b", "aw_w", "aw_b", "vp_w", "vp_b", "op_w", "op_b")
    attrs = {**_DeformOp.attrs, "num_bev_queue": Int(2)}

    def infer(self, c, query, value, pos, ref, *params):
        self.check(c, query, value or query.with_(
            shape=(query.shape[0] * c.num_bev_queue,) + query.shape[1:]))
        require(pos.shape == query.shape, f"query_pos {pos} must match query {query}")
        return query

    def compute(self, c, query, value, pos, ref, so_w, so_b, aw_w, aw_b, vp_w, vp_b, op_w, op_b):
        nbq = c.num_bev_queue
        bs, nq, ch = query.shape
        if value is None:
            value = np.stack([query] * nbq, 1).reshape(bs * nbq, nq, ch)
        q = query + pos
        qcat = np.concatenate([value[:bs], q], -1)

        def place(off, aw):     # (bs, Q, H, queue, L, P, ...) -> batch = b*queue + i
            off = off.transpose(0, 3, 1, 2, 4, 5, 6).reshape(bs * nbq, nq, *off.shape[2:3],
                                                              *off.shape[4:])
            aw = aw.transpose(0, 3, 1, 2, 4, 5).reshape(bs * nbq, nq, aw.shape[2], *aw.shape[4:])
            return ref[:, :, None, :, None, :] + off, aw
        out = _deform_sample(c, qcat, value, place, so_w, so_b, aw_w, aw_b, vp_w, vp_b, groups=nbq)
        out = out.transpose(1, 2, 0).reshape(nq, ch, bs, nbq).mean(-1).transpose(2, 0, 1)
        return (_linear(out, op_w, op_b) + query).astype(query.dtype)

    def decompose(self, b, node):
        c = self.ctx(node)
        query, value, pos, ref, *params = node.inputs
        nbq, (bs, nq, ch) = c.num_bev_queue, query.type.shape
        heads, levels, points = c.num_heads, c.num_levels, c.num_points
        with _part(b, node, "queue"):
            if value is None:
                value = b.reshape(b.concat(*[b.unsqueeze(query, axes=(1,))] * nbq, axis=1),
                                  shape=(bs * nbq, nq, ch))
            first = b.slice(value, starts=(0,), ends=(bs,), axes=(0,), steps=(1,))
            qcat = b.concat(first, b.add(query, pos), axis=-1)

        def place(off, aw):
            off = b.reshape(b.transpose(off, perm=(0, 3, 1, 2, 4, 5, 6)),
                            shape=(bs * nbq, nq, heads, levels, points, 2))
            aw = b.reshape(b.transpose(aw, perm=(0, 3, 1, 2, 4, 5)),
                           shape=(bs * nbq, nq, heads, levels, points))
            return b.add(b.reshape(ref, shape=(bs * nbq, nq, 1, levels, 1, 2)), off), aw
        out = _deform_sample_ir(b, node, c, qcat, value, place, *params[:6], groups=nbq)
        with _part(b, node, "queue_mean"):
            out = b.reshape(b.transpose(out, perm=(1, 2, 0)), shape=(nq, ch, bs, nbq))
            out = b.transpose(b.reduce_mean(out, axes=(-1,), keepdims=False), perm=(2, 0, 1))
        return [_project_out(b, node, out, *params[6:], query)]


class SpatialCrossAttention(_DeformOp):
    """BEVFormer SpatialCrossAttention (dense form) with MSDeformableAttention3D: every
    camera samples its features at the query's projected pillar anchors (point p uses anchor
    p % D); results of the cameras that see the query (any anchor in bev_mask) are summed in
    camera order and divided by their count (at least 1); output projection and residual.
    query (1, Q, C); value (N, V, C); reference_points_cam (N, Q, D, 2); bev_mask (N, Q, D)."""

    name = "spatial_cross_attention"
    operands = ("query", "value", "reference_points_cam", "bev_mask",
                "so_w", "so_b", "aw_w", "aw_b", "vp_w", "vp_b", "op_w", "op_b")
    attrs = {**_DeformOp.attrs, "num_cams": Int(6)}

    def infer(self, c, query, value, ref, mask, *params):
        self.check(c, query, value)
        require(value.shape[0] == c.num_cams and ref.shape[:2] == (c.num_cams, query.shape[1])
                and mask.shape == ref.shape[:3], f"cameras: value {value}, reference points {ref}, "
                f"mask {mask} must agree with num_cams={c.num_cams} and the query {query}")
        require(c.num_points % ref.shape[2] == 0, "num_points must be a multiple of the anchors")
        return query

    def compute(self, c, query, value, ref, mask, so_w, so_b, aw_w, aw_b, vp_w, vp_b, op_w, op_b):
        n, nq, d = ref.shape[:3]
        heads, levels, points = c.num_heads, c.num_levels, c.num_points

        def place(off, aw):     # offsets from the shared query, broadcast over cameras
            off = off[:, :, :, 0].reshape(1, nq, heads, levels, points // d, d, 2)
            loc = ref[:, :, None, None, None, :, :] + off
            aw = np.broadcast_to(aw[:, :, :, 0], (n, nq, heads, levels, points))
            return loc.reshape(n, nq, heads, levels, points, 2), aw
        out = _deform_sample(c, query, value, place, so_w, so_b, aw_w, aw_b, vp_w, vp_b)
        visible = mask.any(-1).astype(query.dtype)                   # (N, Q)
        slots = np.zeros_like(query[0])
        for i in range(n):                                           # camera order, as the module
            slots = slots + out[i] * visible[i][:, None]
        count = np.maximum(visible.sum(0), 1.0)
        slots = (slots / count[:, None])[None]
        return (_linear(slots, op_w, op_b) + query).astype(query.dtype)

    def decompose(self, b, node):
        c = self.ctx(node)
        query, value, ref, mask, *params = node.inputs
        n, nq, d = ref.type.shape[:3]
        heads, levels, points = c.num_heads, c.num_levels, c.num_points

        def place(off, aw):
            off = b.reshape(off, shape=(1, nq, heads, levels, points // d, d, 2))
            loc = b.add(b.reshape(ref, shape=(n, nq, 1, 1, 1, d, 2)), off)
            aw = b.expand(b.reshape(aw, shape=(1, nq, heads, levels, points)),
                          shape=(n, nq, heads, levels, points))
            return b.reshape(loc, shape=(n, nq, heads, levels, points, 2)), aw
        out = _deform_sample_ir(b, node, c, query, value, place, *params[:6])
        with _part(b, node, "camera_mean"):
            visible = b.reduce_max(b.cast(mask, to="f32"), axes=(-1,), keepdims=True)
            slots = b.reduce_sum(b.mul(out, visible), axes=(0,), keepdims=True)
            count = b.max(b.reduce_sum(visible, axes=(0,), keepdims=True),
                          b.const(np.ones((1, 1, 1), np.float32), "one"))
            slots = b.div(slots, count)
        return [_project_out(b, node, slots, *params[6:], query)]


class DeformableCrossAttention(_DeformOp):
    """BEVFormer CustomMSDeformableAttention (the decoder's cross-attention into the BEV):
    offsets and weights from query+pos, output projection and residual. query/query_pos
    (bs, Nq, C); value (bs, V, C); reference_points (bs, Nq, L, 2)."""

    name = "deformable_cross_attention"
    operands = ("query", "value", "query_pos", "reference_points",
                "so_w", "so_b", "aw_w", "aw_b", "vp_w", "vp_b", "op_w", "op_b")

    def infer(self, c, query, value, pos, ref, *params):
        self.check(c, query, value)
        require(pos.shape == query.shape, f"query_pos {pos} must match query {query}")
        return query

    def compute(self, c, query, value, pos, ref, so_w, so_b, aw_w, aw_b, vp_w, vp_b, op_w, op_b):
        def place(off, aw):
            return ref[:, :, None, :, None, :] + off[:, :, :, 0], aw[:, :, :, 0]
        out = _deform_sample(c, query + pos, value, place, so_w, so_b, aw_w, aw_b, vp_w, vp_b)
        return (_linear(out, op_w, op_b) + query).astype(query.dtype)

    def decompose(self, b, node):
        c = self.ctx(node)
        query, value, pos, ref, *params = node.inputs
        bs, nq = query.type.shape[:2]
        shape = (bs, nq, c.num_heads, c.num_levels, c.num_points)

        def place(off, aw):
            loc = b.add(b.reshape(ref, shape=(bs, nq, 1, c.num_levels, 1, 2)),
                        b.reshape(off, shape=shape + (2,)))
            return loc, b.reshape(aw, shape=shape)
        with _part(b, node, "query_pos"):
            q = b.add(query, pos)
        out = _deform_sample_ir(b, node, c, q, value, place, *params[:6])
        return [_project_out(b, node, out, *params[6:], query)]


class MsDeformAttn(OpDef):
    """mmcv multi_scale_deformable_attn_pytorch: value (bs, V, H, d), sampling_locations
    (bs, Nq, H, L, P, 2), attention_weights (bs, Nq, H, L, P) -> (bs, Nq, H*d). The value
    holds the levels' maps one after the other, level l an (h_l, w_l) map of
    ``spatial_shapes`` (row-major tokens); per query and head::

        out[b, q, h] = sum over l, p of aw[b, q, h, l, p] * sample_l(loc[b, q, h, l, p])

    sample_l(x, y): level l bilinearly at pixel coordinate (x * w_l - 0.5, y * h_l - 0.5)
    (grid_sample with zeros padding, align_corners=False): the four pixels around it,
    weighted (1 - fx)(1 - fy), fx(1 - fy), (1 - fx)fy, fx fy, a pixel outside the map 0."""

    name = "ms_deform_attn"
    onnx_export = staticmethod(ms_deform_attn)
    fixed_point = FixedLowering("deform_attn")
    operands = ("value", "sampling_locations", "attention_weights")
    attrs = {"spatial_shapes": Ints()}

    def infer(self, c, value, loc, aw):
        float_operands(value, loc, aw)
        require(value.rank == 4 and loc.rank == 6 and aw.rank == 5 and loc.shape[-1] == 2
                and loc.shape[:5] == aw.shape and value.shape[0] == loc.shape[0]
                and value.shape[2] == loc.shape[2], f"shapes do not fit: {value}, {loc}, {aw}")
        return TensorType((loc.shape[0], loc.shape[1], value.shape[2] * value.shape[3]),
                          value.dtype)

    def compute(self, c, value, loc, aw):
        return kernel_for("ms_deform_attn")(c, value, loc, aw)   # kernels/sample.py

    def macs(self, c):
        return c.in_types[2].numel * c.in_types[0].shape[3] * 4


    def cycle_cost(self, c):
        return sampling_work(c.in_types[0], c.in_types[2])


class MultiheadAttention(OpDef):
    """mmcv MultiheadAttention as BEVFormer's decoder uses it: q = k = query + query_pos,
    v = query, torch's nn.MultiheadAttention (scale 1/sqrt(head_dim)), residual added.
    Sequence first: query (Nq, bs, C)."""

    name = "multihead_attention"
    operands = ("query", "query_pos", "in_w", "in_b", "out_w", "out_b")
    attrs = {"num_heads": Int()}

    def infer(self, c, query, pos, in_w, in_b, out_w, out_b):
        float_operands(query, pos, in_w, out_w)
        ch = query.shape[-1]
        require(query.rank == 3 and pos.shape == query.shape and in_w.shape == (3 * ch, ch)
                and out_w.shape == (ch, ch) and ch % c.num_heads == 0,
                f"shapes do not fit: query {query}, in_proj {in_w}, out_proj {out_w}")
        return query

    def compute(self, c, query, pos, in_w, in_b, out_w, out_b):
        nq, bs, ch = query.shape
        h = c.num_heads
        hd = ch // h
        qk = query + pos
        wq, wk, wv = np.split(in_w, 3)
        bq, bk, bv = np.split(in_b, 3)
        heads = lambda t: t.reshape(nq, bs * h, hd).transpose(1, 0, 2)  # noqa: E731
        q = heads(_linear(qk, wq, bq)) * np.float32(1 / np.sqrt(hd))
        k, v = heads(_linear(qk, wk, bk)), heads(_linear(query, wv, bv))
        attn = softmax_np(q @ k.transpose(0, 2, 1), -1)
        out = (attn @ v).transpose(1, 0, 2).reshape(nq, bs, ch)
        return (query + _linear(out, out_w, out_b)).astype(query.dtype)

    def decompose(self, b, node):
        query, pos, in_w, in_b, out_w, out_b = node.inputs
        nq, bs, ch = query.type.shape
        h = self.ctx(node).num_heads
        hd = ch // h

        def proj(x, i, part):
            with _part(b, node, part):
                y = _linear_ir(b, x, _rows(b, in_w, i * ch, (i + 1) * ch),
                               _rows(b, in_b, i * ch, (i + 1) * ch))
                return b.transpose(b.reshape(y, shape=(nq, bs * h, hd)), perm=(1, 0, 2))
        with _part(b, node, "query_pos"):
            qk = b.add(query, pos)
        q, k, v = proj(qk, 0, "q_proj"), proj(qk, 1, "k_proj"), proj(query, 2, "v_proj")
        with _part(b, node, "attention"):
            q = b.mul(q, b.const(np.float32(1 / np.sqrt(hd)), "scale"))
            attn = b.softmax(b.matmul(q, b.transpose(k, perm=(0, 2, 1))), axis=-1)
            out = b.reshape(b.transpose(b.matmul(attn, v), perm=(1, 0, 2)), shape=(nq, bs, ch))
        with _part(b, node, "out_proj"):
            return [b.add(query, _linear_ir(b, out, out_w, out_b))]

    def macs(self, c):
        nq, bs, ch = c.in_types[0].shape
        return nq * bs * ch * ch * 4 + 2 * bs * nq * nq * ch


class FFN(OpDef):
    """mmcv FFN (two linear layers, ReLU between) with the identity added: x + fc2(relu(fc1(x)))."""

    name = "ffn"
    operands = ("x", "w1", "b1", "w2", "b2")
    attrs = {"activation": Str("relu", ("relu",))}

    def infer(self, c, x, w1, b1, w2, b2):
        float_operands(x, w1, w2)
        require(w1.shape[1] == x.shape[-1] and w2.shape == (x.shape[-1], w1.shape[0]),
                f"weights {w1}, {w2} do not fit {x}")
        return x

    def compute(self, c, x, w1, b1, w2, b2):
        return (x + _linear(relu_values(_linear(x, w1, b1)), w2, b2)).astype(x.dtype)

    def decompose(self, b, node):
        x, w1, b1, w2, b2 = node.inputs
        with _part(b, node, "layers.0"):
            hidden = b.relu(_linear_ir(b, x, w1, b1))
        with _part(b, node, "layers.1"):
            return [b.add(x, _linear_ir(b, hidden, w2, b2))]

    def macs(self, c):
        x, w1 = c.in_types[0], c.in_types[1]
        return 2 * (x.numel // x.shape[-1]) * w1.numel
