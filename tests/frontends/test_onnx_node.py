"""The ONNX backend node test cases shipped with the onnx package, through bevir.from_onnx,
at the opsets they ship with (10..28).

Only the cases whose ops all have a converter are collected. Every case must import and
match the expected outputs (with the backend's own tolerances, rtol 1e-3 / atol 1e-7;
exact for integers and bools), except the cases listed in ``tests/data/onnx_node_skips.json``:
those the importer is expected to refuse (UnsupportedError: a dtype, attribute, mode or
dynamic shape bevir does not take), each with the importer's message as its reason. A
case refused but not listed fails ("newly refused"), so does a listed case refused for
another reason or one that imports ("listed as skip but passes"); a listed name that is
no longer a collected case, and a supported op whose node cases are all listed, fail
their own tests. After a change to the importer, ``python -m tests.frontends.test_onnx_node``
(from the repository root) rewrites the manifest from the current refusals: review its diff, a
refusal from a supported converter that should take the case is a bug, not a skip. The
session ends with the counts: passed, skipped by reason (:func:`skip_reason`) and failed,
per opset range and per op, and the pass rate of the cases whose dtypes bevir has.

One adaptation lets more cases exercise the importer, without changing what they check: an
operand that determines a shape (Reduce axes, Slice starts, Pad pads...) that the case
passes as a graph input is turned into an initializer holding the case's data (bevir
shapes are static, so such a model is imported for given shapes).
"""
from __future__ import annotations

import json
from collections import Counter

import pytest

import bevir
from bevir.frontends.onnx import CONVERTERS
from tests.shared import (NODE_FROZEN, NODE_SKIPS, NODE_SKIPS_FILE, check_node_case,
                          import_node_case, onnx_node_cases)

MANIFEST = NODE_SKIPS_FILE
#: the cases the importer is expected to refuse: name -> the importer's message
SKIPS: dict[str, str] = NODE_SKIPS

#: supported ops whose collected node cases are all listed skips: op type -> why
NO_PASSING_CASES: dict[str, str] = {}


def _default_opset(model) -> int:
    return max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


CASES = onnx_node_cases()

# the empty-set reduction cases take log(0) = -inf on purpose
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")

#: the opset ranges the summary counts by
OPSET_RANGES = ((1, 9), (10, 12), (13, 17), (18, 21), (22, 28))
_DTYPE_WORDS = ("dtype", "must be float32, got float16", "float8", "bfloat16")


def skip_reason(message: str) -> str:
    """The reason class of a listed refusal: a dtype bevir does not have, training-only
    behaviour, or a feature out of bevir's scope (an attribute, mode, rank or dynamic
    shape)."""
    if any(w in message for w in _DTYPE_WORDS):
        return "dtype"
    if "inference only" in message or "training" in message:
        return "training"
    return "out of scope"


_outcomes: dict[str, str] = {}     # case name -> passed / failed / skipped:<reason>


def summary_lines() -> list[str]:
    """The counts the session prints: totals, per opset range, the pass rate of the cases
    whose dtypes bevir has, and per op type."""
    by_name = {c.name: c for c in CASES}

    def counts(names) -> Counter:
        return Counter(_outcomes[n] for n in names)

    def fmt(cnt: Counter) -> str:
        skips = {k.split(":", 1)[1]: v for k, v in cnt.items() if k.startswith("skipped:")}
        s = ", ".join(f"{v} {k}" for k, v in sorted(skips.items()))
        return (f"{cnt['passed']} passed, {sum(skips.values())} skipped ({s or 'none'}), "
                f"{cnt['failed']} failed")
    ran = [n for n in by_name if n in _outcomes]
    total = counts(ran)
    eligible = sum(v for k, v in total.items() if k != "skipped:dtype")
    rate = 100.0 * total["passed"] / eligible if eligible else 0.0
    lines = [f"onnx node tests: {len(ran)} cases for supported ops at their own opsets: "
             f"{fmt(total)}; {total['passed']}/{eligible} = {rate:.1f} % of the cases whose "
             f"dtypes bevir has pass ({len(NODE_FROZEN)} with shape inputs frozen to constants)"]
    for lo, hi in OPSET_RANGES:
        names = [n for n in ran if lo <= _default_opset(by_name[n].model) <= hi]
        lines.append(f"  opsets {lo}..{hi}: {len(names)} cases: {fmt(counts(names))}")
    per_op: dict[str, Counter] = {}
    for n in ran:
        for op in sorted(_op_types(by_name[n])):
            per_op.setdefault(op, Counter())[_outcomes[n]] += 1
    for op, cnt in sorted(per_op.items()):
        lines.append(f"  {op}: {fmt(cnt)}")
    return lines


class _Summary:
    """Records this file's node-case outcomes and prints the counts at the session's end."""

    def pytest_runtest_logreport(self, report):
        if "test_onnx_node.py::test_node[" not in report.nodeid:
            return
        name = report.nodeid.split("[", 1)[1][:-1]
        if report.skipped:
            _outcomes[name] = f"skipped:{skip_reason(SKIPS.get(name, ''))}"
        elif report.failed:
            _outcomes[name] = "failed"
        elif report.when == "call" and report.passed:
            _outcomes[name] = "passed"

    def pytest_terminal_summary(self, terminalreporter):
        if _outcomes:
            for line in summary_lines():
                terminalreporter.write_line(line)


@pytest.fixture(scope="module", autouse=True)
def _summary(request):
    pm = request.config.pluginmanager
    if not pm.has_plugin("bevir-onnx-node-summary"):
        pm.register(_Summary(), "bevir-onnx-node-summary")
    yield


def _op_types(case) -> set[str]:
    return {n.op_type for n in case.model.graph.node}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node(case):
    check_node_case(case)


def test_skip_manifest_lists_collected_cases_sorted():
    stale = sorted(set(SKIPS) - {c.name for c in CASES})
    assert not stale, f"{MANIFEST.name} lists cases that are not collected any more: {stale}"
    assert list(SKIPS) == sorted(SKIPS), f"keep {MANIFEST.name} sorted by case name"


def test_every_supported_op_has_node_cases_expected_to_pass():
    """Per op type, the collected cases that use it minus the listed skips: at least one,
    for every supported op that has node cases, unless NO_PASSING_CASES says why not."""
    collected, expected = Counter(), Counter()
    for case in CASES:
        collected.update(_op_types(case))
        if case.name not in SKIPS:
            expected.update(_op_types(case))
    none_pass = {op: f"{collected[op]} cases, all listed" for op in collected if expected[op] < 1}
    assert none_pass.keys() == NO_PASSING_CASES.keys(), (
        f"supported ops without a node case expected to pass: {none_pass} "
        f"(exempted: {sorted(NO_PASSING_CASES)})")


#: converters whose breaking once went unnoticed (their cases moved from pass to skip)
_GUARDED = ("Selu", "Elu", "HardSigmoid", "ReduceL2", "PRelu", "Softplus", "GlobalMaxPool")


@pytest.mark.parametrize("op_type", _GUARDED)
def test_a_broken_converter_fails_its_node_cases(op_type, monkeypatch):
    case = next(c for c in CASES if op_type in _op_types(c) and c.name not in SKIPS)
    check_node_case(case)           # passes with the real converter

    def broken(c):
        raise bevir.UnsupportedError("broken on purpose", op=c.op_type, node=c.loc)

    monkeypatch.setattr(CONVERTERS[op_type], "fn", broken)
    with pytest.raises(pytest.fail.Exception, match=f"newly refused: {case.name}: "):
        check_node_case(case)


def test_a_stale_manifest_entry_fails(monkeypatch):
    passing = next(c for c in CASES if c.name not in SKIPS)
    monkeypatch.setitem(SKIPS, passing.name, "once refused")
    with pytest.raises(pytest.fail.Exception, match="listed as skip but passes: remove it"):
        check_node_case(passing)
    refused = next(c for c in CASES if c.name in SKIPS and c.name != passing.name)
    monkeypatch.setitem(SKIPS, refused.name, "refused for the reason listed")
    with pytest.raises(pytest.fail.Exception, match="refused for another reason"):
        check_node_case(refused)


def write_manifest() -> None:
    """Rewrite the manifest from the importer's current refusals (review the diff)."""
    refusals = {}
    for case in CASES:
        try:
            import_node_case(case)
        except bevir.UnsupportedError as e:
            refusals[case.name] = str(e)
    MANIFEST.parent.mkdir(exist_ok=True)
    MANIFEST.write_text(json.dumps(dict(sorted(refusals.items())), indent=1) + "\n")
    print(f"{MANIFEST}: {len(refusals)} of {len(CASES)} cases refused")


if __name__ == "__main__":
    write_manifest()
