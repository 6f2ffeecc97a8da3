"""Fixed-point lowerings of data movement: concatenation on the codes."""
from __future__ import annotations

from ...ir.graph import Node
from ...ir.types import DType
from ..quant_config import Rule
from .context import Context, lowers, read_by_tables


@lowers("concat")
def concat(cx: Context, node: Node, rule: Rule, fy: int, target: None) -> str | None:
    """concat on the codes, each operand requantized to the result's frac bits; in 16
    bits, keeping every bit, where some operands are exact sums on their way to a table
    (see Context.exact_width)."""
    qs = cx.wide_operands(node) if read_by_tables(node.output) else cx.operands(node)
    if qs is None:
        return "uncalibrated input"
    out = {"out_frac_bits": fy} if all(q.type.dtype is DType.i8 for q in qs) else \
        cx.exact_width(node.output, qs)
    qs = [q if (q.type.quant.frac_bits[0], q.type.dtype.value) ==
          (out["out_frac_bits"], out.get("out_dtype", "i8")) else
          cx.create("fx_requantize", [q], out, node) for q in qs]
    cx.swap(node, cx.create("concat", qs, node.attrs, node))
    return None
