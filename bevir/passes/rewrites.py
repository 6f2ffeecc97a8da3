"""The rewrite budget: every rewriting driver asks before each rewrite.

Drivers (pattern rewriting, canonicalize included; cse, dce, decompose) call
:func:`rewrite_permitted` right before they change the graph for one rewrite; when it says
False they skip that rewrite and try no further ones. Under :func:`limit_rewrites` only the
first ``limit`` rewrites are permitted and each is logged, which lets numeric verification
bisect a pass down to the first rewrite that changed a result::

    with limit_rewrites(3) as log:
        bevir.optimize(graph, "canonicalize")
    print(log.entries[-1])  # rewrite #3 fold-constants on node %y (op 'add', loc 'model/add')

Budgets nest: the innermost active one decides and logs. The budget is per context (a
:class:`contextvars.ContextVar`), so threads do not share it. Without an active budget
:func:`rewrite_permitted` returns True at the cost of one context-variable lookup.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from ..errors import PassError
from ..ir.graph import Node, Value


@dataclass(frozen=True)
class RewriteRecord:
    """One permitted rewrite: its 1-based ``index`` within the budget, ``what`` did it
    (a pattern name such as ``fold-constants``, ``cse:merge``, ...) and the node it started
    from (display name ``%x``, op, loc; empty strings when the driver gave no node)."""
    index: int
    what: str
    node: str
    op: str
    loc: str

    def __str__(self) -> str:
        where = [f"op '{self.op}'"] if self.op else []
        if self.loc:
            where.append(f"loc '{self.loc}'")
        on = f" on node {self.node}" if self.node else ""
        detail = f" ({', '.join(where)})" if where else ""
        return f"rewrite #{self.index} {self.what}{on}{detail}"


@dataclass
class RewriteLog:
    """The rewrites permitted under one :func:`limit_rewrites` (``limit`` None: unlimited).

    ``entries`` are the permitted rewrites in order; ``refused`` counts the requests turned
    down because the budget was spent (0 means every rewrite the drivers wanted was done).
    """
    limit: int | None = None
    entries: list[RewriteRecord] = field(default_factory=list)
    refused: int = 0

    @property
    def count(self) -> int:
        """How many rewrites were permitted."""
        return len(self.entries)

    @property
    def spent(self) -> bool:
        """Whether the budget allows no further rewrite."""
        return self.limit is not None and self.count >= self.limit

    def __str__(self) -> str:
        head = f"{self.count} rewrite(s)" + ("" if self.limit is None else f" of {self.limit}")
        return "\n".join([head] + [f"  {e}" for e in self.entries])


_ACTIVE: ContextVar[tuple[RewriteLog, ...]] = ContextVar("bevir_rewrite_budgets", default=())


def rewrite_permitted(what: str, node: Node | Value | None = None) -> bool:
    """True (and the rewrite is logged) if the active budget allows one more rewrite;
    False, when it is spent: the caller must skip this rewrite and try no further ones.
    Always True without an active budget. ``node`` is the node rewritten (or the value,
    for rewrites of constants)."""
    active = _ACTIVE.get()
    if not active:
        return True
    log = active[-1]
    if log.spent:
        log.refused += 1
        return False
    log.entries.append(RewriteRecord(log.count + 1, what, *_where(node)))
    return True


def _where(item: Node | Value | None) -> tuple[str, str, str]:
    """(node display name, op, loc) of what a rewrite starts from."""
    if isinstance(item, Node):
        return item.name, item.op, item.loc
    if isinstance(item, Value):
        return "%" + item.name, "const" if item.is_const else "", ""
    return "", "", ""


@contextmanager
def limit_rewrites(limit: int | None) -> Iterator[RewriteLog]:
    """Permit at most ``limit`` rewrites (None: any number, just logging) inside the block;
    yields the :class:`RewriteLog`."""
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise PassError(f"limit_rewrites: limit must be None or an int >= 0, got {limit!r}")
    log = RewriteLog(limit)
    token = _ACTIVE.set(_ACTIVE.get() + (log,))
    try:
        yield log
    finally:
        _ACTIVE.reset(token)
