"""The core's issuer alone (``hw.core.issuer.Issuer``) in Amaranth's simulator.

Random checked chains are offered with gaps; the four instance streams are taken with
random stalls, the writer holding each instance a random number of cycles before it
takes it (which retires it). Checked against a plain account of ``docs/npu.md``
("Issue"):

* every stream carries each chain's iterations in order, with iteration ``i``'s
  addresses ``start + i * inc`` and the chain's other fields; the MVM stream only those
  of chains with a product;
* no instance reaches the reader before every earlier instance whose writes overlap
  its reads (the chain's read, ``extent`` vectors; each ``vv`` operand, ``length``) has
  been retired: a read sees the writes before it;
* ``idle`` never while an instance waits for the writer, and at the end.

The whole core, with the issuer in it, is ``tests/hw/test_npu_hw.py``.
"""

import random

import pytest
from amaranth.hdl import Shape
from amaranth.lib import data
from amaranth.sim import Simulator

from host.spec.isa import MAX_WRITES, Space
from hw.core.decode import built_vrfs, vrf_space
from hw.core.feeder import feeder_layout
from hw.core.issuer import Issuer, checked_chain_layout
from hw.core.reader import reader_layout
from hw.core.writer import writer_layout
from hw.mvm.mvm import command_layout
from tests.hw.test_npu_hw import ALL_BUILDS

SPACES = (Space.NETQ, Space.IVRF, Space.ASVRF0, Space.MULVRF0)


def field(layout, *path):
    """``(offset, width)`` of the field at ``path`` (names and array indices)."""
    offset = 0
    for key in path:
        f = data.Layout.cast(layout)[key]
        offset += f.offset
        layout = f.shape
    return offset, Shape.cast(layout).width


def get(layout, value, *path):
    offset, width = field(layout, *path)
    return value >> offset & ((1 << width) - 1)


def pack(layout, fields):
    """The bits of a payload of ``layout``: ``fields`` maps paths (tuples) to ints."""
    value = 0
    for path, v in fields.items():
        offset, width = field(layout, *path)
        value |= (int(v) & ((1 << width) - 1)) << offset
    return value


def random_chain(rng, config):
    """A checked chain as ``{path: value}``, addresses small enough never to wrap."""
    vrfs = 2 * config.mfus
    length = rng.randint(1, 3)
    c = {("rd_space",): rng.choice(SPACES).value, ("rd_addr",): rng.randrange(24),
         ("rd_inc",): rng.randrange(6), ("has_mv",): rng.randrange(2),
         ("mv_slot",): rng.randrange(32), ("mv_inc",): rng.randrange(4),
         ("pix",): rng.randint(1, 3), ("win_w",): rng.randint(1, 2), ("win_h",): rng.randint(1, 2),
         ("pitch",): rng.randrange(8), ("lanes_cols",): rng.randint(1, config.n),
         ("cols",): rng.randint(1, 8), ("c_in",): rng.randint(1, 8),
         ("extent",): rng.randint(1, 6), ("length",): length,
         ("lanes_last",): rng.randint(1, config.n), ("iters",): rng.randint(1, 4),
         ("rounding",): rng.randrange(2), ("static",): rng.randrange(2),
         ("q_exponent",): rng.randrange(256), ("narrow",): rng.randint(1, 64),
         ("vv_used",): rng.getrandbits(vrfs) & sum(1 << k for k in built_vrfs(config)),
         ("w_valid",): rng.randint(1, (1 << MAX_WRITES) - 1)}
    layout = checked_chain_layout(config)
    for k in range(config.mfus):
        for name in ("order", "addsub_op", "act_op", "reduce_op"):
            c[("mfu", k, name)] = rng.getrandbits(field(layout, "mfu", k, name)[1])
        c[("mfu", k, "addsub_addr")] = rng.randrange(24)
        c[("mfu", k, "mul_addr")] = rng.randrange(24)
    for k in range(vrfs):
        c[("vv_inc", k)] = rng.randrange(6)
        # The ends the front end sums at the hand-off (checked_chain_layout).
        c[("vv_end", k)] = vv_base(c, k) + length
    c[("rd_end",)] = c[("rd_addr",)] + c[("extent",)]
    for k in range(MAX_WRITES):
        c[("w_space", k)] = rng.choice(SPACES).value
        c[("w_addr", k)] = rng.randrange(24)
        c[("w_inc", k)] = rng.randrange(6)
    return c


def vv_base(chain, k):
    return chain[("mfu", k // 2, "addsub_addr" if k % 2 == 0 else "mul_addr")]


def instances(config, chains):
    """Per stream, the expected payloads (dicts of paths), and per instance its reads and
    writes as ``(space, lo, hi)``."""
    want = {"reader": [], "feeder": [], "writer": [], "mvm": []}
    ranges = []
    for ch in chains:
        for i in range(ch[("iters",)]):
            length = ch[("length",)]
            rd = ch[("rd_addr",)] + i * ch[("rd_inc",)]
            want["reader"].append({
                ("space",): ch[("rd_space",)], ("base",): rd,
                **{(f,): ch[(f,)] for f in ("pix", "win_w", "win_h", "pitch", "lanes_cols")},
                ("to_mvm",): ch[("has_mv",)]})
            if ch[("has_mv",)]:
                want["mvm"].append({
                    ("base",): ch[("mv_slot",)] + i * ch[("mv_inc",)],
                    ("row_tiles",): length, ("col_tiles",): ch[("cols",)],
                    ("rounding",): ch[("rounding",)], ("static",): ch[("static",)],
                    ("static_exponent",): ch[("q_exponent",)],
                    ("narrow_width",): ch[("narrow",)]})
            fe = {("to_mvm",): ch[("has_mv",)], ("chain", "length"): length,
                  ("chain", "lanes_last"): ch[("lanes_last",)]}
            for k in range(config.mfus):
                for name in ("order", "addsub_op", "act_op", "reduce_op"):
                    fe[("chain", "mfu", k, name)] = ch[("mfu", k, name)]
                fe[("chain", "mfu", k, "addsub_addr")] = \
                    vv_base(ch, 2 * k) + i * ch[("vv_inc", 2 * k)]
                fe[("chain", "mfu", k, "mul_addr")] = \
                    vv_base(ch, 2 * k + 1) + i * ch[("vv_inc", 2 * k + 1)]
            want["feeder"].append(fe)
            wr = {("length",): length, ("valid",): ch[("w_valid",)]}
            writes = []
            for k in range(MAX_WRITES):
                addr = ch[("w_addr", k)] + i * ch[("w_inc", k)]
                wr[("space", k)], wr[("addr", k)] = ch[("w_space", k)], addr
                if ch[("w_valid",)] >> k & 1 and ch[("w_space", k)] != Space.NETQ.value:
                    writes.append((ch[("w_space", k)], addr, addr + length))
            want["writer"].append(wr)
            reads = []
            if ch[("rd_space",)] != Space.NETQ.value:
                reads.append((ch[("rd_space",)], rd, rd + ch[("extent",)]))
            for k in built_vrfs(config):
                if ch[("vv_used",)] >> k & 1:
                    lo = vv_base(ch, k) + i * ch[("vv_inc", k)]
                    reads.append((vrf_space(k), lo, lo + length))
            ranges.append((reads, writes))
    return want, ranges


def overlaps(reads, writes):
    return any(rs == ws and rlo < whi and wlo < rhi
               for rs, rlo, rhi in reads for ws, wlo, whi in writes)


@pytest.mark.parametrize("build, stall", [("n8t1", 0.0), ("n8t1", 0.5), ("n8t1u", 0.3)])
def test_issuer_against_the_account(build, stall):
    config = ALL_BUILDS[build]
    rng = random.Random(f"issuer {build} {stall}")
    chains = [random_chain(rng, config) for _ in range(60)]
    want, ranges = instances(config, chains)
    layouts = {"reader": reader_layout(config), "feeder": feeder_layout(config),
               "writer": writer_layout(config), "mvm": command_layout(config.mvm)}
    chain_l = checked_chain_layout(config)
    dut = Issuer(config)
    got = {name: [] for name in layouts}
    retired = []             # cycle at which instance j retired
    reader_at = []           # cycle at which instance j reached the reader
    problems = []
    cycle = {"now": 0}

    async def offer(ctx):
        for ch in chains:
            while rng.random() < 0.3:
                await ctx.tick()
            ctx.set(dut.chains.payload.as_value(), pack(chain_l, ch))
            ctx.set(dut.chains.valid, 1)
            await ctx.tick().until(dut.chains.ready)
            ctx.set(dut.chains.valid, 0)

    async def sink(ctx, name):
        stream = getattr(dut, name)
        while len(got[name]) < len(want[name]):
            ready = rng.random() >= stall
            ctx.set(stream.ready, ready)
            if ready and ctx.get(stream.valid):
                got[name].append(ctx.get(stream.payload).as_value().value)
                if name == "reader":
                    reader_at.append(cycle["now"])
            await ctx.tick()
        ctx.set(stream.ready, 0)

    async def writer(ctx):
        stream = dut.writer
        while len(got["writer"]) < len(want["writer"]):
            if not ctx.get(stream.valid):
                await ctx.tick()
                continue
            for _ in range(rng.choice((0, 1, 5, 20))):      # the instance's beats
                await ctx.tick()
            got["writer"].append(ctx.get(stream.payload).as_value().value)
            retired.append(cycle["now"])
            ctx.set(stream.ready, 1)      # taken with its last beat: retired
            await ctx.tick()
            ctx.set(stream.ready, 0)

    async def clock(ctx):
        while len(got["writer"]) < len(want["writer"]):
            await ctx.tick()
            cycle["now"] += 1
            assert cycle["now"] < 100_000, "the issuer stopped making progress"
        await ctx.tick().repeat(2)
        if not ctx.get(dut.idle):
            problems.append("not idle at the end")

    async def idle_watch(ctx):
        # An instance waiting for the writer is in flight: the issuer is not idle.
        while len(got["writer"]) < len(want["writer"]):
            if ctx.get(dut.idle) and ctx.get(dut.writer.valid):
                problems.append(f"idle at cycle {cycle['now']} with an instance in flight")
                return
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(offer, background=True)
    for name in ("reader", "feeder", "mvm"):
        async def bench(ctx, name=name):
            await sink(ctx, name)
        sim.add_testbench(bench, background=True)
    sim.add_testbench(writer)
    sim.add_testbench(clock)
    sim.add_testbench(idle_watch, background=True)
    sim.run()

    for name, layout in layouts.items():
        assert len(got[name]) == len(want[name]), name
        for j, (value, fields) in enumerate(zip(got[name], want[name], strict=True)):
            for path, v in fields.items():
                width = field(layout, *path)[1]
                assert get(layout, value, *path) == v & ((1 << width) - 1), (name, j, path)
    # A read waits for the earlier writes it overlaps.
    for j, (reads, _) in enumerate(ranges):
        for e in range(j):
            if overlaps(reads, ranges[e][1]):
                assert retired[e] < reader_at[j], (e, j, retired[e], reader_at[j])
    assert not problems, problems


def test_issuer_refuses_a_bad_config():
    with pytest.raises(TypeError, match="config must be an NpuConfig, not 'n8t1'"):
        Issuer("n8t1")
