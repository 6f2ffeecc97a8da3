"""From a node to a TVM kernel: the toolkit an op's ``tvm_lowering`` builds its compute
with, the kernel signature kernels are deduplicated by, and the PrimFunc of a node.

An op lowers itself (``OpDef.tvm_lowering(self, c, L, *operands)``): ``c`` is the node's
:class:`~bevir.ir.opdef.Ctx`, ``L`` a :class:`Lowering` (te, the integer numerics of
:mod:`bevir.ops.numerics` written as expressions, constants), the operands are te tensors
(None for an omitted optional one). It returns its result tensor(s), of the node's result
shapes and dtypes. The kernel's arguments are the operands, then the constant arrays the
lowering asked for (:meth:`Lowering.const`), then the results.

Ops never import tvm: the toolkit is handed to them, so the op layer stays importable
without it.
"""
from __future__ import annotations

import functools
import hashlib
import re
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import BevirError, CodegenError
from ..extras import require
from ..ir.graph import Node
from ..ir.types import TensorType


def tvm_modules():
    """(tvm, te, tirx), imported on first use (tvm takes a second to import)."""
    return require("tvm"), require("tvm.te"), require("tvm.tirx")


def dtype_name(t: TensorType) -> str:
    """The numpy / TVM name of a tensor type's dtype ('int8', 'float32', ...)."""
    return np.dtype(t.dtype.np).name


def signature(node: Node) -> str:
    """What a node's kernel depends on: op, attributes, operand and result types. Nodes of
    equal signature share one kernel."""
    h = hashlib.sha256()
    h.update(node.op.encode())
    for k, v in sorted(node.attrs.items()):
        h.update(f"|{k}=".encode())
        h.update(v.tobytes() + str(v.dtype).encode() + str(v.shape).encode()
                 if isinstance(v, np.ndarray) else repr(v).encode())
    for v in node.inputs:
        h.update(f"|in {None if v is None else v.type}".encode())
    for v in node.outputs:
        h.update(f"|out {v.type}".encode())
    return h.hexdigest()[:16]


class Lowering:
    """The toolkit an op's lowering builds with (see the module docstring). ``micro``:
    whether the kernel may call the host build's micro-kernels (:mod:`bevir.codegen.micro`)."""

    def __init__(self, micro: bool = False):
        self.tvm, self.te, self.tirx = tvm_modules()
        self.constants: list[tuple[object, np.ndarray]] = []
        self.micro = micro

    # ---- tensors ---------------------------------------------------------------------
    def placeholder(self, t: TensorType, name: str):
        return self.te.placeholder(t.shape, dtype_name(t), name=name)

    def const(self, array: np.ndarray, name: str = "table"):
        """A constant array the kernel reads (a table, per-channel parameters): a kernel
        argument bound to ``array`` whenever the kernel runs."""
        array = np.require(array, requirements="C")
        p = self.te.placeholder(array.shape, str(array.dtype), name=f"{name}{len(self.constants)}")
        self.constants.append((p, array))
        return p

    def compute(self, t: TensorType, fn: Callable, name: str = "y"):
        """te.compute of a result of type ``t``; ``fn(*indices)`` gives its element."""
        dtype = dtype_name(t)
        return self.te.compute(t.shape, lambda *i: self.cast(fn(*i), dtype), name=name)

    def micro_conv(self, c, x, w, x_zero: int):
        """The exact int32 accumulator of an 8-bit convolution (x - x_zero, raw weight
        codes) in the result's layout, computed by a micro-kernel; None where this build
        has none for it."""
        if not self.micro:
            return None
        from .micro import conv_accumulator
        return conv_accumulator(c, self, x, w, x_zero)

    def micro_matmul(self, x, w, shape):
        """The exact int32 accumulator x @ w^T of 8-bit codes (x [..., K] centered at 0,
        w [N, K] raw codes), of result ``shape``, computed by a micro-kernel; None where
        this build has none for it."""
        if not self.micro:
            return None
        from .micro import matmul_accumulator
        return matmul_accumulator(self, x, w, shape)

    # ---- scalar expressions ------------------------------------------------------------
    def cast(self, v, dtype: str):
        return v if getattr(v, "dtype", None) == dtype else self.tirx.Cast(dtype, v)

    def i64(self, v):
        return self.const_or_cast(v, "int64")

    def const_or_cast(self, v, dtype):
        if isinstance(v, (int, np.integer)):
            return self.tirx.const(int(v), dtype)
        if isinstance(v, (float, np.floating)):
            return self.tirx.const(float(v), dtype)
        return self.cast(v, dtype)

    def select(self, cond, a, b):
        return self.tirx.Select(cond, a, b)

    def max(self, a, b):
        return self.tirx.max(a, b)

    def min(self, a, b):
        return self.tirx.min(a, b)

    def saturate(self, v, dtype):
        """Clamp int64 ``v`` to the range of the integer ``dtype`` (a name or numpy dtype)
        and convert (numerics.saturate)."""
        info = np.iinfo(dtype)
        v = self.i64(v)
        return self.cast(self.min(self.max(v, self.i64(info.min)), self.i64(info.max)),
                         np.dtype(dtype).name)

    def rshift_round(self, v, shift):
        """round_half_up(v / 2**shift) of int64 ``v`` (numerics.rshift_round); ``shift`` a
        Python int or an int64 expression (per channel); <= 0 is an exact left shift."""
        v = self.i64(v)
        if isinstance(shift, (int, np.integer)):
            s = int(shift)
            if s > 0:
                return (v + self.i64(1 << (s - 1))) >> self.i64(s)
            return v << self.i64(-s) if s < 0 else v
        s = self.i64(shift)
        zero, one = self.i64(0), self.i64(1)
        right = self.max(s, zero)
        half = self.select(right > zero, one << self.max(right - one, zero), zero)
        return ((v + half) >> right) << self.max(-s, zero)

    def rescale(self, acc, rescale, channel, dtype):
        """numerics.Rescale.apply of int64 ``acc``: per tensor, or per channel with
        ``channel`` the index expression of the element's channel."""
        m, n = rescale.multiplier, rescale.shift
        if len(m) == 1:
            v = self.i64(acc) * self.i64(m[0]) if m[0] != 1 else self.i64(acc)
            return self.saturate(self.rshift_round(v, n[0]), dtype)
        mt = self.const(np.asarray(m, np.int64), "mult")
        nt = self.const(np.asarray(n, np.int64), "shift")
        return self.saturate(self.rshift_round(self.i64(acc) * mt[channel], nt[channel]), dtype)

    def shl(self, v, n: int):
        """int64 ``v`` times 2**n (n >= 0), exactly."""
        return self.i64(v) << self.i64(n) if n else self.i64(v)

    def guarded(self, cond, load, dtype: str):
        """``load`` where ``cond`` holds, else 0 (the load is not evaluated outside)."""
        return self.tirx.if_then_else(cond, load, self.tirx.const(0, dtype))

    # ---- data movement -----------------------------------------------------------------
    def same_order(self, x, t_in: TensorType, t_out: TensorType):
        """The elements of x in their row-major order, reshaped to ``t_out``."""
        def fn(*i):
            flat = 0
            for a, n in zip(i, t_out.shape):
                flat = flat * n + a
            idx = []
            for n in reversed(t_in.shape):
                idx.append(flat % n)
                flat = flat // n
            return x[tuple(reversed(idx))]
        return self.compute(t_out, fn)

    def permuted(self, x, perm: Sequence[int], t_out: TensorType):
        """x transposed by ``perm`` (result axis a is operand axis perm[a])."""
        def fn(*i):
            idx = [None] * len(perm)
            for a, p in enumerate(perm):
                idx[p] = i[a]
            return x[tuple(idx)]
        return self.compute(t_out, fn)

    def joined(self, xs, axis: int, t_out: TensorType):
        """The pieces xs joined along ``axis`` (concat)."""
        def fn(*i):
            starts, start = [], 0
            for x in xs:
                starts.append(start)
                start += int(x.shape[axis])
            v = None            # the last piece, then each earlier one below its end
            for x, s in reversed(list(zip(xs, starts))):
                load = x[tuple(i[:axis]) + (i[axis] - s,) + tuple(i[axis + 1:])]
                end = s + int(x.shape[axis])
                v = load if v is None else self.tirx.if_then_else(i[axis] < end, load, v)
            return v
        return self.compute(t_out, fn)

    # ---- indexing ------------------------------------------------------------------------
    @staticmethod
    def broadcast_index(t: TensorType, out_shape: Sequence[int], idx: Sequence) -> tuple:
        """The index into operand ``t`` that numpy broadcasting reads for result index ``idx``."""
        lead = len(out_shape) - t.rank
        return tuple(0 if t.shape[a] == 1 and out_shape[a + lead] != 1 else idx[a + lead]
                     for a in range(t.rank))

    def reduce_axis(self, n: int, name: str = "k"):
        return self.te.reduce_axis((0, n), name=name)

    def sum(self, expr, axis):
        return self.te.sum(expr, axis=axis)


@dataclass
class KernelDef:
    """A node's kernel: its PrimFunc (arguments: operands, constants, results), the
    constants to bind and the signature it is shared by."""

    name: str
    func: object
    constants: list[np.ndarray]
    signature: str
    op: str
    operands: int          # how many of the arguments are operands (then constants, results)


def kernel_def(node: Node, micro: bool = False) -> KernelDef:
    """Lower ``node`` through its op's ``tvm_lowering`` (raises CodegenError naming the
    node, op and source for an op without one or a lowering that fails). ``micro``: the
    kernel may call the host build's micro-kernels."""
    opdef = node.opdef
    where = {"op": node.op, "node": node.name, "loc": node.loc}
    if opdef.tvm_lowering is None:
        raise CodegenError(f"op '{node.op}' has no lowering", **where)
    L = Lowering(micro)
    operands = [None if v is None else L.placeholder(v.type, f"in{i}")
                for i, v in enumerate(node.inputs)]
    try:
        outs = opdef.tvm_lowering(opdef.ctx(node), L, *operands)
    except BevirError as e:         # a lowering's refusal: name the node it refused
        if e.node is None:
            raise CodegenError(e.message, **where) from e
        raise
    except Exception as e:          # a lowering bug: name where it happened
        raise CodegenError(f"lowering failed: {type(e).__name__}: {e}", **where) from e
    outs = [outs] if not isinstance(outs, (list, tuple)) else list(outs)
    for o, v in zip(outs, node.outputs):
        if tuple(int(s) for s in o.shape) != v.type.shape or o.dtype != dtype_name(v.type):
            raise CodegenError(f"lowering gives {o.dtype}{list(o.shape)}, the node declares "
                               f"{v.type}", **where)
    sig = signature(node)
    name = kernel_name(node)
    args = [p for p in operands if p is not None] + [p for p, _ in L.constants] + outs
    func = L.te.create_prim_func(args).with_attr("global_symbol", name)
    return KernelDef(name, func, [a for _, a in L.constants], sig, node.op,
                     sum(p is not None for p in operands))


@functools.lru_cache(maxsize=None)
def code_digest(*packages: str) -> str:
    """A digest of the source files of bevir's ``packages`` (``"ops"``; a file:
    ``"codegen/lower.py"``) and TVM's version: part of the key of anything cached that this
    code produced."""
    from importlib.metadata import PackageNotFoundError, version
    root = Path(__file__).resolve().parents[1]
    try:
        tvm_version = version("apache-tvm")         # without importing TVM (a second)
    except PackageNotFoundError:                    # a build from source, or none
        tvm_version = require("tvm").__version__
    h = hashlib.sha256(tvm_version.encode())
    for package in packages:
        folder = root / package
        for f in sorted(folder.glob("*.py")) if folder.is_dir() else [folder]:
            h.update(f"{package}/{f.name}".encode() + f.read_bytes())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """A digest of the code that turns a node into kernel source (the op definitions and
    their lowerings, the lowering toolkit and the C printer, TVM's version; not the host
    schedules nor the program writer): with a node's signature, a key for sources built
    before that needs no lowering."""
    return code_digest("ops", "codegen/lower.py", "codegen/build.py")


@functools.lru_cache(maxsize=None)
def _file_digest(path: str, mtime_ns: int) -> bytes:
    return hashlib.sha256(Path(path).read_bytes()).digest()


def op_code_key(opdef) -> str:
    """A digest of the code behind an op's kernels: the file defining the op and the code
    of its lowering (so a user's op, or a lowering replaced at run time, builds afresh).
    The same in every process: nothing in it depends on addresses or hash seeds."""
    import inspect
    h = hashlib.sha256(code_version().encode())
    try:
        path = inspect.getsourcefile(type(opdef))
        h.update(_file_digest(path, Path(path).stat().st_mtime_ns))
    except (TypeError, OSError):            # a class without a file: its lowering's code only
        pass
    lowering = getattr(type(opdef), "tvm_lowering", None)
    if lowering is not None:
        h.update(stable_code(lowering))
    return h.hexdigest()[:20]


_ADDRESS = re.compile(rb" at 0x[0-9a-fA-F]+")


def stable_code(obj) -> bytes:
    """A function's code (its bytecode, names and constants, nested code and the values
    its closure holds) as bytes that are the same in every process: sets in sorted order,
    no object addresses."""
    if isinstance(obj, types.FunctionType):
        cells = tuple(c.cell_contents for c in obj.__closure__ or () if _filled(c))
        return b"fn" + stable_code(obj.__code__) + stable_code(cells)
    if isinstance(obj, types.CodeType):
        return b"|".join([b"code", obj.co_qualname.encode(), obj.co_code,
                          repr(obj.co_names).encode(), stable_code(obj.co_consts)])
    if isinstance(obj, (tuple, list)):
        return b"(" + b",".join(stable_code(x) for x in obj) + b")"
    if isinstance(obj, (set, frozenset)):
        return b"{" + b",".join(sorted(stable_code(x) for x in obj)) + b"}"
    return _ADDRESS.sub(b"", repr(obj).encode())


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018  (reading an empty cell raises)
    except ValueError:                      # a cell not yet filled
        return False
    return True


def source_key(node: Node) -> str:
    """A cache key for ``node``'s kernel source, computed without lowering: its signature
    and :func:`op_code_key` of its op."""
    return hashlib.sha256(f"{signature(node)}{op_code_key(node.opdef)}".encode()).hexdigest()[:20]


def kernel_name(node: Node) -> str:
    """The name of ``node``'s kernel: op and signature."""
    return f"{node.op}_{signature(node)}"


def kernel_defs(nodes, micro: bool = False
                ) -> tuple[dict[str, tuple[KernelDef, Node]], dict[str, str]]:
    """The kernels of ``nodes``, each signature lowered once: (signature -> (kernel, the
    first node using it), node name -> signature). ``micro``: as :func:`kernel_def`."""
    defs: dict[str, tuple[KernelDef, Node]] = {}
    of_node: dict[str, str] = {}
    for n in nodes:
        sig = signature(n)
        if sig not in defs:
            defs[sig] = (kernel_def(n, micro), n)
        of_node[n.name] = sig
    return defs, of_node
