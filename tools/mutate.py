#!/usr/bin/env python
"""Mutation testing of bevir's numerics: does the suite notice a wrong rounding, a lost
saturation or an off-by-one shift?

Each mutant changes one expression of a target module (TARGETS); the tests that execute
that line run against it (``-x -q -p no:cacheprovider``), and the mutant is *killed* when
one fails (or errors, or runs past the time limit) and *survives* when all pass. A
surviving mutant is a gap in the suite: kill it with a test against an independent
reference, or list it in tools/mutants_equivalent.json with the reason no test can tell
it from the original. docs/contributing.md has the workflow.

Selection rule (what is mutated):

- the bodies and default arguments of every module-level function and method of a target,
  except type rules and error reporting: methods named in ``SKIP["*"]`` (``infer``,
  ``macs``, ...) and the module's type helpers in ``SKIP[module]``; inside a body, calls to
  ``require`` / ``InterpreterError``, ``raise`` statements, strings and annotations are
  left alone;
- module- and class-level assignments of numeric literals (``NORM_FRAC = 16``,
  ``sign = -1``), except names in ``SKIP_CONSTANTS`` (used by type rules only).

Mutation operators: arithmetic swaps (+ -, * //, / *, << >>, & |, ** *, unary minus
dropped), comparison swaps (< <=, > >=, == !=, is / is not, in / not in), and/or, a
condition negated (if, while, ternary; np.where's branches swapped), numeric literals +/-1
(True/False flipped), rounding swaps (rint -> floor/ceil, floor <-> ceil, round -> floor),
min <-> max (np.maximum, np.fmax -> np.fmin / np.maximum, .max() <-> .min()),
np.add <-> np.subtract, np.left_shift <-> np.right_shift, saturation removed (np.clip(x,
...) -> x; saturate(x, d) -> x wrapped by astype(d)).

How a mutant runs: no file is ever written, so an interrupted run leaves the worktree as
it was. One pytest session collects the target's test files once; its run loop is
replaced: a forked child runs every test unmutated under sys.settrace and maps each test
to the target lines it executes (lru caches cleared per test); then, per mutant, a forked
child patches the mutant into the imported module in memory (a function's ``__code__``
swapped for the mutated compile, so every reference and the op registry see it; defaults
re-evaluated; a constant's assignment re-run) and runs the tests that reach the mutated
lines, fastest first, stopping at the first failure. A child past its time limit (a
multiple of those tests' unmutated time) is killed and the mutant counts as killed by
timeout. Mutants of constants run the tests of the functions that read them.

Usage (from the repository root)::

    python tools/mutate.py                        # every target, full run
    python tools/mutate.py --target bevir/ops/numerics.py --only saturate,rshift_round
    python tools/mutate.py --list                 # the mutants, not run
    python tools/mutate.py --json /tmp/mutants.json

Exit status 1 when a mutant not listed as equivalent survives.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "bevir"

# ---- configuration -----------------------------------------------------------------------
#: target module -> the test files that cover it
TARGETS: dict[str, tuple[str, ...]] = {
    "bevir/ops/numerics.py": ("tests/ops/test_fixed_point.py", "tests/passes/test_bridge.py",
                              "tests/frontends/test_onnx_qoperator.py",
                              "tests/passes/test_fold_qdq.py",
                              "tests/ops/test_numerics_mutants.py"),
    "bevir/ops/fixed_point.py": ("tests/ops/test_fixed_point.py", "tests/passes/test_bridge.py",
                                 "tests/ops/test_numerics_mutants.py"),
    "bevir/ops/fixed_products.py": ("tests/ops/test_fixed_point.py", "tests/passes/test_bridge.py",
                                    "tests/ops/test_numerics_mutants.py"),
    "bevir/ops/fixed_norms.py": ("tests/ops/test_fixed_point.py", "tests/passes/test_bridge.py",
                                 "tests/ops/test_numerics_mutants.py"),
    "bevir/ops/fixed_attention.py": ("tests/ops/test_fixed_point.py", "tests/passes/test_bridge.py",
                                     "tests/ops/test_numerics_mutants.py"),
    "bevir/ops/fixed_tables.py": ("tests/ops/test_fixed_point.py",
                                  "tests/ops/test_numerics_mutants.py"),
    "bevir/ops/qlinear.py": ("tests/frontends/test_onnx_qoperator.py",
                             "tests/passes/test_fold_qdq.py", "tests/passes/test_layout.py",
                             "tests/ops/test_numerics_mutants.py"),
}
#: functions and methods not mutated: type rules and shape checks ("*": in every target)
SKIP: dict[str, tuple[str, ...]] = {
    "*": ("infer", "macs", "reduction", "weight_axes", "out_shape", "weight_axis",
          "check_attrs"),
    "bevir/ops/fixed_point.py": ("fixed_quant", "frac_of", "weight_quant", "fixed_type",
                                 "_params", "check_bias", "require_out_frac", "out_dtype",
                                 "_broadcast"),
    "bevir/ops/qlinear.py": ("affine", "_q8", "_qlinear_pair", "_out_type"),
}
#: module- and class-level constants not mutated (read by type rules only)
SKIP_CONSTANTS: dict[str, tuple[str, ...]] = {"bevir/ops/numerics.py": ("MAX_REDUCTION",)}
#: calls whose arguments are checks or messages, not numerics
SKIP_CALLS = ("require", "InterpreterError", "VerifyError")
EQUIVALENT = ROOT / "tools" / "mutants_equivalent.json"
#: the child's address-space limit above the parent's (a mutant that allocates wildly dies)
MEMORY_HEADROOM = 6 << 30

# ---- mutation operators ------------------------------------------------------------------
BINOP_SWAPS = {ast.Add: (ast.Sub,), ast.Sub: (ast.Add,), ast.Mult: (ast.FloorDiv,),
               ast.FloorDiv: (ast.Mult,), ast.Div: (ast.Mult,), ast.Mod: (ast.FloorDiv,),
               ast.LShift: (ast.RShift,), ast.RShift: (ast.LShift,), ast.BitAnd: (ast.BitOr,),
               ast.BitOr: (ast.BitAnd,), ast.BitXor: (ast.BitOr,), ast.Pow: (ast.Mult,)}
COMPARE_SWAPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
                 ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
                 ast.In: ast.NotIn, ast.NotIn: ast.In}
#: function renames (dotted name -> replacements)
CALL_SWAPS = {
    "np.rint": ("np.floor", "np.ceil"), "np.floor": ("np.ceil", "np.rint"),
    "np.ceil": ("np.floor",), "np.round": ("np.floor",), "np.trunc": ("np.floor",),
    "math.floor": ("math.ceil",), "math.ceil": ("math.floor",),
    "np.maximum": ("np.minimum",), "np.minimum": ("np.maximum",),
    "np.fmax": ("np.fmin", "np.maximum"), "np.fmin": ("np.fmax", "np.minimum"),
    "max": ("min",), "min": ("max",),
    "np.add": ("np.subtract",), "np.subtract": ("np.add",),
    "np.left_shift": ("np.right_shift",), "np.right_shift": ("np.left_shift",),
}
#: method renames (x.max() -> x.min())
METHOD_SWAPS = {"max": "min", "min": "max"}


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _name_expr(dotted: str) -> ast.expr:
    return ast.parse(dotted, mode="eval").body


def _literal(node: ast.AST) -> int | float | bool | None:
    """The value of a numeric literal (a constant or a negated one), else None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = _literal(node.operand)
        return None if v is None or isinstance(v, bool) else -v
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    return None


def _literal_mutants(value, in_index: bool) -> list[ast.expr]:
    if isinstance(value, bool):
        return [ast.Constant(not value)]
    steps = (1, -1) if not (in_index and value == 0) else (1,)   # x[0] -> x[-1]: same on 1-tuples
    return [ast.parse(repr(value + d), mode="eval").body for d in steps]


def mutations(node: ast.AST, in_index: bool = False) -> list[tuple[ast.AST, ast.AST]]:
    """(site, replacement) pairs for one node: the site is the node itself or its test."""
    out: list[tuple[ast.AST, ast.AST]] = []
    value = _literal(node)
    if value is not None:
        return [(node, m) for m in _literal_mutants(value, in_index)]
    if isinstance(node, ast.BinOp):
        out += [(node, ast.BinOp(node.left, op(), node.right))
                for op in BINOP_SWAPS.get(type(node.op), ())]
    elif isinstance(node, ast.AugAssign):
        out += [(node, ast.AugAssign(node.target, op(), node.value))
                for op in BINOP_SWAPS.get(type(node.op), ())]
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Invert, ast.Not)):
        out.append((node, node.operand))
    elif isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            ops = list(node.ops)
            ops[i] = COMPARE_SWAPS[type(op)]()
            out.append((node, ast.Compare(node.left, ops, node.comparators)))
    elif isinstance(node, ast.BoolOp):
        other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        out.append((node, ast.BoolOp(other, node.values)))
    elif isinstance(node, (ast.If, ast.While, ast.IfExp)) and not _negation_covered(node.test):
        out.append((node.test, ast.UnaryOp(ast.Not(), node.test)))
    elif isinstance(node, ast.Call):
        out += _call_mutations(node)
    return out


def _negation_covered(test: ast.AST) -> bool:
    """Whether ``not test`` equals another mutant: of ``a == b`` (``a != b``), of ``not x``
    (``x``)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return True
    return isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(
        test.ops[0], (ast.Eq, ast.NotEq, ast.Is, ast.IsNot, ast.In, ast.NotIn))


def _call_mutations(node: ast.Call) -> list[tuple[ast.AST, ast.AST]]:
    name = _dotted(node.func)
    out = [(node, ast.Call(_name_expr(new), node.args, node.keywords))
           for new in CALL_SWAPS.get(name, ())]
    if name == "np.clip" and node.args:
        out.append((node, node.args[0]))
    if name == "saturate" and node.args:           # wrap instead of clamp
        dtype = node.args[1] if len(node.args) > 1 else _name_expr("np.int8")
        wrapped = ast.Call(_name_expr("np.asarray"), [node.args[0]], [])
        out.append((node, ast.Call(ast.Attribute(wrapped, "astype", ast.Load()), [dtype], [])))
    if name == "np.where" and len(node.args) == 3:
        c, a, b = node.args
        out.append((node, ast.Call(node.func, [c, b, a], node.keywords)))
    if (isinstance(node.func, ast.Attribute) and node.func.attr in METHOD_SWAPS
            and _dotted(node.func.value) not in ("np", "math")):
        func = ast.Attribute(node.func.value, METHOD_SWAPS[node.func.attr], ast.Load())
        out.append((node, ast.Call(func, node.args, node.keywords)))
    return out


# ---- mutant enumeration ------------------------------------------------------------------
@dataclass
class Mutant:
    """One mutation of one target module."""

    module: str
    qualname: str
    line: int
    end_line: int
    key: str                       # stable across edits elsewhere: qualname + old -> new
    lines: tuple[int, ...] = ()    # the target lines whose tests run it; () = every test
    span: tuple[int, int, int, int] = (0, 0, 0, 0)
    replacement: str = ""
    statement: bool = False
    kind: str = "code"             # code (a body) | defaults | constant (an assignment)
    stmt_line: int = 0             # constant: the line of the assignment
    status: str = "pending"        # killed | timeout | survived | equivalent
    reason: str = ""
    tests: int = 0
    seconds: float = 0.0
    killed_by: str = ""


def _walk(node: ast.AST, parent: ast.AST | None = None):
    """(node, parent) in source order below ``node``, skipping checks and messages."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Raise, ast.JoinedStr)) or (
                isinstance(child, ast.Call) and _dotted(child.func) in SKIP_CALLS):
            continue
        if isinstance(child, ast.arg) or child in getattr(node, "decorator_list", ()):
            continue
        if getattr(node, "returns", None) is child or getattr(node, "annotation", None) is child:
            continue
        yield child, node
        yield from _walk(child, node)


def _sites(tree: ast.Module, module: str):
    """(qualname, node, parent, lines, kind) for every mutable node, in source order;
    ``lines``: the lines whose coverage selects the tests (() for every test of the target,
    None for the node's own); ``kind``: "code", "defaults" or the line of a constant's
    assignment."""
    skip = set(SKIP["*"]) | set(SKIP.get(module, ()))
    skip_const = set(SKIP_CONSTANTS.get(module, ()))
    readers: dict[str, set[int]] = {}     # a constant's name -> the lines of its readers
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for n in ast.walk(fn):
                ref = n.id if isinstance(n, ast.Name) else getattr(n, "attr", None)
                if ref is not None:
                    readers.setdefault(ref, set()).update(range(fn.body[0].lineno,
                                                                fn.end_lineno + 1))

    def body(stmts, prefix):
        for st in stmts:
            if isinstance(st, ast.ClassDef):
                yield from body(st.body, f"{prefix}{st.name}.")
            elif isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)) and st.name not in skip:
                yield from function(st, prefix + st.name)
            elif isinstance(st, ast.Assign) and all(
                    _literal(v) is not None for v in _values(st.value)):
                names = [t.id for t in ast.walk(st) if isinstance(t, ast.Name)]
                if not set(names) & skip_const:
                    lines = tuple(sorted({n for name in names for n in readers.get(name, ())}))
                    for node, parent in _walk(st):
                        yield prefix + "/".join(names), node, parent, lines, st.lineno

    def function(fn, qualname):
        lines = tuple(range(fn.body[0].lineno, fn.end_lineno + 1))
        for default in fn.args.defaults + [d for d in fn.args.kw_defaults if d is not None]:
            yield qualname, default, fn.args, lines, "defaults"
            for node, parent in _walk(default):
                yield qualname, node, parent, lines, "defaults"
        stmts = fn.body[1:] if ast.get_docstring(fn) else fn.body
        for st in stmts:
            yield qualname, st, fn, None, "code"
            for node, parent in _walk(st):
                yield qualname, node, parent, None, "code"
    yield from body(tree.body, "")


def _values(node: ast.AST):
    """The leaves of a constant expression (tuples and arithmetic of literals)."""
    if isinstance(node, ast.Tuple):
        for e in node.elts:
            yield from _values(e)
    elif isinstance(node, ast.BinOp):
        yield from _values(node.left)
        yield from _values(node.right)
    else:
        yield node


def enumerate_mutants(module: str) -> list[Mutant]:
    """Every mutant of ``module`` (a path relative to the repository root), in source
    order, each applied and parsed once to drop duplicates and no-ops."""
    src = (ROOT / module).read_text()
    tree = ast.parse(src)
    original = ast.dump(tree)
    seen, keys, out = {original}, {}, []
    for qualname, node, parent, lines, kind in _sites(tree, module):
        if isinstance(node, ast.Constant) and isinstance(parent, ast.UnaryOp):
            continue                                      # -1 is mutated as a literal
        if (isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.LShift)
                and parent.left is node and _literal(node) == 1):
            continue                                      # 1 << k: k and << are mutated
        in_index = isinstance(parent, ast.Subscript) and parent.slice is node
        for site, new in mutations(node, in_index):
            stmt = isinstance(site, ast.stmt)
            text = ast.unparse(ast.fix_missing_locations(new))
            key = f"{qualname}: {ast.unparse(site)} -> {text}"
            keys[key] = keys.get(key, 0) + 1
            if keys[key] > 1:
                key += f" #{keys[key]}"
            m = Mutant(module, qualname, site.lineno, site.end_lineno, key,
                       lines or tuple(range(site.lineno, site.end_lineno + 1)),
                       (site.lineno, site.col_offset, site.end_lineno, site.end_col_offset),
                       text, stmt)
            if lines == ():
                m.lines = ()
            if isinstance(kind, int):
                m.kind, m.stmt_line = "constant", kind
            else:
                m.kind = kind
            try:
                dump = ast.dump(ast.parse(apply(src, m)))
            except SyntaxError:
                continue
            if dump not in seen:
                seen.add(dump)
                out.append(m)
    return out


def apply(src: str, m: Mutant) -> str:
    """The module source with the mutant's span replaced (line numbers kept)."""
    data = src.encode()
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    l0, c0, l1, c1 = m.span
    a, b = starts[l0 - 1] + c0, starts[l1 - 1] + c1
    text = m.replacement if m.statement else f"({m.replacement}{chr(10) * (l1 - l0)})"
    return (data[:a] + text.encode() + data[b:]).decode()


# ---- applying a mutant in memory ---------------------------------------------------------
def _module_name(module: str) -> str:
    return Path(module).with_suffix("").as_posix().replace("/", ".")


def _owner(mod, qualname: str):
    """(the class or module holding the last part of ``qualname``, that name)."""
    *path, name = qualname.split(".")
    obj = mod
    for part in path:
        obj = getattr(obj, part)
    return obj, name


def _function(mod, qualname: str):
    """The plain function object behind ``qualname`` (staticmethod and lru_cache
    unwrapped)."""
    owner, name = _owner(mod, qualname)
    f = vars(owner)[name]
    f = getattr(f, "__func__", f)
    return getattr(f, "__wrapped__", f)


def _code(code, qualname: str):
    """The code object of the function ``qualname`` inside a compiled module."""
    for const in code.co_consts:
        if hasattr(const, "co_qualname"):
            if const.co_qualname == qualname:
                return const
            found = _code(const, qualname)
            if found is not None:
                return found
    return None


def _def_node(tree: ast.Module, qualname: str):
    body = tree.body
    for part in qualname.split("."):
        node = next(n for n in body if getattr(n, "name", None) == part)
        body = getattr(node, "body", [])
    return node


def patch(m: Mutant, source: str) -> None:
    """Put the mutant into the imported module, in place: a function body by swapping its
    code object (every reference to the function sees it), defaults by re-evaluating them,
    a constant by re-running its assignment (and updating the modules that imported it)."""
    import importlib
    mod = importlib.import_module(_module_name(m.module))
    text = apply(source, m)
    if m.kind == "code":
        f = _function(mod, m.qualname)
        new = _code(compile(text, mod.__file__, "exec"), m.qualname)
        if new is None or new.co_freevars != f.__code__.co_freevars:
            raise RuntimeError(f"cannot patch {m.qualname}")
        f.__code__ = new
    elif m.kind == "defaults":
        f, node = _function(mod, m.qualname), _def_node(ast.parse(text), m.qualname)
        ev = lambda e: eval(compile(ast.Expression(e), mod.__file__, "eval"), vars(mod))  # noqa
        f.__defaults__ = tuple(ev(d) for d in node.args.defaults) or None
        kw = {a.arg: ev(d) for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults) if d}
        f.__kwdefaults__ = kw or None
    else:
        _patch_constant(mod, m, ast.parse(text))
    for obj in list(vars(mod).values()):       # tables cached before the patch are stale
        if hasattr(obj, "cache_clear"):
            obj.cache_clear()


def _patch_constant(mod, m: Mutant, tree: ast.Module) -> None:
    owner = _owner(mod, m.qualname)[0]
    bodies = [tree.body] + [n.body for n in tree.body if isinstance(n, ast.ClassDef)]
    stmt = next(s for b in bodies for s in b if s.lineno == m.stmt_line)
    ns: dict = {}
    exec(compile(ast.Module([stmt], []), mod.__file__, "exec"), vars(mod), ns)
    for name, value in ns.items():
        old = getattr(owner, name)
        setattr(owner, name, value)
        if owner is mod:                        # `from .fixed import NORM_FRAC` elsewhere
            for other in list(sys.modules.values()):
                if other is not mod and getattr(other, name, None) is old and hasattr(
                        other, "__file__") and str(ROOT) in str(other.__file__):
                    setattr(other, name, value)


# ---- running tests in forked children ----------------------------------------------------
class Runner:
    """A pytest plugin that collects the tests once, then, in place of pytest's run loop,
    forks one child per job: the coverage map (every test, traced), then each mutant
    (patched in, its selected tests run with -x). At most ``jobs`` children at once."""

    def __init__(self, mutants: list[Mutant], files: dict[str, tuple[str, ...]], jobs: int,
                 factor: float):
        self.mutants, self.files, self.jobs, self.factor = mutants, files, jobs, factor
        self.sources = {mod: (ROOT / mod).read_text() for mod in files}
        self.tmp = Path(tempfile.mkdtemp(prefix="bevir-mutate-"))
        self.running: dict[int, tuple] = {}     # pid -> (job, deadline, started, out file)
        self.limit = _vm_size() + MEMORY_HEADROOM
        self.failed: list[str] = []
        self.durations: dict[str, float] = {}
        self.lines: dict[str, dict[str, set]] | None = None
        self.current: dict[str, set] | None = None
        self.items: dict = {}

    # -- in a child ------------------------------------------------------------------------
    def pytest_runtest_logreport(self, report):
        self.durations[report.nodeid] = self.durations.get(report.nodeid, 0.0) + report.duration
        if report.failed and report.nodeid not in self.failed:
            self.failed.append(report.nodeid)

    def _trace(self, frame, event, arg):
        rel = self.traced.get(frame.f_code.co_filename)
        if rel is None or self.current is None:
            return None
        lines = self.current.setdefault(rel, set())

        def local(frame, event, arg):
            if event == "line":
                lines.add(frame.f_lineno)
            return local
        return local

    def _run_items(self, items: list, stop_on_failure: bool) -> None:
        for i, item in enumerate(items):
            if self.lines is not None:
                for mod in self.files:
                    patch_free_caches(_module_name(mod))
                self.current = self.lines.setdefault(item.nodeid, {})
            nxt = items[i + 1] if i + 1 < len(items) else None
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=nxt)
            if self.failed and stop_on_failure:
                return

    def _child(self, job, items: list, out: Path) -> None:
        code = 3
        try:
            log = os.open(out.with_suffix(".log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(log, 1)
            os.dup2(log, 2)
            if items:                              # progress dots would reach the terminal
                pm = items[0].config.pluginmanager
                pm.unregister(pm.get_plugin("terminalreporter"))
            if job is None:                        # the coverage map
                import importlib
                self.traced = {importlib.import_module(_module_name(m)).__file__: m
                               for m in self.files}
                self.lines = {}
                sys.settrace(self._trace)
                self._run_items(items, stop_on_failure=False)
                sys.settrace(None)
            else:
                patch(job, self.sources[job.module])
                self._run_items(items, stop_on_failure=True)
            lines = {t: {k: sorted(v) for k, v in ls.items()}
                     for t, ls in (self.lines or {}).items()}
            code = 1 if self.failed else 0
            out.write_text(json.dumps({"code": code, "failed": self.failed,
                                       "durations": self.durations, "lines": lines}))
        except BaseException as e:              # noqa: BLE001 - a child never returns
            out.write_text(json.dumps({"code": 2, "error": repr(e), "failed": self.failed}))
            code = 2
        os._exit(code)

    # -- in the parent ---------------------------------------------------------------------
    def start(self, job, items: list, timeout: float) -> None:
        out = self.tmp / f"{len(self.running)}-{time.monotonic_ns()}.json"
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.setpgid(0, 0)
            resource.setrlimit(resource.RLIMIT_AS, (self.limit, self.limit))
            self._child(job, items, out)
        try:
            os.setpgid(pid, pid)           # also here: a kill may come before the child's
        except OSError:
            pass
        self.running[pid] = (job, time.monotonic() + timeout, time.monotonic(), out)

    def wait(self) -> tuple:
        """(job, result, seconds) of the next child to end; one past its deadline is killed
        and reported with code 'timeout'."""
        while True:
            for pid, (job, deadline, t0, out) in list(self.running.items()):
                done, status = os.waitpid(pid, os.WNOHANG)
                late = not done and time.monotonic() > deadline
                if late:
                    _kill(pid)
                    os.waitpid(pid, 0)
                if done or late:
                    del self.running[pid]
                    res = {"code": "timeout", "failed": []} if late else (
                        json.loads(out.read_text()) if out.exists()
                        else {"code": "died", "error": f"wait status {status}", "failed": []})
                    return job, res, time.monotonic() - t0
            time.sleep(0.01)

    def pytest_runtestloop(self, session):
        try:
            self.items = {item.nodeid: item for item in session.items}
            self.cmap = self.coverage_map(list(session.items))
            self.run_all()
        finally:
            for pid in list(self.running):
                _kill(pid)
                os.waitpid(pid, 0)
            shutil.rmtree(self.tmp, ignore_errors=True)
        return True

    def coverage_map(self, items: list) -> dict[str, dict]:
        """nodeid -> {"duration": s, "lines": {module: [line, ...]}} from one unmutated,
        traced run of every test; raises SystemExit when a test fails unmutated."""
        print(f"\nmapping {len(items)} tests to the lines they run", flush=True)
        self.start(None, items, timeout=3600)
        _, res, secs = self.wait()
        if res["code"] != 0:
            raise SystemExit(f"the unmutated tests do not pass: "
                             f"{res.get('failed') or res.get('error', res['code'])}")
        print(f"  {secs:.0f} s", flush=True)
        return {t: {"duration": res["durations"].get(t, 0.0), "lines": res["lines"].get(t, {})}
                for t in self.items}

    def run_all(self) -> None:
        todo = [m for m in self.mutants if m.status == "pending"]
        queue, done, killed, t0 = list(todo), 0, 0, time.monotonic()
        while queue or self.running:
            while queue and len(self.running) < self.jobs:
                m = queue.pop(0)
                ids = select_tests(m, self.cmap, self.files[m.module])
                m.tests = len(ids)
                if not ids:
                    m.status, m.reason = "survived", "no test reaches this line"
                    done += 1
                    _progress(done, len(todo), killed, m)
                    continue
                budget = self.factor * sum(self.cmap[t]["duration"] for t in ids) + 10
                self.start(m, [self.items[t] for t in ids], budget)
            if not self.running:
                continue
            m, res, m.seconds = self.wait()
            code = res["code"]
            if code not in (0, 1, "timeout"):
                m.reason = res.get("error", str(code))[:300]
            m.status = "timeout" if code == "timeout" else "killed" if code else "survived"
            m.killed_by = (res.get("failed") or [m.reason])[0]
            killed += m.status != "survived"
            done += 1
            _progress(done, len(todo), killed, m)
        self.seconds = time.monotonic() - t0
        print(f"{len(todo)} mutants run in {self.seconds:.0f} s", flush=True)


def patch_free_caches(name: str) -> None:
    """Clear the lru caches of a module's functions (a test must build its own tables)."""
    mod = sys.modules.get(name)
    for obj in list(vars(mod).values()) if mod else ():
        if hasattr(obj, "cache_clear"):
            obj.cache_clear()


def _kill(pid: int) -> None:
    """SIGKILL a child and its process group."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _vm_size() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def select_tests(m: Mutant, cmap: dict[str, dict], files: tuple[str, ...]) -> list[str]:
    """The tests of ``files`` reaching the mutant's lines, fastest first."""
    want = set(m.lines)
    ids = [t for t, e in cmap.items() if t.split("::")[0] in files and
           (not want or want & set(e["lines"].get(m.module, ())))]
    return sorted(ids, key=lambda t: (cmap[t]["duration"], t))


# ---- driver ------------------------------------------------------------------------------
def load_equivalent() -> dict[str, dict[str, str]]:
    return json.loads(EQUIVALENT.read_text()) if EQUIVALENT.exists() else {}


def _matches(m: Mutant, only: list[str], lines: tuple[int, int] | None) -> bool:
    if lines and not (lines[0] <= m.line <= lines[1]):
        return False
    parts = m.qualname.split(".")
    return not only or any(o == m.qualname or o in parts for o in only)


def run_mutants(mutants: list[Mutant], files: dict[str, tuple[str, ...]], jobs: int,
                factor: float) -> float:
    """Run every pending mutant in one pytest session, setting its status; returns the
    seconds the mutants took."""
    import pytest
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)
    runner = Runner(mutants, files, jobs, factor)
    tests = sorted({t for fs in files.values() for t in fs})
    code = pytest.main(tests + ["-q", "-p", "no:cacheprovider", "-o", "addopts=", "--no-header"],
                       plugins=[runner])
    if code not in (0, pytest.ExitCode.OK) or not hasattr(runner, "seconds"):
        raise SystemExit(f"pytest session ended with {code!r}")
    return runner.seconds


def _progress(done: int, total: int, killed: int, m: Mutant) -> None:
    mark = {"killed": "K", "timeout": "T", "survived": "S"}[m.status]
    print(f"[{done}/{total}] killed {killed}  {mark} {m.module}:{m.line} {m.key[:110]}"
          f"  ({m.tests} tests, {m.seconds:.1f} s)", flush=True)


def summarize(mutants: list[Mutant]) -> dict:
    """Per module and overall: counts and the score (killed / non-equivalent)."""
    def counts(ms):
        c = {s: sum(m.status == s for m in ms) for s in ("killed", "timeout", "survived",
                                                           "equivalent")}
        c["total"] = len(ms)
        live = c["killed"] + c["timeout"] + c["survived"]
        c["score"] = round(100.0 * (c["killed"] + c["timeout"]) / live, 1) if live else None
        return c
    mods = sorted({m.module for m in mutants})
    return {"modules": {mod: counts([m for m in mutants if m.module == mod]) for mod in mods},
            "all": counts(mutants)}


def _take_kills(mutants: list[Mutant], earlier: list[dict]) -> None:
    """Copy the verdicts of mutants killed in an earlier run (the same key), so that only
    the rest run; a kill stands as long as the tests that made it are unchanged."""
    kills = {(e["module"], e["key"]): e for e in earlier if e["status"] in ("killed", "timeout")}
    for m in mutants:
        e = kills.get((m.module, m.key))
        if e is not None and m.status == "pending":
            m.status, m.tests, m.seconds, m.killed_by = (e["status"], e["tests"], e["seconds"],
                                                         e["killed_by"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", action="append", choices=sorted(TARGETS),
                    help="target module (repeatable; default: all)")
    ap.add_argument("--tests", nargs="+", help="test files to run (default: the target's)")
    ap.add_argument("--only", default="", help="comma-separated functions, methods or classes")
    ap.add_argument("--lines", help="restrict to source lines A-B")
    ap.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    ap.add_argument("--json", type=Path, help="write every mutant and the summary here")
    ap.add_argument("--jobs", "-j", type=int, default=1, help="mutants run at once")
    ap.add_argument("--timeout-factor", type=float, default=5.0,
                    help="a mutant's time limit: this times its tests' unmutated time, + 30 s")
    ap.add_argument("--rerun", type=Path, metavar="JSON",
                    help="take the killed mutants of an earlier --json result as they are and "
                         "run only the others (after adding tests)")
    ap.add_argument("--include-equivalent", action="store_true",
                    help="run the listed equivalent mutants too (each should survive)")
    a = ap.parse_args(argv)
    targets = a.target or sorted(TARGETS)
    files = {t: tuple(a.tests) if a.tests else TARGETS[t] for t in targets}
    only = [s for s in a.only.split(",") if s]
    lines = tuple(int(v) for v in a.lines.split("-")) if a.lines else None
    equivalent = load_equivalent()
    mutants, stale = [], []
    for t in targets:
        ms = enumerate_mutants(t)
        listed = equivalent.get(t, {})
        stale += [f"{t}: {k}" for k in listed if k not in {m.key for m in ms}]
        for m in ms:
            if m.key in listed and not a.include_equivalent:
                m.status, m.reason = "equivalent", listed[m.key]
        mutants += [m for m in ms if _matches(m, only, lines)]
    if a.rerun:
        _take_kills(mutants, json.loads(a.rerun.read_text())["mutants"])
    if stale:
        print("equivalent entries matching no mutant (remove them):\n  " + "\n  ".join(stale))
    if a.list:
        for i, m in enumerate(mutants):
            print(f"{i:4d} {m.module}:{m.line:<4d} {m.status[:5]:5s} {m.key}")
        print(f"{len(mutants)} mutants")
        return 0
    seconds = run_mutants(mutants, files, max(1, a.jobs), a.timeout_factor)
    summary = {**summarize(mutants), "seconds": round(seconds)}
    survivors = [m for m in mutants if m.status == "survived"]
    if a.include_equivalent:
        wrongly = [m for m in mutants if m.key in equivalent.get(m.module, {})
                   and m.status != "survived"]
        for m in wrongly:
            print(f"listed as equivalent but killed by {m.killed_by}: {m.module}: {m.key}")
        survivors = [m for m in survivors if m.key not in equivalent.get(m.module, {})]
    for m in survivors:
        print(f"SURVIVED {m.module}:{m.line} {m.key}" + (f"  [{m.reason}]" if m.reason else ""))
    print(json.dumps(summary, indent=1))
    if a.json:
        a.json.write_text(json.dumps({"summary": summary, "mutants": [asdict(m) for m in mutants]},
                                     indent=1))
    return 1 if survivors else 0


def _reexec_pinned() -> None:
    """Re-run under a fixed hash seed and single-threaded BLAS: the same mutants, the same
    test data and the same verdicts on every run."""
    pinned = {"PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
              "MKL_NUM_THREADS": "1"}
    if any(os.environ.get(k) != v for k, v in pinned.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **pinned})


if __name__ == "__main__":
    _reexec_pinned()
    sys.exit(main())
