"""The zoos on the GPNPU (bevir.testing.device_zoo): a subset of both zoos, each model as
the CLI takes it (from_torch, bevir quantize with the default config, bevir compile --hw
"QC-U 8MB 16MAC x4", bevir exec --check), runs as one device stage with 0 elements
differing from the golden model, and within 30 dB of float. The session ends with the
table; bench/bench_zoo_device.py prints it over every model."""
from __future__ import annotations

import pytest

from bevir.testing.device_zoo import HEADER, device_row, names
from bevir.testing.hub_zoo import available

ROWS: dict[str, str] = {}

#: a CNN, an encoder, one that computes its position ids from its token ids (RoBERTa), a
#: causal decoder, a ViT, an MLP-mixer, a detector: each a few seconds
SUBSET = ["tv/squeezenet1_1", "tv/resnet18", "hf/bert", "hf/roberta", "hf/gpt2",
          "timm/vit_tiny", "timm/mixer", "hf/detr"]


@pytest.mark.parametrize("name", SUBSET)
def test_zoo_model_runs_on_the_device_as_one_stage_bit_exact(name):
    if not name.startswith("tv/") and available() is not None:
        pytest.skip(f"timm and transformers (the test extra's): {available()}")
    row = device_row(name)
    ROWS[name] = row.line()
    assert not row.failure, row.failure
    assert row.one_device_stage and row.differing == 0, row.line()
    assert row.sqnr >= 30, row.line()       # the bar for INT8 against float


def test_the_subset_is_of_the_zoos():
    assert set(SUBSET) <= set(names())


def table() -> str:
    """The rows of the models measured in this session."""
    return "\n".join([HEADER, *ROWS.values()])
