# amaranth: UnusedElaboratable=no
"""The core's hazard walk alone (``hw.core.hazard.HazardWalk``), in Amaranth's simulator:
its verdict on random and directed chains against the model's
(:meth:`host.model.core.NpuModel._check_hazards`), and its cycles on directed ones.

The whole core, with the walk in its chain checker, is ``tests/hw/test_npu_hw.py``.
"""

import random

import pytest
from amaranth.sim import Simulator

from host.model.core import NpuModel
from host.spec.config import NpuConfig, preset
from host.spec.isa import ErrorCode, Space
from hw.core.hazard import HazardWalk, pair_keys, walk_pairs
from tests.hw.test_npu_hw import ALL_BUILDS

#: The cycles a walk may take at most before the bench gives up: every pair stepped
#: through every iteration, and the end (far below for the chains here).
LIMIT = 4000


class Chain:
    """A chain's ranges as the walk's port takes them, and as the model's check does."""

    def __init__(self, config, length, iters):
        self.config, self.length, self.iters = config, length, iters
        self.ranges = {key: None for key in pair_keys(config)}     # None: not used

    def set(self, key, space, start, inc):
        self.ranges[key] = (Space(space), start, inc)
        return self

    def model_says(self):
        """The model's verdict: True for a hazard."""
        reads, writes = [], []
        for key, r in self.ranges.items():
            if r is None:
                continue
            space, start, inc = r
            if key[0] == "w":
                writes.append((space, start, self.length, inc, None))
            else:
                reads.append((space, start, self.length, inc, None, False))
        # The model walks the writes in program order: the walk's pairs cover the same.
        found = []

        def fail(code, message):
            assert code is ErrorCode.HAZARD
            found.append(message)
            raise StopIteration

        try:
            NpuModel._check_hazards(reads, writes, self.iters, fail)
        except StopIteration:
            pass
        return bool(found)


def walk(config, chains, aborts=None):
    """Run each chain through a fresh cycle of ``to_check``, ``start``; returns
    ``[(hazard, cycles)]``, cycles counted from the first after ``start``. ``aborts``
    maps a chain's index to the cycle in which ``abort`` drops its walk: its entry is
    then ``("aborted", cycles)``, and the walk must stay idle for 12 cycles (longer than
    the chains of the tests walk)."""
    aborts = aborts or {}
    dut = HazardWalk(config)
    keys = pair_keys(config)
    out = []

    async def bench(ctx):
        for chain in chains:
            for i, key in enumerate(keys):
                r = chain.ranges[key]
                port = dut.ranges[i]
                ctx.set(port.used, r is not None)
                if r is not None:
                    space, start, inc = r
                    ctx.set(port.space, space)
                    ctx.set(port.start, start)
                    ctx.set(port.inc, inc)
                    ctx.set(port.prod, (chain.iters - 1) * inc)
            ctx.set(dut.length, chain.length)
            ctx.set(dut.last_iter, chain.iters - 1)
            ctx.set(dut.to_check, 1)
            await ctx.tick()
            ctx.set(dut.to_check, 0)
            ctx.set(dut.start, 1)                       # the CHECK cycle
            assert not ctx.get(dut.clear) and not ctx.get(dut.hazard), "answer before start"
            await ctx.tick()
            ctx.set(dut.start, 0)
            for cycles in range(1, LIMIT):
                if aborts.get(len(out)) == cycles:
                    ctx.set(dut.abort, 1)
                    await ctx.tick()
                    ctx.set(dut.abort, 0)
                    out.append(("aborted", cycles))
                    break
                clear, hazard = ctx.get(dut.clear), ctx.get(dut.hazard)
                assert not (clear and hazard), "clear and hazard at once"
                await ctx.tick()
                if clear or hazard:
                    out.append((bool(hazard), cycles))
                    break
            else:
                raise AssertionError(f"no answer in {LIMIT} cycles")
            # Idle cycles between chains: the walk holds no answer.
            for _ in range(12 if out[-1][0] == "aborted" else 3):
                assert not ctx.get(dut.clear) and not ctx.get(dut.hazard), "answer when idle"
                await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return out


def _vector_spaces(config):
    vrfs = [key[1] + 2 for key in pair_keys(config) if key[0] == "v"]
    return [Space.IVRF] + [Space(s) for s in vrfs]


def random_chain(config, rng):
    """A chain with ranges crowded into few spaces and few addresses, so that pairs are
    often in one memory and often close."""
    length = rng.randint(1, config.max_length)
    iters = rng.choice([1, 2, 3, rng.randint(1, 12)])
    chain = Chain(config, length, iters)
    spaces = rng.sample(_vector_spaces(config), k=min(2, len(_vector_spaces(config))))
    for key in pair_keys(config):
        if rng.random() < 0.35:
            continue
        space = Space(key[1] + 2) if key[0] == "v" else rng.choice(spaces)
        start = rng.randint(0, 24)
        inc = rng.choice([0, 1, length, 2 * length, rng.randint(0, 3 * length + 2)])
        chain.set(key, space, start, inc)
    return chain


@pytest.mark.parametrize("build", ["ulx3s_n4", "n8t1u"])
def test_random_chains_against_the_model(build):
    config = preset(build) if build == "ulx3s_n4" else ALL_BUILDS[build]
    rng = random.Random(f"hazard walk {build}")
    chains = [random_chain(config, rng) for _ in range(300)]
    got = walk(config, chains)
    said = [chain.model_says() for chain in chains]
    for k, (chain, (hazard, cycles), want) in enumerate(zip(chains, got, said)):
        assert hazard == want, f"chain {k} ({chain.ranges}, L {chain.length}, " \
                               f"{chain.iters} iterations): walk {hazard}, model {want}"
        pairs = len(walk_pairs(config))
        assert cycles <= pairs * (chain.iters + 1) + 1, f"chain {k}: {cycles} cycles"
    # Both verdicts occur often enough for the comparison to mean something.
    assert 50 < sum(said) < 250, sum(said)


def _config():
    return preset("ulx3s_n4")


@pytest.mark.parametrize("what, ranges, length, iters, hazard, cycles", [
    # No pair in one memory: the first cycle ends the walk.
    ("nothing", {("w", 0): (Space.IVRF, 0, 0)}, 2, 3, False, 1),
    ("other memories", {("w", 0): (Space.IVRF, 0, 0), ("r",): (Space.ASVRF0, 0, 0)},
     2, 3, False, 1),
    # A step shorter than the interval: one cycle for the pair, one to end.
    ("write just past the read", {("w", 0): (Space.IVRF, 4, 0), ("r",): (Space.IVRF, 0, 0)},
     4, 5, False, 2),
    ("write ahead of the read", {("w", 0): (Space.IVRF, 3, 0), ("r",): (Space.IVRF, 0, 0)},
     4, 5, True, 1),
    ("write onto the read", {("w", 0): (Space.IVRF, 0, 0), ("r",): (Space.IVRF, 0, 0)},
     4, 5, False, 2),
    ("two writes overlap", {("w", 0): (Space.IVRF, 0, 0), ("w", 1): (Space.IVRF, 3, 0)},
     4, 1, True, 1),
    # A step of 8 against an interval of 4: PICK, then STEP for iterations 0, 1, 2; the
    # start difference 1 - 16 + 8 i is 1 in iteration 2, the write ahead of the read.
    ("long step, hazard in iteration 2",
     {("w", 0): (Space.IVRF, 1, 8), ("r",): (Space.IVRF, 16, 0)}, 4, 5, True, 4),
    # The same from 0: the difference goes -16, -8, 0, 8 (past the interval), then PICK
    # ends the walk: 6 cycles.
    ("long step, no hazard",
     {("w", 0): (Space.IVRF, 0, 8), ("r",): (Space.IVRF, 16, 0)}, 4, 5, False, 6),
    # A step equal to the interval: the difference goes -8, -4, 0, 4, and 4 is the
    # interval's end: the pair is done there (6 cycles), not an iteration later.
    ("step of the interval, ends on its edge",
     {("w", 0): (Space.IVRF, 0, 4), ("r",): (Space.IVRF, 8, 0)}, 4, 8, False, 6),
])
def test_directed(what, ranges, length, iters, hazard, cycles):
    config = _config()
    chain = Chain(config, length, iters)
    for key, r in ranges.items():
        chain.set(key, *r)
    assert chain.model_says() == hazard, f"{what}: the model disagrees with the case"
    assert walk(config, [chain]) == [(hazard, cycles)], what


def test_abort_drops_the_walk():
    """The front end aborts the walk of a chain that failed its range check, in the
    walk's first cycle (PICK), the only one it sets ``abort`` in. The walk is then idle,
    and the next chain's walk is as if it ran alone."""
    config = _config()
    long_walk = Chain(config, 4, 5)         # 6 cycles, no hazard (test_directed)
    long_walk.set(("w", 0), Space.IVRF, 0, 8)
    long_walk.set(("r",), Space.IVRF, 16, 0)
    hazard = Chain(config, 4, 5)            # 4 cycles, a hazard
    hazard.set(("w", 0), Space.IVRF, 1, 8)
    hazard.set(("r",), Space.IVRF, 16, 0)
    got = walk(config, [long_walk, hazard, hazard, long_walk],
               aborts={0: 1, 2: 1})
    assert got == [("aborted", 1), (True, 4), ("aborted", 1), (False, 6)]


def test_constructor_errors():
    with pytest.raises(TypeError, match="config must be an NpuConfig, not 4"):
        HazardWalk(4)
    assert isinstance(_config(), NpuConfig)
