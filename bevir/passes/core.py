"""Passes, textual pipelines, the instrument interface and reproducer text.

A pass is a small class: a dataclass whose fields are its typed options. Defining a
subclass with a ``name`` registers it for pipelines (``@dataclass`` is applied for you)::

    class FoldThings(Pass):
        name = "fold-things"
        description = "Fold the things"
        preserves = (Liveness,)          # analyses still valid after it changed the graph

        limit: int = 16                  # an option: fold-things{limit=32}
        aggressive: bool = False

        def run(self, graph, am):
            ...
            self.stat("folded")          # a statistic, reported per pass

A pipeline is text: ``canonicalize,cse,dce`` or ``fold-things{limit=32, aggressive=true}``;
:func:`parse_pipeline` reads it and ``str(pass)`` / :func:`pipeline_text` print it back.
:class:`~bevir.passes.manager.PassManager` runs a pipeline with instruments (timing, IR
dumps, verification, statistics, crash reproducers; see ``instruments.py``) and an
analysis cache.
"""
from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from typing import Any, ClassVar

from ..errors import BevirError, PassError
from ..ir.graph import Graph
from .analysis import AnalysisManager

_PASSES: dict[str, type[Pass]] = {}
_OPTION_TYPES = {"int": int, "float": float, "bool": bool, "str": str}


def _hw_config():
    from ..target.hw import HWConfig
    return HWConfig


#: option types beyond the scalars: a class with ``from_option(text)`` and ``option_text()``
#: (the text a pipeline prints back); such an option defaults to None (not given)
_RICH_OPTION_TYPES = {"HWConfig | None": _hw_config}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_BARE_VALUE = re.compile(r'[^,{}=\s"]+')


@dataclasses.dataclass
class Pass:
    """Base of passes; see the module docstring.

    Class attributes: ``name`` (the pipeline name; defining it registers the class),
    ``description`` (one line) and ``preserves`` (analysis classes that stay valid when the
    pass changes the graph; every other cached analysis is dropped). Dataclass fields are
    the options: ``int``, ``float``, ``bool`` or ``str``, with defaults, or ``HWConfig |
    None = None`` (a hardware config: a preset, a vendor string or JSON in the text).

    Numerics, as :class:`~bevir.passes.instruments.VerifyNumerics` checks them against the
    golden interpreter: ``semantics_preserving`` (default True) says the graph computes
    the same after the pass; a pass that means to change results (quantization) sets it
    False and is not checked. ``tolerance`` (default 0.0) bounds the change a preserving
    pass may make to a float output, relative to that output's magnitude: at most
    ``tolerance * max|output|`` per element (e.g. a reassociating fusion). Integer and
    boolean outputs, and every output of a quantized graph, must stay bit-identical
    whatever the tolerance. A pass made of parts with their own claims (patterns) says,
    after a run, what that run claims (:meth:`claimed_tolerance`) and which part must be
    checked alone (:meth:`exact_part`).
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    preserves: ClassVar[tuple[type, ...]] = ()
    semantics_preserving: ClassVar[bool] = True
    tolerance: ClassVar[float] = 0.0

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        dataclasses.dataclass(cls)      # the options are fields, with or without @dataclass
        for f in dataclasses.fields(cls):
            _option_type(cls, f)        # unsupported option types fail at definition
        if "name" in cls.__dict__:
            old = _PASSES.get(cls.name)
            if old is not None and (old.__module__, old.__qualname__) != (cls.__module__,
                                                                          cls.__qualname__):
                raise PassError(f"pass '{cls.name}' is defined twice "
                                f"({old.__module__}.{old.__qualname__} and "
                                f"{cls.__module__}.{cls.__qualname__})")
            _PASSES[cls.name] = cls

    def __post_init__(self):
        for f in dataclasses.fields(self):
            t = _option_type(type(self), f)
            setattr(self, f.name, _check_option(self, f.name, t, getattr(self, f.name)))

    @property
    def claimed_tolerance(self) -> float:
        """The tolerance the last run claims (a pass of patterns: its loosest pattern that
        rewrote something); by default ``tolerance``."""
        return self.tolerance

    def exact_part(self) -> Pass | None:
        """After a run that mixed rewrites claiming bit-identity with looser ones: a copy of
        the pass running only the exact ones, which VerifyNumerics checks on their own (so
        a loose rewrite beside them cannot hide their error); else None."""
        return None

    # ---- to be defined by passes -------------------------------------------------------
    def run(self, graph: Graph, am: AnalysisManager) -> None:
        """Rewrite ``graph`` in place. ``am.get(Analysis)`` gives cached analyses."""
        raise NotImplementedError(f"pass '{self.name}' does not define run()")

    # ---- statistics --------------------------------------------------------------------
    def stat(self, counter: str, n: int = 1) -> None:
        """Add ``n`` to the statistic ``counter`` of this pass's current run."""
        stats = self.__dict__.setdefault("_stats", {})
        stats[counter] = stats.get(counter, 0) + n

    @property
    def statistics(self) -> dict[str, int]:
        """The counters of the last run (reset when the pass manager starts the pass)."""
        return dict(self.__dict__.get("_stats", {}))

    def reset_statistics(self) -> None:
        self.__dict__["_stats"] = {}

    # ---- text --------------------------------------------------------------------------
    @classmethod
    def options(cls) -> dict[str, tuple[type, Any]]:
        """Option name -> (type, default); the default is ``dataclasses.MISSING`` if required."""
        return {f.name: (_option_type(cls, f), f.default) for f in dataclasses.fields(cls)}

    def __str__(self) -> str:
        """The canonical pipeline text: the name, then the options that differ from their
        defaults, e.g. ``canonicalize{fold_limit=16}``."""
        items = [f"{f.name}={_fmt_option(getattr(self, f.name))}" for f in dataclasses.fields(self)
                 if f.default is dataclasses.MISSING or getattr(self, f.name) != f.default]
        return self.name + ("{" + ",".join(items) + "}" if items else "")


def _option_type(cls: type, f: dataclasses.Field) -> type:
    if f.type in _RICH_OPTION_TYPES:
        if f.default is not None:
            raise TypeError(f"pass {cls.__qualname__}: option '{f.name}' must default to None")
        return _RICH_OPTION_TYPES[f.type]()
    t = _OPTION_TYPES.get(f.type, f.type) if isinstance(f.type, str) else f.type
    if t not in (int, float, bool, str):
        raise TypeError(f"pass {cls.__qualname__}: option '{f.name}' has type {f.type!r}; "
                        "options are int, float, bool, str or HWConfig | None")
    return t


def _rich(t: type) -> bool:
    return hasattr(t, "from_option")


def _check_option(p: Pass | type, key: str, t: type, value: Any) -> Any:
    name = getattr(p, "name", type(p).__name__)
    if _rich(t):
        if value is None or isinstance(value, t):
            return value
        if isinstance(value, str):             # a preset, a vendor string, JSON
            try:
                return t.from_option(value)
            except BevirError as e:
                raise PassError(f"pass '{name}': option '{key}': {e.message}") from None
        raise PassError(f"pass '{name}': option '{key}' must be {t.__name__}, got {value!r}")
    ok = (isinstance(value, bool) if t is bool else
          isinstance(value, int) and not isinstance(value, bool) if t is int else
          isinstance(value, (int, float)) and not isinstance(value, bool) if t is float else
          isinstance(value, str))
    if not ok:
        raise PassError(f"pass '{name}': option '{key}' must be {t.__name__}, got {value!r}")
    return float(value) if t is float else value


def _parse_option(cls: type[Pass], key: str, text: str) -> Any:
    opts = cls.options()
    if key not in opts and key.replace("-", "_") in opts:
        key = key.replace("-", "_")
    if key not in opts:
        known = ", ".join(opts) or "none"
        raise PassError(f"pass '{cls.name}' has no option '{key}' (options: {known})")
    t = opts[key][0]
    try:
        if t is bool:
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            value = text.lower() in ("true", "1")
        elif t is int:
            value = int(text, 0)
        elif t is float:
            value = float(text)
        else:
            value = text          # rich types are read by _check_option
    except ValueError:
        raise PassError(f"pass '{cls.name}': option '{key}' must be {t.__name__}, "
                        f"got '{text}'") from None
    return key, value


def _fmt_option(v: Any) -> str:
    if hasattr(v, "option_text"):
        v = v.option_text()
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return v if _BARE_VALUE.fullmatch(v) else json.dumps(v)


# ---- registry ----------------------------------------------------------------------------
def get_pass(name: str) -> type[Pass]:
    """The pass class registered as ``name``; PassError listing the known passes if none."""
    try:
        return _PASSES[name]
    except KeyError:
        raise PassError(f"unknown pass '{name}'; known passes: "
                        f"{', '.join(sorted(_PASSES))}") from None


def all_passes() -> dict[str, type[Pass]]:
    """Every registered pass class, by name."""
    return dict(sorted(_PASSES.items()))


# ---- pipeline text -----------------------------------------------------------------------
class _PipelineReader:
    def __init__(self, text: str):
        self.text, self.pos = text, 0

    def error(self, message: str) -> PassError:
        return PassError(f"pipeline '{self.text}': col {self.pos + 1}: {message}")

    def ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def accept(self, lit: str) -> bool:
        self.ws()
        if self.text.startswith(lit, self.pos):
            self.pos += len(lit)
            return True
        return False

    def match(self, pattern: re.Pattern, what: str) -> str:
        self.ws()
        m = pattern.match(self.text, self.pos)
        if not m:
            found = self.text[self.pos:self.pos + 10] or "end of text"
            raise self.error(f"expected {what}, found '{found}'")
        self.pos = m.end()
        return m.group(0)

    def value(self) -> str:
        self.ws()
        if self.text.startswith('"', self.pos):
            m = re.compile(r'"(?:[^"\\]|\\.)*"').match(self.text, self.pos)
            if not m:
                raise self.error("unterminated string")
            self.pos = m.end()
            return json.loads(m.group(0))
        return self.match(_BARE_VALUE, "an option value")

    def pass_(self) -> Pass:
        cls = get_pass(self.match(_NAME, "a pass name"))
        kwargs: dict[str, Any] = {}
        if self.accept("{"):
            while not self.accept("}"):
                if kwargs:
                    self.accept(",")        # options are separated by commas or spaces
                key = self.match(_NAME, "an option name")
                if not self.accept("="):
                    raise self.error(f"expected '=' after option '{key}'")
                key, value = _parse_option(cls, key, self.value())
                if key in kwargs:
                    raise PassError(f"pass '{cls.name}': option '{key}' given twice")
                kwargs[key] = value
                self.ws()
                if self.pos >= len(self.text):
                    raise self.error(f"expected '}}' closing the options of '{cls.name}'")
        return make_pass(cls, **kwargs)

    def pipeline(self) -> list[Pass]:
        passes: list[Pass] = []
        self.ws()
        if self.pos == len(self.text):
            return passes
        passes.append(self.pass_())
        while self.accept(","):
            passes.append(self.pass_())
        self.ws()
        if self.pos != len(self.text):
            raise self.error(f"expected ',' or end of pipeline, found '{self.text[self.pos:]}'")
        return passes


def make_pass(cls: type[Pass] | str, **options) -> Pass:
    """Instantiate a pass (a class or a registered name); bad options raise PassError."""
    cls = get_pass(cls) if isinstance(cls, str) else cls
    try:
        return cls(**options)
    except TypeError as e:      # a missing required option or an unknown keyword
        raise PassError(f"pass '{cls.name}': {e}") from None


def parse_pipeline(text: str) -> list[Pass]:
    """Read ``name{opt=value,...},name,...`` into pass instances."""
    return _PipelineReader(text).pipeline()


def pipeline_text(passes: Sequence[Pass]) -> str:
    """The canonical text of a pipeline; :func:`parse_pipeline` reads it back."""
    return ",".join(str(p) for p in passes)


# ---- instrumentation ---------------------------------------------------------------------
class Instrument:
    """Hooks the pass manager calls around the pipeline and each pass. Override any.

    Set ``wants_ir_before = True`` to receive the IR text before a failing pass in
    :meth:`on_failure` (the manager then snapshots the graph before every pass).
    """

    wants_ir_before: ClassVar[bool] = False

    def before_pipeline(self, graph: Graph) -> None: ...

    def after_pipeline(self, graph: Graph) -> None: ...

    def before_pass(self, pass_: Pass, graph: Graph) -> None: ...

    def after_pass(self, pass_: Pass, graph: Graph, changed: bool) -> None: ...

    def on_failure(self, pass_: Pass, graph_before_text: str, error: BevirError) -> None: ...

    def on_failure_graph(self, pass_: Pass, graph_before: Graph | None,
                         error: BevirError) -> None:
        """Called on failure with the graph before the pass (None unless an instrument
        ``wants_ir_before``); by default prints it with constants inline for
        :meth:`on_failure`. Override to write it another way (e.g. constants beside it)."""
        from ..ir.printer import print_graph
        text = print_graph(graph_before, constants="inline") if graph_before is not None else ""
        self.on_failure(pass_, text, error)


# ---- reproducers -------------------------------------------------------------------------
REPRODUCER_TAG = "// bevir-reproducer:"


def reproducer_text(pass_: Pass, graph_before_text: str, error: BevirError | None = None) -> str:
    """A standalone reproducer: the failing pass's pipeline, then the IR before it."""
    lines = [f"{REPRODUCER_TAG} pipeline={json.dumps(str(pass_))}"]
    if error is not None:
        lines.append("// error: " + " ".join(str(error).split("\n")))
    return "\n".join(lines) + "\n" + graph_before_text
