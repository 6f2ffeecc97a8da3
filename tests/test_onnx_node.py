"""The ONNX backend node test cases shipped with the onnx package, through bevir.from_onnx.

Only the cases whose ops all have a converter are collected. A case that the importer
refuses (UnsupportedError: an opset, dtype, attribute or dynamic shape bevir does not
take) is skipped with the error as the reason; every case that imports must match the
expected outputs (with the backend's own tolerances, rtol 1e-3 / atol 1e-7; exact for
integers and bools). A one-line summary is printed at the end of the session.

Two adaptations let more cases exercise the importer, without changing what they check:

* The cases are generated at each op's newest version, which is above bevir's opset range
  (11..21) for most ops, only because opsets 22+ added dtypes (bfloat16, float8, int4...)
  or attributes. A case whose nodes all fit the op's schema at opset 21 (same inputs and
  outputs, every attribute set exists there) is re-stamped to opset 21; cases with the new
  dtypes still skip. A case below opset 11 whose ops are defined the same at 11 (And,
  Not...) is re-stamped to 11.
* An operand bevir needs constant (Reduce axes, Slice starts, Pad pads...) that the case
  passes as a graph input is turned into an initializer holding the case's data.
"""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import bevir
from bevir.frontends.onnx import NonConstantInputError, supported_ops

with warnings.catch_warnings():   # the case generators cast out-of-range values on purpose
    warnings.simplefilter("ignore")
    from onnx.backend.test.case.node import collect_testcases

    _ALL = collect_testcases()

_SUPPORTED = supported_ops()

#: cases whose failure is a known bug in an op definition (not the importer): name -> reason
KNOWN_OP_BUGS: dict[str, str] = {}


def _default_opset(model) -> int:
    return max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def _fits(node, newer, older) -> bool:
    """Whether ``node`` (valid for schema ``newer``) means the same under ``older``: the
    same inputs and outputs, and every attribute it sets exists there."""
    return ([i.name for i in newer.inputs] == [i.name for i in older.inputs]
            and [o.name for o in newer.outputs] == [o.name for o in older.outputs]
            and all(a.name in older.attributes for a in node.attribute))


def _restamped(model):
    """The model re-stamped into bevir's opset range, or None when it is in range already
    or cannot be: a model below the range moves up when each op's definition is unchanged
    (the same since_version), one above it moves down to 21 when each node fits the op's
    opset-21 schema (see the module docstring)."""
    version = _default_opset(model)
    if 11 <= version <= 21:
        return None
    target = 11 if version < 11 else 21
    for n in model.graph.node:
        try:
            have = onnx.defs.get_schema(n.op_type, version)
            there = onnx.defs.get_schema(n.op_type, target)
        except onnx.defs.SchemaError:
            return None
        if version < 11 and have.since_version != there.since_version:
            return None
        if version > 21 and not _fits(n, have, there):
            return None
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for o in m.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = target
    return m


def _freeze(model, name: str, value: np.ndarray):
    """The model with graph input ``name`` turned into an initializer holding ``value``."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    keep = [i for i in m.graph.input if i.name != name]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    m.graph.initializer.append(numpy_helper.from_array(value, name))
    return m


def _collectable(case) -> bool:
    return case.kind == "node" and all(
        n.domain in ("", "ai.onnx") and n.op_type in _SUPPORTED for n in case.model.graph.node)


CASES = [c for c in _ALL if _collectable(c)]

# the empty-set reduction cases take log(0) = -inf on purpose
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")

_counts = {"passed": 0, "skipped": 0, "failed": 0}
_adapted = {"restamped": set(), "frozen": set()}


class _Summary:
    """Counts this file's node-case outcomes and prints one line at the session's end."""

    def pytest_runtest_logreport(self, report):
        if "test_onnx_node.py::test_node[" not in report.nodeid:
            return
        if report.skipped:
            _counts["skipped"] += 1
        elif report.failed:
            _counts["failed"] += 1
        elif report.when == "call" and report.passed:
            _counts["passed"] += 1

    def pytest_terminal_summary(self, terminalreporter):
        terminalreporter.write_line(
            f"onnx node tests: {len(CASES)} cases collected for supported ops, "
            f"{_counts['passed']} passed, {_counts['skipped']} skipped, "
            f"{_counts['failed']} failed ({len(_adapted['restamped'])} re-stamped into "
            f"opsets 11..21, {len(_adapted['frozen'])} with inputs frozen to constants)")


@pytest.fixture(scope="module", autouse=True)
def _summary(request):
    pm = request.config.pluginmanager
    if not pm.has_plugin("bevir-onnx-node-summary"):
        pm.register(_Summary(), "bevir-onnx-node-summary")
    yield


def _array(x) -> np.ndarray:
    return numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else np.asarray(x)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node(case):
    if case.name in KNOWN_OP_BUGS:
        pytest.skip(KNOWN_OP_BUGS[case.name])
    model = case.model
    inits = {t.name for t in model.graph.initializer}
    in_names = [i.name for i in model.graph.input if i.name not in inits]
    out_names = [o.name for o in model.graph.output]
    assert len(case.data_sets) == 1
    inputs, expected = case.data_sets[0]
    feeds = {n: _array(a) for n, a in zip(in_names, inputs)}
    restamped = _restamped(model)
    if restamped is not None:
        model = restamped
        _adapted["restamped"].add(case.name)
    while True:
        try:
            graph = bevir.from_onnx(model)
            break
        except NonConstantInputError as e:
            if e.value_name not in feeds:
                pytest.skip(str(e))
            model = _freeze(model, e.value_name, feeds.pop(e.value_name))
            _adapted["frozen"].add(case.name)
        except bevir.UnsupportedError as e:
            pytest.skip(str(e))
    got = bevir.run(graph, feeds)
    for name, ref in zip(out_names, expected):
        ref = _array(ref)
        out = np.asarray(got[name])
        assert out.shape == ref.shape, f"{name}: shape {out.shape} != {ref.shape}"
        assert out.dtype == ref.dtype, f"{name}: dtype {out.dtype} != {ref.dtype}"
        if ref.dtype.kind == "f":
            np.testing.assert_allclose(out, ref, rtol=case.rtol, atol=case.atol, err_msg=name)
        else:
            np.testing.assert_array_equal(out, ref, err_msg=name)
