"""IR core: types, graph mutation, text round trip, verifier, save/load."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bevir
from bevir import (AffineQuant, Builder, DType, FixedPointQuant, Layout, ParseError, TensorType,
                   VerifyError)

def small_cnn() -> bevir.Graph:
    rng = np.random.default_rng(0)                    # the same weights in every test
    b = Builder("cnn")
    x = b.input("x", TensorType((1, 3, 8, 8), layout=Layout.nchw))
    w = b.const(rng.standard_normal((4, 3, 3, 3), np.float32), "conv.w")
    bias = b.const(rng.standard_normal(4).astype(np.float32), "conv.b")
    y = b.conv2d(x, w, bias, pads=(1, 1, 1, 1), loc="/conv/Conv")
    y = b.relu(y, loc="/relu/Relu")
    y = b.add(y, b.const(np.float32(0.25), "quarter"), loc="/add/Add")
    b.output("out", y)
    return b.graph


def same_arrays(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)


# ---- types ------------------------------------------------------------------------------
def test_type_text_and_equality():
    t = TensorType((1, 64, 8, 8), DType.i8, Layout.nchw, AffineQuant([0.5] * 64, [0] * 64, axis=1))
    assert str(t).startswith("tensor<1x64x8x8xi8, nchw, affine<scale=[0.5, 0.5")
    assert t == t.with_() and t != t.with_(layout=Layout.nhwc)
    assert str(TensorType((), DType.f32)) == "tensor<f32>"
    assert str(TensorType((4,), DType.i8, quant=FixedPointQuant([5]))) == \
        "tensor<4xi8, fixed<frac_bits=5>>"
    assert t.nbytes == 64 * 64


@pytest.mark.parametrize("bad, msg", [
    (TensorType((1, 3), DType.f32, Layout.nchw), "needs rank 4"),
    (TensorType((4,), DType.f32, quant=FixedPointQuant([3])), "integer element type"),
    (TensorType((4, 2), DType.i8, quant=AffineQuant([1.0, 2.0], [0, 0], axis=0)), "channels"),
    (TensorType((4,), DType.u8, quant=AffineQuant([1.0], [300])), "zero point"),
    (TensorType((4,), DType.i8, quant=AffineQuant([0.0], [0])), "positive"),
])
def test_verifier_rejects_inconsistent_types(bad, msg):
    g = bevir.Graph()
    v = g.add_input("x", bad)
    g.set_output("x", v)
    with pytest.raises(VerifyError, match=msg):
        bevir.verify(g)


# ---- graph API ---------------------------------------------------------------------------
def test_graph_mutation_keeps_use_lists():
    g = small_cnn()
    bevir.verify(g)
    relu = next(n for n in g.nodes if n.op == "relu")
    conv = relu.inputs[0].producer
    # bypass the relu: add now reads the conv directly
    g.replace_all_uses(relu.output, conv.output)
    g.erase(relu)
    bevir.verify(g)
    assert [n.op for n in g.nodes] == ["conv2d", "add"]
    assert conv.output.users == [g.nodes[1]]


def test_erase_refuses_used_node():
    g = small_cnn()
    with pytest.raises(VerifyError, match="still used"):
        g.erase(g.nodes[0])


def test_clone_is_independent_and_equal(rng):
    g = small_cnn()
    c = g.clone()
    assert str(c) == str(g)
    c.nodes[-1].loc = "changed"
    assert "changed" not in str(g)
    x = {"x": rng.standard_normal((1, 3, 8, 8), np.float32)}
    assert same_arrays(bevir.run(g, x), bevir.run(c, x))


def test_toposort_and_cycle_detection():
    g = small_cnn()
    g.nodes.reverse()
    with pytest.raises(VerifyError, match="topological"):
        bevir.verify(g)
    g.toposort()
    bevir.verify(g)
    # make a cycle: conv reads the add's result
    conv, add = g.nodes[0], g.nodes[-1]
    conv.set_input(0, add.output)
    with pytest.raises(VerifyError, match="cycle"):
        bevir.verify(g)


def test_verifier_names_node_op_and_provenance():
    g = small_cnn()
    conv = g.nodes[0]
    conv.outputs[0].type = TensorType((1, 5, 8, 8), layout=Layout.nchw)
    with pytest.raises(VerifyError) as e:
        bevir.verify(g)
    assert e.value.op == "conv2d" and e.value.loc == "/conv/Conv" and e.value.node == "%0"
    assert "differ from inferred" in str(e.value)


def test_verifier_checks_arity_and_attrs():
    g = small_cnn()
    g.nodes[1].attrs["bogus"] = 1
    with pytest.raises(VerifyError, match="unknown attribute"):
        bevir.verify(g)
    with pytest.raises(bevir.AttrError, match="must be ints"):
        Builder().conv2d(None, None, strides=3)
    g = small_cnn()
    g.nodes[1].inputs.append(g.nodes[1].inputs[0])
    with pytest.raises(VerifyError, match="operands"):
        bevir.verify(g)


def test_networkx_view_and_dominators():
    g = small_cnn()
    nxg = g.to_networkx()
    assert nxg.number_of_nodes() == 3 and nxg.number_of_edges() == 2
    b = Builder()
    x = b.input("x", TensorType((4,)))
    a, c = b.relu(x), b.neg(x)
    s = b.add(b.exp(a), c)
    b.output("s", s)
    idom = {n.op: (d.op if d else None) for n, d in b.graph.dominators().items()}
    # add joins two branches: only the entry dominates it; exp is dominated by relu
    assert idom == {"relu": None, "neg": None, "exp": "relu", "add": None}


# ---- text format -------------------------------------------------------------------------
def test_text_round_trip_and_semantics(rng):
    g = small_cnn()
    text = str(g)
    assert 'loc("/conv/Conv")' in text and '%"conv.w"' not in text
    g2 = bevir.parse(text)
    assert str(g2) == text
    bevir.verify(g2)
    x = {"x": rng.standard_normal((1, 3, 8, 8), np.float32)}
    assert same_arrays(bevir.run(g, x), bevir.run(g2, x))


def test_quoted_names_and_output_aliases():
    b = Builder("odd name")
    x = b.input("in/put:0", TensorType((2,)))
    y = b.neg(x, name="a b", loc='quote"d')
    b.output("final out", y)
    text = str(b.graph)
    assert '%"a b"' in text and 'as "final out"' in text and '@"odd name"' in text
    assert str(bevir.parse(text)) == text


def test_elided_constants_print_but_do_not_parse():
    text = bevir.print_graph(small_cnn(), constants="elide")
    assert "dense<...>" in text and "dense<0.25>" in text
    with pytest.raises(ParseError, match="elided"):
        bevir.parse(text)


@pytest.mark.parametrize("text, line, col, msg", [
    ("graph @g() {\n  return %x\n}", 2, 10, "undefined value %x"),
    ("graph @g(%x: tensor<2xq8>) {\n  return %x\n}", 1, 21, "unknown element type"),
    ("graph @g(%x: tensor<2xf32>) {\n  %y = neg(%x) : tensor<2xf32>\n  %y = neg(%x) : "
     "tensor<2xf32>\n  return %y\n}", 3, 3, "defined twice"),
    ("graph @g(%x: tensor<2xf32>) {\n  %y = frobnicate(%x) : tensor<2xf32>\n  return %y\n}",
     2, 8, "unknown op"),
    ("graph @g(%x: tensor<2xf32>) {\n  %c = const dense<[1, 2, 3]> : tensor<2xf32>\n"
     "  return %x\n}", 2, 14, "3 elements"),
    ("graph @g(%x: tensor<2xf32>) {\n  return %x\n} trailing", 3, 3, "after the graph"),
    ("graph @g(%x tensor<2xf32>) {}", 1, 13, "expected ':'"),
])
def test_parse_errors_have_line_and_column(text, line, col, msg):
    with pytest.raises(ParseError, match=msg) as e:
        bevir.parse(text)
    assert (e.value.line, e.value.col) == (line, col)


def test_save_load(tmp_path):
    g = small_cnn()
    path = bevir.save(g, tmp_path / "m.bevir")
    assert (tmp_path / "m.safetensors").exists()
    assert "const external" in path.read_text()
    g2 = bevir.load(path)
    assert str(g2) == str(g)
    (tmp_path / "m.safetensors").write_bytes(b"garbage")
    with pytest.raises(bevir.BevirError, match="cannot read constants"):
        bevir.load(path)


# ---- hypothesis: random graphs round-trip exactly and compute the same --------------------
UNARY = ["relu", "sigmoid", "tanh", "exp", "neg", "abs", "erf", "gelu", "identity"]
BINARY = ["add", "sub", "mul", "max", "min"]
NAMES = st.text(st.sampled_from("abz09_.-/: $\"é"), min_size=1, max_size=6)


@st.composite
def random_graphs(draw):
    b = Builder(draw(NAMES))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=3)))
    values = [b.input(draw(NAMES), TensorType(shape))]
    # an integer input with a quantized type travels through identity
    q = draw(st.sampled_from([AffineQuant([0.125], [3]), FixedPointQuant([4]), None]))
    qin = b.input(draw(NAMES) + "_q", TensorType((3,), DType.i8, quant=q))
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["unary", "binary", "const", "clip", "cast"]))
        loc = draw(st.one_of(st.just(""), NAMES))
        x = draw(st.sampled_from(values))
        if kind == "unary":
            values.append(b.op(draw(st.sampled_from(UNARY)), x, loc=loc))
        elif kind == "binary":
            values.append(b.op(draw(st.sampled_from(BINARY)), x, draw(st.sampled_from(values)),
                               loc=loc))
        elif kind == "const":
            n = draw(st.sampled_from([1, 3, 40]))
            arr = np.asarray(draw(st.lists(st.floats(-4, 4, width=32), min_size=n, max_size=n)),
                             np.float32)
            c = b.const(arr[: int(np.prod(shape))].reshape(shape) if arr.size >= np.prod(shape)
                        else np.resize(arr, shape), draw(NAMES))
            values.append(b.add(x, c, loc=loc))
        elif kind == "clip":
            values.append(b.clip(x, min=draw(st.floats(-2, 0)), max=draw(st.floats(0.1, 2)),
                                 loc=loc))
        else:
            values.append(b.cast(b.cast(x, to="f16"), to="f32", loc=loc))
    b.output("out", values[-1])
    b.output("q", b.identity(qin))
    return b.graph


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs(), st.integers(0, 2**31 - 1))
def test_random_graphs_round_trip(g, seed):
    bevir.verify(g)
    text = str(g)
    g2 = bevir.parse(text)
    assert str(g2) == text
    bevir.verify(g2)
    r = np.random.default_rng(seed)
    inputs = {v.name: (r.standard_normal(v.type.shape).astype(np.float32) if v.type.dtype.is_float
                       else r.integers(-128, 128, v.type.shape).astype(np.int8))
              for v in g.inputs}
    assert same_arrays(bevir.run(g, inputs), bevir.run(g2, inputs))


# ---- interpreter -------------------------------------------------------------------------
def test_run_fetches_intermediates_and_names_failing_node(rng):
    g = small_cnn()
    x = {"x": rng.standard_normal((1, 3, 8, 8), np.float32)}
    out = bevir.run(g, x, fetch=["0"])
    assert set(out) == {"out", "0"} and out["0"].shape == (1, 4, 8, 8)
    assert set(bevir.run(g, x, fetch="all")) >= {"0", "1", "2", "out"}
    with pytest.raises(bevir.InterpreterError, match=r"missing input\(s\) \['x'\]"):
        bevir.run(g, {})
    with pytest.raises(bevir.InterpreterError, match=r"^'X' is not an input of @\w+ \(did you "
                       r"mean 'x'\?\); missing input\(s\) \['x'\]; its inputs: \['x'\]$"):
        bevir.run(g, {"X": x["x"]})
    with pytest.raises(bevir.InterpreterError, match="shape"):
        bevir.run(g, {"x": np.zeros((1, 3, 8, 9), np.float32)})


def test_interpreter_frees_values_after_last_use():
    import gc
    import weakref

    refs = {}

    class Spy(bevir.Interpreter):
        def run_node(self, node, args):
            gc.collect()
            alive[node.name] = sorted(k for k, r in refs.items() if r() is not None)
            results = super().run_node(node, args)
            refs[node.name] = weakref.ref(results[0])
            return results

    alive = {}
    b = Builder()
    y = b.input("x", TensorType((4, 4)))
    for _ in range(4):
        y = b.relu(y)
    b.output("y", y)
    Spy(b.graph).run({"x": np.ones((4, 4), np.float32)})
    # when the 4th relu runs, only the 3rd one's result (its operand) is still alive
    assert alive["%3"] == ["%2"]


def _identity_graph(dtype: str) -> bevir.Graph:
    b = Builder("inputs")
    x = b.input("codes", TensorType((4,), dtype))
    b.output("y", b.reshape(x, shape=(2, 2)))
    return b.graph


@pytest.mark.parametrize("dtype, fed", [
    ("i8", np.array([1, -2, 127, -128], np.int64)),      # int64 codes in range
    ("u8", np.array([0, 1, 200, 255], np.int32)),
    ("i8", np.array([0, 1, 100, 127], np.uint8)),        # unsigned into signed, in range
    ("i32", np.array([1, 2, -3, 2**31 - 1], np.int64)),
    ("f32", np.array([0.1, -2.5, np.inf, np.nan])),      # float64 rounds to float32
    ("f16", np.array([0.5, 1, -2, 65504], np.float32)),
    ("bool", np.array([True, False, True, True])),
])
def test_inputs_convert_when_no_value_changes(dtype, fed):
    y = bevir.run(_identity_graph(dtype), {"codes": fed})["y"]
    assert y.dtype == DType(dtype).np
    assert np.array_equal(y.ravel(), fed.astype(y.dtype), equal_nan=True)
    if DType(dtype).is_int:
        assert y.ravel().tolist() == fed.tolist()                    # the very values


@pytest.mark.parametrize("dtype, fed, msg", [
    ("i8", np.array([1, 2, 300, 4]), r"input %codes: int64 value 300 is outside the i8 "
                                     r"range \[-128, 127\]"),
    ("u8", np.array([0, -1, 2, 3], np.int8), r"input %codes: int8 value -1 is outside the u8"),
    ("i32", np.array([0, 0, 2**31, 0]), r"value 2147483648 is outside the i32"),
    ("i8", np.array([1.0, 2, 3, 4]), r"input %codes has dtype float64 \(float\), expected i8 "
                                     r"\(integer\)"),
    ("i8", np.array([True, False, True, True]), r"input %codes has dtype bool \(bool\)"),
    ("bool", np.array([1, 0, 1, 1], np.int8), r"input %codes has dtype int8 \(integer\), "
                                              r"expected bool"),
    ("f32", np.array([1, 2, 3, 4]), r"input %codes has dtype int64 \(integer\), expected f32"),
    ("f32", np.array([1.0, 1e300, 0, 0]), r"input %codes: float64 value 1e\+300 overflows f32"),
    ("f16", np.array([1.0, 7e4, 0, 0], np.float32), r"value 70000.0 overflows f16"),
])
def test_inputs_of_the_wrong_kind_or_out_of_range_are_refused(dtype, fed, msg):
    """No silent wrap (int64 300 into an i8 input used to become 44) and no cast across
    kinds: the error names the input."""
    with pytest.raises(bevir.InterpreterError, match=msg):
        bevir.run(_identity_graph(dtype), {"codes": fed})


def test_written_files_follow_the_umask(tmp_path):
    """safetensors' own writer creates files readable by their owner only; bevir's follow
    the umask as other files do."""
    import os
    from bevir.fsutil import save_arrays
    b = Builder("g")
    x = b.input("x", TensorType((2,)))
    b.output("y", b.add(x, b.const(np.ones(2, np.float32), "one")))
    old = os.umask(0o022)
    try:
        path = bevir.save(b.graph, tmp_path / "g.bevir")
        save_arrays({"a": np.zeros(3)}, tmp_path / "a.safetensors")
    finally:
        os.umask(old)
    for p in (path, path.with_suffix(".safetensors"), tmp_path / "a.safetensors"):
        assert oct(p.stat().st_mode & 0o777) == oct(0o644), p


class _Refuses(bevir.OpDef):
    """An op whose kernel raises: a user's op with a bug."""
    name = "test_ir.refuses"
    operands = ("x",)

    def infer(self, c, x):
        return x

    def compute(self, c, x):
        raise ValueError("this op says no")


def test_an_error_in_an_ops_kernel_names_its_file_and_line():
    b = Builder("g")
    x = b.input("x", TensorType((2,)))
    with b.loc("mine"):
        b.output("y", b.__getattr__("test_ir.refuses")(x))
    line = next(i for i, text in enumerate(open(__file__), 1) if 'raise ValueError("this op' in text)
    with pytest.raises(bevir.InterpreterError) as e:
        bevir.run(b.graph, {"x": np.ones(2, np.float32)})
    assert str(e.value).endswith(f"from 'mine': ValueError: this op says no (at {__file__}:{line})")
