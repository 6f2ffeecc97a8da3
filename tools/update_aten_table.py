"""Rewrite the supported-ATen-op table in docs/frontends.md from the converter registry."""
from pathlib import Path

from bevir.frontends.torch import aten_table

START, END = "<!-- aten-table -->\n", "<!-- /aten-table -->"
doc = Path(__file__).resolve().parents[1] / "docs" / "frontends.md"
text = doc.read_text()
head, rest = text.split(START)
doc.write_text(head + START + aten_table() + END + rest.split(END, 1)[1])
