"""Einsum as transposes, reshapes, reductions and one batched matmul: shared by the ONNX
and torch frontends (each passes its own ``emit``).

Supported: one or two operands, explicit or implicit output, ``...`` broadcasting
dimensions (the same count in every operand), no index repeated within one operand.
"""
from __future__ import annotations

import math
import string
from collections.abc import Callable, Sequence

from ..errors import UnsupportedError
from ..ir.graph import Value

#: emit(op, inputs, attrs) -> the node's result
Emit = Callable[[str, Sequence[Value], dict], Value]


def parse_equation(equation: str, ranks: Sequence[int]) -> tuple[list[str], str]:
    """The operands' index strings and the output's, ``...`` replaced by fresh letters."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise UnsupportedError(f"einsum '{equation}': {len(terms)} terms for {len(ranks)} "
                               "operands")
    used = set(eq) - set(".,->")
    spare = [ch for ch in string.ascii_letters if ch not in used]
    n_ell = {r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t}
    if len(n_ell) > 1:
        raise UnsupportedError(f"einsum '{equation}': '...' stands for different ranks")
    ell = "".join(spare[:n_ell.pop()]) if n_ell else ""
    terms = [t.replace("...", ell) for t in terms]
    for t, r in zip(terms, ranks):
        if len(t) != r or len(set(t)) != len(t):
            raise UnsupportedError(f"einsum '{equation}': term '{t}' for an operand of rank "
                                   f"{r} (repeated indices are not supported)")
    if arrow:
        out = rhs.replace("...", ell)
    else:
        counts = {ch: sum(t.count(ch) for t in terms) for ch in set("".join(terms))}
        out = ell + "".join(sorted(ch for ch, k in counts.items() if k == 1 and ch not in ell))
    return terms, out


def _permute(emit: Emit, x: Value, have: str, want: str) -> Value:
    if have == want:
        return x
    return emit("transpose", [x], {"perm": tuple(have.index(ch) for ch in want)})


def _sum_out(emit: Emit, x: Value, term: str, keep: set[str]) -> tuple[Value, str]:
    """Sum away the indices of ``term`` that appear nowhere in ``keep``."""
    axes = tuple(i for i, ch in enumerate(term) if ch not in keep)
    if not axes:
        return x, term
    return (emit("reduce_sum", [x], {"axes": axes, "keepdims": False}),
            "".join(ch for ch in term if ch in keep))


def einsum(emit: Emit, equation: str, operands: Sequence[Value]) -> Value:
    """``numpy.einsum(equation, *operands)`` built from registry ops with ``emit``."""
    terms, out = parse_equation(equation, [v.type.rank for v in operands])
    if len(operands) == 1:
        x, t = _sum_out(emit, operands[0], terms[0], set(out))
        return _permute(emit, x, t, out)
    if len(operands) != 2:
        raise UnsupportedError(f"einsum '{equation}': {len(operands)} operands (1 or 2 "
                               "supported)")
    (a, ta), (b, tb) = [_sum_out(emit, v, t, set(out) | set(other))
                        for v, t, other in zip(operands, terms, terms[::-1])]
    size = {ch: d for v, t in ((a, ta), (b, tb)) for ch, d in zip(t, v.type.shape)}
    for v, t in ((a, ta), (b, tb)):
        for ch, d in zip(t, v.type.shape):
            if d != size[ch]:
                raise UnsupportedError(f"einsum '{equation}': index '{ch}' has sizes "
                                       f"{d} and {size[ch]} (broadcasting is not supported)")
    batch = "".join(ch for ch in out if ch in ta and ch in tb)
    left = "".join(ch for ch in out if ch in ta and ch not in tb)
    right = "".join(ch for ch in out if ch in tb and ch not in ta)
    inner = "".join(ch for ch in ta if ch in tb and ch not in out)

    def dims(chars: str) -> int:
        return math.prod(size[ch] for ch in chars)
    a3 = _permute(emit, a, ta, batch + left + inner)
    b3 = _permute(emit, b, tb, batch + inner + right)
    a3 = emit("reshape", [a3], {"shape": (dims(batch), dims(left), dims(inner))})
    b3 = emit("reshape", [b3], {"shape": (dims(batch), dims(inner), dims(right))})
    y = emit("matmul", [a3, b3], {})
    have = batch + left + right
    y = emit("reshape", [y], {"shape": tuple(size[ch] for ch in have)})
    return _permute(emit, y, have, out)
