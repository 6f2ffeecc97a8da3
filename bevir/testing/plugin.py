"""bevir's pytest plugin (registered as the ``pytest11`` entry point ``bevir``).

- ``golden``: a fixture; ``golden(graph, inputs)`` runs the golden model and asserts its
  outputs bit-exact against those stored for this test (``<golden dir>/<test
  name>.safetensors`` and the graph beside it, ``.graph.bevir``; written on the first run).
  A run that differs fails with the first differing output and layer.
- ``--bevir-update-golden`` rewrites the stored runs instead of comparing.
- With the environment variable ``CI`` set, nothing is ever written: a missing run fails,
  and ``--bevir-update-golden`` is refused.
- ini option ``bevir_golden_dir`` (default ``golden``, beside the test file).
"""
from __future__ import annotations

import os
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


def in_ci() -> bool:
    """Whether the environment says this is CI (``CI`` set and not empty or ``0``/``false``,
    as CI services set it)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def pytest_configure(config) -> None:
    if config.getoption("--bevir-update-golden", False) and in_ci():
        raise pytest.UsageError("--bevir-update-golden: CI is set, and golden runs are never "
                                "written in CI")


@pytest.fixture
def golden(request):
    """``golden(graph, inputs, name=None)`` -> the golden model's outputs, asserted
    bit-exact against the stored ones (``name`` tells several calls in one test apart)."""
    folder = Path(request.config.getini("bevir_golden_dir"))
    if not folder.is_absolute():
        folder = Path(request.node.path).parent / folder
    store = GoldenStore(folder, update=request.config.getoption("--bevir-update-golden"),
                        write=not in_ci())

    def check(graph, inputs, name: str | None = None):
        key = request.node.name + (f"-{name}" if name else "")
        return store.check(key, graph, inputs)
    return check
