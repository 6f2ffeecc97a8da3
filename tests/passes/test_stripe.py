"""stripe-images: the layers whose tensors the OCM cannot hold run one image at a time, so
they stay on chip. The striped graph computes bit for bit what the graph did (golden model,
per-core C programs on 1 and 2 cores, counting what the cycle model charges); only the ops
that compute images alone are striped, and a group ends after its last op too large for
the budget; the ranges other cores read of a piece are cut on the core that made it."""
from __future__ import annotations

import numpy as np
import pytest

import bevir
from bevir.flows.target import compile_program
from bevir.passes import make_pass
from bevir.passes.stripe import by_image, groups
from bevir.passes.target import plan_for_target
from bevir.target.describe import describe_schedule
from bevir.target import HWConfig, model
from bevir.testing import assert_bit_exact
from tests.shared import assert_counted_as_modelled, fx, ints, partitioned

#: an OCM small enough that the net's first layers do not fit it (the budget is half of it
#: per core: 32 KB a core, 64 KB on two)
SMALL = "QC-U 64KB 16MAC x2"


def conv3x3(b, rng, v, cin: int, cout: int, name: str, stride: int = 1):
    """A 3x3 convolution with random weights, padded by one (loc ``<graph>/<name>``)."""
    w = b.const(ints(rng, (cout, cin, 3, 3)), f"{name}.w", fx((cout, cin, 3, 3), 7))
    return b.fx_conv2d(v, w, strides=(stride, stride), pads=(1, 1, 1, 1), out_frac_bits=4,
                       loc=f"{b.graph.name}/{name}", name=name)


def net(rng, images: int = 3, rows: int = 23):
    """conv 3x3 -> conv 3x3 -> residual add (large: images x 16 x rows x 40) -> conv 3x3
    stride 4 (small) -> a reshape that mixes the images (the end of any group)."""
    b = bevir.Builder("net")
    x = b.input("x", fx((images, 4, rows, 40), 5))
    def conv(v, cin, cout, name, stride=1):
        return conv3x3(b, rng, v, cin, cout, name, stride)
    y1 = conv(x, 4, 16, "conv1")
    y2 = conv(y1, 16, 16, "conv2")
    y3 = b.fx_add(y1, y2, out_frac_bits=3, loc="net/residual", name="residual")
    y4 = conv(y3, 16, 8, "conv3", stride=4)
    t = y4.type.shape
    b.output("y", b.reshape(y4, shape=[1, t[0] * t[1], t[2] * t[3]], loc="net/flatten"))
    b.output("mid", y3)
    return b.graph, {"x": ints(rng, (images, 4, rows, 40))}


def striped(graph, hw: str = SMALL):
    return bevir.optimize(graph.clone(), [make_pass("stripe-images", hw=hw)])


def test_the_large_layers_run_image_by_image_bit_for_bit(rng):
    graph, feed = net(rng)
    g = striped(graph)
    stripes = [n for n in g.nodes if "stripe" in n.meta]
    # conv1, conv2 and the add exceed the budget: three copies each; conv3 (stride 4)
    # fits and reads the whole batch, as the reshape after it
    assert sorted((n.meta["stripe"]["of"], n.meta["stripe"]["index"]) for n in stripes) == \
        sorted((of, i) for of in ("conv1", "conv2", "residual") for i in range(3))
    assert all(n.output.type.shape[0] == 1 for n in stripes)
    assert [n.op for n in g.nodes if n.output.name in ("conv3", "residual")] == \
        ["core_gather", "fx_conv2d"]
    # image-major: every op of image 0 before any of image 1
    order = [n.meta["stripe"]["index"] for n in stripes]
    assert order == sorted(order)
    assert_bit_exact(bevir.run(g, feed), bevir.run(graph, feed))


def test_nothing_is_striped_where_the_tensors_fit(rng):
    graph, _ = net(rng)
    g = striped(graph, "QC-U 8MB 16MAC x2")
    assert [n.op for n in g.nodes] == [n.op for n in graph.nodes]


def test_only_ops_that_compute_images_alone_join_a_group(rng):
    graph, _ = net(rng)
    by = {n.output.name: by_image(n) for n in graph.nodes}
    assert by["conv1"] and by["conv2"] and by["residual"] and by["conv3"]
    assert not any(v for k, v in by.items() if k not in ("conv1", "conv2", "residual",
                                                          "conv3"))   # the reshape
    hw = HWConfig.parse(SMALL)
    (group,) = groups(graph, hw.ocm_per_core // 2, hw.cores)
    assert [n.output.name for n in group.nodes] == ["conv1", "conv2", "residual"]
    assert group.images == 1


@pytest.mark.parametrize("cores", [1, 2])
def test_striped_programs_are_bit_exact_and_count_what_the_model_charges(rng, tmp_path,
                                                                          cores):
    """The target pipeline stripes, partitions (where the model says it pays) and plans
    memory; the per-core C programs compute the golden model's integers, counting the
    bytes the model charges, and nothing streams: every striped tensor is on chip."""
    graph, feed = net(rng, rows=29)             # odd rows: uneven pieces, halos at borders
    hw = HWConfig.parse(SMALL).with_cores(cores)
    program = compile_program(graph, tmp_path, hw=hw)
    g = program.graph
    assert any("stripe" in n.meta for n in g.nodes)
    assert_bit_exact(program.run(feed), bevir.run(graph, feed))
    assert_counted_as_modelled(program, hw)
    assert not any("stream" in n.meta for n in g.nodes if "stripe" in n.meta)


def test_striping_cuts_the_ddr_traffic(rng):
    graph, _ = net(rng)
    hw = HWConfig.parse(SMALL).with_cores(1)
    whole = bevir.optimize(graph.clone(), [make_pass("plan-memory", hw=hw)])
    images = bevir.optimize(striped(graph, hw.option_text()), [make_pass("plan-memory", hw=hw)])
    assert model(images, hw).ddr_bytes < model(whole, hw).ddr_bytes


def test_a_piece_s_halo_is_cut_where_it_was_made(rng, tmp_path):
    """A row piece reads its neighbours' halo rows: the neighbour cuts them (core_slice on
    the core that made the piece) and only those rows cross, not the whole piece. (The
    convolutions split by rows, as a replayed plan says.)"""
    from bevir.passes.partition import save_plan
    graph, _ = net(rng, images=1, rows=40)
    plan = partitioned(graph, 2).meta["partition"]
    for entry in plan["ops"]:
        if entry["op"] == "fx_conv2d":
            entry["choice"], entry["axis"] = "rows", 2
    save_plan(plan, tmp_path / "rows.json")
    g = partitioned(graph, 2, plan=str(tmp_path / "rows.json"))
    assert all(e["choice"] == "rows" for e in g.meta["partition"]["ops"]
               if e["op"] == "fx_conv2d")
    cross = [n for n in g.nodes if n.op == "core_slice" and n.inputs[0].producer is not None
             and n.inputs[0].producer.meta.get("piece")]
    assert cross
    assert all(n.meta["core"] == n.inputs[0].producer.meta["core"] for n in cross)
    assert all(n.output.type.nbytes < n.inputs[0].type.nbytes for n in cross)


def test_a_bad_budget_is_a_clear_error(rng):
    graph, _ = net(rng)
    with pytest.raises(bevir.BevirError, match="budget"):
        bevir.optimize(graph, [make_pass("stripe-images", budget=0.0)])


def test_core_slices_and_gathers_split_along_the_other_axes(rng):
    """Pieces of a core_slice or core_gather along any axis but its own read the same
    range of each operand (what lets the partition split an image's plumbing by rows)."""
    from bevir.passes.partition import pieces_at
    graph, feed = net(rng)
    g = striped(graph)
    gather = next(n for n in g.nodes if n.op == "core_gather")
    sl = next(n for n in g.nodes if n.op == "core_slice")
    for node in (gather, sl):
        assert 0 not in node.opdef.region_axes(node.opdef.ctx(node))
        (spec,) = pieces_at(node, 2, [(3, 9)])
        assert all(r == (2, 3, 9) for r in spec.ranges)
    np.testing.assert_array_equal(bevir.run(g, feed)["mid"], bevir.run(graph, feed)["mid"])


def test_show_schedule_lists_the_groups_splits_and_cycles(rng, tmp_path, capsys):
    """bevir show --schedule: the schedule bevir compile makes, with the figures bevir sim
    reports (the same makespan), the striped group and its ops, the splits."""
    from bevir.cli import main
    from bevir.passes.target import plan_for_target
    graph, _ = net(rng)
    bevir.save(graph, tmp_path / "net.bevir")
    assert main(["show", str(tmp_path / "net.bevir"), "--schedule", "--hw", SMALL]) == 0
    text = capsys.readouterr().out
    hw = HWConfig.parse(SMALL)
    makespan = model(plan_for_target(graph, hw), hw).makespan
    assert f"makespan {makespan:,} cycles" in text
    assert "run stripe by stripe: 1 group(s)" in text
    assert "group 0 (cascade 0): 4 ops x 3 stripes of 1 image(s) from %conv1 (net/conv1) to %conv3" \
        in text                          # one core's plan: it is the faster
    assert "splits (ops):" in text and "steps by bound:" in text


def deep(rng):
    """Six images through conv 3x3 -> conv 3x3 stride 4 (both too large for more than one
    image a stripe) -> conv 3x3 -> residual add (small images: three a stripe fit), then a
    reshape that mixes the images."""
    b = bevir.Builder("deep")
    x = b.input("x", fx((6, 8, 32, 64), 5))
    def conv(v, cin, cout, name, stride=1):
        return conv3x3(b, rng, v, cin, cout, name, stride)
    y2 = conv(conv(x, 8, 16, "conv1"), 16, 32, "conv2", stride=4)
    y4 = b.fx_add(y2, conv(y2, 32, 32, "conv3"), out_frac_bits=3, loc="deep/add", name="add")
    b.output("y", b.reshape(y4, shape=[1, 6 * 32, 8 * 16], loc="deep/mix"))
    return b.graph, {"x": ints(rng, (6, 8, 32, 64))}


def test_smaller_layers_run_several_images_a_stripe(rng):
    """Where a layer's images are small, a stripe holds as many as fit (and fill the
    array's rows): the stripes widen after the first layers, and the wider stripes read
    the narrow ones joined, never the whole batch."""
    graph, feed = deep(rng)
    hw = HWConfig.parse(SMALL)
    found = groups(graph, hw.ocm_per_core // 2, hw.cores, hw)
    assert [([n.output.name for n in g.nodes], g.images) for g in found] == \
        [(["conv1", "conv2"], 1), (["conv3", "add"], 3)]
    g = striped(graph)
    wide = [n for n in g.nodes if n.meta.get("stripe", {}).get("images") == 3]
    assert sorted(n.output.name for n in wide) == ["add.i0_3", "add.i3_6", "conv3.i0_3",
                                                   "conv3.i3_6"]
    joins = {n.output.name: n for n in g.nodes if n.op == "core_gather"}
    for k in (0, 3):                # three single-image stripes of conv2, joined
        conv3 = next(n for n in wide if n.output.name == f"conv3.i{k}_{k + 3}")
        join = conv3.inputs[0].producer
        assert join.op == "core_gather" and join.output.name in joins
        assert [v.producer.meta["stripe"]["index"] for v in join.inputs] == [k, k + 1, k + 2]
    assert "conv2" not in {v.name for v in g.values()}     # conv2's batch is never whole
    assert_bit_exact(bevir.run(g, feed), bevir.run(graph, feed))
    # the widths weighed, with the cycles the model gave each: wider fills the array
    weighed = [(w["ops"], w["images"], w["widths"]) for w in g.meta["stripe_groups"]]
    assert [(ops, images, sorted(widths)) for ops, images, widths in weighed] == \
        [(2, 1, ["1"]), (2, 3, ["1", "2", "3"])]
    cycles = weighed[1][2]
    assert cycles["3"] < cycles["2"] < cycles["1"]
    planned = plan_for_target(graph, hw)                # bevir show --schedule says so
    text = describe_schedule(planned, model(planned, hw))
    wide = planned.meta["stripe_groups"][1]
    widths = ", ".join(f"{w}: {c:,}" + (" (chosen)" if int(w) == wide["images"] else "")
                       for w, c in wide["widths"].items())
    assert f"images a stripe that fit, array cycles as modelled: {widths}" in text


def test_a_cascade_runs_each_stripe_as_soon_as_its_images_are_made(rng):
    """The groups of one run form a cascade: a stripe of the wider group runs right after
    the narrow stripes it reads, before the next ones (three single images, then their
    three-image stripe), so only a stripe's images wait between the groups."""
    graph, feed = deep(rng)
    g = striped(graph)
    order = [(s["group"], s["index"]) for s in
             (n.meta.get("stripe") for n in g.nodes) if s]
    stripes = list(dict.fromkeys(order))          # each stripe's ops run together
    assert stripes == [(0, 0), (0, 1), (0, 2), (1, 0), (0, 3), (0, 4), (0, 5), (1, 1)]
    assert [s.get("cascade") for s in g.meta["stripe_groups"]] == [0, 0]
    assert_bit_exact(bevir.run(g, feed), bevir.run(graph, feed))


@pytest.mark.parametrize("cores", [1, 2])
def test_wide_stripes_programs_are_bit_exact(rng, tmp_path, cores):
    graph, feed = deep(rng)
    hw = HWConfig.parse(SMALL).with_cores(cores)
    program = compile_program(graph, tmp_path, hw=hw)
    assert any(n.meta.get("stripe", {}).get("images", 1) > 1 for n in program.graph.nodes)
    assert_bit_exact(program.run(feed), bevir.run(graph, feed))
    assert_counted_as_modelled(program, hw)


def test_a_group_is_cut_where_its_weights_would_not_stay_on_chip(rng):
    """A group whose weights exceed what a core keeps beside its activations is cut, so
    each part keeps its weights for all its stripes; only where what crosses the cut, for
    all the stripes, fits the budget; the result is bit for bit the same."""
    from bevir.passes.stripe import Group, by_weights
    graph, feed = deep(rng)
    conv1, conv2, conv3, add = graph.nodes[:4]
    weights = [sum(v.type.nbytes for v in n.inputs if v is not None and v.is_const)
               for n in (conv1, conv2, conv3, add)]
    group = Group([conv1, conv2, conv3, add], 1)
    assert [g.nodes for g in by_weights(group, None, 1, 1)] == [group.nodes]
    roomy = 1 << 30                       # conv3 and add read conv2's 6 x 32 x 8 x 16
    cut = by_weights(group, weights[1] + weights[2] - 1, roomy, 1)
    assert [g.nodes for g in cut] == [[conv1, conv2], [conv3, add]]
    assert all(g.images == 1 for g in cut)
    crossing = conv2.output.type.nbytes
    assert [g.nodes for g in by_weights(group, weights[1] + weights[2] - 1, crossing - 1, 1)
            ] == [group.nodes]           # conv2's batch would not fit the budget: no cut
    g = bevir.optimize(graph.clone(), [make_pass("stripe-images", hw=SMALL)])
    assert_bit_exact(bevir.run(g, feed), bevir.run(graph, feed))


def tail(rng):
    """conv 3x3 -> conv 3x3 stride 4 over four images (too large for a 64 KB OCM on the
    whole batch), then three residual blocks of 3x3 convolutions (14 KB of weights each,
    more than a core keeps beside the stripes; the whole batch fits), then a reshape that
    mixes the images."""
    b = bevir.Builder("tail")
    x = b.input("x", fx((4, 8, 48, 32), 5))
    def conv(v, cin, cout, name, stride=1):
        return conv3x3(b, rng, v, cin, cout, name, stride)
    y = conv(conv(x, 8, 24, "conv1"), 24, 40, "conv2", stride=4)
    for k in range(3):
        y = b.fx_add(y, conv(y, 40, 40, f"conv{k + 3}"), out_frac_bits=3, loc=f"tail/add{k}",
                     name=f"add{k}")
    b.output("y", b.reshape(y, shape=[1, 4 * 40, 12 * 8], loc="tail/mix"))
    return b.graph, {"x": ints(rng, (4, 8, 48, 32))}


def test_a_run_s_later_layers_run_on_the_whole_batch_where_they_fit(rng, tmp_path):
    """Where a run's groups would be cut for their weights (each weight then kept through
    or loaded again for every stripe), its ops from where the whole batch fits the OCM run
    unstriped, loading each weight once, and the stripes before them one image at a time:
    fewer DDR bytes than striping them; the program is bit for bit the golden model's and
    counts what the model charges."""
    from collections import Counter
    from bevir.target.schedule import schedule_of
    graph, feed = tail(rng)
    hw = HWConfig.parse("QC-U 64KB 16MAC x1")
    budget = hw.ocm_per_core // 2
    kept = groups(graph, budget, hw.cores, hw, whole=False)
    assert len({g.cascade for g in kept}) > 1                    # cut for the weights
    assert [([n.output.name for n in g.nodes], g.images)
            for g in groups(graph, budget, hw.cores, hw)] == [(["conv1", "conv2"], 1)]

    def planned(whole: bool):
        return bevir.optimize(graph.clone(), [make_pass("stripe-images", hw=hw, whole=whole),
                                              make_pass("partition", hw=hw),
                                              make_pass("plan-memory", hw=hw)])
    assert model(planned(True), hw).ddr_bytes < model(planned(False), hw).ddr_bytes
    program = compile_program(graph, tmp_path, hw=hw)
    g = program.graph
    assert not any("stripe" in n.meta for n in g.nodes if n.loc.startswith(("tail/conv3",
                                                                            "tail/add")))
    weights = {v.name for v in g.constants.values()}
    loads = Counter(a.value for st in schedule_of(g).steps(0)
                    for a in st.loads + (st.ddr_args() if st.node.op == "dma_copy" else [])
                    if a.value in weights)
    assert [loads[f"conv{k}.w"] for k in (3, 4, 5)] == [1, 1, 1]
    assert_bit_exact(program.run(feed), bevir.run(graph, feed))
    assert_counted_as_modelled(program, hw)


def test_each_core_cuts_what_its_neighbours_read_before_it_waits_for_theirs(rng):
    """Program order of a halo exchange: on every core the cuts the other cores read come
    before its own join, so no core waits on a chain of its neighbours' joins (the model
    shows no wait there)."""
    graph, _ = net(rng, images=1, rows=40)
    g = partitioned(graph, 3)
    position = {id(n): k for k, n in enumerate(g.nodes)}
    joins = [n for n in g.nodes if n.op == "core_gather" and any(
        u.meta.get("piece") for u, _ in n.output.uses)]
    assert joins
    for join in joins:
        reader = next(u for u, _ in join.output.uses)
        of = reader.meta["piece"]["of"]
        cuts = [n for n in g.nodes if n.op == "core_slice" and n.meta["core"] ==
                join.meta["core"] and any(u.op == "core_gather" and u is not join and any(
                    w.meta.get("piece", {}).get("of") == of for w, _ in u.output.uses)
                    for u, _ in n.output.uses)]
        assert all(position[id(c)] < position[id(join)] for c in cuts), join.name


def heads(rng, n: int = 72):
    """Attention over 4 heads (the batch): 16-bit scores whose softmax, in and out, exceeds
    the budget, then the product with the values, which does not (its result is 18 times
    smaller than the probabilities), then a reshape that mixes the heads."""
    b = bevir.Builder("heads")
    q = b.input("q", fx((4, n, 8), 5))
    kt = b.input("kt", fx((4, 8, n), 5))
    v = b.input("v", fx((4, n, 8), 5))
    s = b.fx_matmul(q, kt, out_frac_bits=6, out_dtype="i16", loc="att/scores", name="scores")
    p = b.fx_softmax(s, out_dtype="i16", out_frac_bits=14, loc="att/softmax", name="probs")
    o = b.fx_matmul(p, v, out_frac_bits=4, loc="att/values", name="out")
    b.output("y", b.reshape(o, shape=[n, 32], loc="att/merge"))
    feed = {"q": ints(rng, (4, n, 8)), "kt": ints(rng, (4, 8, n)), "v": ints(rng, (4, n, 8))}
    return b.graph, feed


def test_a_group_ends_where_what_it_joins_is_small(rng, tmp_path):
    """The softmax is the run's last op too large for the budget, but the group goes on
    through the product with the values: joining 4 x 72 x 8 bytes per head instead of the
    16-bit probabilities saves more than running the product head by head costs. Bit for
    bit, in the golden model and the C programs."""
    graph, feed = heads(rng)
    hw = HWConfig.parse(SMALL)
    (group,) = groups(graph.clone(), int(hw.ocm_per_core * 0.5), hw.cores, hw)
    assert [n.output.name for n in group.nodes] == ["scores", "probs", "out"]
    g = striped(graph)
    joined = [n.output.name for n in g.nodes if n.op == "core_gather"]
    assert joined == ["out"]                              # the probabilities are never joined
    assert_bit_exact(bevir.run(g, feed), bevir.run(graph, feed))
    program = compile_program(graph, tmp_path, hw=hw)
    assert_bit_exact(program.run(feed), bevir.run(graph, feed))
    assert_counted_as_modelled(program, hw)
