"""The GPNPU hardware configuration: what the cycle model (bevir/target/cycles.py) and the
target passes read about the machine.

``HWConfig`` is a frozen pydantic model. It is built directly, from a named preset
(``HWConfig.preset("qc-u-4c")``) or from the vendor flow's string
(``HWConfig.parse("QC-U 8MB 16MAC x4")``). Sizes are binary (1 MB = 2**20 bytes).
Every default that is not public is an assumption; docs/target.md lists which.
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import BevirError

KB, MB, GB = 1 << 10, 1 << 20, 1 << 30

#: the op classes an efficiency factor can be given for (Work.op_class in bevir/ops/cost.py)
OP_CLASSES = ("conv", "matmul", "mac", "elementwise", "table", "reduce", "norm", "softmax",
              "sampling", "data")


class HWConfigError(BevirError):
    """A hardware configuration is malformed (bad field, unknown preset or string)."""


class HWConfig(BaseModel):
    """One GPNPU configuration; cycles are core clock cycles, bandwidths bytes per cycle."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field("custom", description="a label; not part of the hash")
    cores: int = Field(1, ge=1, le=64)
    pe_rows: int = Field(16, ge=1, le=256)
    pe_cols: int = Field(16, ge=1, le=256)
    macs_per_pe: int = Field(8, ge=1, le=256, description="INT8 MAC lanes per PE")
    alu_ops_per_pe: int = Field(1, ge=1, le=64, description="ALU operations per PE per cycle")
    regfile_bytes_per_pe: int = Field(4 * KB, ge=64)
    clock_ghz: float = Field(1.0, gt=0, le=10)
    ocm_bytes: int = Field(8 * MB, ge=KB)
    ocm_shared: bool = Field(False, strict=True,
                             description="one OCM for all cores (True) or one per core")
    ocm_bytes_per_cycle: float = Field(128.0, gt=0, description="OCM <-> PE array, per core")
    broadcast_bytes_per_cycle: float = Field(
        32.0, gt=0, description="OCM -> PE array weight broadcast bus, per core")
    ddr_bytes_per_cycle: float = Field(25.6, gt=0, description="DDR <-> OCM, all cores")
    ddr_latency_cycles: int = Field(500, ge=0)
    dma_burst_bytes: int = Field(128, ge=1)
    dma_setup_cycles: int = Field(32, ge=0, description="per DMA transfer (one tensor)")
    double_buffer: bool = Field(True, strict=True,
                                description="DMA overlaps compute except the first burst")
    barrier_cycles: int = Field(200, ge=0)
    launch_cycles: int = Field(100, ge=0, description="per op: program preamble, set-up")
    efficiency: dict[str, float] = Field(default_factory=dict,
                                         description="per op class, in (0, 1]; absent: 1")

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "config"
            raise HWConfigError(f"hardware config: {where}: {err['msg']}") from None

    @field_validator("efficiency")
    @classmethod
    def _known_classes(cls, v: dict[str, float]) -> dict[str, float]:
        for k, f in v.items():
            if k not in OP_CLASSES:
                raise ValueError(f"unknown op class '{k}' (known: {', '.join(OP_CLASSES)})")
            if not 0 < f <= 1:
                raise ValueError(f"efficiency of '{k}' must be in (0, 1], got {f}")
        return dict(sorted(v.items()))

    # ---- derived ------------------------------------------------------------------------
    @property
    def pes(self) -> int:
        return self.pe_rows * self.pe_cols

    @property
    def peak_macs_per_cycle(self) -> int:
        """MACs per cycle of one core."""
        return self.pes * self.macs_per_pe

    @property
    def ocm_per_core(self) -> int:
        """The OCM bytes one core may use."""
        return self.ocm_bytes // self.cores if self.ocm_shared else self.ocm_bytes

    def efficiency_of(self, op_class: str) -> float:
        return self.efficiency.get(op_class, 1.0)

    @property
    def tops(self) -> float:
        """Peak INT8 tera-operations per second (2 per MAC), all cores."""
        return 2 * self.cores * self.peak_macs_per_cycle * self.clock_ghz / 1000

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no spaces."""
        return json.dumps(self.model_dump(), sort_keys=True, separators=(",", ":"))

    @property
    def hash(self) -> str:
        """sha256 of the canonical JSON without the label: equal hardware, equal hash."""
        body = json.dumps(self.model_dump(exclude={"name"}), sort_keys=True,
                          separators=(",", ":"))
        return hashlib.sha256(body.encode()).hexdigest()

    def describe(self) -> str:
        """The vendor-style string of the fields it names (PE array, OCM, MACs, cores);
        :meth:`option_text` gives a text that parses back to this whole config."""
        return (f"{self.pe_rows}x{self.pe_cols} {format_size(self.ocm_bytes)} "
                f"{self.macs_per_pe}MAC x{self.cores}")

    def with_cores(self, cores: int) -> HWConfig:
        """The same machine with ``cores`` cores (validated); a label that names this
        hardware names the new one (``QC-U 8MB 16MAC x4`` -> ``... x2``)."""
        new = HWConfig(**{**self.model_dump(), "cores": cores})
        for name in (re.sub(r"\s*\bx\s*\d+\s*$", "", self.name) + f" x{cores}",
                     new.describe()):
            named = new.model_copy(update={"name": name})
            if named.option_text() == name:
                return named
        return new

    def same_hardware(self, other: HWConfig) -> bool:
        """Equal fields, label aside."""
        return self.hash == other.hash

    @property
    def label(self) -> str:
        """What to call this config where people read it: the user's string where it names
        this hardware (e.g. "QC-U 8MB 16MAC x4"), else the vendor-style description."""
        text = self.option_text()
        return text if not text.startswith("{") else self.describe()

    # ---- as a pass option -----------------------------------------------------------------
    def option_text(self) -> str:
        """The text of this config in a pass pipeline: the label when it parses back to
        this hardware (a preset or a vendor string), else the canonical JSON."""
        try:
            if HWConfig.parse(self.name).same_hardware(self):
                return self.name
        except HWConfigError:
            pass
        return self.to_json()

    @classmethod
    def from_option(cls, text: str) -> HWConfig:
        """A pass option's text: a preset, a vendor string or JSON of the fields."""
        if text.lstrip().startswith("{"):
            try:
                fields = json.loads(text)
            except ValueError as e:
                raise HWConfigError(f"cannot read hardware config JSON: {e}") from None
            if not isinstance(fields, dict):
                raise HWConfigError("a hardware config in JSON is an object of fields")
            return cls(**fields)
        return cls.parse(text)

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def preset(cls, preset: str, **overrides: Any) -> HWConfig:
        """A named preset (see :data:`PRESETS`), with fields overridden."""
        key = preset.strip().lower()
        if key not in PRESETS:
            raise HWConfigError(f"unknown hardware preset '{preset}' (known: "
                                f"{', '.join(sorted(PRESETS))})")
        return cls(**{"name": key, **PRESETS[key], **overrides})

    @classmethod
    def parse(cls, text: str) -> HWConfig:
        """A preset name, or the vendor string: an optional family (a preset), then any
        of ``8MB`` / ``512KB`` (OCM), ``16MAC`` (MACs per PE), ``x4`` (cores), ``32x32``
        (PE rows x cols), ``1.2GHz`` / ``800MHz`` (clock), ``shared`` (one OCM)."""
        if not isinstance(text, str) or not text.strip():
            raise HWConfigError(f"empty hardware config string {text!r}")
        if text.strip().lower() in PRESETS:
            return cls.preset(text)
        tokens = _TOKEN.findall(text.strip())
        if "".join(t for t in tokens).replace(" ", "") != re.sub(r"\s+", "", text.strip()):
            raise HWConfigError(f"cannot read hardware config {text!r}")
        base, fields = "qc-u", {}
        for i, token in enumerate(t.strip() for t in tokens):
            if i == 0 and token.lower() in FAMILIES:
                base = FAMILIES[token.lower()]
                continue
            read = _read_token(token, text)
            again = sorted(set(read) & set(fields))
            if again:
                raise HWConfigError(f"hardware config {text!r} sets {', '.join(again)} twice "
                                    f"(again by '{token}')")
            fields.update(read)
        return cls.preset(base, name=" ".join(text.split()), **fields)


_TOKEN = re.compile(r"\s*(\d+\s*x\s*\d+|\d+(?:\.\d+)?\s*[A-Za-z]+|x\s*\d+|[A-Za-z][\w-]*)",
                    re.I)
_SIZE = {"b": 1, "k": KB, "kb": KB, "kib": KB, "m": MB, "mb": MB, "mib": MB, "g": GB,
         "gb": GB, "gib": GB}


def _read_token(token: str, text: str) -> dict[str, Any]:
    t = token.lower().replace(" ", "")
    if m := re.fullmatch(r"(\d+)x(\d+)", t):
        return {"pe_rows": int(m[1]), "pe_cols": int(m[2])}
    if m := re.fullmatch(r"x(\d+)", t):
        return {"cores": int(m[1])}
    if m := re.fullmatch(r"(\d+)macs?", t):
        return {"macs_per_pe": int(m[1])}
    if m := re.fullmatch(r"(\d+(?:\.\d+)?)(ghz|mhz)", t):
        return {"clock_ghz": float(m[1]) / (1000 if m[2] == "mhz" else 1)}
    if _SIZE_RE.fullmatch(t):
        return {"ocm_bytes": parse_size(t)}
    if t == "shared":
        return {"ocm_shared": True}
    raise HWConfigError(f"cannot read '{token}' in hardware config {text!r} (expected e.g. "
                        f"'QC-U 8MB 16MAC x4')")


_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)([kmg]i?b?|b)")


def parse_size(text: str) -> int:
    """Bytes of a size such as ``8MB``, ``512KB``, ``1.5M`` (binary units)."""
    m = _SIZE_RE.fullmatch(text.strip().lower().replace(" ", ""))
    if not m:
        raise HWConfigError(f"cannot read size {text!r} (expected e.g. '8MB', '512KB')")
    return int(float(m[1]) * _SIZE[m[2]])


def format_size(n: int) -> str:
    for unit, size in (("GB", GB), ("MB", MB), ("KB", KB)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n}B"


#: named presets: (field overrides). The Chimera IP sizes are the public 2022 figures
#: (8x8 / 16x16 / 32x32 PEs x 8 MACs at 1 GHz = 1 / 4 / 16 TOPS); "qc-u-4c" is the seed's
#: HWConfig(num_cores=4, macs_per_pe=16, ocm_size="8MB"), its 16x16 array an assumption.
PRESETS: dict[str, dict[str, Any]] = {
    "chimera-1tops": {"pe_rows": 8, "pe_cols": 8, "macs_per_pe": 8, "ocm_bytes": 8 * MB},
    "chimera-4tops": {"pe_rows": 16, "pe_cols": 16, "macs_per_pe": 8, "ocm_bytes": 8 * MB},
    "chimera-16tops": {"pe_rows": 32, "pe_cols": 32, "macs_per_pe": 8, "ocm_bytes": 8 * MB},
    "qc-u": {"pe_rows": 16, "pe_cols": 16, "macs_per_pe": 16, "ocm_bytes": 8 * MB},
    "qc-u-4c": {"pe_rows": 16, "pe_cols": 16, "macs_per_pe": 16, "ocm_bytes": 8 * MB,
                "cores": 4},
}
#: family names a vendor string may start with -> the preset it starts from
FAMILIES = {"qc-u": "qc-u", "qc-ultra": "qc-u", "chimera": "chimera-4tops"}
