"""The schedule's joins: a ``core_gather`` whose result crosses DDR is a view of its pieces
there (each producer stores its piece into its range of the result's slot, each reader
waits for the pieces and loads the whole), bit for bit in the golden model and the C
programs, which count what the model charges; a join read only where it is made stays a
copy; a reader that does not wait for a piece is refused by check_schedule."""
from __future__ import annotations

import numpy as np
import pytest

import bevir
from bevir import Builder
from bevir.passes.target import plan_for_target
from bevir.target import HWConfig, ScheduleError, check_schedule, model, schedule_of
from bevir.target.schedule import joined_in_ddr
from bevir.testing import assert_bit_exact
from tests.shared import fx, ints

HW = HWConfig.parse("QC-U 8MB 16MAC x4")


def all_gather(readers: tuple[int, ...] = (0, 1, 2, 3), axis: int = 0) -> bevir.Graph:
    """Four cores each compute a range of x's rows (of axis ``axis``), joined on core 0 and
    read whole on each core of ``readers``."""
    b = Builder("all_gather")
    shape = (16, 32) if axis == 0 else (3, 16, 8)
    x = b.input("x", fx(shape, 5))
    pieces = []
    for k in range(4):
        s = b.core_slice(x, axis=axis, start=4 * k, stop=4 * k + 4, name=f"x.c{k}")
        s.producer.meta["core"] = k
        y = b.fx_relu(s, out_frac_bits=5, name=f"y.c{k}")
        y.producer.meta["core"] = k
        pieces.append(y)
    g = b.core_gather(*pieces, axis=axis, name="y")
    g.producer.meta["core"] = 0
    for k in readers:
        z = b.fx_add(g, g, out_frac_bits=4, name=f"z{k}")
        z.producer.meta["core"] = k
        b.output(f"z{k}", z)
    b.graph.meta["partition"] = {"cores": 4}            # partitioned by hand
    return b.graph


def test_a_join_read_on_every_core_is_a_view_of_its_pieces_in_ddr(rng, tmp_path):
    from bevir.flows.target import compile_program
    from tests.shared import assert_counted_as_modelled
    graph = all_gather()
    planned = plan_for_target(graph, HW, cache=False)
    sched = schedule_of(planned)
    check_schedule(sched)
    assert joined_in_ddr(planned.value("y").producer)
    mm = sched.memory
    assert [name for name, _ in mm.joined["y"]] == [f"y.c{k}" for k in range(4)]
    assert [mm.ddr[f"y.c{k}"] for k in range(4)] == [mm.ddr["y"] + 128 * k for k in range(4)]
    steps = {(s.core, s.node.name): s for s in sched.steps()}
    gather = steps[0, "%y"]
    assert gather.view and not gather.waits and not gather.loads and not gather.kernel
    for k in range(4):                     # each stores its piece, waits for the others'
        assert [t.value for t in steps[k, f"%y.c{k}"].stores] == [f"y.c{k}"]
        reader = steps[k, f"%z{k}"]
        assert sorted(reader.waits) == [f"y.c{j}" for j in range(4) if j != k]
        assert [t.value for t in reader.loads] == ["y"]
    feed = {"x": ints(rng, (16, 32))}
    want = bevir.run(graph, feed)
    assert_bit_exact(bevir.run(planned, feed), want)
    program = compile_program(planned, tmp_path)
    assert_bit_exact(program.run(feed), want)
    counts = assert_counted_as_modelled(program, HW)
    # per core: its rows of x read in place, its piece stored, the whole loaded, its
    # result stored for the host; nothing more for the join
    assert counts["ddr_bytes"] == model(planned, HW).ddr_bytes == 4 * (128 + 128 + 512 + 512)


@pytest.mark.parametrize("readers, axis, why", [
    ((0,), 0, "read only on the core that joins it"),
    ((0, 1, 2, 3), 1, "the pieces are strided in the result (axis 0 is longer than 1)")])
def test_a_join_stays_a_copy_where_it_cannot_be_a_view(rng, readers, axis, why):
    graph = all_gather(readers, axis)
    planned = plan_for_target(graph, HW, cache=False)
    sched = schedule_of(planned)
    check_schedule(sched)
    assert not joined_in_ddr(planned.value("y").producer), why
    assert not sched.memory.joined
    gather = next(s for s in sched.steps() if s.node.name == "%y")
    assert gather.kernel
    shape = (16, 32) if axis == 0 else (3, 16, 8)
    feed = {"x": ints(rng, shape)}
    assert_bit_exact(bevir.run(planned, feed), bevir.run(graph, feed))


def test_a_reader_that_does_not_wait_for_a_piece_is_refused():
    sched = schedule_of(plan_for_target(all_gather(), HW, cache=False))
    reader = next(s for s in sched.steps() if s.node.name == "%z0")
    reader.waits.clear()                  # core 0 runs first: the others' pieces are not in
    with pytest.raises(ScheduleError, match=r"reads 'y\.c1' from ddr .* does not hold it"):
        check_schedule(sched)


def test_the_pieces_of_a_view_are_stored_by_their_producers_only(rng):
    """No piece passes through the joining core: core 0 loads nothing but the whole."""
    sched = schedule_of(plan_for_target(all_gather(), HW, cache=False))
    loads = [(s.core, t.value) for s in sched.steps() for t in s.loads]
    assert sorted(loads) == [(k, "y") for k in range(4)]
    assert np.all([s.ddr_bytes == 0 for s in sched.steps() if s.node.op == "core_gather"])
