# amaranth: UnusedElaboratable=no
"""The core's scoreboard alone (``hw.core.scoreboard.Scoreboard``), in Amaranth's
simulator, cycle by cycle against a plain Python account of the instances in flight:
random issues, takes and retirements (with idle cycles), and directed overlaps.

The whole core, with the scoreboard in its issuer, is ``tests/hw/test_npu_hw.py``.
"""

import random
from collections import deque

import pytest
from amaranth.sim import Simulator

from host.spec.config import preset
from host.spec.isa import MAX_WRITES
from hw.core.scoreboard import IN_FLIGHT, Scoreboard, read_count
from tests.hw.test_npu_hw import ALL_BUILDS


def overlap(w, r):
    """Two spans ``(on, space, lo, hi)`` share an address: both on, one memory,
    ``[lo, hi)`` intersecting."""
    return w[0] and r[0] and w[1] == r[1] and w[2] < r[3] and r[2] < w[3]


class Account:
    """What the scoreboard must say: the instances in flight, oldest first, and the reads
    of the iteration to issue (those last given with an issue or a take)."""

    def __init__(self):
        self.flight = deque()
        self.reads = []

    def conflict(self):
        return any(overlap(w, r) for entry in self.flight for w in entry for r in self.reads)

    def step(self, issue, take, retire, issued, reads_next):
        if retire:
            self.flight.popleft()
        if issue:
            self.flight.append(issued)
        if issue or take:
            self.reads = reads_next


def _set_spans(ctx, ports, spans):
    for port, (on, space, lo, hi) in zip(ports, spans, strict=True):
        ctx.set(port.on, on)
        ctx.set(port.space, space)
        ctx.set(port.lo, lo)
        ctx.set(port.hi, hi)


def run(config, cycles_of):
    """Drive a Scoreboard with ``cycles_of(account)``'s cycles, each
    ``(issue, take, retire, issued, reads_next)``, and check every cycle's outputs
    against the account. Returns how many cycles showed a conflict."""
    dut = Scoreboard(config)
    account = Account()
    seen = {"conflicts": 0}

    async def bench(ctx):
        for k, (issue, take, retire, issued, reads_next) in enumerate(cycles_of(account)):
            want = (account.conflict(), len(account.flight) == IN_FLIGHT,
                    len(account.flight) == 0)
            got = (bool(ctx.get(dut.conflict)), bool(ctx.get(dut.full)),
                   bool(ctx.get(dut.empty)))
            assert got == want, f"cycle {k}: (conflict, full, empty) {got}, expected " \
                                f"{want}; in flight {list(account.flight)}, reads " \
                                f"{account.reads}"
            seen["conflicts"] += want[0]
            ctx.set(dut.issue, issue)
            ctx.set(dut.take, take)
            ctx.set(dut.retire, retire)
            _set_spans(ctx, dut.issued, issued)
            _set_spans(ctx, dut.reads_next, reads_next)
            await ctx.tick()
            account.step(issue, take, retire, issued, reads_next)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return seen["conflicts"]


def random_span(rng):
    lo = rng.randint(0, 24)
    return (rng.random() < 0.8, rng.randint(1, 3), lo, lo + rng.randint(1, 6))


@pytest.mark.parametrize("build", ["ulx3s_n4", "n8t1u"])
def test_random_against_the_account(build):
    config = preset(build) if build == "ulx3s_n4" else ALL_BUILDS[build]
    rng = random.Random(f"scoreboard {build}")
    reads = read_count(config)

    def cycles(account):
        for _ in range(4000):
            n = len(account.flight)
            take = rng.random() < 0.15
            issue = not take and n < IN_FLIGHT and rng.random() < 0.4
            retire = n > 0 and rng.random() < 0.35
            yield (issue, take, retire, [random_span(rng) for _ in range(MAX_WRITES)],
                   [random_span(rng) for _ in range(reads)])

    conflicts = run(config, cycles)
    assert 400 < conflicts < 3600, conflicts      # both answers, many times


def test_directed():
    """Edges: touching ranges, another memory, a span switched off, a retired entry, a
    full window."""
    config = preset("ulx3s_n4")
    reads = read_count(config)
    off = (0, 1, 0, 1)
    w = [(1, 1, 8, 12)] + [off] * (MAX_WRITES - 1)

    def reads_of(*spans):
        return list(spans) + [off] * (reads - len(spans))

    script = [
        # Issue the write [8, 12) of the IVRF; the next reads: [12, 16) (touching).
        (1, 0, 0, w, reads_of((1, 1, 12, 16))),
        (0, 0, 0, w, reads_of()),                        # no conflict: touching
        # Take a chain reading [11, 12): overlaps the entry in flight.
        (0, 1, 0, w, reads_of((1, 1, 11, 12))),
        (0, 0, 0, w, reads_of()),                        # conflict (no take: the
                                                         # reads stay)
        # Another take: the same addresses in another memory, then the span off.
        (0, 1, 0, w, reads_of((1, 2, 8, 12))),
        (0, 1, 0, w, reads_of((0, 1, 8, 12))),
        (0, 1, 0, w, reads_of((1, 1, 0, 9))),            # overlaps [8, 9)
        (0, 0, 1, w, reads_of()),                        # retire: the conflict ends
        # Fill the window: four issues, then full until a retirement.
        (1, 0, 0, w, reads_of()), (1, 0, 0, w, reads_of()), (1, 0, 0, w, reads_of()),
        (1, 0, 0, w, reads_of()), (0, 0, 0, w, reads_of()), (0, 0, 1, w, reads_of()),
        (0, 0, 0, w, reads_of()),
    ]
    conflicts = run(config, lambda account: iter(script))
    # The reads [11, 12) conflict from the cycle after their take until the next take
    # (two cycles); [0, 9) for one cycle, until the retirement.
    assert conflicts == 3, conflicts


def test_constructor_errors():
    with pytest.raises(TypeError, match="config must be an NpuConfig, not 4"):
        Scoreboard(4)
