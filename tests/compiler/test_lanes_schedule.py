"""The scheduler at ``lanes`` l < n (issue 36 item 1, step 2 of
``docs/notes/2026-11-28-lanes-plan.md``, section 3): its weights count MFU beats and the
MVM bound counts the beats a row block takes into the MFU; at ``l == n`` it orders
chains exactly as before."""

from __future__ import annotations

import dataclasses

import pytest
from program_checks import outcome, same_bits

from host.compiler.deps import check_order, dependency_graph, reorder
from host.compiler.schedule import _costs, schedule
from host.model.core import Timing, _Clock
from sim.randprog import RANDOM_BUILDS, random_program

#: The model's timing of commit 5e314df: no latency of its own for the direct path, no
#: register slice after the direct buffer, no register on the units' ``busy``.
TIMING_5E314DF = Timing(direct_latency=0, direct_write_register=0, direct_slice=0,
                         busy_register=0)

#: ``schedule(random_program(RANDOM_BUILDS[name], seed, chains=30), beam=2)`` computed
#: with the scheduler and model of commit 5e314df (before the beat-level timing, and before
#: the direct path's latency, its register slice and the registered ``busy``:
#: ``TIMING_5E314DF``).
STORED = {
    ("n8t2m3", 5): [0, 3, 4, 23, 2, 1, 5, 10, 7, 29, 24, 8, 6, 11, 12, 13, 16, 26, 18, 9,
                    14, 15, 17, 19, 20, 21, 22, 27, 28, 25],
    ("n8t2m3", 6): [2, 13, 16, 1, 20, 7, 0, 4, 17, 3, 5, 6, 8, 15, 25, 9, 12, 26, 10, 14,
                    11, 18, 19, 27, 22, 23, 24, 28, 29, 21],
    ("n4t3m2", 5): [0, 1, 2, 6, 3, 4, 5, 7, 8, 9, 11, 15, 12, 13, 14, 16, 17, 20, 22, 21,
                    23, 18, 24, 19, 28, 26, 25, 27, 29, 10],
    ("n4t3m2", 6): [3, 0, 1, 2, 4, 5, 6, 7, 11, 12, 14, 8, 9, 15, 16, 17, 10, 13, 18, 19,
                    21, 22, 20, 26, 27, 23, 25, 24, 29, 28],
}


@pytest.mark.parametrize("name,seed", sorted(STORED))
def test_lanes_n_schedules_as_before(name, seed):
    prog = random_program(RANDOM_BUILDS[name], seed, chains=30)
    assert schedule(prog, beam=2, timing=TIMING_5E314DF) == STORED[name, seed]


@pytest.mark.parametrize("lanes", [4, 2])
def test_costs_count_beats(lanes):
    """A chain's MFU occupancy is its fill plus ``L*B`` beats per destination, and a
    product's MVM weight ``iterations * R * max(G, B)`` sequencer cycles."""
    cfg = dataclasses.replace(RANDOM_BUILDS["n8t2m3"], lanes=lanes)
    beats = cfg.n // lanes
    products = 0
    for seed in (1, 2):
        prog = random_program(RANDOM_BUILDS["n8t2m3"], seed, chains=30)
        graph = dependency_graph(prog, cfg)
        for chain, cost in zip(graph.chains, _costs(graph, _Clock, Timing())):
            fill, _ = _Clock(cfg, Timing())._fill(list(cost.ops), cost.length)
            assert cost.mfu_tail == fill + cost.length * beats * max(cost.dests, 1)
            if cost.cols is None:
                assert cost.mvm == 0
            else:
                groups = -(-cost.cols // cfg.tiles)
                assert cost.mvm == cost.iterations * cost.length * max(groups, beats)
                products += groups < beats
    assert products > 0          # some products are paced by the beats


@pytest.mark.parametrize("name", sorted(RANDOM_BUILDS))
def test_schedules_at_fewer_lanes_keep_the_results(name):
    """At l = 2 the scheduled order still keeps every edge and computes the same bits."""
    cfg = dataclasses.replace(RANDOM_BUILDS[name], lanes=2)
    prog = random_program(RANDOM_BUILDS[name], 7, chains=30)
    graph = dependency_graph(prog, cfg)
    order = schedule(prog, cfg, beam=2)
    assert check_order(graph, order) is None
    assert same_bits(outcome(prog, prog.words), outcome(prog, reorder(prog, order)))


def test_schedule_refuses_a_timing_that_is_not_one():
    prog = random_program(RANDOM_BUILDS["n8t2m3"], 5, chains=30)
    with pytest.raises(TypeError, match="timing must be a host.model.core.Timing, not 4"):
        schedule(prog, beam=2, timing=4)
