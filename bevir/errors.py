"""The error hierarchy. Every error bevir raises on bad input derives from BevirError."""
from __future__ import annotations


class BevirError(Exception):
    """Base of all bevir errors.

    ``node``, ``op`` and ``loc`` (the provenance: ONNX node name or torch module path) say
    where the problem is, so that a message speaks in the user's names.
    """

    def __init__(self, message: str, *, node: str | None = None, op: str | None = None,
                 loc: str | None = None):
        self.message, self.node, self.op, self.loc = message, node, op, loc
        super().__init__(self._format())

    def _format(self) -> str:
        where = []
        if self.op:
            where.append(f"op '{self.op}'")
        if self.node:
            where.append(f"node {self.node}")
        if self.loc:
            where.append(f"from '{self.loc}'")
        return f"{' '.join(where)}: {self.message}" if where else self.message


class ParseError(BevirError):
    """The IR text is malformed; ``line`` and ``col`` are 1-based."""

    def __init__(self, message: str, line: int, col: int, source: str = "<text>"):
        self.line, self.col, self.source = line, col, source
        super().__init__(f"{source}:{line}:{col}: {message}")


class VerifyError(BevirError):
    """The graph breaks an IR invariant."""


class AttrError(BevirError):
    """An attribute is missing, unknown or of the wrong type."""


class UnsupportedError(BevirError):
    """A frontend met an op, attribute or opset bevir does not support."""


class InterpreterError(BevirError):
    """An op failed while the golden interpreter ran it."""


class PassError(BevirError):
    """A pass failed, or a pipeline is malformed."""


class CodegenError(BevirError):
    """Code generation failed: an op without a lowering, a lowering, build or run error."""



def raised_at(error: BaseException, *sources: str) -> str:
    """`` (at FILE:LINE)``: the innermost frame of ``error``'s traceback in one of the
    ``sources`` (files, or folders holding them: a user's plugin, pass or op), so that an
    error from a user's code says where in it; ``""`` when none of its frames is there."""
    import os
    import traceback
    roots = [os.path.abspath(s) for s in sources if s]
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if any(os.path.abspath(f.filename) == r or
                     os.path.abspath(f.filename).startswith(r + os.sep) for r in roots)]
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def source_of(obj: object) -> str:
    """The file that defines ``obj``'s class (or ``obj``, a class), or ``""``."""
    import inspect
    try:
        return inspect.getsourcefile(obj if isinstance(obj, type) else type(obj)) or ""
    except TypeError:           # a built-in
        return ""
