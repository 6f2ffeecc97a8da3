"""The rewrite budget: every rewriting driver asks before each rewrite.

Drivers (canonicalize, cse, dce, pattern rewriting) call :func:`rewrite_permitted` right
before they change the graph for one rewrite. Under :func:`limit_rewrites` only the first
``limit`` rewrites are permitted and each is logged, which lets numeric verification
bisect a pass down to the first rewrite that changed a result.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..ir.graph import Node


@dataclass(frozen=True)
class RewriteRecord:
    """One permitted rewrite: its index, what did it, and the node it started from."""
    index: int
    what: str
    node: str
    op: str
    loc: str

    def __str__(self) -> str:
        where = f" (loc {self.loc})" if self.loc else ""
        return f"rewrite #{self.index} {self.what} on {self.op} %{self.node}{where}"


@dataclass
class RewriteLog:
    """The rewrites permitted under one :func:`limit_rewrites` (None: unlimited)."""
    limit: int | None = None
    entries: list[RewriteRecord] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.entries)


_ACTIVE: list[RewriteLog] = []


def rewrite_permitted(what: str, node: Node | None = None) -> bool:
    """True (and the rewrite is logged) if the active budget allows one more rewrite."""
    if not _ACTIVE:
        return True
    log = _ACTIVE[-1]
    if log.limit is not None and log.count >= log.limit:
        return False
    name = node.outputs[0].name if node is not None and node.outputs else ""
    log.entries.append(RewriteRecord(log.count, what, name, node.op if node else "",
                                     node.loc if node else ""))
    return True


@contextmanager
def limit_rewrites(limit: int | None) -> Iterator[RewriteLog]:
    """Permit at most ``limit`` rewrites (None: any number) inside the block, logging them."""
    log = RewriteLog(limit)
    _ACTIVE.append(log)
    try:
        yield log
    finally:
        _ACTIVE.remove(log)
