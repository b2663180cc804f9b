"""cocotb bench of the DP16KD model (``sim/models/DP16KD.v``) against Amaranth's memories:
the top is ``sim.dp16kd_bench.Dp16kdBench`` (see its module for what is compared).

Every cycle the bench drives random inputs just after the rising edge, then compares
after the falling edge (the ``neg`` memory's edge; an asynchronous reset shows here) and
after the rising edge: every mapped memory's netlist output with its Amaranth output,
every direct cell with its reference. A difference fails the test with the case, the
cycle, both values and the inputs of the last cycles.

``DP16KD_CYCLES`` sets the random test's length (default 3000), ``DP16KD_ROM_WORDS``
the ROM sweep's (default 16384, every word).
"""

from __future__ import annotations

import collections
import itertools
import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, ReadOnly, RisingEdge, Timer

from sim.dp16kd_bench import CASES, DIRECT, INPUTS, MODES, _rom_init

CLOCK_NS = 10


def _slices(widths):
    out, pos = {}, 0
    for name, width in widths:
        out[name] = (pos, width)
        pos += width
    return out


MAPPED = _slices((c.name, c.width) for c in CASES)
CELLS = _slices((name, width) for name, (_, width) in DIRECT.items())


def _field(value, where):
    pos, width = where
    return value >> pos & ((1 << width) - 1)


def _unsigned(handle, slices, side):
    """The bus as an integer; AssertionError naming the cases with X or Z bits."""
    value = handle.value
    if value.is_resolvable:
        return value.to_unsigned()
    text = str(value)[::-1]                       # bit i at index i
    bad = [name for name, (pos, width) in slices.items()
           if set(text[pos:pos + width]) - set("01")]
    raise AssertionError(f"{side} has undefined bits in {', '.join(bad)}")


class TB:
    def __init__(self, dut, seed):
        self.dut = dut
        self.rng = random.Random(seed)
        self.history = collections.deque(maxlen=4)
        self.cycle = 0
        self.pool = [self.rng.getrandbits(14) for _ in range(6)]
        # Outputs of the Amaranth side, per case, to show that the stimulus tells the
        # modes apart (a model that ignored a mode would then differ from it).
        self.seen = collections.defaultdict(list)

    async def start(self):
        """Start the clock and read every memory once, uncompared: Amaranth's read data
        registers have no initial value in its Verilog (X under Icarus until the first
        read), where the DP16KD's read 0 from power-on."""
        Clock(self.dut.clk, CLOCK_NS, unit="ns").start()
        self.dut.rst.value = 0
        self.drive({**dict.fromkeys(INPUTS, 0), "ce": 1})
        await RisingEdge(self.dut.clk)
        await RisingEdge(self.dut.clk)

    def drive(self, values):
        for name, value in values.items():
            getattr(self.dut, name).value = value
        self.history.append(values)

    def random_inputs(self):
        rng = self.rng
        addr = rng.choice(self.pool) if rng.random() < 0.6 else rng.getrandbits(14)
        raddr = rng.choice(self.pool) if rng.random() < 0.6 else rng.getrandbits(14)
        ce = int(rng.random() < 0.85)
        we = int(rng.random() < 0.45)
        if ce and we and (raddr & 0x3FF) == (addr & 0x3FF):
            # The simple dual-port memories are marked READ_COLLISION_UNUSED: a read of
            # the word being written is undefined on the device, so none is made.
            raddr ^= 1
        rrst = int(not we and rng.random() < 0.08)   # never reset while writing
        return {"ce": ce, "we": we, "addr": addr, "din": rng.getrandbits(64),
                "be": rng.getrandbits(8), "raddr": raddr, "oce": int(rng.random() < 0.7),
                "rrst": rrst, "cs": 0b101 if rng.random() < 0.85 else rng.getrandbits(3)}

    def compare(self, when):
        dut = self.dut
        rtl, net = _unsigned(dut.rtl, MAPPED, "Amaranth"), _unsigned(dut.net, MAPPED, "netlist")
        cell = _unsigned(dut.cell, CELLS, "DP16KD")
        ref = _unsigned(dut.ref, CELLS, "reference")
        bad = []
        for name, where in MAPPED.items():
            a, b = _field(rtl, where), _field(net, where)
            self.seen[name].append(a)
            if a != b:
                bad.append(f"{name}: netlist {b:#x}, Amaranth {a:#x}")
        for name, where in CELLS.items():
            a, b = _field(ref, where), _field(cell, where)
            self.seen[name].append(a)
            if a != b:
                bad.append(f"{name}: DP16KD {b:#x}, reference {a:#x}")
        assert not bad, (f"cycle {self.cycle} ({when}): " + "; ".join(bad[:6])
                         + f"; inputs of the last cycles (oldest first): {list(self.history)}")

    async def cycle_with(self, values):
        """Drive ``values`` after the rising edge, compare after the falling edge and
        after the next rising edge."""
        self.drive(values)
        await FallingEdge(self.dut.clk)
        await ReadOnly()
        self.compare("after the falling edge")
        await RisingEdge(self.dut.clk)
        await ReadOnly()
        self.compare("after the rising edge")
        await Timer(1, unit="ps")                 # leave the read-only phase
        self.cycle += 1


@cocotb.test()
async def test_random(dut):
    """Random writes and reads of every memory and cell; then the stimulus must have
    told every write mode of every width apart, and the resets and the output register
    must have changed something, so that a model that ignored them would have failed."""
    tb = TB(dut, seed=int(os.environ.get("DP16KD_SEED", "2026")))
    await tb.start()
    for _ in range(int(os.environ.get("DP16KD_CYCLES", "3000"))):
        await tb.cycle_with(tb.random_inputs())
    for width in (1, 2, 4, 9, 18):
        for a, b in itertools.combinations(MODES, 2):
            ta = tb.seen[f"srsw_w{width}_{a.lower()}"]
            tb_ = tb.seen[f"srsw_w{width}_{b.lower()}"]
            assert ta != tb_, f"width {width}: modes {a} and {b} were never told apart"
    assert any(tb.seen["outreg_sync_w18"]), "the output-register cell never read data"
    assert any(tb.seen["csdecode_w4"]), "the chip-select cell never read data"


@cocotb.test()
async def test_rom_sweep(dut):
    """Every word of every ROM, in address order (``DP16KD_ROM_WORDS`` addresses from 0,
    default all 16384; fewer cover every word of the shallower ROMs and the first words
    of the deeper ones): the netlist (DP16KD instances with Yosys's INITVAL) reads what
    the Amaranth memory was initialised with, and agrees with the Amaranth side on every
    output."""
    tb = TB(dut, seed=1)
    await tb.start()
    roms = [c for c in CASES if c.kind == "rom"]
    expect = {c.name: _rom_init(c) for c in roms}
    got = collections.defaultdict(dict)
    quiet = {"ce": 1, "we": 0, "din": 0, "be": 0, "raddr": 0, "oce": 1, "rrst": 0, "cs": 0}
    words = int(os.environ.get("DP16KD_ROM_WORDS", str(max(c.depth for c in roms))))
    for addr in range(words):
        # Driven after the falling edge, read on the rising edge, compared after it.
        await FallingEdge(dut.clk)
        tb.drive({**quiet, "addr": addr})
        await RisingEdge(dut.clk)
        await ReadOnly()
        tb.compare("ROM sweep")
        net = _unsigned(dut.net, MAPPED, "netlist")
        for c in roms:
            got[c.name][addr % c.depth] = _field(net, MAPPED[c.name])
        tb.cycle += 1
    for c in roms:
        wrong = [a for a, v in got[c.name].items() if v != expect[c.name][a]]
        assert not wrong, (f"{c.name}: {len(wrong)} of {len(got[c.name])} words differ "
                           f"from the Amaranth init, first at {wrong[0]}: "
                           f"{got[c.name][wrong[0]]:#x} != {expect[c.name][wrong[0]]:#x}")
        assert len(got[c.name]) == min(c.depth, words)
