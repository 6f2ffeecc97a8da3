"""insert-bridges: hand onnxruntime's INT8 backbone over to the fixed-point head.

The composed graph dequantizes the backbone's affine codes to float and the quantized head
quantizes them again to its frac bits, usually after a layout change and reshapes:
``fx_quantize(reshape(transpose(dequantize(q))))``. This pass replaces the float round trip
by one integer op, ``fx_bridge`` (requantization of the affine scale to frac bits, rounded
once, plus the transpose), and moves the data movement onto the integers:

=============================  ===========================================================
pattern                        rewrites
=============================  ===========================================================
hoist-quantize                 fx_quantize(M(y)) -> M(fx_quantize(y)) for data movement M
                               (reshape, flatten, squeeze, unsqueeze, transpose) whose
                               result only the fx_quantize reads (as the matcher requires
                               of every inner node)
bridge-dequantize              fx_quantize(dequantize(q)) with q u8/i8 per-tensor affine
                               -> fx_bridge(q) (to i8 or i16 codes)
fold-transpose-into-bridge     transpose(fx_bridge(q)) -> fx_bridge(q, perm composed), the
                               bridge read by the transpose only
=============================  ===========================================================

The bridge rounds the exact product (q - z) * s * 2**f once; dequantize then fx_quantize
rounds the float32 product first, so the two can differ by one code near ties: the pass is
not semantics-preserving (numeric verification skips it), and a test bounds the change.
"""
from __future__ import annotations

from typing import ClassVar

from ..ir.types import AffineQuant, DType
from .patterns import Match, PatternPass, RewritePattern, Rewriter, op

MOVEMENT = ("reshape", "flatten", "squeeze", "unsqueeze", "transpose")


class HoistQuantize(RewritePattern):
    """fx_quantize(M(y)) -> M(fx_quantize(y)): quantizing elementwise commutes with moving."""

    name = "hoist-quantize"
    pattern = op("fx_quantize", op(MOVEMENT, "y", name="move"))

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        move = m["move"]
        q = rw.create("fx_quantize", [m["y"]], m.root.attrs)
        rw.replace(m.root, rw.create(move.op, [q.outputs[0]], move.attrs))


class BridgeDequantize(RewritePattern):
    """fx_quantize(dequantize(q)) -> fx_bridge(q) for u8/i8 per-tensor affine q."""

    name = "bridge-dequantize"
    benefit: ClassVar[int] = 2
    pattern = op("fx_quantize", op("dequantize", "q", name="dq"))

    def check(self, m: Match) -> str | None:
        if m.root.attrs["out_dtype"] not in ("i8", "i16"):
            return f"the head reads {m.root.attrs['out_dtype']} codes, not i8/i16"
        t = m["q"].type
        if t.dtype not in (DType.u8, DType.i8):
            return f"{m['q'].name} is {t.dtype}, not u8/i8"
        if not isinstance(t.quant, AffineQuant) or t.quant.axis is not None:
            return f"{m['q'].name} is not per-tensor affine"
        return None

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        a = m.root.attrs
        rw.replace(m.root, rw.create("fx_bridge", [m["q"]], {
            "out_frac_bits": a["out_frac_bits"], "out_dtype": a["out_dtype"]}))


class FoldTransposeIntoBridge(RewritePattern):
    """transpose(fx_bridge(q)) -> fx_bridge(q) with the permutations composed."""

    name = "fold-transpose-into-bridge"
    pattern = op("transpose", op("fx_bridge", "q", name="bridge"))

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        bridge = m["bridge"]
        inner = tuple(bridge.attrs["perm"]) or tuple(range(m["q"].type.rank))
        perm = [inner[p] for p in m.root.attrs["perm"]]
        rw.replace(m.root, rw.create("fx_bridge", [m["q"]], {**bridge.attrs, "perm": perm}))


class InsertBridges(PatternPass):
    """Replace dequantize -> data movement -> fx_quantize between onnxruntime's affine codes
    and fixed-point values by fx_bridge. Options: ``enable`` / ``disable``,
    ``max_rewrites``."""

    name = "insert-bridges"
    description = "affine INT8 -> fixed point hand-over as fx_bridge (requantize + transpose)"
    patterns = (HoistQuantize, BridgeDequantize, FoldTransposeIntoBridge)
    semantics_preserving = False
