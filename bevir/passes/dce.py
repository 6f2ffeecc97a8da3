"""dce: remove pure nodes and constants that do not contribute to the graph outputs."""
from __future__ import annotations

from ..ir.graph import Graph
from .analysis import AnalysisManager, Liveness
from .core import Pass
from .rewrites import rewrite_permitted


class DCE(Pass):
    """Dead code elimination: erase pure nodes whose results reach no graph output and no
    node with effects (transitively), then unused constants. Graph inputs stay. Each
    erase asks the rewrite budget (``dce:erase``); a refusal ends the pass."""

    name = "dce"
    description = "remove pure nodes and constants that reach no output"

    def run(self, graph: Graph, am: AnalysisManager) -> None:
        live = am.get(Liveness)
        for node in reversed(live.dead_nodes):
            if not rewrite_permitted("dce:erase", node):
                return
            graph.erase(node)
            self.stat("removed")
        for v in live.dead_constants:
            if not rewrite_permitted("dce:erase", v):
                return
            graph.erase_const(v)
            self.stat("removed")
