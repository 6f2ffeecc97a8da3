"""bevir's pytest plugin (registered as the ``pytest11`` entry point ``bevir``).

- ``golden``: a fixture; ``golden(graph, inputs)`` runs the golden model and asserts its
  outputs bit-exact against those stored for this test, graph and inputs
  (``<golden dir>/<test name>-<digest>.safetensors``; written on the first run).
- ``--bevir-update-golden`` rewrites the stored outputs instead of comparing.
- ini option ``bevir_golden_dir`` (default ``golden``, beside the test file).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from . import GoldenStore


def pytest_addoption(parser) -> None:
    group = parser.getgroup("bevir")
    group.addoption("--bevir-update-golden", action="store_true", default=False,
                    help="rewrite the golden outputs stored by the `golden` fixture")
    parser.addini("bevir_golden_dir", default="golden",
                  help="folder of the `golden` fixture's stored outputs, relative to each "
                       "test file's folder (or absolute)")


@pytest.fixture
def golden(request):
    """``golden(graph, inputs, name=None)`` -> the golden model's outputs, asserted
    bit-exact against the stored ones (``name`` tells several calls in one test apart)."""
    folder = Path(request.config.getini("bevir_golden_dir"))
    if not folder.is_absolute():
        folder = Path(request.node.path).parent / folder
    store = GoldenStore(folder, update=request.config.getoption("--bevir-update-golden"))

    def check(graph, inputs, name: str | None = None):
        key = request.node.name + (f"-{name}" if name else "")
        return store.check(key, graph, inputs)
    return check
