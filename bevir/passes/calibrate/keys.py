"""What every part of calibration shares: its error, a value's stable key (:class:`ValueKey`)
and the values calibration can know."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ...errors import BevirError
from ...ir.graph import Graph, Value


class CalibrationError(BevirError):
    """Calibration was asked something impossible: an unknown method, missing inputs,
    a corrupt ranges file, a value without a range."""


def provenance(value: Value) -> dict[str, str | None]:
    """The node/op/loc of a value's producer, for error messages."""
    p = value.producer
    if p is None:
        return dict(node="%" + value.name)
    return dict(node=p.name, op=p.op, loc=p.loc or None)


def calibratable_values(graph: Graph) -> Iterator[Value]:
    """The values calibration can know: graph inputs and node results."""
    yield from graph.inputs
    for n in graph.nodes:
        yield from n.outputs


@dataclass(frozen=True)
class ValueKey:
    """A value's stable identity: its name, its producer's provenance and result index.

    Graph inputs have ``loc == ""`` and ``index == 0``; so have entries seeded by name only
    (tranges, onnxruntime) until :meth:`Ranges.rekey` fills them in from a graph.
    """

    name: str
    loc: str = ""
    index: int = 0

    @classmethod
    def of(cls, value: Value) -> ValueKey:
        p = value.producer
        if p is None:
            return cls(value.name)
        return cls(value.name, p.loc, next(i for i, o in enumerate(p.outputs) if o is value))

    def __str__(self) -> str:
        return f"%{self.name}" + (f" from '{self.loc}'#{self.index}" if self.loc else "")
