"""check_schedule: a schedule replayed on a symbolic memory before anything runs it. A
planned schedule passes; each way a plan can hand a step the wrong bytes (a load missing,
a reader not waiting for its prefetch, a store of a value still in flight, two live values
in one OCM range) is refused naming the step; a host node never reads through a load the
device made for it."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

import bevir
from bevir.flows.target import compile_program
from bevir.ir.types import DType, TensorType
from bevir.passes import make_pass
from bevir.target import HWConfig, ScheduleError, check_schedule, schedule_of
from bevir.target.schedule import Transfer, lowerable
from bevir.testing import assert_bit_exact
from tests.shared import fx, ints, partitioned, prefetching


@pytest.fixture
def sched(rng):
    graph, _ = prefetching(rng)
    hw = HWConfig.parse("QC-U 100KB 16MAC")
    s = schedule_of(bevir.optimize(partitioned(graph, 1), [make_pass("plan-memory", hw=hw)]))
    check_schedule(s)                      # the plan as made passes
    assert any(st.prefetch for st in s.steps())
    return s


def first(sched, pred):
    return next(st for st in sched.steps() if pred(st))


def test_a_reader_that_does_not_wait_for_its_prefetch_is_refused(sched):
    loaded = {st.args[-1].value for st in sched.steps() if st.prefetch}
    reader = first(sched, lambda st: loaded & set(st.dma_waits))
    reader.dma_waits.clear()
    with pytest.raises(ScheduleError, match="while the prefetch of .* may still write it") as e:
        check_schedule(sched)
    assert e.value.node == reader.node.name


def test_a_spill_is_waited_for_before_its_source_is_overwritten(sched):
    """The skip's store runs on the DMA engine while the first linear runs (which reads
    the skip where it is); the step after it waits for the store. Without that wait, a
    later step writes over the store's source while it may still be in flight."""
    spill = first(sched, lambda st: st.spill)
    assert spill.node.meta["async"] and spill.node.inputs[0].name == "skip"
    steps = list(sched.steps(spill.core))
    at = steps.index(spill)
    kernel = next(k for k in range(at + 1, len(steps)) if steps[k].node.op != "dma_copy")
    waiter = steps[kernel + 1]
    assert waiter.dma_waits[0] == spill.node.output.name
    waiter.dma_waits.pop(0)
    with pytest.raises(ScheduleError, match="the source of the spill of .* still in flight"):
        check_schedule(sched)


def test_a_load_issued_behind_the_spill_it_reads_is_accepted(sched):
    """The core's DMA engine runs its transfers in order: a load of the skip's DDR copy
    issued right after the skip's spill (before the step that waits for the spill) reads
    the copy once the spill landed, so the schedule checks (its buffer moved past every
    other, so that nothing else changes)."""
    steps = next(st.steps[0] for st in sched.stages if st.device)
    spill = next(st for st in steps if st.spill)
    load = next(st for st in steps if st.prefetch
                and st.node.inputs[0].name == spill.node.output.name)
    reader = next(st for st in steps if load.node.output.name in st.dma_waits)
    assert steps.index(load) > steps.index(spill) + 2
    moved = dataclasses.replace(load.args[1], place=dataclasses.replace(
        load.args[1].place, offset=sched.memory.ocm_size[0]))
    load.args[1] = moved
    reader.args = [moved if a.value == moved.value else a for a in reader.args]
    steps.remove(load)
    steps.insert(steps.index(spill) + 1, load)
    check_schedule(sched)


def test_a_store_of_a_value_still_in_flight_is_refused(sched):
    issue = first(sched, lambda st: st.prefetch)
    src, dst = issue.args
    issue.stores.append(Transfer(dst.value, issue.core, "store", dst.nbytes, dst.place.offset,
                                 sched.memory.ddr_size))
    with pytest.raises(ScheduleError, match="the store reads OCM .* prefetch"):
        check_schedule(sched)


def test_a_missing_load_is_refused(sched):
    step = first(sched, lambda st: st.loads)
    t = step.loads.pop(0)
    with pytest.raises(ScheduleError, match=f"reads '{t.value}' from ocm"):
        check_schedule(sched)


def test_two_live_values_in_one_ocm_range_are_refused(sched):
    """The final add reads two values in OCM; planning the first onto the second's range
    (where its producer writes it and the add reads it): one of them is overwritten while
    it lives, and the step reading it is named."""
    add = [st for st in sched.steps() if st.kernel
           and sum(a.place.mem == "ocm" for a in st.args[:2]) == 2][-1]
    a, b = add.args[:2]
    producer = next(st for st in sched.steps() if st.kernel and st.args[-1].value == a.value)
    moved = dataclasses.replace(a, place=b.place)
    producer.args[-1], add.args[0] = moved, moved
    with pytest.raises(ScheduleError, match=f"'({re.escape(a.value)}|{re.escape(b.value)})'"):
        check_schedule(sched)


def test_a_host_node_reads_ddr_not_a_load_made_for_it(rng, tmp_path):
    """An index table read by a device gather at the start and a host gather at the end,
    spilled to DDR between them on a 200 KB OCM: the host reads it from DDR (no device load
    feeds a host node: such a load, prefetched, raced the store the host read), the
    schedule checks and the program is bit-exact."""
    b = bevir.Builder("mixed")
    idx = b.const(rng.integers(0, 64, (1024,)).astype(np.int64), "idx")
    x = b.input("x", fx((64, 256), 5))
    v = b.gather(x, idx, axis=0, name="pick")
    for k in range(3):
        w = b.const(ints(rng, (256, 256)), f"w{k}", fx((256, 256), 7))
        v = b.fx_linear(v, w, out_frac_bits=5, name=f"fc{k}")
    b.output("y", v)
    t = b.input("t", TensorType((64, 32), DType.f32))
    b.output("g", b.gather(t, idx, axis=0, name="host_pick"))
    hw = HWConfig.parse("QC-U 200KB 16MAC")
    g = bevir.optimize(partitioned(b.graph, 1), [make_pass("plan-memory", hw=hw)])
    assert "idx" in g.meta["memory_plan"]["ddr_values"]
    host = [n for n in g.nodes if not lowerable(n)]
    assert [n.name for n in host] == ["%host_pick"]
    assert [v.name for v in host[0].inputs] == ["t", "idx"]
    check_schedule(schedule_of(g))
    feed = {"t": rng.standard_normal((64, 32)).astype(np.float32), "x": ints(rng, (64, 256))}
    assert_bit_exact(compile_program(g, tmp_path / "p").run(feed), bevir.run(b.graph, feed))


def test_a_step_waits_for_the_dma_engine_before_its_loads(sched, tmp_path):
    """A step that waits for a spill may load into the spill's source (the plan frees the
    source after the core's next node): the program waits for the engine before it loads,
    as the cycle model does, so the load never lands under a store in flight."""
    spill = first(sched, lambda st: st.spill)
    steps = list(sched.steps(spill.core))
    at = steps.index(spill)
    kernel = next(k for k in range(at + 1, len(steps)) if steps[k].node.op != "dma_copy")
    waiter = steps[kernel + 1]
    assert waiter.dma_waits[0] == spill.node.output.name
    source = spill.args[0]
    x = sched.graph.inputs[0]
    waiter.loads.insert(0, Transfer(x.name, waiter.core, "load", source.nbytes,
                                    source.place.offset, sched.memory.ddr[x.name]))
    check_schedule(sched)
