"""Shared fixtures: reproducible random data, one generator per test."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

pytest_plugins = ["pytester"]


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


#: the test files that take most of the suite's time (model zoos, the end-to-end flow and the
#: BEVFormer model, crash and concurrency tests, Ray, the notebook, fuzzing): marked ``slow``
#: with every test that builds a BEVFormer graph; ``make test-fast`` leaves them out
SLOW_FILES = {"test_hub_zoo", "test_zoo", "test_int8_cnn", "test_scale", "test_crash_safety",
              "test_bevformer_e2e", "test_bevformer_model", "test_walkthrough", "test_sequence",
              "test_precision", "test_determinism", "test_decompose", "test_fuzz",
              "test_backbone_flow"}


def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.stem in SLOW_FILES or "bevformer" in item.name \
                or "bevformer_int8" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


def pytest_terminal_summary(terminalreporter):
    """The zoo tables (tests/test_zoo.py, tests/test_hub_zoo.py), of the zoos that ran."""
    import sys
    for module, title in (("test_zoo", "model zoo"), ("test_hub_zoo", "timm and transformers zoo")):
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
