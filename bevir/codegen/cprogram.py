"""Per-core C programs: a partitioned (and usually memory-planned) graph as one C program
per core that calls the generated kernels in graph order, with buffer offsets from the
memory plan, copies between DDR and each core's OCM, and barriers; built with the system
C compiler into one library per core that needs only libc; run with one thread per core.

    compiled = bevir.codegen.compile(graph, "out/")      # writes and builds out/
    outputs = compiled.run(inputs)                         # or CompiledProgram.load("out/")

Memory. Each core has an OCM arena; all cores share a DDR arena. A value the plan put in
OCM (``value.meta["ocm"]``) lives at its planned offset in the OCM of each core holding
it; any other value lives in DDR. A value also gets a DDR slot where it crosses a
boundary: written by the host (graph inputs, constants, float pre-processing), read by
the host (outputs, float post-processing), or read on a core other than its producer's;
its producer stores it there and then publishes a ready flag, and a reader on another core
waits for the flag and loads it into its own OCM (or reads it in place). Barriers are full
barriers of all cores, in graph order. Kernels run on what their core holds.

Stages. Float nodes run on the host through the golden model; the program has one entry
per core and device stage (:func:`~bevir.codegen.lower.stages`), so a quantized network
runs as host pre-processing, the cores, host post-processing.

Files in the output folder: ``kernels/<kernel>.c`` (TVM's C with an entry taking data
pointers), ``core<k>.c`` (the program of core k), ``runtime.c`` (barrier, flags, the few
functions TVM's C calls), ``core<k>.so``, ``manifest.json`` (kernels, buffers, offsets,
copies, waits and barriers per core, with provenance) and ``graph.bevir`` (the graph,
for the host stages). The same graph gives byte-identical sources and manifest.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import CodegenError
from ..ir.graph import Graph, Node, Value
from ..progress import Progress
from ..sim.interpreter import Interpreter
from .build import CFLAGS, RUNTIME_C, build_shared, c_kernel_source, cache_dir, include_dirs
from .lower import (code_digest, dtype_name, kernel_def, kernel_name, op_code_key, signature,
                    source_key, stages)

ALIGN = 64

RUNTIME_SYNC = r"""
#include <sched.h>
/* ready flags: a value's producer publishes the run's epoch once the value is in DDR */
void bevir_publish(int64_t* flag, int64_t epoch) { __atomic_store_n(flag, epoch, __ATOMIC_RELEASE); }
void bevir_wait(int64_t* flag, int64_t epoch) {
  while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) != epoch) sched_yield();
}
/* a full barrier of n cores: bar[0] counts arrivals, bar[1] is the generation */
void bevir_barrier(int64_t* bar, int64_t n) {
  int64_t gen = __atomic_load_n(&bar[1], __ATOMIC_ACQUIRE);
  if (__atomic_add_fetch(&bar[0], 1, __ATOMIC_ACQ_REL) == n) {
    __atomic_store_n(&bar[0], 0, __ATOMIC_RELAXED);
    __atomic_store_n(&bar[1], gen + 1, __ATOMIC_RELEASE);
  } else {
    while (__atomic_load_n(&bar[1], __ATOMIC_ACQUIRE) == gen) sched_yield();
  }
}
"""


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass
class Layout:
    """Where every value of the device stages lives: DDR slots, OCM offsets per core, the
    producing core, the ready flags."""

    cores: int
    ddr: dict[str, int] = field(default_factory=dict)          # value -> DDR offset
    ocm: dict[tuple[str, int], int] = field(default_factory=dict)  # (value, core) -> offset
    ocm_size: list[int] = field(default_factory=list)
    flags: dict[str, int] = field(default_factory=dict)        # value -> flag index
    ddr_size: int = 0

    def where(self, v: Value, core: int) -> tuple[str, int]:
        """("ocm", offset) where core holds v on chip, else ("ddr", offset)."""
        off = self.ocm.get((v.name, core))
        return ("ocm", off) if off is not None else ("ddr", self.ddr[v.name])


def _core(n: Node) -> int:
    return int(n.meta.get("core", 0) or 0)


def producer_core(v: Value, device: set[int]) -> int | None:
    """The core that produces v (a barrier's result: its operand's), None for the host."""
    n = v.producer
    if n is None or id(n) not in device:
        return None
    if n.op == "barrier":
        return producer_core(n.inputs[n.outputs.index(v)], device)
    return _core(n)


def plan_layout(graph: Graph, device: set[int], cores: int) -> Layout:
    """DDR slots and OCM offsets (from the memory plan's ``meta["ocm"]``) for the values
    the device stages touch (see the module docstring)."""
    layout = Layout(cores, ocm_size=[0] * cores)
    touched: dict[str, Value] = {}
    readers: dict[str, set] = {}
    for n in graph.nodes:
        if id(n) not in device:
            for v in n.inputs:
                if v is not None:
                    readers.setdefault(v.name, set()).add("host")
            continue
        for v in n.tensors():
            touched[v.name] = v
        for v in n.inputs:
            if v is not None:
                readers.setdefault(v.name, set()).add(_core(n) if n.op != "barrier" else None)
    for v in graph.outputs.values():
        readers.setdefault(v.name, set()).add("host")
    for v in touched.values():
        for e in v.meta.get("ocm") or []:
            if e["core"] < cores:
                layout.ocm[(v.name, e["core"])] = e["offset"]
                layout.ocm_size[e["core"]] = max(layout.ocm_size[e["core"]], e["offset"] + e["size"])
    for v in touched.values():
        p = producer_core(v, device)
        others = readers.get(v.name, set()) - {p, None}
        if p is None or (v.name, p) not in layout.ocm or others:
            layout.ddr[v.name] = layout.ddr_size
            layout.ddr_size += _align(v.type.nbytes)
        if p is not None and others - {"host"}:
            layout.flags[v.name] = len(layout.flags)
    return layout


class _CoreWriter:
    """Emits one core's program: each node's loads, waits, kernel call, stores, flags."""

    def __init__(self, core: int, layout: Layout, device: set[int]):
        self.core, self.layout, self.device = core, layout, device
        self.lines: list[str] = []
        self.steps: list[dict] = []
        self.on_chip: set[str] = set()        # values this core has loaded into its OCM
        self.waited: set[str] = set()

    def ptr(self, v: Value) -> tuple[str, int]:
        return self.layout.where(v, self.core)

    def operand(self, v: Value, step: dict) -> tuple[str, int]:
        """Where the operand is on this core, after waiting for / loading it as needed."""
        p = producer_core(v, self.device)
        mem, off = self.layout.where(v, self.core)
        if p != self.core and v.name not in self.waited and v.name in self.layout.flags:
            self.lines.append(f"  bevir_wait(flags + {self.layout.flags[v.name]}, epoch);")
            self.waited.add(v.name)
            step["waits"].append(v.name)
        if mem == "ocm" and p != self.core and v.name not in self.on_chip:
            self.lines.append(f"  memcpy(ocm + {off}, ddr + {self.layout.ddr[v.name]}, "
                              f"{v.type.nbytes});")
            self.on_chip.add(v.name)
            step["loads"].append(v.name)
        return mem, off

    def result(self, v: Value, step: dict) -> None:
        """Store a result to its DDR slot where it has one and publish it."""
        mem, off = self.layout.where(v, self.core)
        if mem == "ocm" and v.name in self.layout.ddr:
            self.lines.append(f"  memcpy(ddr + {self.layout.ddr[v.name]}, ocm + {off}, "
                              f"{v.type.nbytes});")
            step["stores"].append(v.name)
        if v.name in self.layout.flags:
            self.lines.append(f"  bevir_publish(flags + {self.layout.flags[v.name]}, epoch);")

    def node(self, n: Node, kernel: str | None) -> None:
        step = {"node": n.name, "op": n.op, "loc": n.loc, "kernel": kernel, "loads": [],
                "waits": [], "stores": [], "args": []}
        self.lines.append(f"  /* {n.name} = {n.op} from '{n.loc}' */")
        if n.op == "barrier":           # this core's pieces pass through, then all wait
            for x, y in zip(n.inputs, n.outputs):
                if producer_core(x, self.device) == self.core:
                    src, dst = self.operand(x, step), self.ptr(y)
                    self.lines.append(f"  memcpy({dst[0]} + {dst[1]}, {src[0]} + {src[1]}, "
                                      f"{x.type.nbytes});")
                    self.result(y, step)
            self.lines.append(f"  bevir_barrier(bar, {self.layout.cores});")
            step["barrier"] = True
        else:
            values = [v for v in n.inputs if v is not None]
            places = [self.operand(v, step) for v in values] + [self.ptr(v) for v in n.outputs]
            step["args"] = [{"value": v.name, "mem": mem, "offset": off, "bytes": v.type.nbytes}
                            for v, (mem, off) in zip(values + n.outputs, places)]
            pointers = ", ".join(f"(void*)({mem} + {off})" for mem, off in places)
            self.lines.append(f"  {{ void* a[] = {{{pointers}}}; "
                              f"if (bevir_{kernel}(a)) return {len(self.steps) + 1}; }}")
            for v in n.outputs:
                self.result(v, step)
        self.steps.append(step)


def generate(graph: Graph, cores: int) -> tuple[dict[str, str], dict[str, Node], dict]:
    """(C sources by file name, each kernel's first node by kernel name, manifest) of the
    programs."""
    parts = stages(graph)
    device = {id(n) for dev, nodes in parts if dev for n in nodes}
    layout = plan_layout(graph, device, cores)
    # each kernel's first node; lowering waits until a kernel's source is not cached
    kernels: dict[str, Node] = {}
    node_kernel: dict[str, str] = {}
    for n in graph.nodes:
        if id(n) in device and n.op != "barrier":
            node_kernel[n.name] = kernel_name(n)
            kernels.setdefault(node_kernel[n.name], n)
    writers = [_CoreWriter(k, layout, device) for k in range(cores)]
    entries: list[list[str]] = [[] for _ in range(cores)]
    device_stage = 0
    for dev, nodes in parts:
        if not dev:
            continue
        for w in writers:
            w.lines.append(f"int bevir_core{w.core}_stage{device_stage}(uint8_t* ddr, uint8_t* ocm, "
                           "int64_t* flags, int64_t epoch, int64_t* bar) {")
        for n in nodes:
            for w in writers:
                if n.op == "barrier" or _core(n) == w.core:
                    w.node(n, node_kernel.get(n.name))
        for w in writers:
            w.lines += ["  return 0;", "}", ""]
            entries[w.core].append(f"bevir_core{w.core}_stage{device_stage}")
        device_stage += 1
    sources = {}
    for w in writers:
        used = sorted({s["kernel"] for s in w.steps if s["kernel"]})
        head = ["/* generated by bevir: the program of core %d */" % w.core,
                "#include <stdint.h>", "#include <string.h>",
                "void bevir_wait(int64_t*, int64_t);", "void bevir_publish(int64_t*, int64_t);",
                "void bevir_barrier(int64_t*, int64_t);"]
        head += [f"int bevir_{k}(void** data);" for k in used] + [""]
        sources[f"core{w.core}.c"] = "\n".join(head + w.lines)
    manifest = {
        "format": "bevir-program", "version": 1, "graph": graph.name, "cores": cores,
        "stages": [{"device": dev, "nodes": len(nodes)} for dev, nodes in parts],
        "ddr_bytes": layout.ddr_size, "ocm_bytes": layout.ocm_size,
        "ddr": layout.ddr, "flags": layout.flags,
        "ocm": [{"value": v, "core": c, "offset": o} for (v, c), o in sorted(layout.ocm.items())],
        "kernels": {name: {"op": n.op, "signature": signature(n), "file": f"kernels/{name}.c",
                           "node": n.name, "loc": n.loc}
                    for name, n in sorted(kernels.items())},
        "programs": [{"core": w.core, "entries": entries[w.core], "steps": w.steps}
                     for w in writers],
    }
    return sources, kernels, manifest


def compile(graph: Graph, out: str | Path, hw: str | None = None,
            cores: int | None = None, progress: bool | None = None) -> CompiledProgram:
    """Compile ``graph`` into folder ``out`` and build it. With ``hw`` (a preset, a vendor
    string such as "QC-U 8MB 16MAC x4"), a copy of the graph is partitioned for its cores
    by its cycle model (``cores`` overrides) and its OCM planned; with ``cores`` alone it
    is partitioned and every value stays in DDR; with neither, the graph is taken as it is
    (partitioned already, or one core). ``progress`` shows a bar over the kernel builds
    (``None``: when stderr is a terminal). Returns the loaded program."""
    out = Path(out)
    key = _plan_key(graph, hw, cores)
    ops = sorted({n.op: n.opdef for n in graph.nodes}.items())
    built = cache_dir().parent / "programs" / _digest(
        key, *(f"{name}:{op_code_key(opdef)}" for name, opdef in ops), " ".join(CFLAGS),
        os.environ.get("CC", "cc"))
    if (built / "manifest.json").exists():     # built before: the same files, no work
        shutil.copytree(built, out, dirs_exist_ok=True)
        return CompiledProgram.load(out)
    saved = None
    if hw is not None or cores is not None:
        graph, saved = _planned(graph, hw, cores, key)
    program = write_program(graph, out, progress, saved)
    _publish(lambda tmp: shutil.copytree(out, tmp, dirs_exist_ok=True), built)
    return program


def _digest(*parts: str) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]


def _publish(fill, cached: Path) -> None:
    """Make the cache folder ``cached`` with ``fill(folder)``, whole or not at all."""
    tmp = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    fill(tmp)
    try:
        tmp.rename(cached)                      # a racing writer's copy wins
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


def _plan_key(graph: Graph, hw: str | None, cores: int | None) -> str:
    """The graph's content (text, constants, meta), ``hw``, ``cores`` and the code of the
    passes: what planning and code generation depend on."""
    from ..ir.serialize import graph_digest, meta_document
    doc, arrays = meta_document(graph)
    h = hashlib.sha256(f"{graph_digest(graph)}|{hw}|{cores}|{code_digest('passes', 'ops', 'ir', 'hw.py')}|"
                       f"{json.dumps(doc, sort_keys=True)}".encode())
    for k in sorted(arrays or {}):
        h.update(k.encode() + np.ascontiguousarray(arrays[k]).tobytes())
    return h.hexdigest()[:20]


def planned(graph: Graph, hw: str | None = None, cores: int | None = None) -> Graph:
    """A copy of ``graph`` partitioned (unless it is) and, with ``hw``, memory-planned, as
    :func:`compile` does. The result is cached on disk by the graph's content (text,
    constants, meta), ``hw``, ``cores`` and the code of the passes, so compiling an
    unchanged graph again plans nothing."""
    return _planned(graph, hw, cores, _plan_key(graph, hw, cores))[0]


def _planned(graph: Graph, hw: str | None, cores: int | None, key: str) -> tuple[Graph, Path]:
    """:func:`planned`, and where the planned graph is saved in the cache."""
    from ..ir.serialize import load, save
    from ..passes import make_pass, optimize
    folder = cache_dir().parent / "plans" / key
    if (folder / "graph.bevir").exists():
        return load(folder / "graph.bevir"), folder / "graph.bevir"
    graph = graph.clone()
    passes = [] if "partition" in graph.meta else [
        make_pass("partition", cores=cores or 0, hw=hw or "")]
    if hw is not None:
        from ..hw import HWConfig
        config = HWConfig.parse(hw)
        if cores:
            config = config.model_copy(update={"cores": cores})
        passes.append(make_pass("plan-memory", hw=config.describe()))
    if passes:
        optimize(graph, passes)             # one pipeline: the input verified once
    _publish(lambda tmp: save(graph, tmp / "graph.bevir"), folder)
    return graph, folder / "graph.bevir"


def write_program(graph: Graph, out: str | Path, progress: bool | None = None,
                  saved: Path | None = None) -> CompiledProgram:
    """Write and build the per-core programs of ``graph`` as it is (its cores are its
    nodes' ``meta["core"]``; memory-planned or not) into folder ``out``. ``saved``: where
    ``graph`` is saved already (as ``graph.bevir``), copied instead of saved again."""
    from ..ir.serialize import constants_path, meta_paths, save
    out = Path(out)
    (out / "kernels").mkdir(parents=True, exist_ok=True)
    cores = graph.meta["partition"]["cores"] if "partition" in graph.meta else \
        1 + max((_core(n) for n in graph.nodes), default=0)
    sources, kernels, manifest = generate(graph, cores)
    (out / "runtime.c").write_text(RUNTIME_C + RUNTIME_SYNC)
    for fname, text in sources.items():
        (out / fname).write_text(text)
    bar = Progress(len(kernels), "kernels", progress)
    # one C compiler per CPU: the per-core programs (the largest files) first, then the
    # kernels in batches of KERNELS_PER_UNIT as their sources come, while the next ones
    # are lowered (one translation unit per batch: the compiler starts and reads TVM's
    # headers once per batch, not once per kernel)
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        programs = {f: pool.submit(_object, out / f) for f in ["runtime.c", *sources]}
        batches, batch = [], []
        for name, n in bar.iterate(sorted(kernels.items())):
            src = _kernel_source(name, n)
            (out / "kernels" / f"{name}.c").write_text(src.read_text())
            batch.append((name, src))
            if len(batch) == KERNELS_PER_UNIT:
                batches.append((batch, pool.submit(_objects, [src for _, src in batch])))
                batch = []
        if batch:
            batches.append((batch, pool.submit(_objects, [src for _, src in batch])))
        objects = {name: built.result() for batch, built in batches for name, _ in batch}
        objects.update((f, built.result()) for f, built in programs.items())
    bar.close()
    manifest_text = json.dumps(manifest, indent=1) + "\n"
    (out / "manifest.json").write_text(manifest_text)
    if saved is None:
        save(graph, out / "graph.bevir")
    else:
        for src in (saved, constants_path(saved), *meta_paths(saved)):
            dst = out / src.name
            dst.unlink(missing_ok=True)
            if src.exists():
                shutil.copyfile(src, dst)
    for k in range(cores):
        used = sorted({objects[s["kernel"]] for s in manifest["programs"][k]["steps"]
                       if s["kernel"]})
        build_shared([objects[f"core{k}.c"], objects["runtime.c"], *used], out / f"core{k}.so")
    # the graph just saved, not read back; the manifest as written (JSON types)
    return CompiledProgram(out, graph, json.loads(manifest_text))


def _kernel_source(name: str, node: Node) -> Path:
    """The C source of ``node``'s kernel in the cache; lowered, built to TIR and printed
    only when the cache does not hold it (:func:`~bevir.codegen.lower.source_key`)."""
    src = cache_dir() / f"{name}_{source_key(node)}.program.c"
    if not src.exists():
        io = [(v.type.shape, dtype_name(v.type)) for v in node.inputs if v is not None] + \
             [(v.type.shape, dtype_name(v.type)) for v in node.outputs]
        tmp = src.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(c_kernel_source(kernel_def(node), io))
        tmp.replace(src)
    return src


#: kernels compiled together in one translation unit
KERNELS_PER_UNIT = 16


def _object(src: Path, key_text: bytes | None = None, what: str | None = None) -> Path:
    """``src`` compiled to an object file, cached by the hash of ``key_text`` (default: its
    text) and the flags."""
    import subprocess
    text = src.read_bytes() if key_text is None else key_text
    key = hashlib.sha256(text + " ".join(CFLAGS).encode()).hexdigest()[:20]
    obj = cache_dir() / f"{src.stem}_{key}.o"
    if not obj.exists():
        tmp = obj.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp.o")
        cmd = [os.environ.get("CC", "cc"), *CFLAGS, "-c", *(f"-I{d}" for d in include_dirs()),
               str(src), "-o", str(tmp)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise CodegenError(f"C build of {what or src.name} failed: "
                               f"{done.stderr.strip()[-500:]}")
        tmp.replace(obj)
    return obj


def _objects(srcs: list[Path]) -> Path:
    """The kernel sources ``srcs`` (cached files) compiled as one translation unit, which
    includes them, into one object file cached by the hash of their texts."""
    texts = b"".join(src.read_bytes() for src in srcs)
    unit = cache_dir() / f"kernels_{hashlib.sha256(texts).hexdigest()[:20]}.c"
    if not unit.exists():
        tmp = unit.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text("".join(f'#include "{src.resolve()}"\n' for src in srcs))
        tmp.replace(unit)
    return _object(unit, texts, f"{len(srcs)} kernels from {srcs[0].name}")


class CompiledProgram:
    """A compiled folder (see :func:`compile`): the per-core libraries and the graph."""

    def __init__(self, out: Path, graph: Graph | None, manifest: dict):
        """``graph``: the compiled graph, or None to read ``out/graph.bevir`` when needed."""
        self.out, self.manifest = out, manifest
        if graph is not None:
            self.graph = graph
        self.cores = manifest["cores"]
        self.libs = [ctypes.CDLL(str(out / f"core{k}.so")) for k in range(self.cores)]
        self._epoch = 0

    @functools.cached_property
    def graph(self) -> Graph:
        from ..ir.serialize import load
        return load(self.out / "graph.bevir")

    @functools.cached_property
    def _stages(self) -> list:
        return stages(self.graph)

    @functools.cached_property
    def _values(self) -> dict[str, Value]:
        return {v.name: v for v in self.graph.values()}

    @functools.cached_property
    def _crossing(self) -> set[str]:
        """The values that cross between host and device stages, and the outputs."""
        side = {id(n): dev for dev, nodes in self._stages for n in nodes}
        g = self.graph
        return {v.name for v in g.outputs.values()} | {
            v.name for n in g.nodes for v in n.inputs
            if v is not None and v.producer is not None and side[id(v.producer)] != side[id(n)]}

    @classmethod
    def load(cls, out: str | Path) -> CompiledProgram:
        """The program compiled into folder ``out`` (its graph read when first needed)."""
        out = Path(out)
        manifest = json.loads((out / "manifest.json").read_text())
        if manifest.get("format") != "bevir-program":
            raise CodegenError(f"{out}: not a bevir program (manifest.json)")
        return cls(out, None, manifest)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The graph's outputs: host stages on the golden model, device stages on the
        per-core programs, one thread per core."""
        m = self.manifest
        ddr = np.zeros(max(m["ddr_bytes"], 1), np.uint8)
        ocm = [np.zeros(max(n, 1), np.uint8) for n in m["ocm_bytes"]]
        flags = np.zeros(max(len(m["flags"]), 1), np.int64)
        bar = np.zeros(2, np.int64)
        self._epoch += 1
        env: dict[str, np.ndarray] = {}
        interp = Interpreter(self.graph)
        for v in self.graph.constants.values():
            if v.name in m["ddr"]:
                _put(ddr, m["ddr"][v.name], v.const, v)
        device_stage = 0
        for dev, nodes in self._stages:
            if not dev:
                wanted = sorted({v.name for n in nodes for v in n.outputs} & self._crossing)
                if wanted:
                    got = interp.run(inputs, fetch=wanted, initial_env=env)
                    env.update({k: got[k] for k in wanted})
                continue
            for v in self.graph.inputs:
                if v.name in m["ddr"]:
                    _put(ddr, m["ddr"][v.name], inputs[v.name], v)
            for name, arr in env.items():
                if name in m["ddr"]:
                    _put(ddr, m["ddr"][name], arr, self._values[name])
            self._launch(device_stage, ddr, ocm, flags, bar)
            for n in nodes:
                for v in n.outputs:
                    if v.name in m["ddr"] and v.name in self._crossing:
                        env[v.name] = _get(ddr, m["ddr"][v.name], v)
            device_stage += 1
        self.arenas = (ddr, ocm)        # what the last run left, for inspection
        outs = {}
        for name, v in self.graph.outputs.items():
            outs[name] = env[v.name] if v.name in env else interp.run(
                inputs, fetch=[v.name], initial_env=env)[v.name]
        return outs

    def _launch(self, stage: int, ddr, ocm, flags, bar) -> None:
        errors = [0] * self.cores

        def work(k):
            fn = getattr(self.libs[k], f"bevir_core{k}_stage{stage}")
            fn.restype = ctypes.c_int
            errors[k] = fn(ctypes.c_void_p(ddr.ctypes.data), ctypes.c_void_p(ocm[k].ctypes.data),
                           ctypes.c_void_p(flags.ctypes.data), ctypes.c_int64(self._epoch),
                           ctypes.c_void_p(bar.ctypes.data))
        threads = [threading.Thread(target=work, args=(k,)) for k in range(self.cores)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for k, e in enumerate(errors):
            if e:
                step = self.manifest["programs"][k]["steps"][e - 1]
                raise CodegenError(f"kernel {step['kernel']} failed on core {k}", op=step["op"],
                                   node=step["node"], loc=step["loc"])


def _put(ddr: np.ndarray, offset: int, array: np.ndarray, v: Value) -> None:
    a = np.require(np.asarray(array, dtype_name(v.type)), requirements="C")
    ddr[offset:offset + a.nbytes] = a.reshape(-1).view(np.uint8)


def _get(ddr: np.ndarray, offset: int, v: Value) -> np.ndarray:
    n = v.type.nbytes
    return ddr[offset:offset + n].view(dtype_name(v.type)).reshape(v.type.shape).copy()
