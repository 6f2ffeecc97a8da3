"""The decompose pass: module-level ops expand into primitive ops with the same results."""

import numpy as np
import pytest

import bevir
from bevir.passes.rewrites import limit_rewrites

from examples.bevformer import e2e
from examples.bevformer.config import CONFIGS
from examples.bevformer.inputs import make_inputs
from examples.bevformer.weights import build_model

CFG = CONFIGS["test"]
MODULE_OPS = ("temporal_self_attention", "spatial_cross_attention",
              "deformable_cross_attention", "multihead_attention", "ffn")


@pytest.fixture(scope="module", params=[True, False], ids=["prev_bev", "first-frame"])
def graph_and_feed(request, tmp_path_factory):
    inputs = make_inputs(CFG, 0, with_prev_bev=request.param)
    g = e2e.build_graph(build_model(CFG, seed=0).eval(), inputs, tmp_path_factory.mktemp("bf"))
    return g, e2e.golden_inputs(g, inputs)


def test_decomposition_is_bit_identical(graph_and_feed):
    g, feed = graph_and_feed
    g = g.clone()
    before = bevir.run(g, feed)
    names = {k: v.name for k, v in g.outputs.items()}
    pm = bevir.passes.PassManager("decompose,canonicalize,cse,dce")
    pm.run(g)
    counts = g.op_counts()
    assert not set(MODULE_OPS) & set(counts)
    assert counts["ms_deform_attn"] == 2 * CFG.encoder_layers + CFG.decoder_layers
    assert pm.passes[0].statistics["ffn"] == CFG.encoder_layers + CFG.decoder_layers
    after = bevir.run(g, feed)
    for k in before:
        assert np.array_equal(before[k], after[k]), k
    assert {k: v.name for k, v in g.outputs.items()} == names


def test_parts_keep_module_provenance(graph_and_feed):
    g = graph_and_feed[0].clone()
    bevir.optimize(g, "decompose{ops=ffn}")
    assert "ffn" not in g.op_counts() and "temporal_self_attention" in g.op_counts()
    locs = {n.loc for n in g.nodes if n.op == "gemm"}
    assert "pts_bbox_head.transformer.encoder.layers.0.ffns.0/layers.1" in locs


def test_decompose_respects_the_rewrite_budget(graph_and_feed):
    g = graph_and_feed[0].clone()
    with limit_rewrites(1) as log:
        bevir.optimize(g, "decompose")
    assert log.count == 1
    left = sum(g.op_counts().get(op, 0) for op in MODULE_OPS)
    assert left == 2 * CFG.encoder_layers + 3 * CFG.decoder_layers + CFG.encoder_layers - 1
