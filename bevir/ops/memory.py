"""Memory movement ops of the target: ``dma_copy`` (written by the plan-memory pass).

A DMA moves a tensor between DDR and the on-chip memory (OCM); the values are unchanged,
so for the golden model it is the identity and a planned graph computes bit for bit what
the unplanned one did.
"""
from __future__ import annotations

from ..ir.opdef import OpDef, Str

MEMORIES = ("ddr", "ocm")


class DmaCopy(OpDef):
    """Copy ``x`` from memory ``src`` to memory ``dst`` (identity on the values)."""

    name = "dma_copy"
    #: a transfer the plan placed on purpose: never folded, merged or removed
    pure = False
    moves_data = True
    values_unchanged = True
    operands = ("x",)
    attrs = {"src": Str(choices=MEMORIES), "dst": Str(choices=MEMORIES)}

    def infer(self, c, x):
        return x

    def compute(self, c, x):
        return x

    def tvm_lowering(self, c, L, x):
        return L.compute(c.out_types[0], lambda *i: x[i])
