"""HWConfig: the vendor string, presets, the hash, and one-line errors."""
from __future__ import annotations

import json

import pydantic
import pytest

import bevir
from bevir.target import MB, HWConfig, HWConfigError


def test_the_seed_string_is_the_seeds_config():
    hw = HWConfig.parse("QC-U 8MB 16MAC x4")
    assert (hw.cores, hw.macs_per_pe, hw.ocm_bytes) == (4, 16, 8 * MB)
    assert hw.peak_macs_per_cycle == hw.pe_rows * hw.pe_cols * 16
    assert hw.hash == HWConfig.preset("qc-u-4c").hash      # the label is not hashed
    assert HWConfig.parse(hw.describe()).hash == hw.hash   # describe() parses back


@pytest.mark.parametrize("text, field, value", [
    ("QC-U 512KB 16MAC x4", "ocm_bytes", 512 * 1024),
    ("qc-u 8 MB 16 MACs x 2", "cores", 2),
    ("QC-U 8MB 8MAC", "macs_per_pe", 8),
    ("QC-U 32x32", "pe_rows", 32),
    ("QC-U 800MHz", "clock_ghz", 0.8),
    ("QC-U 8MB x4 shared", "ocm_shared", True),
    ("chimera-16tops", "pe_cols", 32),
])
def test_close_variants_parse(text, field, value):
    assert getattr(HWConfig.parse(text), field) == value


def test_hash_is_stable_and_sensitive():
    a, b = HWConfig.preset("qc-u"), HWConfig.preset("qc-u")
    assert a.hash == b.hash and len(a.hash) == 64
    assert HWConfig.preset("qc-u", ddr_latency_cycles=501).hash != a.hash
    assert HWConfig.preset("qc-u", efficiency={"conv": 0.5}).hash != a.hash
    assert json.loads(a.to_json()) == a.model_dump()
    assert HWConfig(**json.loads(a.to_json())) == a


def test_the_config_is_frozen():
    hw = HWConfig()
    with pytest.raises(pydantic.ValidationError):
        hw.cores = 2
    assert hw.cores == 1


def test_shared_ocm_is_split_between_cores():
    assert HWConfig.parse("QC-U 8MB x4 shared").ocm_per_core == 2 * MB
    assert HWConfig.parse("QC-U 8MB x4").ocm_per_core == 8 * MB


@pytest.mark.parametrize("make, words", [
    (lambda: HWConfig.parse("QC-U 8QB 16MAC"), "8QB"),
    (lambda: HWConfig.parse("QC-U 8MB x0"), "cores"),
    (lambda: HWConfig.parse(""), "empty"),
    (lambda: HWConfig.parse("QC-U 8MB; x4"), "cannot read"),
    (lambda: HWConfig.preset("qc-z"), "qc-z"),
    (lambda: HWConfig(pe_rows=0), "pe_rows"),
    (lambda: HWConfig(efficiency={"conv": 1.5}), "conv"),
    (lambda: HWConfig(efficiency={"warp": 0.5}), "warp"),
    (lambda: HWConfig(colour="red"), "colour"),
    (lambda: HWConfig.parse("QC-U 8MB 16MAC x2 x3"), "sets cores twice (again by 'x3')"),
    (lambda: HWConfig.parse("QC-U 8MB 16MAC 4MB"), "sets ocm_bytes twice"),
    (lambda: HWConfig.parse("QC-U 16x16 32x32"), "sets pe_cols, pe_rows twice"),
    (lambda: HWConfig.parse("x4 shared shared"), "sets ocm_shared twice"),
])
def test_errors_are_one_line_bevir_errors(make, words):
    with pytest.raises(HWConfigError) as e:
        make()
    assert isinstance(e.value, bevir.BevirError)
    assert words in str(e.value) and "\n" not in str(e.value)
