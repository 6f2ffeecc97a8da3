"""A graph compiled kernel by kernel: every node that touches an integer tensor run by its
generated kernel, built for TVM's llvm target (the host build) or its C target (C sources
built by the system C compiler into libraries that need only libc); float-only nodes (the
pre- and post-processing) by the golden model, with the interpreter as the scheduler. And
the check that compares each generated kernel with its golden op on the same operands.

    program = bevir.codegen.Program(graph, target="llvm")   # one kernel per signature
    outputs = program.run(inputs)
    report = program.check(inputs)       # the first node whose kernel differs, by provenance
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..errors import CodegenError
from ..ir.graph import Graph, Node
from ..sim.interpreter import Interpreter
from .build import CKernel, HostKernel, build_host
from ..target.schedule import lowerable
from .lower import kernel_defs
from .micro import available as micro_available


@dataclass
class Mismatch:
    """The first node whose generated results differ from the golden op's on the same
    operands: where, how many elements, the first differing index and both values there."""

    node: str
    op: str
    loc: str
    differing: int
    index: tuple
    generated: object
    golden: object

    def __str__(self) -> str:
        return (f"op '{self.op}' node {self.node} from '{self.loc}': {self.differing} elements "
                f"differ, first at {list(self.index)}: generated {self.generated}, golden "
                f"{self.golden}")


@dataclass
class CheckReport:
    """What :meth:`Program.check` found: nodes checked and the first mismatch."""

    checked: int = 0
    mismatch: Mismatch | None = None
    outputs: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.mismatch is None


TARGETS = ("llvm", "c")


class Program:
    """A graph compiled for ``target`` ("llvm" or "c"): one kernel per distinct signature
    (op, attributes, types); raises CodegenError naming the node for an integer op
    without a lowering. ``micro``: whether the host build's kernels call the micro-kernels
    of :mod:`bevir.codegen.micro` (None: where this processor has their instructions);
    the results are the same bits either way. The host build runs no kernel for the ops
    whose results are their operands (``OpDef.values_unchanged``: DMA transfers, barriers)."""

    def __init__(self, graph: Graph, target: str = "llvm", micro: bool | None = None):
        if target not in TARGETS:
            raise CodegenError(f"unknown target '{target}': one of {', '.join(TARGETS)}")
        if micro and target != "llvm":
            raise CodegenError("micro-kernels are for the host build (target 'llvm')")
        self.graph, self.target = graph, target
        self.micro = target == "llvm" and (micro_available() if micro is None else micro)
        self.kernels: dict[str, HostKernel | CKernel] = {}
        # one memory and one thread: transfers and barriers pass their operands on
        run = [n for n in graph.nodes if lowerable(n)
               and not (target == "llvm" and n.opdef.values_unchanged)]
        defs, self.node_kernel = kernel_defs(run, self.micro)
        if target == "llvm":
            built = build_host([kd for kd, _ in defs.values()], self.micro)
            self.kernels = {sig: built[kd.name] for sig, (kd, _) in defs.items()}
        else:
            self.kernels = {sig: CKernel(kd, [v.type for v in n.inputs if v is not None],
                                         [v.type for v in n.outputs])
                            for sig, (kd, n) in defs.items()}

    def _kernel(self, node: Node, args: list) -> list[np.ndarray]:
        k = self.kernels[self.node_kernel[node.name]]
        return k([a for a in args if a is not None], [v.type for v in node.outputs])

    def interpreter(self) -> Interpreter:
        return Interpreter(self.graph, node_kernels={n: self._kernel for n in self.node_kernel})

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The graph's outputs, lowered nodes computed by their kernels."""
        return self.interpreter().run(inputs)

    def check(self, inputs: Mapping[str, np.ndarray]) -> CheckReport:
        """Run the graph on the golden model and, beside every lowered node, its kernel on
        the same operands; the first node (in graph order) whose results differ is reported
        by provenance."""
        report = CheckReport()

        def compare(node, args, results):
            if report.mismatch is not None or node.name not in self.node_kernel:
                return None
            report.checked += 1
            for got, want in zip(self._kernel(node, list(args)), results):
                diff = got != want
                if diff.any():
                    first = tuple(int(i) for i in np.argwhere(diff)[0])
                    report.mismatch = Mismatch(node.name, node.op, node.loc,
                                               int(diff.sum()), first, got[first], want[first])
                    break
            return None
        report.outputs = Interpreter(self.graph, on_node_end=compare).run(inputs)
        return report
