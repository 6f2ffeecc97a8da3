"""Calibration: activation ranges for INT8 quantization, measured with the golden model.

    import bevir
    ranges = bevir.calibrate(graph, samples, method="mse")   # one input dict, or many
    lo, hi = ranges.range(value)                              # a Value, a name or a ValueKey
    ranges.save("ranges.json")                                # + ranges.safetensors

The pieces, by module:

- :mod:`.keys`: :class:`ValueKey`, a value's key: its name, the provenance (``loc``) of
  the node producing it and which result of that node it is; :class:`CalibrationError`.
- :mod:`.histogram`, :mod:`.tensor_range`: :class:`Histogram`, :class:`TensorRange`:
  what calibration knows about one value.
- :mod:`.methods`: :class:`RangeMethod`: statistics -> range: ``minmax``,
  ``percentile``, ``mse``, ``entropy``.
- :mod:`.result`: :class:`Ranges`, the result. Lookup in a rewritten graph (see
  :meth:`Ranges.resolve`): by name when the provenance agrees; else by provenance
  (entries whose name no value of the graph holds any more, paired by op, then from the
  last backwards: the last value a module produces is the one that leaves it); else by
  name alone.
- :mod:`.calibrator`: :class:`Selector`, :class:`Calibrator`,
  :class:`CalibrationObserver`: calibration points on chosen values; statistics are
  streamed node by node while the interpreter runs, so activations are never kept.
- :mod:`.files`: ranges files; seeding: :meth:`Ranges.from_tranges` (``bevir-tranges``
  files) and :meth:`Ranges.from_onnxruntime` (onnxruntime's ``TensorsData``);
  calibration inputs (:func:`load_inputs`).
- :mod:`.integration`: :func:`calibrate`, the :class:`AttachedRanges` analysis and the
  ``calibrate`` pass (:class:`Calibrate`). Ranges attached to a graph
  (:meth:`Ranges.attach`) are what ``am.get(AttachedRanges)`` resolves for later passes.
  They are the graph's meta entry ``"ranges"`` (a registered key): clones, composed graphs
  and saved graphs carry them.
"""
from ...progress import Progress  # noqa: F401  (bevir.flows.backbone imports it from here)
from .calibrator import Axis, CalibrationObserver, Calibrator, Feed, Selector, channel_axis
from .files import FORMAT, TRANGES_FORMAT, TRANGES_VERSION, VERSION, load_inputs
from .histogram import Histogram
from .integration import AttachedRanges, Calibrate, calibrate
from .keys import CalibrationError, ValueKey
from .methods import METHODS, RangeMethod, entropy_threshold, mse_threshold
from .result import META_KEY, Ranges, ranges_of
from .tensor_range import TensorRange

__all__ = ["Axis", "CalibrationObserver", "Calibrator", "Feed", "Selector", "channel_axis",
           "FORMAT", "TRANGES_FORMAT", "TRANGES_VERSION", "VERSION", "load_inputs",
           "Histogram", "Calibrate", "AttachedRanges", "calibrate", "CalibrationError",
           "ValueKey", "METHODS", "RangeMethod", "entropy_threshold", "mse_threshold",
           "META_KEY", "Ranges", "ranges_of", "TensorRange"]
