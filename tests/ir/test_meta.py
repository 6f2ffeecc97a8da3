"""Meta: typed annotations on graphs, nodes and values, carried through clone, compose,
rewrites and save/load; the calibrated ranges live there."""
from __future__ import annotations

import hashlib
import json
import re

import numpy as np
import pytest

import bevir
from bevir import Builder, TensorType
from bevir.ir.compose import compose
from bevir.ir.meta import Meta, MetaError, register_meta_key
from bevir.ir.serialize import meta_paths
from bevir.passes.calibrate import Ranges, TensorRange, ValueKey, ranges_of
from bevir.passes.patterns import RewritePattern, apply_patterns, op
from bevir.passes.quant_config import QuantConfig
from bevir.passes.quantize import quantize

# keys as a backend would declare them: where a node runs, where a value lives
register_meta_key("test.core", int, survives_rewrite=True)
register_meta_key("test.ocm_offset", int, survives_rewrite=True)


class Span:
    """A registered type that is not JSON itself: saved through its codec."""

    def __init__(self, lo: int, hi: int):
        self.lo, self.hi = lo, hi

    def __eq__(self, other):
        return isinstance(other, Span) and (self.lo, self.hi) == (other.lo, other.hi)


register_meta_key("test.span", Span, lambda s: [s.lo, s.hi], lambda d: Span(*d))


def _net(seed: int = 0) -> bevir.Graph:
    rng = np.random.default_rng(seed)
    b = Builder("net")
    x = b.input("x", TensorType((8, 16)))
    with b.loc("enc.fc"):
        h = b.relu(b.gemm(x, b.const(rng.standard_normal((16, 16)).astype(np.float32) / 4, "w"),
                          trans_b=True))
    with b.loc("enc.out"):
        y = b.add(b.neg(b.neg(h)), x)
    b.output("y", y)
    return b.graph


def _annotate(g: bevir.Graph) -> None:
    """Meta of every kind on every level: registered, unregistered, arrays, odd floats."""
    g.meta["test.notes"] = {"by": "test", "passes": ["a", "b"], "inf": float("-inf")}
    g.inputs[0].meta["test.ocm_offset"] = 0
    g.constants["w"].meta["test.span"] = Span(3, 9)
    for i, n in enumerate(g.nodes):
        n.meta["test.core"] = i % 2
        n.output.meta["test.ocm_offset"] = 1024 * (i + 1)
    g.nodes[0].meta["test.tile"] = np.arange(6, dtype=np.int32).reshape(2, 3)
    g.nodes[0].meta["test.scalar"] = np.array(2.5)
    g.nodes[1].meta["test.nan"] = float("nan")


def _metas(g: bevir.Graph) -> list:
    """Every meta of the graph, by position, as comparable plain data."""
    def plain(m):
        return {k: (v.tolist(), v.dtype.str, v.shape) if isinstance(v, np.ndarray) else
                ("nan" if isinstance(v, float) and v != v else v) for k, v in m.items()}
    return ([plain(g.meta)] + [(v.name, plain(v.meta)) for v in g.values()]
            + [(n.op, plain(n.meta)) for n in g.nodes])


def _x(n: int = 4, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((8, 16)).astype(np.float32)} for _ in range(n)]


# ---- the container ------------------------------------------------------------------------
def test_registered_keys_are_typed_and_unregistered_keys_are_kept():
    m = Meta()
    m["test.core"] = 2
    with pytest.raises(MetaError, match="meta key 'test.core' holds int, not str"):
        m["test.core"] = "two"
    with pytest.raises(MetaError, match="holds int, not str"):
        m.update({"test.core": "two"})
    with pytest.raises(MetaError, match="holds Ranges, not dict"):
        Meta(ranges={})
    m["anything"] = object()
    assert m["test.core"] == 2 and "anything" in m


# ---- clone ----------------------------------------------------------------------------------
def test_clone_copies_meta_and_mutating_the_clone_does_not_leak():
    g = _net()
    _annotate(g)
    before = _metas(g)
    c = g.clone()
    assert _metas(c) == before
    c.meta["test.notes"]["passes"].append("c")              # nested, in place
    c.nodes[0].meta["test.tile"][0, 0] = 99                 # an array, in place
    c.nodes[0].meta["test.core"] = 7
    c.constants["w"].meta["test.span"].lo = -1
    c.inputs[0].meta.clear()
    c.nodes[-1].output.meta["new"] = 1
    assert _metas(g) == before


def test_a_calibrated_clone_is_calibrated_independently():
    g = _net()
    ranges = bevir.calibrate(g, _x())
    c = g.clone()
    assert ranges_of(c) == ranges and ranges_of(c) is not ranges
    ranges_of(c)[c.outputs["y"]].hi = 1e9
    ranges_of(c).add(ranges_of(c)["x"].copy())
    assert ranges_of(g)[g.outputs["y"]].hi != 1e9
    assert ranges_of(g) == bevir.calibrate(_net(), _x(), attach=False)


# ---- compose --------------------------------------------------------------------------------
def test_compose_carries_node_value_and_graph_meta():
    first, second = _net(0), _net(1)
    _annotate(first)
    second.nodes[0].meta["test.core"] = 5
    second.nodes[0].output.meta["test.ocm_offset"] = 77
    second.meta["test.other"] = [1, 2]
    g = compose(first, second, {"x": "y"})
    assert _metas(g)[1:1 + len(first.inputs) + len(first.constants)] \
        == _metas(first)[1:1 + len(first.inputs) + len(first.constants)]
    assert [n.meta.get("test.core") for n in g.nodes] == \
        [n.meta["test.core"] for n in first.nodes] + [5] + [None] * (len(second.nodes) - 1)
    assert g.nodes[len(first.nodes)].output.meta["test.ocm_offset"] == 77
    assert g.meta["test.other"] == [1, 2] and g.meta["test.notes"]["by"] == "test"
    second.meta["test.notes"] = {"by": "someone else"}
    with pytest.raises(bevir.VerifyError, match="both graphs hold meta 'test.notes'"):
        compose(first, second, {"x": "y"})


def test_compose_merges_calibrated_ranges_under_the_composed_names():
    first, second = _net(0), _net(1)
    r1 = bevir.calibrate(first, _x())
    mid = [{"x": bevir.run(first, s)["y"]} for s in _x()]
    r2 = bevir.calibrate(second, mid)
    g = compose(first, second, {"x": "y"})
    merged = ranges_of(g)
    renamed = {v.name: g_v.name for v, g_v in zip(second.nodes[-1].outputs, g.nodes[-1].outputs)}
    assert list(renamed.values()) != list(renamed)          # the names clashed and changed
    for v in first.values():
        if v in r1.resolve(first):
            assert merged.range(v.name) == r1.range(v)
    for v, gv in zip([o for n in second.nodes for o in n.outputs],
                     [o for n in g.nodes[len(first.nodes):] for o in n.outputs]):
        assert merged.range(gv) == r2.range(v)
    assert merged.range(g.value(first.outputs["y"].name)) == r1.range(first.outputs["y"])


# ---- rewrites -------------------------------------------------------------------------------
class NegNeg(RewritePattern):
    name = "test-meta-neg-neg"
    pattern = op("neg", op("neg", "x"))

    def rewrite(self, rw, m):
        rw.replace(m.root, rw.create("identity", [m["x"]]))


def test_a_rewrite_carries_provenance_and_the_meta_declared_to_survive():
    g = _net()
    inner, root = [n for n in g.nodes if n.op == "neg"]
    inner.loc = "enc.out.neg1"
    root.meta["test.core"] = 3                  # survives rewrites
    root.meta["test.scratch"] = "pass-local"    # unregistered: does not
    root.output.meta["test.ocm_offset"] = 4096
    root.output.meta["test.span"] = Span(0, 1)  # registered without survives_rewrite
    name = root.output.name
    assert apply_patterns(g, [NegNeg()]) == 1
    (new,) = [n for n in g.nodes if n.op == "identity"]
    assert new.loc == "enc.out.neg1+enc.out"    # the match's provenance, fused
    assert dict(new.meta) == {"test.core": 3}
    assert new.output.name == name and dict(new.output.meta) == {"test.ocm_offset": 4096}
    bevir.verify(g)


def test_replace_all_uses_moves_surviving_value_meta_without_overwriting():
    g = _net()
    relu = next(n for n in g.nodes if n.op == "relu")
    gemm = relu.inputs[0]
    relu.output.meta.update({"test.ocm_offset": 1, "test.core": 2, "local": 3})
    gemm.meta["test.core"] = 9
    g.replace_all_uses(relu.output, gemm)
    assert dict(gemm.meta) == {"test.core": 9, "test.ocm_offset": 1}


# ---- save / load ----------------------------------------------------------------------------
def test_save_load_round_trips_meta_exactly_and_leaves_the_text_alone(tmp_path):
    g = _net()
    (tmp_path / "plain").mkdir()
    plain_text = bevir.save(g, tmp_path / "plain" / "m.bevir").read_text()
    assert sorted(p.name for p in (tmp_path / "plain").iterdir()) == ["m.bevir", "m.safetensors"]
    _annotate(g)
    path = bevir.save(g, tmp_path / "m.bevir")
    ir = lambda text: [l for l in text.splitlines() if not l.startswith("//")]  # noqa: E731
    assert ir(path.read_text()) == ir(plain_text) and str(g) == str(_net())   # byte-identical IR
    assert "// meta: none" in plain_text and "// meta: m.meta.json sha256:" in path.read_text()
    doc_path, arrays_path = meta_paths(path)
    assert doc_path.exists() and arrays_path.exists()
    assert json.loads(doc_path.read_text())["encoded"] == ["test.span"]
    g2 = bevir.load(path)
    assert _metas(g2) == _metas(g)
    assert isinstance(g2.constants["w"].meta["test.span"], Span)
    assert g2.nodes[0].meta["test.scalar"].shape == ()
    bevir.save(_net(), path)                                          # a graph without meta
    assert not doc_path.exists() and not arrays_path.exists()
    assert _metas(bevir.load(path)) == _metas(_net())


@pytest.mark.parametrize("value, what", [((1, 2), "tuple"), ({1: "a"}, "non-string keys"),
                                         (np.float32(1), "float32"), ({"$array": 1}, "reserved")])
def test_save_refuses_meta_it_cannot_read_back_naming_it(tmp_path, value, what):
    g = _net()
    g.nodes[1].meta["test.odd"] = value
    where = "meta key 'test.odd' of node %\\S+ \\(op 'relu'\\)"
    with pytest.raises(MetaError, match=f"{where}.*{what}"):
        bevir.save(g, tmp_path / "m.bevir")
    assert list(tmp_path.iterdir()) == []                 # refused before writing anything


def test_load_refuses_meta_that_does_not_fit(tmp_path):
    g = _net()
    g.nodes[1].meta["test.core"] = 1
    path = bevir.save(g, tmp_path / "m.bevir")
    doc_path = meta_paths(path)[0]
    doc = json.loads(doc_path.read_text())
    doc["nodes"][0][1] = "conv2d"
    doc_path.write_text(json.dumps(doc))
    with pytest.raises(MetaError, match="m.meta.json: it is not the file .*m.bevir was saved "
                                        "with \\(its sha256 differs"):
        bevir.load(path)                    # an edited meta file is not the one saved

    def edited(doc):                        # an edit the text's header is told of
        text = json.dumps(doc)
        doc_path.write_text(text)
        header = f"// meta: {doc_path.name} sha256:{hashlib.sha256(text.encode()).hexdigest()}"
        path.write_text(re.sub("// meta: .*", header, path.read_text()))
        return path
    with pytest.raises(MetaError, match="node #1 \\(op 'conv2d'\\) does not fit"):
        bevir.load(edited(doc))
    doc["nodes"], doc["values"] = [], {"nope": {}}
    with pytest.raises(MetaError, match="value %nope"):
        bevir.load(edited(doc))
    doc["values"], doc["graph"], doc["encoded"] = {}, {"test.unknown": [1]}, ["test.unknown"]
    with pytest.raises(MetaError, match="'test.unknown' .* import the module that registers it"):
        bevir.load(edited(doc))


def test_a_calibrated_graph_saved_and_loaded_is_still_calibrated(tmp_path):
    g = _net()
    ranges = bevir.calibrate(g, _x(), method="mse", per_channel=True)     # histograms, arrays
    assert any(e.histogram is not None and e.channel_min is not None for e in ranges)
    ranges.add(TensorRange(ValueKey("unseen")))              # min inf, max -inf: never observed
    loaded = bevir.load(bevir.save(g, tmp_path / "cal.bevir"))
    assert ranges_of(loaded) == ranges and isinstance(ranges_of(loaded), Ranges)
    config = QuantConfig.build({"rules": [{"name": "all", "where": ["*"]}]})
    original = g.clone()
    assert quantize(original, config) == quantize(loaded, config)
    assert str(loaded) == str(original)
    assert any(n.op.startswith("fx_") for n in loaded.nodes)
    for s in _x(2, seed=5):
        a, b = bevir.run(original, s), bevir.run(loaded, s)
        assert all(a[k].tobytes() == b[k].tobytes() for k in a)
