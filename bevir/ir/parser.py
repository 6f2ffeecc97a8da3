"""The text format's parser: a small recursive-descent reader of what printer.py writes.

Errors raise :class:`bevir.ParseError` with the 1-based line and column.
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import BevirError, ParseError
from .graph import Graph, Value
from .limits import tensor_too_big
from .types import AffineQuant, DType, FixedPointQuant, Layout, TensorType

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPNAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_BARE = re.compile(r"[A-Za-z0-9_.$-]+")
_NUMBER = re.compile(r"[-+]?(?:inf|nan|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_WS = re.compile(r"(?:\s|//[^\n]*)*")
_DIMS = re.compile(r"((?:\d+x)*)([a-z][a-z0-9]*)")
#: the deepest an attribute value's lists may nest
MAX_NESTING = 32


class _Reader:
    def __init__(self, text: str, source: str):
        self.text, self.source, self.pos = text, source, 0

    # ---- positions and errors ----------------------------------------------------------
    def error(self, message: str, pos: int | None = None) -> ParseError:
        pos = self.pos if pos is None else pos
        line = self.text.count("\n", 0, pos) + 1
        col = pos - (self.text.rfind("\n", 0, pos) + 1) + 1
        return ParseError(message, line, col, self.source)

    def ws(self) -> None:
        self.pos = _WS.match(self.text, self.pos).end()

    def peek(self, lit: str) -> bool:
        self.ws()
        return self.text.startswith(lit, self.pos)

    def accept(self, lit: str) -> bool:
        if self.peek(lit):
            self.pos += len(lit)
            return True
        return False

    def expect(self, lit: str) -> None:
        if not self.accept(lit):
            got = self.text[self.pos:self.pos + 12].split("\n")[0] or "end of text"
            raise self.error(f"expected '{lit}', found '{got}'")

    def match(self, pattern: re.Pattern, what: str) -> str:
        self.ws()
        m = pattern.match(self.text, self.pos)
        if not m:
            raise self.error(f"expected {what}")
        self.pos = m.end()
        return m.group(0)

    # ---- tokens ------------------------------------------------------------------------
    def ident(self) -> str:
        return self.match(_IDENT, "an identifier")

    def string(self) -> str:
        start = self.pos
        token = self.match(_STRING, "a string")
        try:
            return json.loads(token)
        except json.JSONDecodeError as e:   # e.g. a raw control character inside the quotes
            raise self.error(f"malformed string: {e.msg}", start + e.pos) from None

    def name(self, sigil: str) -> str:
        self.expect(sigil)
        if self.text.startswith('"', self.pos):
            return self.string()
        return self.match(_BARE, "a name")

    def number(self) -> int | float:
        tok = self.match(_NUMBER, "a number")
        return float(tok) if any(c in tok for c in ".eEn") else int(tok)

    def comma_list(self, item, close: str) -> list:
        items = []
        if not self.accept(close):
            items.append(item())
            while self.accept(","):
                items.append(item())
            self.expect(close)
        return items

    # ---- types -------------------------------------------------------------------------
    def type(self) -> TensorType:
        self.expect("tensor<")
        start = self.pos
        m = _DIMS.match(self.text, self.pos)
        if not m:
            raise self.error("expected dimensions and an element type, e.g. 1x3xf32")
        self.pos = m.end()
        try:
            dtype = DType(m.group(2))
        except ValueError:
            raise self.error(f"unknown element type '{m.group(2)}'", start) from None
        shape = tuple(int(d) for d in m.group(1).split("x")[:-1])
        too_big = tensor_too_big(shape, dtype.np.itemsize)
        if too_big:
            raise self.error(f"tensor type {too_big}", start)
        layout, quant = Layout.plain, None
        while self.accept(","):
            word = self.ident()
            if word in ("affine", "fixed"):
                quant = self.quant(word)
            else:
                try:
                    layout = Layout(word)
                except ValueError:
                    raise self.error(f"unknown layout '{word}'", self.pos - len(word)) from None
        self.expect(">")
        return TensorType(shape, dtype, layout, quant)

    def quant(self, kind: str):
        self.expect("<")
        fields = dict(self.comma_list(self.field, ">"))
        try:
            as_tuple = lambda v: tuple(v) if isinstance(v, list) else (v,)  # noqa: E731
            if kind == "affine":
                return AffineQuant(as_tuple(fields["scale"]), as_tuple(fields["zp"]),
                                   fields.get("axis"))
            return FixedPointQuant(as_tuple(fields["frac_bits"]), fields.get("axis"))
        except KeyError as e:
            raise self.error(f"{kind} quantization needs field {e}") from None

    def field(self) -> tuple[str, Any]:
        key = self.ident()
        self.expect("=")
        return key, self.attr_value()

    # ---- attributes and payloads -------------------------------------------------------
    def attr_value(self, depth: int = 0) -> Any:
        if self.accept("["):
            if depth == MAX_NESTING:
                raise self.error(f"attribute value nested deeper than {MAX_NESTING} lists")
            return self.comma_list(lambda: self.attr_value(depth + 1), "]")
        if self.peek('"'):
            return self.string()
        if self.peek("dense<"):
            return self.dense_typed()
        if self.accept("true"):
            return True
        if self.accept("false"):
            return False
        return self.number()

    def dense_typed(self) -> np.ndarray:
        at = self.pos
        raw = self.dense()
        self.expect(":")
        return self.payload(raw, self.type(), at)

    def dense(self):
        """The raw payload: bytes for hex, a list/scalar for literals, None when elided."""
        self.expect("dense<")
        if self.accept("..."):
            raw = None
        elif self.peek('"'):
            s = self.string()
            if not s.startswith("0x"):
                raise self.error("hex payload must start with 0x")
            try:
                raw = bytes.fromhex(s[2:])
            except ValueError:
                raise self.error("malformed hex payload") from None
        elif self.accept("["):
            raw = self.comma_list(self.scalar, "]")
        else:
            raw = self.scalar()
        self.expect(">")
        return raw

    def scalar(self):
        if self.accept("true"):
            return True
        if self.accept("false"):
            return False
        return self.number()

    def payload(self, raw, t: TensorType, at: int) -> np.ndarray:
        if raw is None:
            raise self.error("constant payload is elided ('dense<...>'); "
                             "print with constants='inline' to parse it", at)
        dt = t.dtype.np
        if isinstance(raw, bytes):
            if len(raw) != t.nbytes:
                raise self.error(f"payload has {len(raw)} bytes, {t} needs {t.nbytes}", at)
            return np.frombuffer(raw, dt.newbyteorder("<")).astype(dt).reshape(t.shape)
        flat = raw if isinstance(raw, list) else [raw]
        if len(flat) != t.numel:
            raise self.error(f"literal has {len(flat)} elements, {t} needs {t.numel}", at)
        src = np.float64 if dt.kind in "fc" else None
        return np.array(flat, src).astype(dt).reshape(t.shape)


class _GraphParser(_Reader):
    def __init__(self, text: str, source: str, external: Mapping[str, np.ndarray] | None):
        super().__init__(text, source)
        self.external = external
        self.graph: Graph | None = None
        self.scope: dict[str, Value] = {}

    def define(self, name: str, value: Value, at: int) -> None:
        if name in self.scope:
            raise self.error(f"value %{name} is defined twice", at)
        self.scope[name] = value

    def use(self) -> Value | None:
        if self.accept("_"):
            return None
        at = self.pos
        name = self.name("%")
        try:
            return self.scope[name]
        except KeyError:
            raise self.error(f"use of undefined value %{name}", at) from None

    def parse(self) -> Graph:
        self.expect("graph")
        g = self.graph = Graph(self.name("@"))
        self.expect("(")

        def arg():
            at = self.pos
            name = self.name("%")
            self.expect(":")
            self.define(name, g.add_input(name, self.type()), at)
        self.comma_list(arg, ")")
        self.expect("{")
        while not self.peek("return"):
            self.statement()
        self.expect("return")
        self.returns()
        self.expect("}")
        self.ws()
        if self.pos != len(self.text):
            raise self.error("unexpected text after the graph")
        return g

    def statement(self) -> None:
        at = self.pos
        names = [self.name("%")]
        while self.accept(","):
            names.append(self.name("%"))
        self.expect("=")
        if self.accept("const"):
            return self.constant(names, at)
        op_at = self.pos
        op = self.match(_OPNAME, "an op name")
        self.expect("(")
        inputs = self.comma_list(self.use, ")")
        attrs = dict(self.comma_list(self.field, "}")) if self.accept("{") else {}
        self.expect(":")
        types = [self.type()]
        while self.accept(","):
            types.append(self.type())
        loc = ""
        if self.accept("loc("):
            loc = self.string()
            self.expect(")")
        if len(types) != len(names):
            raise self.error(f"{len(names)} results but {len(types)} types", at)
        try:
            node = self.graph.create_node(op, inputs, attrs, out_types=types, loc=loc, names=names)
        except BevirError as e:
            raise self.error(e.message, op_at) from None
        for n, v in zip(names, node.outputs):
            self.define(n, v, at)

    def constant(self, names: list[str], at: int) -> None:
        if len(names) != 1:
            raise self.error("a constant defines one value", at)
        name = names[0]
        ext = self.accept("external")
        self.ws()
        dense_at = self.pos
        raw = None if ext else self.dense()
        self.expect(":")
        t = self.type()
        if ext:
            if self.external is None or name not in self.external:
                raise self.error(f"no external payload for constant %{name}", at)
            array = np.asarray(self.external[name])
            if array.size == t.numel and t.rank == 0:
                array = array.reshape(())     # safetensors stores scalars as [1]
            if not t.matches(array):
                raise self.error(f"external payload {array.dtype}{list(array.shape)} does not "
                                 f"match {t}", at)
        else:
            array = self.payload(raw, t, dense_at)
        self.define(name, self.graph.add_const(array, name, t), at)

    def returns(self) -> None:
        def ret():
            at = self.pos
            v = self.use()
            if v is None:
                raise self.error("cannot return an omitted value", at)
            name = self.string() if self.accept("as") else v.name
            if name in self.graph.outputs:
                raise self.error(f"output '{name}' returned twice", at)
            self.graph.set_output(name, v)
        if not self.peek("}"):
            ret()
            while self.accept(","):
                ret()


def parse(text: str, *, external: Mapping[str, np.ndarray] | None = None,
          source: str = "<text>") -> Graph:
    """Read a graph from its text form.

    ``external`` supplies the payloads of constants printed as ``external`` (what
    :func:`bevir.load` passes from the safetensors file).
    """
    return _GraphParser(text, source, external).parse()

