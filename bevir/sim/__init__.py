"""Execution: the golden interpreter, per-layer comparison of two runs and 3D-detection
decoding (the GPNPU performance model is :mod:`bevir.target.cycles`)."""
from .interpreter import Interpreter, run  # noqa: F401
