"""cocotb bench of ``tests/hw/test_dsp_hw.py::PairProduct``: two products on one MULT18X18D.

``hw.arith.dsp.registered_product_pair`` packs ``b1`` and ``b2`` into one DSP operand and
unpacks ``a*b1`` and ``a*b2`` from one product (``docs/dsp.md``). The bench offers every
combination of the operands' values (``PAIR_A_BITS``, ``PAIR_B_BITS``, signed) one per
cycle, or ``PAIR_COUNT`` random ones, and checks both products of each two edges later
against Python's integer products: the low product's borrow is undone on both sides only
if the decrement and the increment are right for every sign.
"""

import itertools
import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge

LATENCY = 2          # the DSP's input registers, then its output register


def _signed(value, bits):
    return value - (1 << bits) if value >> (bits - 1) else value


def _operands():
    a_bits, b_bits = int(os.environ["PAIR_A_BITS"]), int(os.environ["PAIR_B_BITS"])
    a_range = range(-(1 << (a_bits - 1)), 1 << (a_bits - 1))
    b_range = range(-(1 << (b_bits - 1)), 1 << (b_bits - 1))
    count = int(os.environ.get("PAIR_COUNT", "0"))
    if count:
        rng = random.Random(cocotb.RANDOM_SEED)
        cases = [(rng.choice(a_range), rng.choice(b_range), rng.choice(b_range))
                 for _ in range(count)]
        # The corners always: the most negative values are the borrow's worst case.
        corners = [a_range[0], -1, 0, 1, a_range[-1]]
        b_corners = [b_range[0], -1, 0, 1, b_range[-1]]
        return cases + list(itertools.product(corners, b_corners, b_corners))
    return list(itertools.product(a_range, b_range, b_range))


@cocotb.test()
async def test_pair_products(dut):
    a_bits, b_bits = int(os.environ["PAIR_A_BITS"]), int(os.environ["PAIR_B_BITS"])
    p_bits = a_bits + b_bits
    cases = _operands()
    Clock(dut.clk, 10, unit="ns").start()
    dut.rst.value = 0
    checked = 0
    # At each falling edge: offer triple c, and check triple c - LATENCY (sampled at the
    # rising edge before the last one).
    for c in range(len(cases) + LATENCY):
        await FallingEdge(dut.clk)
        if c >= LATENCY:
            a, b1, b2 = cases[c - LATENCY]
            got = (_signed(int(dut.p1.value), p_bits), _signed(int(dut.p2.value), p_bits))
            assert got == (a * b1, a * b2), (
                f"a={a} b1={b1} b2={b2}: got {got}, expected {(a * b1, a * b2)}")
            checked += 1
        if c < len(cases):
            a, b1, b2 = cases[c]
            dut.a.value = a & ((1 << a_bits) - 1)
            dut.b1.value = b1 & ((1 << b_bits) - 1)
            dut.b2.value = b2 & ((1 << b_bits) - 1)
    assert checked == len(cases)
    dut._log.info("checked %d operand triples", checked)
