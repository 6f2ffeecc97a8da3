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

DMA. Each core's entry runs beside a DMA engine (a thread with a queue, in the runtime): a
load the memory plan placed is issued to it and the core goes on; the first step reading
the load waits for its ticket; the engine is drained when the entry returns.

Stages. Float nodes run on the host through the golden model; the program has one entry
per core and device stage, so a quantized network runs as host pre-processing, the cores,
host post-processing.

Files in the output folder: ``kernels/<kernel>.c`` (TVM's C with an entry taking data
pointers), ``core<k>.c`` (the program of core k), ``runtime.c`` (barrier, flags, the few
functions TVM's C calls), ``core<k>.so``, ``manifest.json`` (kernels, buffers, offsets,
copies, waits and counters per core, with provenance; the sha256 of each library and of
the graph), ``manifest.c`` (the manifest's digest, linked into each library) and
``graph.bevir`` (the graph, for the host stages). The same graph gives byte-identical
sources and manifest. The folder is built beside its target and swapped in whole; what
``CompiledProgram`` checks before it loads anything is in :mod:`bevir.codegen.verify`.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..errors import CodegenError
from ..fsutil import atomic_path, building_folder, read_json, run_child, sha256_file, write_atomic
from ..ir.graph import Graph, Node, Value
from ..progress import Progress
from ..sim.interpreter import Interpreter
from ..target.check import check_schedule
from ..target.schedule import MemoryMap, Place, Step, graph_cores, schedule_of, stages
from ..target.trace import COMPUTE, DMA, HOST_PID, Trace
from .build import CFLAGS, RUNTIME_C, build_shared, c_kernel_source, cache_dir, include_dirs
from .lower import dtype_name, kernel_def, kernel_name, signature, source_key
from .verify import check_layout, check_manifest, digest_source, open_libraries, read_checked

RUNTIME_SYNC = r"""
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
/* a run's control block, shared by its cores: [0] set once a core failed, [1] the longest a
   core may wait (ns); per core k: [2 + 2k] what it waits for (flag index + 1, -1: a
   barrier), [3 + 2k] the barriers it has reached */
static int64_t* bevir_ctl;
static __thread int64_t bevir_self;
static __thread int64_t* bevir_flags;
static __thread jmp_buf* bevir_leave;
void bevir_control(int64_t* ctl) { bevir_ctl = ctl; }
static int64_t bevir_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}
/* the host's monotonic clock in ns, for the measured trace (bevir exec --trace) */
void bevir_stamp(int64_t* t) { *t = bevir_now(); }
/* one turn of a wait: leave the core's entry (bevir_run returns -1) once another core
   failed, or -2 once this wait took longer than the limit */
static void bevir_waiting(int64_t* since, int64_t* turns, int64_t what) {
  if (++*turns % 1024 == 0) {
    if (__atomic_load_n(&bevir_ctl[0], __ATOMIC_ACQUIRE)) longjmp(*bevir_leave, -1);
    int64_t now = bevir_now();
    if (*since == 0) {
      *since = now;
      bevir_ctl[2 + 2 * bevir_self] = what;
    } else if (now - *since > bevir_ctl[1]) {
      __atomic_store_n(&bevir_ctl[0], 1, __ATOMIC_RELEASE);
      longjmp(*bevir_leave, -2);
    }
  }
  sched_yield();
}
/* ready flags: a value's producer publishes the run's epoch once the value is in DDR */
void bevir_publish(int64_t* flag, int64_t epoch) { __atomic_store_n(flag, epoch, __ATOMIC_RELEASE); }
void bevir_wait(int64_t* flag, int64_t epoch) {
  int64_t since = 0, turns = 0;
  while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) != epoch)
    bevir_waiting(&since, &turns, flag - bevir_flags + 1);
  bevir_ctl[2 + 2 * bevir_self] = 0;
}
/* a full barrier of n cores: bar[0] counts arrivals, bar[1] is the generation */
void bevir_barrier(int64_t* bar, int64_t n) {
  int64_t gen = __atomic_load_n(&bar[1], __ATOMIC_ACQUIRE);
  __atomic_add_fetch(&bevir_ctl[3 + 2 * bevir_self], 1, __ATOMIC_RELEASE);
  if (__atomic_add_fetch(&bar[0], 1, __ATOMIC_ACQ_REL) == n) {
    __atomic_store_n(&bar[0], 0, __ATOMIC_RELAXED);
    __atomic_store_n(&bar[1], gen + 1, __ATOMIC_RELEASE);
  } else {
    int64_t since = 0, turns = 0;
    while (__atomic_load_n(&bar[1], __ATOMIC_ACQUIRE) == gen) bevir_waiting(&since, &turns, -1);
  }
  bevir_ctl[2 + 2 * bevir_self] = 0;
}
/* a core's DMA engine: a thread that runs the copies the core issues, in order, while
   the core goes on; ticket k is done once done >= k */
#define BEVIR_DMA_QUEUE 1024
typedef struct { uint8_t* dst; const uint8_t* src; int64_t n; } bevir_dma_job;
typedef struct {
  bevir_dma_job queue[BEVIR_DMA_QUEUE];
  int64_t issued, done, stop;
  pthread_t thread;
} bevir_dma_engine;
static __thread bevir_dma_engine* bevir_dma;
static void* bevir_dma_loop(void* arg) {
  bevir_dma_engine* e = arg;
  for (int64_t next = 0;;) {
    if (next < __atomic_load_n(&e->issued, __ATOMIC_ACQUIRE)) {
      bevir_dma_job* j = &e->queue[next % BEVIR_DMA_QUEUE];
      memcpy(j->dst, j->src, j->n);
      __atomic_store_n(&e->done, ++next, __ATOMIC_RELEASE);
    } else if (__atomic_load_n(&e->stop, __ATOMIC_ACQUIRE)) {
      return NULL;
    } else {
      sched_yield();
    }
  }
}
int64_t bevir_dma_issue(uint8_t* dst, const uint8_t* src, int64_t n) {
  bevir_dma_engine* e = bevir_dma;
  int64_t k = e->issued;
  while (k - __atomic_load_n(&e->done, __ATOMIC_ACQUIRE) >= BEVIR_DMA_QUEUE) sched_yield();
  e->queue[k % BEVIR_DMA_QUEUE] = (bevir_dma_job){dst, src, n};
  __atomic_store_n(&e->issued, k + 1, __ATOMIC_RELEASE);
  return k + 1;
}
void bevir_dma_wait(int64_t ticket) {
  while (__atomic_load_n(&bevir_dma->done, __ATOMIC_ACQUIRE) < ticket) sched_yield();
}
/* the engine finishes what was issued and stops */
static void bevir_dma_stop(bevir_dma_engine* e) {
  __atomic_store_n(&e->stop, 1, __ATOMIC_RELEASE);
  pthread_join(e->thread, NULL);
  free(e);
}
/* runs one core's entry: its result (the failed step + 1, or 0), -1 when it stopped
   because another core failed, -2 when a wait took longer than the limit, -3 when its
   DMA engine could not start */
typedef int (*bevir_entry)(uint8_t*, uint8_t*, int64_t*, int64_t, int64_t*, int64_t*,
                           int64_t*);
int bevir_run(bevir_entry entry, int64_t core, uint8_t* ddr, uint8_t* ocm, int64_t* flags,
              int64_t epoch, int64_t* bar, int64_t* cnt, int64_t* tm) {
  jmp_buf here;
  bevir_self = core;
  bevir_flags = flags;
  bevir_dma_engine* engine = calloc(1, sizeof *engine);
  if (!engine || pthread_create(&engine->thread, NULL, bevir_dma_loop, engine)) {
    free(engine);
    __atomic_store_n(&bevir_ctl[0], 1, __ATOMIC_RELEASE);
    return -3;
  }
  bevir_dma = engine;
  int left = setjmp(here);
  if (left) {
    bevir_dma_stop(engine);
    return left;
  }
  bevir_leave = &here;
  int failed = entry(ddr, ocm, flags, epoch, bar, cnt, tm);
  bevir_dma_stop(engine);
  if (failed) __atomic_store_n(&bevir_ctl[0], 1, __ATOMIC_RELEASE);
  return failed;
}
"""  # noqa: E501 (the runtime's C as the programs were built before)


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
        self.tickets: dict[str, str] = {}     # value on the DMA engine -> its ticket variable

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
        for v in step.dma_waits:      # the DMA engine's first: a load below may reuse the
            out.append(f"  bevir_dma_wait({self.tickets.pop(v)});")   # source of a spill
        for t in step.loads:
            self.copy(f"ocm + {t.ocm}", f"ddr + {t.ddr}", t.nbytes)
            out.append("  " + _count(s, ddr_bytes=t.nbytes, transfers=1))
        for src, dst in step.copies:         # a barrier: this core's pieces pass through
            self.copy(self.ptr(dst.place), self.ptr(src.place), src.nbytes)
        out.append(_stamp(s, "loaded"))
        if step.on_engine:                    # issued; the engine copies while the core goes on
            src, dst = step.args
            self.tickets[dst.value] = f"t{s}"
            out.append(f"  int64_t t{s} = bevir_dma_issue({self.ptr(dst.place)}, "
                       f"{self.ptr(src.place)}, {dst.nbytes});")
        if step.kernel:
            pointers = ", ".join(f"(void*)({self.ptr(a.place)})" for a in step.args)
            out.append(f"  {{ void* a[] = {{{pointers}}}; "
                       f"if (bevir_{kernel}(a)) return {s + 1}; }}")
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
    check_schedule(sched)                # every byte a step reads holds its value then
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
            w.tickets.clear()                # the engine is drained at each stage's end
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
                "void bevir_barrier(int64_t*, int64_t);", "void bevir_stamp(int64_t*);",
                "int64_t bevir_dma_issue(uint8_t*, const uint8_t*, int64_t);",
                "void bevir_dma_wait(int64_t);"]
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


#: the names in a compiled folder: a folder holding only these may be compiled over
_PROGRAM_FILES = re.compile(r"manifest\.(json|c)|graph\.(bevir|safetensors|meta\.json|"
                            r"meta\.safetensors)|runtime\.c|core\d+\.(c|so)|kernels")


def check_target(out: Path) -> None:
    """Refuse to compile into ``out`` where that would replace files that are not a
    compiled program's (a compiled folder is swapped in whole)."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise CodegenError(f"cannot compile into {out}: not a folder")
    other = sorted(p.name for p in out.iterdir() if not _PROGRAM_FILES.fullmatch(p.name)) \
        if out.is_dir() else []
    if other:
        raise CodegenError(f"cannot compile into {out}: it holds files that are not a "
                           f"compiled program's ({', '.join(other[:3])}"
                           f"{', ...' if len(other) > 3 else ''}); compile into a new or "
                           "empty folder, or over a compiled program")


def install(built: Path, out: Path) -> CompiledProgram:
    """The program compiled into folder ``built`` copied into ``out`` (swapped in whole),
    loaded (and so checked)."""
    check_target(out)
    with building_folder(out) as tmp:
        shutil.copytree(built, tmp, dirs_exist_ok=True)
    return CompiledProgram.load(out)


def write_program(graph: Graph, out: str | Path, progress: bool | None = None,
                  saved: Path | None = None) -> CompiledProgram:
    """Write and build the per-core programs of ``graph`` as it is (its cores are its
    nodes' ``meta["core"]``; memory-planned or not) into folder ``out``, built beside it
    and swapped in whole. ``saved``: where ``graph`` is saved already (as
    ``graph.bevir``), copied instead of saved again."""
    out = Path(out)
    check_target(out)
    with building_folder(out) as tmp:
        manifest = _write(graph, tmp, progress, saved)
    # the graph just saved, not read back
    return CompiledProgram(out, graph, manifest)


def _write(graph: Graph, out: Path, progress: bool | None, saved: Path | None) -> dict:
    """:func:`write_program` into the empty folder ``out``; returns the manifest as
    written (JSON types)."""
    from ..ir.serialize import constants_path, meta_paths, save
    (out / "kernels").mkdir()
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
    if saved is None:
        save(graph, out / "graph.bevir")
    else:
        for src in (saved, constants_path(saved), *meta_paths(saved)):
            if src.exists():
                shutil.copyfile(src, out / src.name)
    # each library holds the digest of the manifest (the libraries' own digests aside)
    manifest["files"] = {"graph.bevir": sha256_file(out / "graph.bevir")}
    manifest = json.loads(json.dumps(manifest))
    (out / "manifest.c").write_text(digest_source(manifest))
    signed = _object(out / "manifest.c")
    manifest["libraries"] = []
    for k in range(cores):
        used = sorted({objects[s["kernel"]] for s in manifest["programs"][k]["steps"]
                       if s["kernel"]})
        lib = build_shared([objects[f"core{k}.c"], objects["runtime.c"], signed, *used],
                           out / f"core{k}.so")
        manifest["libraries"].append({"file": lib.name, "sha256": sha256_file(lib)})
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _kernel_source(name: str, node: Node) -> Path:
    """The C source of ``node``'s kernel in the cache; lowered, built to TIR and printed
    only when the cache does not hold it (:func:`~bevir.codegen.lower.source_key`)."""
    src = cache_dir() / f"{name}_{source_key(node)}.program.c"
    if not src.exists():
        io = [(v.type.shape, dtype_name(v.type)) for v in node.inputs if v is not None] + \
             [(v.type.shape, dtype_name(v.type)) for v in node.outputs]
        write_atomic(src, c_kernel_source(kernel_def(node), io))
    return src


#: kernels compiled together in one translation unit
KERNELS_PER_UNIT = 16


def _object(src: Path, key_text: bytes | None = None, what: str | None = None) -> Path:
    """``src`` compiled to an object file, cached by the hash of ``key_text`` (default: its
    text) and the flags."""
    text = src.read_bytes() if key_text is None else key_text
    key = hashlib.sha256(text + " ".join(CFLAGS).encode()).hexdigest()[:20]
    obj = cache_dir() / f"{src.stem}_{key}.o"
    if not obj.exists():
        with atomic_path(obj) as tmp:
            cmd = [os.environ.get("CC", "cc"), *CFLAGS, "-c",
                   *(f"-I{d}" for d in include_dirs()), str(src), "-o", str(tmp)]
            done = run_child(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise CodegenError(f"C build of {what or src.name} failed: "
                                   f"{done.stderr.strip()[-500:]}")
    return obj


def _objects(srcs: list[Path]) -> Path:
    """The kernel sources ``srcs`` (cached files) compiled as one translation unit, which
    includes them, into one object file cached by the hash of their texts."""
    texts = b"".join(src.read_bytes() for src in srcs)
    unit = cache_dir() / f"kernels_{hashlib.sha256(texts).hexdigest()[:20]}.c"
    if not unit.exists():
        write_atomic(unit, "".join(f'#include "{src.resolve()}"\n' for src in srcs))
    return _object(unit, texts, f"{len(srcs)} kernels from {srcs[0].name}")


#: the longest one core waits for another (a flag, a barrier) before the run fails, in
#: seconds; $BEVIR_WAIT_SECONDS overrides
WAIT_SECONDS = 300.0


class CompiledProgram:
    """A compiled folder (see :func:`bevir.compile`): the per-core libraries and the graph,
    checked before anything is loaded (:mod:`bevir.codegen.verify`).

    ``wait_seconds``: the longest one core waits for another before the run fails with an
    error naming them (default :data:`WAIT_SECONDS`, or ``$BEVIR_WAIT_SECONDS``)."""

    def __init__(self, out: Path, graph: Graph | None, manifest: dict):
        """``graph``: the compiled graph, or None to read ``out/graph.bevir`` when needed."""
        self.out, self.manifest = out, check_manifest(manifest, out)
        if graph is not None:
            self.graph = graph
        self.cores = manifest["cores"]
        self.libs = open_libraries(out, manifest)
        self._epoch = 0
        self.wait_seconds = float(os.environ.get("BEVIR_WAIT_SECONDS") or WAIT_SECONDS)

    @functools.cached_property
    def graph(self) -> Graph:
        from ..ir.serialize import load
        path = self.out / "graph.bevir"
        read_checked(path, self.manifest["files"]["graph.bevir"])
        graph = load(path)
        check_layout(self.manifest, graph, self.out)
        return graph

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
        return cls(out, None, read_json(out / "manifest.json", CodegenError, kind=None))

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
        """Run device stage ``stage``, one thread per core; every core's failure (a kernel,
        a wait past ``wait_seconds``, an exception) in one CodegenError."""
        ctl = np.zeros(2 + 2 * self.cores, np.int64)     # see RUNTIME_SYNC
        ctl[1] = int(self.wait_seconds * 1e9)
        codes: list[int | BaseException] = [0] * self.cores
        pointer = lambda a: ctypes.c_void_p(a.ctypes.data)  # noqa: E731

        def work(k):
            try:
                lib = self.libs[k]
                entry = ctypes.cast(getattr(lib, f"bevir_core{k}_stage{stage}"), ctypes.c_void_p)
                codes[k] = lib.bevir_run(entry, ctypes.c_int64(k), pointer(ddr), pointer(ocm[k]),
                                         pointer(flags), ctypes.c_int64(self._epoch),
                                         pointer(bar), pointer(self._counts[k]),
                                         pointer(self._stamps[k]))
            except BaseException as e:       # noqa: BLE001  (reported with the others)
                codes[k] = e
                ctl[0] = 1                      # the other cores stop waiting
        for lib in self.libs:
            lib.bevir_control(pointer(ctl))
            lib.bevir_run.restype = ctypes.c_int
        threads = [threading.Thread(target=work, args=(k,)) for k in range(self.cores)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        failures = [self._failure(k, code, ctl) for k, code in enumerate(codes)
                    if isinstance(code, BaseException) or code > 0 or code in (-2, -3)]
        if failures:
            raise CodegenError(f"device stage {stage} failed: " + "; ".join(failures))

    def _failure(self, k: int, code: int | BaseException, ctl: np.ndarray) -> str:
        """What went wrong on core ``k``: ``code`` as :func:`bevir_run` returned it."""
        if isinstance(code, BaseException):
            return f"core {k}: {type(code).__name__}: {code}"
        if code == -3:
            return f"core {k}: its DMA engine (a thread) could not start"
        steps = self.manifest["programs"][k]["steps"]
        if code > 0:
            step = steps[code - 1] if code <= len(steps) else {}
            return (f"core {k}: kernel {step.get('kernel')} failed (op '{step.get('op')}' "
                    f"node {step.get('node')} from '{step.get('loc')}')")
        waited, reached = int(ctl[2 + 2 * k]), ctl[3::2]
        if waited > 0:
            name = next((v for v, i in self.manifest["flags"].items() if i == waited - 1), "?")
            p = self._values.get(name)
            producer = p.producer.meta.get("core", 0) if p is not None and p.producer else "?"
            return (f"core {k} waited {self.wait_seconds:g} s for value %{name} from core "
                    f"{producer}, which never stored it")
        late = [j for j in range(self.cores) if reached[j] < reached[k]]
        return (f"core {k} waited {self.wait_seconds:g} s at barrier {int(reached[k])} for "
                f"core(s) {late or '?'}, which never reached it")

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
