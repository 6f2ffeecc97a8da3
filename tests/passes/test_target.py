"""One plan for the target: a partitioned graph is never slower than one core (the planning
pipeline keeps a split only where the cycle model says the whole planned graph is faster),
on BEVFormer's `test` frame on 2, 3 and 4 cores and on five CNNs of the zoo quantized by
onnxruntime; the planned graphs compute bit for bit what the INT8 graph does."""
from __future__ import annotations

import numpy as np
import pytest

import bevir
from bevir.passes.partition import plan_of
from bevir.passes.target import plan_for_target
from bevir.target import HWConfig, model
from bevir.testing import assert_bit_exact
from bevir.testing.zoo import build, input_shape
from tests.shared import check_never_slower

QCU = HWConfig.parse("QC-U 8MB 16MAC x4")
CNNS = ("resnet18", "mobilenet_v3_small", "efficientnet_b0", "shufflenet_v2", "regnet_y_400mf")


def never_slower(graph, cores: int) -> tuple[bevir.Graph, int, int]:
    """The planned graph for ``cores`` cores, its makespan and the one-core plan's; checks
    the partition's own figures agree."""
    hw = QCU.with_cores(cores)
    g = plan_for_target(graph, hw, cache=False)
    one = model(plan_for_target(graph, hw.with_cores(1), cache=False), hw).makespan
    got = model(g, hw).makespan
    m = g.meta["partition"]["modelled"]
    check_never_slower(m, one, got)
    assert plan_of(g)["cores"] == (cores if m["kept"] else 1)
    return g, got, one


@pytest.mark.parametrize("cores", [2, 3, 4])
def test_bevformer_partitioned_is_never_slower_than_one_core(bevformer_int8, cores):
    q, feed = bevformer_int8
    g, got, one = never_slower(q, cores)
    print(f"\ntest x{cores}: {one:,} cycles on one core -> {got:,} ({one / got:.2f}x)")
    assert got < one                 # and on this frame the split pays
    assert_bit_exact(bevir.run(g, feed), bevir.run(q, feed))


@pytest.fixture(scope="module")
def zoo_int8(tmp_path_factory):
    """The zoo's CNNs (small configs, random weights) quantized as the reference flow does
    (onnxruntime, QOperator INT8), with an input."""
    out = {}
    for name in CNNS:
        model_, x = build(name, untrained_norms=True)
        rng = np.random.default_rng(0)
        calib = [rng.standard_normal(input_shape(name)).astype(np.float32) for _ in range(2)]
        qb = bevir.flows.quantize_backbone(model_, calib, tmp_path_factory.mktemp(name),
                                           progress=False)
        out[name] = (qb.graph, {qb.graph.inputs[0].name: calib[0]})
    return out


@pytest.mark.parametrize("name", CNNS)
def test_zoo_cnns_partitioned_are_never_slower_than_one_core(zoo_int8, name):
    graph, feed = zoo_int8[name]
    reference = bevir.run(graph, feed)
    for cores in (2, 4):
        g, got, one = never_slower(graph, cores)
        print(f"\n{name} x{cores}: {one:,} -> {got:,} cycles ({one / got:.2f}x)")
        assert_bit_exact(bevir.run(g, feed), reference)


def test_a_planning_pass_that_breaks_the_graph_is_named(rng):
    """The planning pipeline verifies once, at its end; where that fails it runs again
    verifying after each pass, so the error names the pass that broke the graph."""
    from bevir.passes.target import _planned
    from tests.shared import CorruptType, chain
    graph, _ = chain(rng)
    with pytest.raises(bevir.BevirError, match="pass 'test-corrupt-type' produced invalid IR"):
        _planned(graph, [CorruptType()])
    bevir.verify(graph)                        # the graph given is left as it was
