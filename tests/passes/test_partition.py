"""The partition pass splits integer ops across cores, and the partitioned graph computes
bit for bit what the graph did, for 1 to 4 cores: on one-op graphs of every fx op family
(each declared split forced through a plan), on a chain of them, and on BEVFormer's INT8
graph. The plan is data: every candidate with its modelled cycles, the choice, the reason;
a saved plan replays to the same graph; a plan of another graph is a clear error."""
from __future__ import annotations

import copy
import json
import time

import numpy as np
import pytest

import bevir
from bevir.testing import assert_bit_exact
from bevir import DType, Layout, TensorType
from bevir.flows.target import compile_program
from bevir.passes import make_pass
from bevir.passes.partition import format_plan, plan_of, save_plan, search
from bevir.target import HWConfig, model
from tests.shared import (FREE_SYNC, GRAPHS, add, assert_counted_as_modelled, chain,
                          conv_nhwc, differing, fx, ints, partitioned)


def split_entries(g) -> list[dict]:
    return [e for e in plan_of(g)["ops"] if e["choice"] != "none"]


# ---- bit identity ------------------------------------------------------------------------
@pytest.mark.parametrize("name", GRAPHS)
@pytest.mark.parametrize("cores", [1, 2, 3, 4])
def test_partitioned_graph_is_bit_identical(rng, name, cores):
    graph, inputs = GRAPHS[name](rng)
    reference = bevir.run(graph, inputs)
    g = partitioned(graph, cores)
    bevir.verify(g)
    assert_bit_exact(bevir.run(g, inputs), reference)
    if cores == 1:
        assert str(g) == str(graph) and not split_entries(g)
    else:
        assert split_entries(g), "nothing was split: the check would be empty"
        assert "barrier" not in g.op_counts()        # cores wait on the values they read
        for e in split_entries(g):
            pieces = [n for n in g.nodes if n.meta.get("piece", {}).get("of") ==
                      e["node"].lstrip("%")]
            assert [p.meta["core"] for p in pieces] == list(range(len(pieces))) and pieces


def forced(plan: dict, node: str, kind: str, axis: int | None = None) -> dict:
    """``plan`` with node's choice set to ``kind`` (along ``axis``; default the first it
    cuts), the others unsplit."""
    plan = copy.deepcopy(plan)
    assert node in [e["node"] for e in plan["ops"]]
    for e in plan["ops"]:
        e["choice"] = kind if e["node"] == node else "none"
        e.pop("axis", None)
        if e["node"] == node and axis is not None:
            e["axis"] = axis
    return plan


SPLIT_CASES = [(name, kind) for name, kinds in [
    ("conv_nhwc", ("batch", "rows", "channels")), ("conv_nchw", ("batch", "rows", "channels")),
    ("matmul", ("batch", "rows", "columns")), ("linear", ("rows", "columns")),
    ("add", ("rows",)), ("layer_norm", ("rows",)), ("softmax", ("rows",)),
    ("deform_attn", ("batch", "queries"))] for kind in kinds]


@pytest.mark.parametrize("name,kind", SPLIT_CASES, ids=[f"{n}-{k}" for n, k in SPLIT_CASES])
def test_every_declared_split_is_bit_identical(rng, tmp_path, name, kind):
    graph, inputs = GRAPHS[name](rng)
    reference = bevir.run(graph, inputs)
    checked = 0
    for cores in (2, 3, 4):
        plan = search(graph, FREE_SYNC.with_cores(cores))
        for entry in plan["ops"]:
            cand = next((c for c in entry["candidates"] if c["split"] == kind
                         and c["applies"]), None)
            if cand is None:
                continue
            path = tmp_path / f"{entry['node'][1:]}-{kind}-{cores}.json"
            save_plan(forced(plan, entry["node"], kind, cand["axis"]), path)
            g = partitioned(graph, cores, plan=str(path))
            assert len(split_entries(g)) == 1
            pieces = [n for n in g.nodes if n.op == entry["op"]
                      and n.output.name.startswith(entry["node"][1:] + ".c")]
            assert len(pieces) == len(cand["sizes"]) == min(cores, sum(cand["sizes"]))
            assert differing(bevir.run(g, inputs), reference) == 0, (entry["node"], cores)
            checked += 1
    assert checked >= 3            # the kind applies on 2, 3 and 4 cores


def test_conv_rows_read_their_halo_and_pad_only_at_the_border(rng, tmp_path):
    graph, _ = conv_nhwc(rng)            # H 11, kernel 3, stride 2, pads 1: 6 output rows
    plan = forced(search(graph, FREE_SYNC.with_cores(2)), "%y", "rows")
    cand = next(c for c in plan["ops"][0]["candidates"] if c["split"] == "rows")
    assert cand["axis"] == 1 and cand["sizes"] == [3, 3]
    save_plan(plan, tmp_path / "rows.json")
    g = partitioned(graph, 2, plan=str(tmp_path / "rows.json"))
    slices = [(n.attrs["start"], n.attrs["stop"]) for n in g.nodes if n.op == "core_slice"]
    # output row r reads input rows 2r-1..2r+1: rows 0..2 read -1..5 (-1 the top padding),
    # rows 3..5 read 5..11 (11 the bottom padding); row 5 is the halo both read
    assert slices == [(0, 6), (5, 11)]
    convs = [n for n in g.nodes if n.op == "fx_conv2d"]
    assert [n.attrs["pads"] for n in convs] == [(1, 1, 0, 1), (0, 1, 1, 1)]
    # both pieces take the whole weights and bias (a split of rows does not cut them)
    assert {n.inputs[1].name for n in convs} == {"w"} and len(g.constants) == 2


def test_a_split_of_channels_cuts_the_weights_at_compile_time(rng, tmp_path):
    graph, inputs = conv_nhwc(rng)
    plan = forced(search(graph, FREE_SYNC.with_cores(3)), "%y", "channels")
    save_plan(plan, tmp_path / "channels.json")
    g = partitioned(graph, 3, plan=str(tmp_path / "channels.json"))
    convs = [n for n in g.nodes if n.op == "fx_conv2d"]
    # each core's weights and bias are constants of their own: no core_slice of a constant
    assert [n.inputs[1].type.shape[0] for n in convs] == [2, 2, 2]
    assert all(n.inputs[1].is_const and n.inputs[2].is_const for n in convs)
    assert not any(n.op == "core_slice" and n.inputs[0].is_const for n in g.nodes)
    assert_bit_exact(bevir.run(g, inputs), bevir.run(graph, inputs))


# ---- metadata: the core of every node ----------------------------------------------------
def test_every_piece_has_its_core_in_meta(rng, tmp_path):
    graph, inputs = chain(rng)
    g = partitioned(graph, 4)
    for n in g.nodes:
        assert n.meta["core"] in range(4), n
        if "piece" in n.meta:
            assert n.output.name.endswith(f".c{n.meta['core']}")
    for n in g.nodes:     # a range of a piece is cut where the piece was made (only the
        if n.op == "core_slice":      # range crosses); of anything else, by its reader
            made = n.inputs[0].producer
            users = {u.meta["core"] for u in n.output.users}
            piece = made is not None and "piece" in made.meta
            assert {n.meta["core"]} == ({made.meta["core"]} if piece else users)
    bevir.save(g, tmp_path / "g.bevir")
    saved = bevir.load(tmp_path / "g.bevir")
    assert [n.meta.get("core") for n in saved.nodes] == [n.meta.get("core") for n in g.nodes]
    assert plan_of(saved) == plan_of(g)


# ---- the plan ----------------------------------------------------------------------------
def test_plan_lists_every_candidate_its_cycles_the_choice_and_why(rng):
    graph, _ = chain(rng)
    g = partitioned(graph, 4)
    plan = json.loads(json.dumps(plan_of(g)))             # plain JSON
    assert plan["cores"] == 4 and plan["hw_hash"] == FREE_SYNC.with_cores(4).hash
    assert [(e["node"], e["op"], e["loc"]) for e in plan["ops"]] == \
        [(n.name, n.op, n.loc) for n in graph.nodes]
    for e, node in zip(plan["ops"], graph.nodes):
        assert e["reason"] and e["candidates"][0]["split"] == "none"
        if node.opdef.splits and all(v.type.dtype.is_int for v in node.inputs + node.outputs):
            assert e["candidates"][1]["split"] == "copies"     # then each kind, per axis
            kinds = [c["split"] for c in e["candidates"][2:]]
            assert list(dict.fromkeys(kinds)) == list(node.opdef.splits)
            axes = node.opdef.region_axes(node.opdef.ctx(node))
            assert [(c["split"], c["axis"]) for c in e["candidates"][2:] if "axis" in c] == \
                [(k, a) for k in node.opdef.splits for a in sorted(axes) if axes[a] == k]
        applies = [c for c in e["candidates"] if c["applies"]]
        best = min(c["cycles"] for c in applies)
        chosen = next(c for c in applies if c["split"] == e["choice"])
        assert chosen["cycles"] == best                   # the cheapest wins
        for c in applies[1:]:
            assert c["split"] == "copies" or sum(c["sizes"]) == node.output.type.shape[c["axis"]]
    reasons = {e["op"]: e["reason"] for e in plan["ops"]}
    assert reasons["reshape"] == "no declared split applies"    # it merges the leading axes
    assert reasons["fx_dequantize"].startswith("not an integer op")


def test_costs_are_the_cycle_models_and_small_ops_stay_unsplit(rng):
    """On one core an op's candidate is the cycle model's own cycles of it (its operands
    and result in DDR, as the program runs an unplanned graph); a small add stays on one
    core, a large convolution splits."""
    b = bevir.Builder("sizes")
    small = b.input("s", fx((4, 8), 5))
    big = b.input("x", fx((1, 32, 32, 128), 5, layout=Layout.nhwc))     # compute-bound
    w = b.const(ints(rng, (128, 128, 3, 3)), "w", fx((128, 128, 3, 3), 7))
    b.output("s2", b.fx_add(small, small, out_frac_bits=4))
    b.output("y", b.fx_conv2d(big, w, pads=(1, 1, 1, 1), out_frac_bits=3))
    hw = HWConfig.parse("QC-U 8MB 16MAC x4")
    plan = search(b.graph, hw)
    add_entry, conv_entry = plan["ops"]
    alone = {r.name: r.own_cycles for r in model(b.graph, hw.with_cores(1)).records}
    for e in plan["ops"]:
        assert e["candidates"][0]["cycles"] == alone[e["node"]]
    assert add_entry["choice"] == "none" and "no split is cheaper" in add_entry["reason"]
    assert conv_entry["choice"] != "none" and conv_entry["reason"].startswith(conv_entry["choice"])


def test_replay_gives_the_same_graph(rng, tmp_path):
    graph, inputs = chain(rng)
    g = partitioned(graph, 3)
    save_plan(plan_of(g), tmp_path / "plan.json")
    again = partitioned(graph, 3, plan=str(tmp_path / "plan.json"))
    assert str(again) == str(g)
    assert [n.meta.get("core") for n in again.nodes] == [n.meta.get("core") for n in g.nodes]
    assert_bit_exact(bevir.run(again, inputs), bevir.run(graph, inputs))


def test_partition_is_deterministic(rng):
    graph, _ = chain(rng)
    a, b = partitioned(graph, 4), partitioned(graph, 4)
    assert str(a) == str(b)
    assert json.dumps(plan_of(a)) == json.dumps(plan_of(b))


def rows_of(plan: dict) -> dict:
    """The first op's rows candidate."""
    return next(c for c in plan["ops"][0]["candidates"] if c["split"] == "rows")


@pytest.mark.parametrize("break_it,message", [
    (lambda p: p.update(cores=2), "it is for 2 cores, the pass for 4"),
    (lambda p: p["ops"].pop(), "op entries for"),
    (lambda p: p["ops"][0].update(op="fx_mul"), "entry 0 is ('%y', 'fx_mul')"),
    (lambda p: p["ops"][0].update(choice="heads"), "split 'heads' is not one of the op's"),
    (lambda p: rows_of(p).update(sizes=[3, 3, 3, 3]), "do not cut axis 1"),
    (lambda p: rows_of(p).update(axis=2), "cuts axis 2, the op's axes are [1]"),
    (lambda p: p.update(format="other"), "not a bevir-partition plan"),
])
def test_a_plan_that_does_not_fit_is_a_clear_error(rng, tmp_path, break_it, message):
    graph, _ = conv_nhwc(rng)
    plan = forced(search(graph, FREE_SYNC.with_cores(4)), "%y", "rows")
    break_it(plan)
    save_plan(plan, tmp_path / "bad.json")
    with pytest.raises(bevir.PassError, match="does not fit the graph") as e:
        partitioned(graph, 4, plan=str(tmp_path / "bad.json"))
    assert message in str(e.value)
    if "entry" in message or "split" in message or "axis" in message:
        assert "op 'fx_conv2d' node %y from 'net/conv'" in str(e.value)


def test_copies_of_an_op_the_search_does_not_consider_are_refused(rng, tmp_path):
    graph, _ = chain(rng)
    plan = search(graph, FREE_SYNC.with_cores(2))
    for e in plan["ops"]:
        e["choice"] = "copies" if e["op"] == "fx_dequantize" else "none"
    save_plan(plan, tmp_path / "float.json")
    with pytest.raises(bevir.PassError, match="'copies' needs an op the search considers; "
                       "this one: not an integer op") as e:
        partitioned(graph, 2, plan=str(tmp_path / "float.json"))
    assert "op 'fx_dequantize'" in str(e.value)


def test_a_graph_is_partitioned_once(rng):
    graph, _ = add(rng)
    with pytest.raises(bevir.PassError, match="partitioned already"):
        partitioned(partitioned(graph, 2), 2)


def test_format_plan_says_what_was_split(rng):
    graph, _ = chain(rng)
    text = format_plan(plan_of(partitioned(graph, 4)))
    print(text)
    assert text.startswith("partition of @chain for 4 cores")
    assert "fx_conv2d %" in text and "(c/conv)" in text
    assert "cycles with its consumers: none " in text
    assert "no declared split applies" in text


# ---- the command line --------------------------------------------------------------------
def test_cli_runs_planned_and_shows_the_figure_sim_reports(rng, tmp_path, capsys):
    from safetensors.numpy import load_file, save_file
    from bevir.cli import main
    graph, inputs = chain(rng)
    bevir.save(graph, tmp_path / "m.bevir")
    save_file(inputs, str(tmp_path / "in.safetensors"))
    hw = tmp_path / "hw.json"
    hw.write_text(FREE_SYNC.model_dump_json())
    model_in = [str(tmp_path / "m.bevir"), "--hw", str(hw)]
    outs = {}
    for cores in ("1", "4"):
        out = tmp_path / f"out{cores}.safetensors"
        assert main(["run", *model_in, "--inputs", str(tmp_path / "in.safetensors"),
                     "-o", str(out), "--cores", cores]) == 0
        outs[cores] = load_file(str(out))
    assert "ops split" in capsys.readouterr().err
    assert_bit_exact(outs["4"], bevir.run(graph, inputs))
    assert_bit_exact(outs["1"], outs["4"])
    assert main(["show", *model_in, "--partition", "--cores", "4",
                 "--plan-out", str(tmp_path / "plan.json")]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("partition of @chain for 4 cores")
    assert "cycles with its consumers: none" in shown
    figure = int(shown.split(" -> ")[1].split()[0].replace(",", ""))
    assert main(["sim", *model_in, "--cores", "4", "--out", str(tmp_path / "perf"),
                 "--no-plots"]) == 0
    capsys.readouterr()
    summary = json.loads((tmp_path / "perf" / "summary.json").read_text())
    assert summary["makespan_cycles"] == figure           # show --partition = sim
    assert main(["run", *model_in, "--inputs", str(tmp_path / "in.safetensors"),
                 "--cores", "4", "--plan", str(tmp_path / "plan.json")]) == 0
    assert main(["run", *model_in, "--inputs", str(tmp_path / "in.safetensors"),
                 "--cores", "2", "--plan", str(tmp_path / "plan.json")]) == 1
    assert "does not fit the graph: it is for 4 cores" in capsys.readouterr().err


# ---- BEVFormer's INT8 graph --------------------------------------------------------------
@pytest.mark.parametrize("hw", [HWConfig.parse("qc-u"), FREE_SYNC], ids=["qc-u", "free-sync"])
def test_bevformer_int8_is_bit_identical_on_1_to_4_cores(bevformer_int8, hw):
    q, feed = bevformer_int8
    reference = bevir.run(q, feed)
    for cores in (1, 2, 3, 4):
        t0 = time.perf_counter()
        g = partitioned(q, cores, hw)
        t1 = time.perf_counter()
        out = bevir.run(g, feed)
        kinds = {}
        for e in split_entries(g):
            kinds[f"{e['op']}:{e['choice']}"] = kinds.get(f"{e['op']}:{e['choice']}", 0) + 1
        print(f"\n{cores} cores of {hw.name}: {len(g.nodes)} nodes, split {kinds}; "
              f"partition {t1 - t0:.2f}s, run {time.perf_counter() - t1:.2f}s")
        assert differing(out, reference) == 0, cores
        if cores > 1:
            assert any(k.startswith("qlinear_conv:") for k in kinds)
        if cores > 1 and hw is FREE_SYNC:        # the head's integer ops split too
            assert {"fx_linear", "fx_softmax", "fx_ms_deform_attn"} <= \
                {k.split(":")[0] for k in kinds}


@pytest.mark.parametrize("name", GRAPHS)
def test_golden_outputs_stay_as_stored(golden, name):
    """The integer test graphs' golden outputs are pinned in tests/passes/golden/ (bevir.testing's
    `golden` fixture): a change of an op's integer semantics shows here; the 4-core
    partition agrees with them."""
    graph, inputs = GRAPHS[name](np.random.default_rng(0))
    expected = golden(graph, inputs)
    assert_bit_exact(bevir.run(partitioned(graph, 4), inputs), expected)


def test_a_split_of_channels_feeds_a_split_of_rows_without_a_gather(rng, tmp_path):
    """Channels on 2 cores, then rows on 2 cores: each core reads its rows of every
    channel piece, cut where the piece was made and joined on the reader; no core gathers
    the whole tensor first. Bit for bit."""
    b = bevir.Builder("channels_rows")
    x = b.input("x", fx((1, 4, 13, 7), 5))
    w1 = b.const(ints(rng, (8, 4, 3, 3)), "w1", fx((8, 4, 3, 3), 7))
    w2 = b.const(ints(rng, (6, 8, 3, 3)), "w2", fx((6, 8, 3, 3), 7))
    y = b.fx_conv2d(x, w1, pads=(1, 1, 1, 1), out_frac_bits=4, name="y")
    b.output("z", b.fx_conv2d(y, w2, pads=(1, 1, 1, 1), out_frac_bits=4, name="z"))
    inputs = {"x": ints(rng, (1, 4, 13, 7))}
    plan = search(b.graph, FREE_SYNC.with_cores(2))
    for e in plan["ops"]:
        e["choice"], e["axis"] = {"%y": ("channels", 1), "%z": ("rows", 2)}[e["node"]]
    save_plan(plan, tmp_path / "plan.json")
    g = partitioned(b.graph, 2, plan=str(tmp_path / "plan.json"))
    assert differing(bevir.run(g, inputs), bevir.run(b.graph, inputs)) == 0
    pieces = {n.output.name: n for n in g.nodes if "piece" in n.meta}
    for k in (0, 1):                 # z's piece k reads a join of both y pieces' rows
        join = pieces[f"z.c{k}"].inputs[0].producer
        assert join.op == "core_gather" and join.attrs["axis"] == 1
        cuts = [v.producer for v in join.inputs]
        assert [c.meta["core"] for c in cuts] == [0, 1] and all(
            c.op == "core_slice" and c.attrs["axis"] == 2 for c in cuts)
    assert "y" not in {v.name for v in g.values()}       # y is never gathered whole


def test_quantize_splits_by_rows_but_not_along_its_channel_axis():
    b = bevir.Builder("q")
    x = b.input("x", TensorType((2, 3, 8, 5), DType.f32))
    q = b.quantize(x, dtype="i8", scale=[0.1, 0.2, 0.3], zero_point=[0, 1, -1], axis=1)
    b.output("q", q)
    node = b.graph.nodes[0]
    axes = node.opdef.region_axes(node.opdef.ctx(node))
    assert 1 not in axes and {0, 2} <= set(axes)
    feed = {"x": np.random.default_rng(0).normal(size=(2, 3, 8, 5)).astype(np.float32)}
    g = partitioned(b.graph, 2)
    assert differing(bevir.run(g, feed), bevir.run(b.graph, feed)) == 0


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_reshapes_and_transposes_split_by_the_ranges_they_read(rng, tmp_path, axis):
    """A reshape keeping its leading axes cuts them as its operand's; a transpose cuts its
    result axis as the operand axis it comes from: split across 2 cores, bit for bit."""
    b = bevir.Builder("moves")
    x = b.input("x", fx((2, 6, 8), 5))
    r = b.reshape(x, shape=[2, 6, 2, 4], name="r")
    t = b.transpose(r, perm=[0, 2, 1, 3], name="t")
    b.output("y", t)
    inputs = {"x": ints(rng, (2, 6, 8))}
    reshape, transpose = b.graph.nodes
    assert set(reshape.opdef.region_axes(reshape.opdef.ctx(reshape))) == {0, 1}
    assert set(transpose.opdef.region_axes(transpose.opdef.ctx(transpose))) == {0, 1, 2}
    plan = search(b.graph, FREE_SYNC.with_cores(2))
    for e in plan["ops"]:
        node = reshape if e["node"] == reshape.name else transpose
        cut = axis if axis in node.opdef.region_axes(node.opdef.ctx(node)) else 0
        e["choice"], e["axis"] = "rows", cut
    save_plan(plan, tmp_path / "plan.json")
    g = partitioned(b.graph, 2, plan=str(tmp_path / "plan.json"))
    assert len(split_entries(g)) == 2
    assert differing(bevir.run(g, inputs), bevir.run(b.graph, inputs)) == 0


@pytest.mark.parametrize("axis", [0, 1, 2, 3])
def test_an_expand_splits_by_any_leading_axis(rng, tmp_path, axis):
    """An expand cuts a range of any leading result axis: where its operand has that axis
    it reads the same range, where it repeats the operand (axes 0 and 1 here) it reads the
    whole; its target shape takes the range's length. Split across 2 cores, bit for bit."""
    b = bevir.Builder("repeat")
    x = b.input("x", fx((1, 6, 8), 5))
    b.output("y", b.expand(x, shape=[4, 3, 6, 8], name="e"))
    node = b.graph.nodes[0]
    assert set(node.opdef.region_axes(node.opdef.ctx(node))) == {0, 1, 2}
    if axis == 3:
        assert node.opdef.region(node.opdef.ctx(node), axis, 0, 4) is None
        return
    plan = search(b.graph, FREE_SYNC.with_cores(2))
    (e,) = plan["ops"]
    e["choice"], e["axis"] = "rows", axis
    save_plan(plan, tmp_path / "plan.json")
    g = partitioned(b.graph, 2, plan=str(tmp_path / "plan.json"))
    assert len(split_entries(g)) == 1
    inputs = {"x": ints(rng, (1, 6, 8))}
    assert differing(bevir.run(g, inputs), bevir.run(b.graph, inputs)) == 0


def test_a_reshape_cuts_the_axes_it_keeps_whole():
    """A reshape cuts each result axis (but the last) that is an operand axis with the
    same elements before it: unit axes added or dropped keep the cut."""
    def axes(src, dst):
        b = bevir.Builder("r")
        b.output("y", b.reshape(b.input("x", fx(src, 5)), shape=list(dst)))
        node = b.graph.nodes[0]
        c = node.opdef.ctx(node)
        return {a: node.opdef.operand_axis(c, a) for a in node.opdef.region_axes(c)}
    assert axes((2500, 256), (1, 2500, 256)) == {1: 0}
    assert axes((1, 2500, 256), (2500, 256)) == {0: 1}
    assert axes((2500, 128), (1, 2500, 8, 1, 1, 8, 2)) == {1: 0}
    assert axes((2, 6, 8), (2, 6, 2, 4)) == {0: 0, 1: 1}
    assert axes((5000, 256), (2, 2500, 8, 32)) == {}      # 5000 rows become two axes


def _forced_rows(graph, tmp_path, cores):
    """``graph`` partitioned with every node that cuts rows split by them."""
    plan = search(graph, FREE_SYNC.with_cores(cores))
    for e in plan["ops"]:
        cand = next((c for c in e["candidates"] if c["split"] == "rows" and c["applies"]),
                    None)
        assert cand is not None, e
        e["choice"], e["axis"] = "rows", cand["axis"]
    save_plan(plan, tmp_path / f"rows{cores}.json")
    return partitioned(graph, cores, plan=str(tmp_path / f"rows{cores}.json"))


@pytest.mark.parametrize("cores", [2, 3])
def test_float_quantize_reshape_concat_and_kept_reductions_split_by_rows(rng, tmp_path, cores):
    """The encoder's plumbing splits by rows, bit for bit: a quantize of float input (one
    rounding per element, whatever the piece), reshapes that add a unit axis, a concat
    along the last axis, a sum over an axis it keeps, a mean over the last axis that
    drops it (the axes before it are the operand's)."""
    b = bevir.Builder("plumbing")
    x = b.input("x", TensorType((10, 8), DType.f32))
    s = b.input("s", fx((3, 1, 10, 8), 4))
    qx = b.fx_quantize(x, out_frac_bits=4)
    r = b.reshape(qx, shape=[1, 10, 8])
    q = b.quantize(x, dtype="i8", scale=[0.05], zero_point=[3])
    total = b.fx_reduce_sum(s, axes=[0], keepdims=True, out_frac_bits=3)
    flat = b.reshape(total, shape=[1, 10, 8])
    b.output("cat", b.concat(r, flat, axis=2))
    b.output("q", q)
    mean = b.fx_reduce_mean(b.input("m", fx((10, 8, 1, 3), 4)), axes=[3], keepdims=False,
                            out_frac_bits=4)
    assert mean.producer.opdef.row_axes(mean.producer.opdef.ctx(mean.producer)) == (0, 1)
    b.output("mean", mean)
    feed = {"x": rng.normal(scale=2.0, size=(10, 8)).astype(np.float32),
            "s": ints(rng, (3, 1, 10, 8)), "m": ints(rng, (10, 8, 1, 3))}
    g = _forced_rows(b.graph, tmp_path, cores)
    pieces = {n.meta["piece"]["of"] for n in g.nodes if "piece" in n.meta}
    assert len(pieces) == len(b.graph.nodes)                  # every node was split
    assert differing(bevir.run(g, feed), bevir.run(b.graph, feed)) == 0


# ---- copies ------------------------------------------------------------------------------
def attention_value(rng, nq: int = 900, side: int = 50, width: int = 32, channels: int = 256):
    """An attention's value projection (a small linear widening ``width`` channels to
    ``channels``: a large result) of a ``side`` x ``side`` map, read whole by the sampling
    of every query: on several cores each core's queries read all of it."""
    heads, points, fl, nv = 8, 16, 12, side * side
    b = bevir.Builder("value")
    x = b.input("x", fx((nv, width), 5))
    w = b.const(ints(rng, (channels, width)), "w", fx((channels, width), 7))
    v = b.fx_linear(x, w, out_frac_bits=4, loc="attn/value_proj", name="value")
    v = b.reshape(v, shape=(1, nv, heads, channels // heads), loc="attn/value_proj",
                  name="heads")
    loc = b.input("loc", fx((1, nq, heads, 1, points, 2), fl, DType.i16))
    aw = b.input("aw", fx((1, nq, heads, 1, points), 7))
    b.output("y", b.fx_ms_deform_attn(v, loc, aw, spatial_shapes=(side, side), out_frac_bits=5,
                                      loc="attn/sampling", name="sampled"))
    locs = np.floor(rng.uniform(-0.2, 1.2, (1, nq, heads, 1, points, 2)) * 2**fl)
    return b.graph, {"x": ints(rng, (nv, width)), "loc": locs.astype(np.int16),
                     "aw": rng.integers(0, 60, (1, nq, heads, 1, points)).astype(np.int8)}


def test_a_value_every_core_reads_whole_is_computed_on_every_core(rng, tmp_path):
    """Where gathering a result costs more than computing it, each core computes all of it
    (``copies``) and its queries read their own copy: no core waits for another, nothing
    crosses DDR but the operands, and the C programs compute the golden model's integers,
    counting what the model charges."""
    graph, feed = attention_value(rng)
    hw = HWConfig.parse("QC-U 8MB 16MAC x4")
    plan = search(graph, hw)
    choice = {e["node"]: e["choice"] for e in plan["ops"]}
    assert choice == {"%value": "copies", "%heads": "copies", "%sampled": "queries"}
    reason = next(e["reason"] for e in plan["ops"] if e["node"] == "%value")
    assert reason.startswith("copies x4: ")
    program = compile_program(graph, tmp_path / "copies", hw=hw)
    g = program.graph
    copies = [n for n in g.nodes if n.op == "fx_linear"]
    assert [(n.meta["core"], n.meta["copy"]) for n in copies] == [
        (k, {"of": "value", "index": k, "copies": 4}) for k in range(4)]
    for piece in (n for n in g.nodes if n.op == "fx_ms_deform_attn"):
        (value,) = [n for n in g.nodes if n.op == "reshape" and n.output is piece.inputs[0]]
        assert value.meta["core"] == piece.meta["core"]          # its own core's copy
    assert "core_gather" not in {n.op for n in g.nodes if n.output.name.startswith("heads")}
    assert_bit_exact(program.run(feed), bevir.run(graph, feed))
    assert_counted_as_modelled(program, hw)
    # the same partition with the value on core 0, gathered for the queries, moves more
    for e in plan["ops"]:
        if e["choice"] == "copies":
            e["choice"] = "none"
    save_plan(plan, tmp_path / "gathered.json")
    gathered = bevir.optimize(graph.clone(), [make_pass("partition", hw=hw,
                                                        plan=str(tmp_path / "gathered.json")),
                                              make_pass("plan-memory", hw=hw)])
    copied, one = model(g, hw), model(gathered, hw)
    assert copied.ddr_bytes < one.ddr_bytes and copied.makespan < one.makespan
    assert copied.macs == one.macs          # the copies are overhead, not work: utilisation
    assert sum(r.macs for r in copied.records) > copied.macs      # counts the value's once


@pytest.mark.parametrize("name", GRAPHS)
def test_copies_are_bit_identical(rng, tmp_path, name):
    """Any integer op may run as copies (forced through a plan): every core's copy computes
    the whole result, each consumer reads its own core's."""
    graph, inputs = GRAPHS[name](rng)
    reference = bevir.run(graph, inputs)
    plan = search(graph, FREE_SYNC.with_cores(3))
    entries = [e for e in plan["ops"] if any(c["split"] == "copies" for c in e["candidates"])]
    assert entries
    for e in plan["ops"]:
        e["choice"] = "copies" if e in entries else "none"
    save_plan(plan, tmp_path / "copies.json")
    g = partitioned(graph, 3, plan=str(tmp_path / "copies.json"))
    bevir.verify(g)
    for e in entries:
        made = [n for n in g.nodes if n.meta.get("copy", {}).get("of") == e["node"][1:]]
        assert [n.meta["core"] for n in made] == [0, 1, 2] and {n.op for n in made} == {e["op"]}
    for n in g.nodes:
        for v in n.inputs:
            if v is not None and v.producer is not None and "copy" in v.producer.meta:
                assert v.producer.meta["core"] == n.meta["core"]     # no copy crosses
    assert_bit_exact(bevir.run(g, inputs), reference)
    again = partitioned(graph, 3, plan=str(tmp_path / "copies.json"))
    assert str(again) == str(g)
