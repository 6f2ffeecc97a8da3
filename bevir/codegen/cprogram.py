"""Per-core C programs: a lowered graph's schedule (bevir/target/schedule.py: where each
value lives, what each core does) as one C program per core that calls the generated
kernels in order, copies between DDR and its OCM, waits for the values other cores make,
and counts what it does; built with the system C compiler into one library per core that
needs only libc; run with one thread per core.

    program = write_program(planned_graph, "out/")      # bevir.compile plans, then this
    outputs = program.run(inputs)                          # or CompiledProgram.load("out/")
    program.counters()                                     # per core and step, and totals

Code generation only generates: the graph comes partitioned and memory-planned as it is
meant to run (``bevir.compile`` / ``bevir.flows.target`` plan it), and every copy, wait
and in-place DDR access the programs make is a step of its schedule, so the bytes the
programs count are the bytes the cycle model charges.

Stages. Float nodes run on the host through the golden model; the program has one entry
per core and device stage, so a quantized network runs as host pre-processing, the cores,
host post-processing.

Files in the output folder: ``kernels/<kernel>.c`` (TVM's C with an entry taking data
pointers), ``core<k>.c`` (the program of core k), ``runtime.c`` (barrier, flags, the few
functions TVM's C calls), ``core<k>.so``, ``manifest.json`` (kernels, buffers, offsets,
copies, waits and counters per core, with provenance) and ``graph.bevir`` (the graph,
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
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..errors import CodegenError
from ..ir.graph import Graph, Node, Value
from ..progress import Progress
from ..sim.interpreter import Interpreter
from ..target.schedule import MemoryMap, Place, Step, graph_cores, schedule_of, stages
from ..target.trace import COMPUTE, DMA, HOST_PID, Trace
from .build import CFLAGS, RUNTIME_C, build_shared, c_kernel_source, cache_dir, include_dirs
from .lower import dtype_name, kernel_def, kernel_name, signature, source_key

RUNTIME_SYNC = r"""
#include <sched.h>
#include <time.h>
/* the host's monotonic clock in ns, for the measured trace (bevir exec --trace) */
void bevir_stamp(int64_t* t) {
  struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
  *t = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
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


#: what the programs count per step (bevir exec --counters): bytes moved between DDR and
#: OCM, DMA transfers, waits (flags and barriers), kernel calls
COUNTERS = ("ddr_bytes", "transfers", "waits", "kernel_calls")


#: when each step passes each point, measured on the host (bevir exec --trace): its
#: begin, its waits done, its loads done, its kernel done, its stores done, its end
STAMPS = ("begin", "waited", "loaded", "computed", "stored", "end")


def _stamp(index: int, point: str) -> str:
    return f"  bevir_stamp(tm + {len(STAMPS) * index + STAMPS.index(point)});"


def _count(index: int, **fields: int) -> str:
    """The C that adds to step ``index``'s counters."""
    return " ".join(f"cnt[{len(COUNTERS) * index + COUNTERS.index(k)}] += {v};"
                    for k, v in fields.items() if v)


class _CoreWriter:
    """Emits one core's steps as C: waits, loads, the kernel call, stores, flags, and the
    counters of each."""

    def __init__(self, core: int, memory: MemoryMap, kernels: dict[str, str]):
        self.core, self.memory, self.kernels = core, memory, kernels
        self.lines: list[str] = []
        self.steps: list[dict] = []

    @staticmethod
    def ptr(place: Place) -> str:
        return f"{place.mem} + {place.offset}"

    def copy(self, dst: str, src: str, nbytes: int) -> None:
        self.lines.append(f"  memcpy({dst}, {src}, {nbytes});")

    def step(self, step: Step) -> None:
        n, s = step.node, len(self.steps)
        kernel = self.kernels.get(n.name) if step.kernel else None
        out = self.lines
        out.append(f"  /* {n.name} = {n.op} from '{n.loc}' */")
        out.append(_stamp(s, "begin"))
        for v in step.waits:
            out.append(f"  bevir_wait(flags + {self.memory.flags[v]}, epoch); "
                       + _count(s, waits=1))
        out.append(_stamp(s, "waited"))
        for t in step.loads:
            self.copy(f"ocm + {t.ocm}", f"ddr + {t.ddr}", t.nbytes)
            out.append("  " + _count(s, ddr_bytes=t.nbytes, transfers=1))
        for src, dst in step.copies:         # a barrier: this core's pieces pass through
            self.copy(self.ptr(dst.place), self.ptr(src.place), src.nbytes)
        out.append(_stamp(s, "loaded"))
        if step.kernel:
            pointers = ", ".join(f"(void*)({self.ptr(a.place)})" for a in step.args)
            out.append(f"  {{ void* a[] = {{{pointers}}}; if (bevir_{kernel}(a)) return {s + 1}; }}")
            out.append("  " + _count(s, kernel_calls=1))
        out.append(_stamp(s, "computed"))
        in_place = step.ddr_args()
        if in_place:
            out.append("  " + _count(s, ddr_bytes=sum(a.nbytes for a in in_place),
                                     transfers=len(in_place)))
        for t in step.stores:
            self.copy(f"ddr + {t.ddr}", f"ocm + {t.ocm}", t.nbytes)
            out.append("  " + _count(s, ddr_bytes=t.nbytes, transfers=1))
        out.append(_stamp(s, "stored"))
        for v in step.publishes:
            out.append(f"  bevir_publish(flags + {self.memory.flags[v]}, epoch);")
        if step.barrier:
            out.append(f"  bevir_barrier(bar, {self.memory.cores}); " + _count(s, waits=1))
        out.append(_stamp(s, "end"))
        self.steps.append({"node": n.name, "op": n.op, "loc": n.loc, "kernel": kernel,
                           "loads": [t.value for t in step.loads], "waits": list(step.waits),
                           "stores": [t.value for t in step.stores],
                           "args": [{"value": a.value, "mem": a.place.mem,
                                     "offset": a.place.offset, "bytes": a.nbytes}
                                    for a in step.args],
                           "ddr_bytes": step.ddr_bytes, "transfers": len(step.transfers()),
                           **({"barrier": True} if step.barrier else {})})


def generate(graph: Graph, cores: int | None = None
             ) -> tuple[dict[str, str], dict[str, Node], dict]:
    """(C sources by file name, each kernel's first node by kernel name, manifest) of the
    programs of ``graph``'s schedule (:func:`~bevir.target.schedule.schedule_of`)."""
    sched = schedule_of(graph, cores)
    # each kernel's first node; lowering waits until a kernel's source is not cached
    kernels: dict[str, Node] = {}
    node_kernel: dict[str, str] = {}
    for step in sched.steps():
        if step.kernel and step.node.name not in node_kernel:
            node_kernel[step.node.name] = kernel_name(step.node)
            kernels.setdefault(node_kernel[step.node.name], step.node)
    writers = [_CoreWriter(k, sched.memory, node_kernel) for k in range(sched.cores)]
    entries: list[list[str]] = [[] for _ in range(sched.cores)]
    for device_stage, stage in enumerate(s for s in sched.stages if s.device):
        for w, steps in zip(writers, stage.steps):
            w.lines.append(f"int bevir_core{w.core}_stage{device_stage}(uint8_t* ddr, "
                           "uint8_t* ocm, int64_t* flags, int64_t epoch, int64_t* bar, "
                           "int64_t* cnt, int64_t* tm) {")
            for step in steps:
                w.step(step)
            w.lines += ["  return 0;", "}", ""]
            entries[w.core].append(f"bevir_core{w.core}_stage{device_stage}")
    sources = {}
    for w in writers:
        used = sorted({s["kernel"] for s in w.steps if s["kernel"]})
        head = ["/* generated by bevir: the program of core %d */" % w.core,
                "#include <stdint.h>", "#include <string.h>",
                "void bevir_wait(int64_t*, int64_t);", "void bevir_publish(int64_t*, int64_t);",
                "void bevir_barrier(int64_t*, int64_t);", "void bevir_stamp(int64_t*);"]
        head += [f"int bevir_{k}(void** data);" for k in used] + [""]
        sources[f"core{w.core}.c"] = "\n".join(head + w.lines)
    mem = sched.memory
    manifest = {
        "format": "bevir-program", "version": 2, "graph": graph.name, "cores": sched.cores,
        "stages": [{"device": st.device, "nodes": len(st.nodes)} for st in sched.stages],
        "ddr_bytes": mem.ddr_size, "ocm_bytes": mem.ocm_size,
        "ddr": mem.ddr, "flags": mem.flags, "counters": list(COUNTERS),
        "stamps": list(STAMPS),
        "ocm": [{"value": v, "core": c, "offset": o} for (v, c), o in sorted(mem.ocm.items())],
        "kernels": {name: {"op": n.op, "signature": signature(n), "file": f"kernels/{name}.c",
                           "node": n.name, "loc": n.loc}
                    for name, n in sorted(kernels.items())},
        "programs": [{"core": w.core, "entries": entries[w.core], "steps": w.steps}
                     for w in writers],
    }
    return sources, kernels, manifest


def write_program(graph: Graph, out: str | Path, progress: bool | None = None,
                  saved: Path | None = None) -> CompiledProgram:
    """Write and build the per-core programs of ``graph`` as it is (its cores are its
    nodes' ``meta["core"]``; memory-planned or not) into folder ``out``. ``saved``: where
    ``graph`` is saved already (as ``graph.bevir``), copied instead of saved again."""
    from ..ir.serialize import constants_path, meta_paths, save
    out = Path(out)
    (out / "kernels").mkdir(parents=True, exist_ok=True)
    cores = graph_cores(graph)
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
        per-core programs, one thread per core. What the programs did is then in
        :meth:`counters`."""
        m = self.manifest
        ddr = np.zeros(max(m["ddr_bytes"], 1), np.uint8)
        ocm = [np.zeros(max(n, 1), np.uint8) for n in m["ocm_bytes"]]
        flags = np.zeros(max(len(m["flags"]), 1), np.int64)
        bar = np.zeros(2, np.int64)
        self._counts = [np.zeros(max(len(p["steps"]), 1) * len(COUNTERS), np.int64)
                        for p in m["programs"]]
        self._stamps = [np.zeros(max(len(p["steps"]), 1) * len(STAMPS), np.int64)
                        for p in m["programs"]]
        self._host_times: list[tuple[int, int, int, int]] = []  # stage, nodes, begin, end
        self._epoch += 1
        env: dict[str, np.ndarray] = {}
        interp = Interpreter(self.graph)
        for v in self.graph.constants.values():
            if v.name in m["ddr"]:
                _put(ddr, m["ddr"][v.name], v.const, v)
        device_stage = 0
        for stage, (dev, nodes) in enumerate(self._stages):
            if not dev:
                wanted = sorted({v.name for n in nodes for v in n.outputs} & self._crossing)
                if wanted:
                    begin = time.monotonic_ns()
                    got = interp.run(inputs, fetch=wanted, initial_env=env)
                    env.update({k: got[k] for k in wanted})
                    self._host_times.append((stage, len(nodes), begin,
                                             time.monotonic_ns()))
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
                           ctypes.c_void_p(bar.ctypes.data),
                           ctypes.c_void_p(self._counts[k].ctypes.data),
                           ctypes.c_void_p(self._stamps[k].ctypes.data))
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


    def counters(self) -> dict:
        """What the programs counted in the last run: per core, per step (node, op, source
        layer and each of :data:`COUNTERS`), the core's totals; and the totals of all cores
        (``ddr_bytes``: bytes moved between DDR and OCM in one frame)."""
        if not hasattr(self, "_counts"):
            raise CodegenError("the program has not run yet: no counters")
        width = len(COUNTERS)
        cores = []
        for program, counts in zip(self.manifest["programs"], self._counts):
            steps = [{"node": st["node"], "op": st["op"], "loc": st["loc"],
                      **dict(zip(COUNTERS, map(int, counts[i * width:(i + 1) * width])))}
                     for i, st in enumerate(program["steps"])]
            totals = {k: sum(st[k] for st in steps) for k in COUNTERS}
            cores.append({"core": program["core"], "steps": steps, **totals})
        return {"cores": cores, **{k: sum(c[k] for c in cores) for k in COUNTERS}}

    def trace(self) -> Trace:
        """The last run as a trace (Perfetto, chrome://tracing), times measured on this
        host: per core each step's waits, its copies between DDR and OCM (the DMA lane) and
        its kernel, named after its node with op and source layer; the host stages."""
        if not hasattr(self, "_stamps"):
            raise CodegenError("the program has not run yet: no trace")
        starts = [int(t[t > 0].min()) for t in self._stamps if (t > 0).any()]
        t0 = min(starts + [b for _, _, b, _ in self._host_times], default=0)
        trace = Trace(1e-3, {"source": "bevir exec (measured on the host)", "unit": "ns",
                             "program": str(self.out), "cores": self.cores})
        trace.process(HOST_PID, "host", {0: "host"})
        for stage, nodes, begin, end in self._host_times:
            trace.slice(HOST_PID, 0, f"host stage {stage}", begin - t0, end - t0, "host",
                        {"nodes": nodes})
        width = len(STAMPS)
        for program, stamps in zip(self.manifest["programs"], self._stamps):
            pid = program["core"] + 1
            trace.process(pid, f"core {program['core']}", {COMPUTE: "compute", DMA: "DMA"})
            for i, st in enumerate(program["steps"]):
                at = dict(zip(STAMPS, (int(x) - t0 for x in stamps[i * width:(i + 1) * width])))
                _trace_step(trace, pid, st, at)
        return trace


def _trace_step(trace: Trace, pid: int, step: dict, at: dict[str, int]) -> None:
    """One step of a core's program in ``trace``, at its measured points ``at``."""
    info = {"node": step["node"], "loc": step["loc"]}
    if step["waits"]:
        trace.slice(pid, COMPUTE, "wait", at["begin"], at["waited"], "wait",
                    {"before": step["node"], "values": step["waits"]})
    if at["loaded"] > at["waited"]:
        trace.slice(pid, DMA, "dma in", at["waited"], at["loaded"], "dma",
                    {**info, "values": step["loads"]})
    if step.get("barrier"):
        trace.slice(pid, COMPUTE, step["node"], at["stored"], at["end"], "barrier",
                    {"op": step["op"], "loc": step["loc"]})
    else:
        trace.slice(pid, COMPUTE, step["node"], at["loaded"], at["computed"], "kernel",
                    {"op": step["op"], "loc": step["loc"], "kernel": step["kernel"],
                     "ddr_bytes": step["ddr_bytes"]})
    if at["stored"] > at["computed"]:
        trace.slice(pid, DMA, "dma out", at["computed"], at["stored"], "dma",
                    {**info, "values": step["stores"]})


def _put(ddr: np.ndarray, offset: int, array: np.ndarray, v: Value) -> None:
    a = np.require(np.asarray(array, dtype_name(v.type)), requirements="C")
    ddr[offset:offset + a.nbytes] = a.reshape(-1).view(np.uint8)


def _get(ddr: np.ndarray, offset: int, v: Value) -> np.ndarray:
    n = v.type.nbytes
    return ddr[offset:offset + n].view(dtype_name(v.type)).reshape(v.type.shape).copy()
