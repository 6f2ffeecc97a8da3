"""bevir.testing: reports of differing outputs, stored golden runs, the pytest plugin."""
import numpy as np
import pytest

import bevir
from bevir.testing import (GoldenMismatch, GoldenStore, assert_bit_exact, assert_close,
                           compare_graphs, differences, graph_digest)
from bevir.ir.builder import Builder
from tests.shared import GRAPHS


def test_bit_exact_reports_where_outputs_differ():
    expected = {"y": np.arange(12, dtype=np.int32).reshape(3, 4), "z": np.zeros(2, np.float32)}
    actual = {k: v.copy() for k, v in expected.items()}
    assert_bit_exact(actual, expected)
    actual["y"][1, 2] += 5
    actual["y"][2, 3] -= 1
    with pytest.raises(GoldenMismatch) as e:
        assert_bit_exact(actual, expected)
    (d,) = e.value.differences
    assert (d.name, d.count, d.size, d.index, d.actual, d.expected, d.max_abs) == \
        ("y", 2, 12, (1, 2), 11, 6, 5.0)
    assert "y: 2 of 12 elements differ; first at [1, 2]: actual 11, expected 6" in str(e.value)


def test_bit_exact_compares_bits():
    nan = np.array([np.nan, 0.0], np.float32)
    assert_bit_exact({"a": nan}, {"a": nan.copy()})                  # the same NaN is equal
    with pytest.raises(GoldenMismatch, match="1 of 2 elements differ"):
        assert_bit_exact({"a": np.array([np.nan, -0.0], np.float32)}, {"a": nan})
    assert_bit_exact(np.ones(3), np.ones(3))                          # bare arrays


@pytest.mark.parametrize("actual,problem", [
    ({"y": np.zeros(3, np.int16)}, "actual int16[3], expected int8[3]"),
    ({"y": np.zeros(4, np.int8)}, "actual int8[4], expected int8[3]"),
    ({}, "missing from the actual outputs"),
    ({"y": np.zeros(3, np.int8), "w": np.zeros(1)}, "w: not among the expected outputs"),
])
def test_bit_exact_names_shape_dtype_and_name_problems(actual, problem):
    with pytest.raises(GoldenMismatch, match=problem.replace("[", r"\[").replace("]", r"\]")):
        assert_bit_exact(actual, {"y": np.zeros(3, np.int8)})


def test_assert_close_uses_its_tolerances():
    e = np.array([1.0, 2.0, 3.0])
    assert_close(e + 1e-7, e)
    with pytest.raises(GoldenMismatch, match=r"first at \[2\]: actual 3.1, expected 3.0"):
        assert_close(e + [0, 0, 0.1], e)
    assert_close(e + [0, 0, 0.1], e, rtol=0.05)
    assert differences(e + [0, 0, 0.1], e, rtol=0.05) == []


def test_golden_store_writes_then_compares(tmp_path, rng):
    graph, inputs = GRAPHS["chain"](rng)
    store = GoldenStore(tmp_path)
    first = store.check("chain", graph, inputs)
    assert store.written == [tmp_path / "chain.safetensors"]
    assert (tmp_path / "chain.graph.bevir").exists()
    assert_bit_exact(GoldenStore(tmp_path).check("chain", graph, inputs), first)
    from safetensors.numpy import load_file, save_file
    stored = load_file(str(store.written[0]))
    name = next(iter(stored))
    stored[name].reshape(-1)[0] += 1                                  # a stored run that differs
    save_file(stored, str(store.written[0]), metadata={"inputs": "?"})
    with pytest.raises(GoldenMismatch, match="the inputs differ from the stored run's"):
        GoldenStore(tmp_path).check("chain", graph, inputs)
    GoldenStore(tmp_path, update=True).check("chain", graph, inputs)  # refreshed
    GoldenStore(tmp_path).check("chain", graph, inputs)
    other = {k: v.copy() for k, v in inputs.items()}
    next(iter(other.values())).reshape(-1)[0] += 1
    assert graph_digest(graph, other) != graph_digest(graph, inputs)


def test_a_changed_graph_fails_with_the_first_differing_output_and_layer(tmp_path):
    inputs = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}
    GoldenStore(tmp_path).check("mlp", mlp(1.0), inputs)
    GoldenStore(tmp_path).check("mlp", mlp(1.0), inputs)             # the same graph passes
    with pytest.raises(GoldenMismatch) as e:
        GoldenStore(tmp_path).check("mlp", mlp(1.5), inputs)
    assert "the first differing layer: 'fc2' (add -> %y, max abs difference 0.5)" in str(e.value)
    assert "y: 8 of 8 elements differ; first at [0, 0]: actual 2.5, expected 2.0" in str(e.value)
    assert [d.name for d in e.value.differences] == ["y"]
    assert sorted(p.name for p in tmp_path.iterdir()) == \
        ["mlp.graph.bevir", "mlp.graph.safetensors", "mlp.safetensors"]   # nothing new written


def test_nothing_is_written_when_writing_is_off(tmp_path):
    inputs = {"x": np.ones((2, 4), np.float32)}
    with pytest.raises(GoldenMismatch, match="no stored golden run .*nothing is written in CI"):
        GoldenStore(tmp_path, write=False).check("mlp", mlp(1.0), inputs)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError):
        GoldenStore(tmp_path, update=True, write=False)


def mlp(second_bias: float) -> bevir.Graph:
    b = Builder("mlp")
    x = b.input("x", bevir.TensorType((2, 4)))
    with b.loc("fc1"):
        h = b.relu(b.add(b.matmul(x, b.const(np.eye(4, dtype=np.float32), "w1")),
                         b.const(np.ones(4, np.float32), "b1"), name="h"), name="r")
    with b.loc("fc2"):
        y = b.add(b.matmul(h, b.const(np.eye(4, dtype=np.float32), "w2"), name="m2"),
                  b.const(np.full(4, second_bias, np.float32), "b2"), name="y")
    b.output("y", y)
    return b.graph


def test_compare_graphs_names_the_first_divergence():
    inputs = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}
    assert compare_graphs(mlp(1.0), mlp(1.0), inputs).first_divergence() is None
    first = compare_graphs(mlp(1.0), mlp(1.5), inputs).first_divergence()
    assert (first.value, first.layer, first.op, first.max_abs) == ("y", "fc2", "add", 0.5)
    assert compare_graphs(mlp(1.0), mlp(1.5), inputs).first_divergence(tolerance=0.5) is None


PLUGIN_TEST = '''
import numpy as np
import bevir
from bevir.ir.builder import Builder

def test_double(golden):
    b = Builder("g")
    x = b.input("x", bevir.TensorType((4,), bevir.DType.i32))
    b.output("y", b.add(x, x))
    out = golden(b.graph, {"x": np.arange(4, dtype=np.int32)})
    assert out["y"].tolist() == [0, 2, 4, 6]
'''


def test_the_pytest_plugin_stores_compares_and_updates(pytester, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    pytester.makepyfile(test_it=PLUGIN_TEST)
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    stored = pytester.path / "golden" / "test_double.safetensors"
    pytester.runpytest().assert_outcomes(passed=1)
    from safetensors.numpy import save_file
    save_file({"y": np.array([0, 2, 4, 7], np.int32)}, str(stored))
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*y: 1 of 4 elements differ; first at [[]3[]]: actual 6, expected 7*"])
    pytester.runpytest("--bevir-update-golden").assert_outcomes(passed=1)
    pytester.runpytest().assert_outcomes(passed=1)


def test_the_pytest_plugin_writes_nothing_in_ci(pytester, monkeypatch):
    monkeypatch.setenv("CI", "true")
    pytester.makepyfile(test_it=PLUGIN_TEST)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*no stored golden run*nothing is written in CI*"])
    assert not (pytester.path / "golden").exists()
    result = pytester.runpytest("-p", "no:cacheprovider", "--bevir-update-golden")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*CI is set, and golden runs are never written in CI*"])
    assert not (pytester.path / "golden").exists()
    monkeypatch.setenv("CI", "")                      # set but empty: not CI
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_the_docs_fixture_example_is_a_test_file(pytester, monkeypatch):
    """docs/testing.md's test file, as a user would copy it: it records, then compares (in
    CI too, once recorded)."""
    import re
    from pathlib import Path
    page = (Path(__file__).resolve().parents[2] / "docs" / "testing.md").read_text()
    (example,) = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "(golden)" in b]
    monkeypatch.delenv("CI", raising=False)
    pytester.makepyfile(test_doc=example)
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert (pytester.path / "golden" / "test_my_pass_keeps_the_outputs.safetensors").exists()
    monkeypatch.setenv("CI", "1")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
