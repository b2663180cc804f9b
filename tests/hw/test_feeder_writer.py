"""The core's feeder and writer alone (``hw.core.feeder.Feeder``,
``hw.core.writer.Writer``) in Amaranth's simulator: random instances through random
offers and stalls on every stream, the events they cause compared in order with a plain
Python account of what the docs say (``docs/npu.md``, "Feeder" and "Writer"), on a build
with one beat per native vector and one with four.

The whole core, with both in its back end, is ``tests/hw/test_npu_hw.py``.
"""

import random

import pytest
from amaranth.sim import Simulator

from host.spec.isa import MAX_WRITES, Space
from hw.core.feeder import Feeder, feeder_layout
from hw.core.writer import Writer
from tests.hw.test_npu_hw import ALL_BUILDS

#: A build with lanes == n (one beat a vector) and one with four beats a vector.
BUILDS = ["n8t1l8", "n8t1u"]


def beats_of(config, vector):
    """The beats of a native vector (an int of 16 n bits), first beat first."""
    width = 16 * config.lanes
    return [(vector >> (b * width)) & ((1 << width) - 1) for b in range(config.beats)]


class Source:
    """A stream source of ``items``: it offers the next one with probability ``prob``
    each cycle and holds the offer until it is taken (the stream rule)."""

    def __init__(self, rng, items, prob):
        self.rng, self.items, self.prob = rng, list(items), prob
        self.offering = False

    def drive(self, ctx, port, payload=lambda item: item):
        if not self.offering and self.items and self.rng.random() < self.prob:
            self.offering = True
        ctx.set(port.valid, self.offering)
        ctx.set(port.payload.as_value(),
                payload(self.items[0]) if self.offering else self.rng.getrandbits(16))

    def took(self, ctx, port):
        """Call after the cycle's outputs settled: True (and the item dropped) if taken."""
        if self.offering and ctx.get(port.ready):
            self.items.pop(0)
            self.offering = False
            return True
        return False


def run(dut, bench_cycle, done, limit):
    """Run ``bench_cycle(ctx)`` every cycle until ``done()``; fail after ``limit`` cycles."""
    count = {"cycles": 0}

    async def bench(ctx):
        while not done():
            assert count["cycles"] < limit, "the block stopped making progress"
            await bench_cycle(ctx)
            await ctx.tick()
            count["cycles"] += 1

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return count["cycles"]


# --- writer ------------------------------------------------------------------------------

def random_instance(rng, config):
    length = rng.randint(1, min(config.max_length, 3))
    valid = rng.randint(1, (1 << MAX_WRITES) - 1)
    spaces = [rng.choice([Space.NETQ, Space.IVRF, Space(2), Space(3)])
              for _ in range(MAX_WRITES)]
    addrs = [rng.randrange(1 << config.vector_addr_bits - 1) for _ in range(MAX_WRITES)]
    return {"length": length, "valid": valid, "space": spaces, "addr": addrs}


def writer_account(config, instances, vectors):
    """The writer's events for ``instances`` and their result ``vectors`` (in order): each
    beat to each destination in order, ``("w", space, addr, beat, data)`` for a vector
    memory and ``("q", vector)`` on the last beat for the output queue; ``("retire",)``
    with the instance's last."""
    events, it = [], iter(vectors)
    for inst in instances:
        for v in range(inst["length"]):
            vector = next(it)
            for b, data in enumerate(beats_of(config, vector)):
                for k in range(MAX_WRITES):
                    if not inst["valid"] >> k & 1:
                        continue
                    if inst["space"][k] == Space.NETQ:
                        if b == config.beats - 1:
                            events.append(("q", vector))
                    else:
                        events.append(("w", inst["space"][k].value, inst["addr"][k] + v, b,
                                       data))
        events.append(("retire",))
    return events


def run_writer(config, seed, inst_prob, result_prob, count=60):
    rng = random.Random(seed)
    dut = Writer(config)
    instances = [random_instance(rng, config) for _ in range(count)]
    vectors = [rng.getrandbits(16 * config.n) for inst in instances
               for _ in range(inst["length"])]
    want = writer_account(config, instances, vectors)
    beats = [data for vector in vectors for data in beats_of(config, vector)]
    inst_src = Source(rng, instances, inst_prob)
    res_src = Source(rng, beats, result_prob)
    got = []

    async def cycle(ctx):
        inst_src.drive(ctx, dut.instances, lambda inst: 0)
        if inst_src.offering:
            inst = inst_src.items[0]
            p = dut.instances.payload
            ctx.set(p.length, inst["length"])
            ctx.set(p.valid, inst["valid"])
            for k in range(MAX_WRITES):
                ctx.set(p.space[k], inst["space"][k])
                ctx.set(p.addr[k], inst["addr"][k])
        res_src.drive(ctx, dut.results, lambda data: data)    # values, last = 0
        wr, push = ctx.get(dut.wr.en), ctx.get(dut.outq_push)
        assert wr + push <= 1, "a write and a push in one cycle"
        if wr:
            got.append(("w", ctx.get(dut.wr.space), ctx.get(dut.wr.addr),
                        ctx.get(dut.wr.beat), ctx.get(dut.wr.data.as_value())))
        if push:
            got.append(("q", ctx.get(dut.outq_data.as_value())))
        if inst_src.took(ctx, dut.instances):
            got.append(("retire",))
        res_src.took(ctx, dut.results)

    run(dut, cycle, lambda: not inst_src.items, limit=40 * len(want))
    assert not res_src.items, f"{len(res_src.items)} result beats never taken"
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"event {k}: {g}, expected {w}"


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("inst_prob,result_prob", [(1.0, 1.0), (0.5, 0.7), (0.2, 0.3)])
def test_writer_against_the_account(build, inst_prob, result_prob):
    config = ALL_BUILDS[build]
    run_writer(config, f"writer {build} {inst_prob} {result_prob}", inst_prob, result_prob)


def test_writer_full_rate():
    """With instances and results always offered, the writer is busy every cycle: the
    cycles are exactly the beats times destinations."""
    config = ALL_BUILDS["n8t1u"]
    rng = random.Random("writer rate")
    dut = Writer(config)
    instances = [random_instance(rng, config) for _ in range(20)]
    slots = sum(inst["length"] * config.beats * inst["valid"].bit_count()
                for inst in instances)
    beats = [rng.getrandbits(16 * config.lanes)
             for inst in instances for _ in range(inst["length"] * config.beats)]
    inst_src = Source(rng, instances, 1.0)
    res_src = Source(rng, beats, 1.0)

    async def cycle(ctx):
        inst_src.drive(ctx, dut.instances, lambda inst: 0)
        if inst_src.offering:
            inst = inst_src.items[0]
            ctx.set(dut.instances.payload.length, inst["length"])
            ctx.set(dut.instances.payload.valid, inst["valid"])
        res_src.drive(ctx, dut.results)
        inst_src.took(ctx, dut.instances)
        res_src.took(ctx, dut.results)

    cycles = run(dut, cycle, lambda: not inst_src.items, limit=10 * slots)
    assert cycles == slots, f"{cycles} cycles for {slots} beat-destinations"


# --- feeder ------------------------------------------------------------------------------

def run_feeder(config, seed, probs, count=60):
    """``probs``: offer probabilities of instances, products, direct beats, and the
    ready probabilities of ``chain`` and ``o_stream``."""
    p_inst, p_prod, p_dir, p_chain, p_out = probs
    rng = random.Random(seed)
    dut = Feeder(config)
    layout = feeder_layout(config)
    length_field = layout["chain"].shape["length"]
    length_at = layout["chain"].offset + length_field.offset
    length_mask = ((1 << length_field.shape.width) - 1) << length_at
    to_mvm_at = layout["to_mvm"].offset
    instances = []
    for _ in range(count):
        raw = rng.getrandbits(layout.size) & ~length_mask & ~(1 << to_mvm_at)
        length = rng.randint(1, min(config.max_length, 4))
        to_mvm = rng.random() < 0.5
        raw |= length << length_at | int(to_mvm) << to_mvm_at
        instances.append({"raw": raw, "length": length, "to_mvm": to_mvm})
    chain_mask = (1 << layout["chain"].shape.size) - 1
    products = [rng.getrandbits(16 * config.n) for inst in instances if inst["to_mvm"]
                for _ in range(inst["length"])]
    direct = [rng.getrandbits(16 * config.lanes) for inst in instances if not inst["to_mvm"]
              for _ in range(inst["length"] * config.beats)]
    # The account: each instance's chain word and, in the same cycle, the instance taken
    # from the queue; then its beats.
    want, prod_it, dir_it = [], iter(products), iter(direct)
    for inst in instances:
        want += [("chain", inst["raw"] >> layout["chain"].offset & chain_mask), ("taken",)]
        for _ in range(inst["length"]):
            if inst["to_mvm"]:
                want += [("beat", b) for b in beats_of(config, next(prod_it))]
            else:
                want += [("beat", next(dir_it)) for _ in range(config.beats)]
    inst_src = Source(rng, instances, p_inst)
    prod_src = Source(rng, products, p_prod)
    dir_src = Source(rng, direct, p_dir)
    got = []

    async def cycle(ctx):
        inst_src.drive(ctx, dut.instances, lambda inst: inst["raw"])
        prod_src.drive(ctx, dut.products)
        dir_src.drive(ctx, dut.direct)
        chain_ready = rng.random() < p_chain
        out_ready = rng.random() < p_out
        ctx.set(dut.chain.ready, chain_ready)
        ctx.set(dut.o_stream.ready, out_ready)
        chained = ctx.get(dut.chain.valid) and chain_ready
        if chained:
            got.append(("chain", ctx.get(dut.chain.payload.as_value())))
        if ctx.get(dut.o_stream.valid) and out_ready:
            got.append(("beat", ctx.get(dut.o_stream.payload.as_value())))
        if inst_src.took(ctx, dut.instances):
            assert chained, "instance taken without its chain"
            got.append(("taken",))
        prod_src.took(ctx, dut.products)
        dir_src.took(ctx, dut.direct)

    run(dut, cycle, lambda: not (inst_src.items or prod_src.items or dir_src.items),
        limit=60 * len(want))
    assert not prod_src.items and not dir_src.items, "source vectors left over"
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"event {k}: {g}, expected {w}"


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("probs", [(1, 1, 1, 1, 1), (0.6, 0.5, 0.5, 0.7, 0.6),
                                   (0.3, 0.9, 0.2, 0.3, 0.9), (1, 0.2, 0.3, 1, 0.25)])
def test_feeder_against_the_account(build, probs):
    run_feeder(ALL_BUILDS[build], f"feeder {build} {probs}", probs)
