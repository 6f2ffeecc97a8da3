"""Execution: the golden interpreter (and, later, the GPNPU performance model)."""
from .interpreter import Interpreter, run  # noqa: F401
