"""Shared fixtures (reproducible random data, one generator per test; the BEVFormer INT8
frame) and the markers given by file: slow, e2e, tvm."""
from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest

pytest_plugins = ["pytester"]

#: the shared checks (tests/shared.py) report failed asserts as the test modules do
pytest.register_assert_rewrite("tests.shared")


def stable_seed(name: str) -> int:
    """A seed from a name that is the same in every process (``hash`` is salted per process)."""
    return zlib.crc32(name.encode())


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A generator of its own for each test, seeded from the test's node id: a test draws the
    same data whichever tests run before it and in whichever process."""
    return np.random.default_rng(stable_seed(request.node.nodeid))


@pytest.fixture
def torch_seed(request) -> None:
    """torch's global generator seeded from the test's node id, for tests whose modules and
    tensors draw from it."""
    import torch
    torch.manual_seed(stable_seed(request.node.nodeid))


TESTS = Path(__file__).resolve().parent

#: the test files that take most of the suite's time (model zoos, the end-to-end flow and the
#: BEVFormer model, crash and concurrency tests, Ray, the notebook, fuzzing), relative to
#: tests/: marked ``slow`` with every test that builds a BEVFormer graph; ``make test-fast``
#: leaves them out
SLOW_FILES = {"frontends/test_hub_zoo.py", "frontends/test_zoo.py", "flows/test_int8_cnn.py",
              "flows/test_backbone.py", "scale/test_scale.py", "top/test_crash_safety.py",
              "top/test_determinism.py", "top/test_fuzz.py", "e2e/test_bevformer_e2e.py",
              "e2e/test_bevformer_model.py", "e2e/test_bevformer_sequence.py",
              "e2e/test_walkthrough.py", "passes/test_precision.py", "passes/test_decompose.py",
              "testing/test_device_zoo.py"}

#: the folders whose tests are all ``e2e`` (the BEVFormer example: its model, the end-to-end
#: flow, frame sequences, the views, the notebook); so is every test that builds a BEVFormer
#: graph, wherever it is
E2E_DIRS = {"e2e"}


#: the test files that generate code and build it (TVM kernels, per-core C programs built by
#: the system C compiler, the host build's micro-kernels): all their tests are ``tvm``
TVM_FILES = {"codegen/test_lower.py", "codegen/test_lower_fx.py", "codegen/test_lower_qlinear.py",
             "codegen/test_lower_int.py",
             "codegen/test_cprogram.py", "codegen/test_micro.py", "codegen/test_exec_trust.py",
             "top/test_determinism.py", "e2e/test_walkthrough.py", "testing/test_device_zoo.py"}
#: and the tests of other files that do (their names, or names with their parameters)
TVM_TESTS = {
    "target/test_trace.py": {"test_sim_and_exec_traces_show_every_step_once_per_core",
                             "test_cli_writes_both_traces", "test_a_trace_before_a_run_is_one_line"},
    "passes/test_stripe.py": {"test_striped_programs_are_bit_exact_and_count_what_the_model_charges"},
    "passes/test_quantize.py": {"test_every_op_of_a_mobile_cnn_lowers_with_the_default_config",
                                "test_padding_runs_on_the_codes", "test_upsampling_runs_on_the_codes"},
    "scale/test_scale.py": {"test_evaluation_runs_the_generated_program_too"},
    "top/test_cli.py": {"test_every_command_that_reads_a_graph_takes_load"},
    "top/test_docs.py": {"test_doc_examples_run[codegen.md]", "test_doc_examples_run[target.md]"},
    "top/test_fuzz.py": {"test_fuzz_target_raises_only_bevir_errors[manifest]",
                         "test_fuzz_target_raises_only_bevir_errors[program]"},
    "top/test_crash_safety.py": {
        "test_a_compile_killed_between_any_two_writes_leaves_the_old_program_or_the_new",
        "test_compiles_killed_in_turn_with_a_cold_cache_finish_from_what_they_left",
        "test_two_compiles_into_one_cache_and_one_folder", "test_the_c_compiler_dies_with_bevir"},
    "e2e/test_bevformer_e2e.py": {     # the tests of the e2e script's run, which compiles
        "test_e2e_script_writes_its_artifacts", "test_e2e_device_stage_is_bit_exact_and_drawn",
        "test_e2e_reports_the_scene_objects", "test_e2e_outputs_match_the_stored_digests",
        "test_int8_top10_matches_pass_the_reference_flows_check"},
}


def pytest_addoption(parser):
    parser.addoption("--full-zoo", action="store_true", default=False,
                     help="run every path on every model of the timm and transformers zoo "
                          "(tests/frontends/test_hub_zoo.py; by default the dynamo exporter "
                          "runs on its DYNAMO_SUBSET)")


def pytest_configure(config):
    """The files named above must exist: a test file moved or renamed without updating
    them would silently lose its markers."""
    listed = SLOW_FILES | TVM_FILES | set(TVM_TESTS)
    missing = sorted(f for f in listed if not (TESTS / f).is_file())
    if missing:
        raise pytest.UsageError(f"tests/conftest.py names test files that do not exist: {missing}")


def _relative(item) -> str:
    """The test's file relative to tests/ (``passes/test_partition.py``)."""
    try:
        return item.path.relative_to(TESTS).as_posix()
    except ValueError:           # a file outside tests/ (pytester's)
        return item.path.name


def _builds_bevformer(item) -> bool:
    return "bevformer" in item.name or "bevformer_int8" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(items):
    for item in items:
        path = _relative(item)
        bevformer = _builds_bevformer(item)
        if path in SLOW_FILES or bevformer:
            item.add_marker(pytest.mark.slow)
        if path.split("/")[0] in E2E_DIRS or bevformer:
            item.add_marker(pytest.mark.e2e)
        if path in TVM_FILES or {item.name, getattr(item, "originalname", item.name)} & \
                TVM_TESTS.get(path, set()):
            item.add_marker(pytest.mark.tvm)


#: the zoo modules whose tables end the session, with their titles
ZOO_TABLES = (("tests.frontends.test_zoo", "model zoo"),
              ("tests.frontends.test_hub_zoo", "timm and transformers zoo"),
              ("tests.testing.test_device_zoo", "the zoos on the GPNPU (INT8, QC-U 8MB 16MAC x4)"))


def pytest_terminal_summary(terminalreporter):
    """The zoo tables (tests/frontends/test_zoo.py, test_hub_zoo.py,
    tests/testing/test_device_zoo.py), of the zoos that ran."""
    import sys
    for module, title in ZOO_TABLES:
        zoo = sys.modules.get(module)
        if zoo is not None and zoo.ROWS:
            terminalreporter.write_sep("-", title)
            terminalreporter.write_line(zoo.table())


@pytest.fixture(scope="session")
def bevformer_int8():
    """The `test` config's INT8 graph as the e2e flow builds it, and its frame's inputs
    (built once per session: several back-end tests share it)."""
    from examples.bevformer import e2e
    return e2e.int8_frame("test")
