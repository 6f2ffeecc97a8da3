"""What several test modules share (test modules never import each other): the integer
test graphs and their helpers, the checks of compiled C programs and of traces, and the
ONNX backend node cases. Imported as ``tests.shared`` (pytest's ``pythonpath`` holds the
repository root)."""
from __future__ import annotations

import collections
import functools
import json
from pathlib import Path

import numpy as np
import pytest

import bevir
from bevir import DType, Layout, TensorType
from bevir.ir.types import AffineQuant, FixedPointQuant
from bevir.passes import Pass, make_pass
from bevir.target import HWConfig, model
from bevir.testing import differences

#: the tests' data files (tests/data)
DATA = Path(__file__).resolve().parent / "data"

I8, I16, I32 = DType.i8, DType.i16, DType.i32


# ---- integer test graphs: one-op graphs of every fx op family and a chain of them ----------
def fx(shape, frac, dtype=I8, layout=Layout.plain, axis=None) -> TensorType:
    """A fixed-point type: ``frac`` bits per tensor, or per channel along ``axis``."""
    fr = tuple(frac) if isinstance(frac, (list, tuple)) else (frac,)
    return TensorType(shape, dtype, layout, FixedPointQuant(fr, axis))


def ints(rng, shape, dtype=np.int8) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape, dtype=np.int64).astype(dtype)


# one-op graphs: (graph, inputs)
def conv_nhwc(rng):
    """A strided NHWC convolution: row pieces read halo rows, the border ones pad."""
    b = bevir.Builder("conv_nhwc")
    x = b.input("x", fx((2, 11, 9, 5), 5, layout=Layout.nhwc))
    w = b.const(ints(rng, (6, 5, 3, 3)), "w", fx((6, 5, 3, 3), list(range(4, 10)), axis=0))
    bias = b.const(rng.integers(-900, 900, 6).astype(np.int32), "b")
    b.output("y", b.fx_conv2d(x, w, bias, strides=(2, 1), pads=(1, 1, 1, 1), out_frac_bits=3,
                              loc="net/conv", name="y"))
    return b.graph, {"x": ints(rng, (2, 11, 9, 5))}


def conv_nchw(rng):
    """An NCHW convolution with uneven pads and dilated rows."""
    b = bevir.Builder("conv_nchw")
    x = b.input("x", fx((3, 4, 13, 7), 5))
    w = b.const(ints(rng, (8, 4, 3, 2)), "w", fx((8, 4, 3, 2), 7))
    b.output("y", b.fx_conv2d(x, w, pads=(2, 0, 1, 1), dilations=(2, 1), out_frac_bits=4,
                              loc="net/conv"))
    return b.graph, {"x": ints(rng, (3, 4, 13, 7))}


def matmul(rng):
    b = bevir.Builder("matmul")
    a = b.input("a", fx((3, 7, 8), 5))
    m = b.input("m", fx((3, 8, 6), 6))
    b.output("y", b.fx_matmul(a, m, out_frac_bits=4, loc="net/scores"))
    return b.graph, {"a": ints(rng, (3, 7, 8)), "m": ints(rng, (3, 8, 6))}


def linear(rng):
    """Per-channel affine weights: a column piece takes its channels' scales."""
    b = bevir.Builder("linear")
    x = b.input("x", fx((2, 9, 12), 5))
    scales = tuple(float(s) for s in rng.uniform(0.002, 0.02, 10))
    w = b.const(ints(rng, (10, 12)), "w", TensorType((10, 12), I8,
                                                      quant=AffineQuant(scales, (0,) * 10, 0)))
    bias = b.const(rng.integers(-500, 500, 10).astype(np.int32), "b")
    b.output("y", b.fx_linear(x, w, bias, out_frac_bits=4, loc="net/proj"))
    return b.graph, {"x": ints(rng, (2, 9, 12))}


def add(rng):
    b = bevir.Builder("add")
    x = b.input("x", fx((9, 10), 5))
    c = b.input("c", fx((10,), 3))
    b.output("y", b.fx_add(x, c, out_frac_bits=4, loc="net/add"))
    return b.graph, {"x": ints(rng, (9, 10)), "c": ints(rng, (10,))}


def layer_norm(rng):
    b = bevir.Builder("layer_norm")
    x = b.input("x", fx((1, 9, 16), 5))
    g = b.const(rng.integers(-3000, 3000, 16).astype(np.int16), "g", fx((16,), 12, I16))
    beta = b.const(rng.integers(-9000, 9000, 16).astype(np.int32), "beta", fx((16,), 14, I32))
    b.output("y", b.fx_layer_norm(x, g, beta, out_frac_bits=5, loc="net/norm"))
    return b.graph, {"x": ints(rng, (1, 9, 16))}


def softmax(rng):
    b = bevir.Builder("softmax")
    x = b.input("x", fx((2, 7, 3, 10), 9, I16))
    b.output("y", b.fx_softmax(x, axis=-1, loc="net/softmax"))
    b.output("z", b.fx_softmax(x, axis=1, loc="net/softmax_queries"))
    return b.graph, {"x": ints(rng, (2, 7, 3, 10), np.int16)}


def deform_attn(rng):
    bs, nq, heads, shapes, points, d, fl = 2, 9, 2, (3, 4, 2, 3), 3, 4, 12
    levels, nv = len(shapes) // 2, 3 * 4 + 2 * 3
    b = bevir.Builder("deform_attn")
    value = b.input("value", fx((bs, nv, heads, d), 6))
    loc = b.input("loc", fx((bs, nq, heads, levels, points, 2), fl, I16))
    aw = b.input("aw", fx((bs, nq, heads, levels, points), 7))
    b.output("y", b.fx_ms_deform_attn(value, loc, aw, spatial_shapes=shapes, out_frac_bits=5,
                                      loc="net/sampling"))
    locs = np.floor(rng.uniform(-0.2, 1.2, (bs, nq, heads, levels, points, 2)) * 2**fl)
    return b.graph, {"value": ints(rng, (bs, nv, heads, d)), "loc": locs.astype(np.int16),
                     "aw": rng.integers(0, 60, (bs, nq, heads, levels, points)).astype(np.int8)}


def chain(rng):
    """conv -> requantize -> linear -> add -> layer norm -> softmax, plus a float tail."""
    b = bevir.Builder("chain")
    x = b.input("x", fx((1, 12, 8, 4), 5, layout=Layout.nhwc))
    w = b.const(ints(rng, (8, 4, 3, 3)), "w", fx((8, 4, 3, 3), 7))
    y = b.fx_conv2d(x, w, pads=(1, 1, 1, 1), out_frac_bits=3, out_dtype="i16", loc="c/conv")
    y = b.fx_requantize(y, out_frac_bits=4, loc="c/requant")
    y = b.reshape(y, shape=(12, 64), loc="c/flat")
    wl = b.const(ints(rng, (16, 64)), "wl", fx((16, 64), 8))
    y = b.fx_linear(y, wl, out_frac_bits=4, loc="c/proj")
    y = b.fx_add(y, y, out_frac_bits=3, loc="c/residual")
    y = b.fx_layer_norm(y, out_frac_bits=5, loc="c/norm")
    y = b.fx_softmax(y, loc="c/softmax")
    b.output("p", y)
    b.output("f", b.fx_dequantize(y, loc="c/dequant"))
    return b.graph, {"x": ints(rng, (1, 12, 8, 4))}


def prefetching(rng):
    """A skip connection around four linears whose 64 KB weights do not all fit a 100 KB
    OCM: the memory plan keeps the skip in DDR and prefetches loads."""
    b = bevir.Builder("prefetch")
    x = b.input("x", fx((64, 256), 5))
    skip = b.fx_relu(x, out_frac_bits=5, name="skip")
    v = skip
    for k in range(4):
        w = b.const(ints(rng, (256, 256)), f"w{k}", fx((256, 256), 7))
        v = b.fx_linear(v, w, out_frac_bits=5, name=f"fc{k}")
    b.output("y", b.fx_add(v, skip, out_frac_bits=4))
    return b.graph, {"x": ints(rng, (64, 256))}


GRAPHS = {f.__name__: f for f in (conv_nhwc, conv_nchw, matmul, linear, add, layer_norm,
                                  softmax, deform_attn, chain)}


#: a machine of one PE with one MAC lane, where starting an op and synchronising cores
#: cost nothing: the array's time dominates, so splits win
FREE_SYNC = HWConfig.preset("qc-u", pe_rows=1, pe_cols=1, macs_per_pe=1, barrier_cycles=0,
                            launch_cycles=0, ddr_latency_cycles=0, dma_setup_cycles=0,
                            name="free-sync")


def partitioned(graph, cores: int, hw: HWConfig = FREE_SYNC, plan: str = ""):
    """``graph`` partitioned for ``cores`` cores of ``hw`` (a plan file replayed if given)."""
    return bevir.optimize(graph.clone(), [make_pass("partition", hw=hw.with_cores(cores),
                                                    plan=plan)])


def differing(a: dict, b: dict) -> int:
    """Elements that differ between two runs' outputs (shapes, dtypes and names must agree)."""
    diffs = differences(a, b)
    assert not any(d.problem for d in diffs), diffs
    return sum(d.count for d in diffs)


def all_codes(shape, dtype=np.int8) -> np.ndarray:
    """Every code of ``dtype`` (cycled) in an array of ``shape``."""
    info = np.iinfo(dtype)
    n = int(np.prod(shape))
    return (np.arange(n) % (info.max - info.min + 1) + info.min).astype(dtype).reshape(shape)


# ---- affine (onnxruntime-exact) types ------------------------------------------------------
def q(dtype, shape, scale, zp, layout=Layout.plain, axis=None) -> TensorType:
    scale, zp = np.atleast_1d(scale), np.atleast_1d(zp)
    return TensorType(shape, dtype, layout, AffineQuant(scale, zp, axis))


# ---- per-core C programs ---------------------------------------------------------------------
def planned(graph, cores: int):
    return bevir.optimize(partitioned(graph, cores),
                          [make_pass("plan-memory", hw=f"QC-U 8MB 16MAC x{cores}")])


def per_node(pairs) -> collections.Counter:
    out = collections.Counter()
    for key, value in pairs:
        out[key] += value
    return out


def assert_counted_as_modelled(program, hw: HWConfig) -> dict:
    """The program's counters (after a run) equal the cycle model's figures of its graph,
    per core and node: bytes between DDR and OCM and DMA transfers. The counters."""
    counts = program.counters()
    profile = model(program.graph, hw)
    for field, of_record in (("ddr_bytes", lambda r: r.ddr_bytes),
                             ("transfers", lambda r: r.transfers)):
        counted = per_node(((c["core"], st["node"]), st[field])
                           for c in counts["cores"] for st in c["steps"])
        modelled = per_node(((r.core, r.name), of_record(r)) for r in profile.records)
        assert +counted == +modelled, field
    assert counts["ddr_bytes"] == profile.ddr_bytes
    assert [c["ddr_bytes"] for c in counts["cores"]] == \
        profile.ddr_bytes_per_core[:len(counts["cores"])]
    assert counts["kernel_calls"] == sum(1 for r in profile.records
                                         if r.bound not in ("barrier", "view", "prefetch", "spill"))
    return counts


# ---- traces (Trace Event format) --------------------------------------------------------------
#: slices that are not a node's step
LANE_SLICES = {"wait", "dma", "dma in", "dma out"}


def check_trace(data: dict) -> dict[int, collections.Counter]:
    """Validate a trace's structure; per process id, how often each node's slice appears."""
    assert set(data) >= {"traceEvents"} and isinstance(data["traceEvents"], list)
    events = data["traceEvents"]
    named = {(e["pid"], e["tid"]) for e in events if e.get("name") == "thread_name"}
    processes = {e["pid"] for e in events if e.get("name") == "process_name"}
    lanes = collections.defaultdict(list)
    nodes = collections.defaultdict(collections.Counter)
    for e in events:
        assert e["ph"] in ("X", "M"), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "M":
            continue
        assert isinstance(e["name"], str) and e["name"] and isinstance(e["cat"], str), e
        assert e["ts"] >= 0 and e["dur"] >= 0, e
        assert (e["pid"], e["tid"]) in named and e["pid"] in processes, e
        lanes[e["pid"], e["tid"]].append((e["ts"], e["ts"] + e["dur"], e["name"]))
        if e["name"] not in LANE_SLICES and e["cat"] != "host":
            assert {"op", "loc"} <= set(e["args"]), e
            nodes[e["pid"]][e["name"]] += 1
    for lane, slices in lanes.items():       # nested or apart (as the format requires)
        slices.sort(key=lambda s: (s[0], -s[1]))
        open_ends: list[float] = []
        for start, end, name in slices:
            while open_ends and open_ends[-1] <= start + 1e-9:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1] + 1e-9, (lane, name)
            open_ends.append(end)
    json.dumps(data)                           # plain JSON
    return nodes


def program_nodes(program) -> dict[int, collections.Counter]:
    """Per process id (core + 1), the nodes the core's program runs."""
    return {p["core"] + 1: collections.Counter(s["node"] for s in p["steps"])
            for p in program.manifest["programs"]}


# ---- ONNX backend node cases (frontends/test_onnx_node.py, and the modules that reuse them) --
#: the node cases the importer is expected to refuse: name -> the importer's message
NODE_SKIPS_FILE = DATA / "onnx_node_skips.json"
NODE_SKIPS: dict[str, str] = json.loads(NODE_SKIPS_FILE.read_text())
#: the cases imported with a shape input frozen to a constant (counted in the summary)
NODE_FROZEN: set[str] = set()


@functools.cache
def onnx_node_cases() -> list:
    """The ONNX backend node cases whose ops all have a converter (collected once)."""
    import warnings

    from bevir.frontends.onnx import supported_ops
    with warnings.catch_warnings():   # the case generators cast out-of-range values on purpose
        warnings.simplefilter("ignore")
        from onnx.backend.test.case.node import collect_testcases

        cases = collect_testcases()
    supported = supported_ops()
    return [c for c in cases if c.kind == "node" and all(
        n.domain in ("", "ai.onnx") and n.op_type in supported for n in c.model.graph.node)]


def freeze_input(model, name: str, value: np.ndarray):
    """The model with graph input ``name`` turned into an initializer holding ``value``."""
    import onnx
    from onnx import numpy_helper
    m = onnx.ModelProto()
    m.CopyFrom(model)
    keep = [i for i in m.graph.input if i.name != name]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    m.graph.initializer.append(numpy_helper.from_array(value, name))
    return m


def onnx_array(x) -> np.ndarray:
    import onnx
    from onnx import numpy_helper
    return numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else np.asarray(x)


def import_node_case(case):
    """The case's model through bevir.from_onnx and its feeds (an operand that determines a
    shape and is passed as a graph input is frozen to an initializer holding the case's
    data); raises UnsupportedError when the importer refuses it."""
    from bevir.frontends.onnx import NonConstantInputError
    model = case.model
    inits = {t.name for t in model.graph.initializer}
    in_names = [i.name for i in model.graph.input if i.name not in inits]
    assert len(case.data_sets) == 1
    feeds = {n: onnx_array(a) for n, a in zip(in_names, case.data_sets[0][0])}
    while True:
        try:
            return bevir.from_onnx(model), feeds
        except NonConstantInputError as e:
            if e.value_name not in feeds:
                raise
            model = freeze_input(model, e.value_name, feeds.pop(e.value_name))
            NODE_FROZEN.add(case.name)


def check_node_outputs(case, graph, feeds) -> None:
    got = bevir.run(graph, feeds)
    out_names = [o.name for o in case.model.graph.output]
    for name, ref in zip(out_names, case.data_sets[0][1]):
        ref = onnx_array(ref)
        out = np.asarray(got[name])
        assert out.shape == ref.shape, f"{name}: shape {out.shape} != {ref.shape}"
        assert out.dtype == ref.dtype, f"{name}: dtype {out.dtype} != {ref.dtype}"
        if ref.dtype.kind == "f":
            np.testing.assert_allclose(out, ref, rtol=case.rtol, atol=case.atol, err_msg=name)
        else:
            np.testing.assert_array_equal(out, ref, err_msg=name)


def check_node_case(case) -> None:
    """One node case against the manifest: a listed case must be refused with its listed
    message (then it skips), any other must import and match the expected outputs."""
    listed = NODE_SKIPS.get(case.name)
    try:
        graph, feeds = import_node_case(case)
    except bevir.UnsupportedError as e:
        if listed is None:
            pytest.fail(f"newly refused: {case.name}: {e} (fix the importer, or list the "
                        f"case in {NODE_SKIPS_FILE.name} with this reason)", pytrace=False)
        if str(e) != listed:
            pytest.fail(f"{case.name} is refused for another reason than {NODE_SKIPS_FILE.name} "
                        f"lists: {e} (listed: {listed})", pytrace=False)
        pytest.skip(listed)
    if listed is None:
        check_node_outputs(case, graph, feeds)
        return
    try:
        check_node_outputs(case, graph, feeds)
    except AssertionError as e:
        pytest.fail(f"{case.name} is listed as skip ({listed}) but imports now, and does "
                    f"not match: {e}", pytrace=False)
    pytest.fail(f"listed as skip but passes: remove it from the manifest ({case.name} in "
                f"{NODE_SKIPS_FILE.name})", pytrace=False)


def check_never_slower(figures: dict, one: int, got: int) -> None:
    """A planned graph's ``meta["partition"]["modelled"]`` figures against the one-core
    plan's makespan ``one`` and the planned graph's ``got``: the kept plan is the faster;
    where one core was not planned, its MAC roofline is below one core's makespan and
    above the split's."""
    if "one_core" in figures:
        assert figures["one_core"] == one and got == min(one, figures["partitioned"]) <= one
        assert figures["kept"] == (figures["partitioned"] < one)
    else:
        assert figures["kept"] and got == figures["partitioned"]
        assert got < figures["one_core_at_least"] <= one


class CorruptType(Pass):
    """Breaks the IR: changes the declared type of the first node's result."""
    name = "test-corrupt-type"

    def run(self, graph, am):
        v = graph.nodes[0].outputs[0]
        v.type = v.type.with_(shape=(7,) + v.type.shape[1:])
