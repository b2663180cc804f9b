"""The FP16 unary unit under an HDL simulator: all 65,536 inputs of every op (Verilator;
Icarus a random quarter), bit-exact against the reference model, with and without stalls,
op switching, events.

The cocotb bench is ``sim/test_fp16_unary.py``; its parameters travel as environment
variables. ``UN_INPUTS`` (patterns per op, default all 65,536) can be lowered from the
environment for a quick run.
"""

import os

import pytest
from amaranth.hdl import Fragment

from host.spec.ops import UnaryOp
from hw.arith.fp16_unary import Fp16Unary
from sim.runner import run_cocotb

INPUTS = int(os.environ.get("UN_INPUTS", str(1 << 16)))
#: Icarus simulates the 16-lane unit about 30 times slower than Verilator: Verilator
#: carries the exhaustive sweeps, Icarus a random sample of each op's inputs.
ICARUS_INPUTS = 1 << 14
#: The subset build shares every table with the full one (only the ROM addresses and the
#: op decoding differ), so random inputs suffice there; the full build is exhaustive.
SUBSET_INPUTS = 8192


def test_fp16_unary_all_ops(simulator):
    """16 lanes (the native vector), every op built: the exhaustive runs (Verilator)."""
    lanes = 16
    inputs = INPUTS if simulator == "verilator" else min(INPUTS, ICARUS_INPUTS)
    run_cocotb(
        name=f"fp16_unary_l{lanes}",
        component=Fp16Unary(lanes=lanes),
        test_module="sim.test_fp16_unary",
        simulator=simulator,
        extra_env={"UN_LANES": str(lanes), "UN_INPUTS": str(inputs)},
    )


def test_fp16_unary_subset(simulator):
    """An odd lane count (one lane has a ROM of its own) and a subset of ops (a smaller
    ROM with other region addresses; unbuilt ops give NaN); 8192 random inputs per op."""
    lanes, ops = 3, (UnaryOp.EXP, UnaryOp.RECIP, UnaryOp.RELU)
    run_cocotb(
        name=f"fp16_unary_l{lanes}_subset",
        component=Fp16Unary(lanes=lanes, ops=ops),
        test_module="sim.test_fp16_unary",
        simulator=simulator,
        extra_env={"UN_LANES": str(lanes), "UN_INPUTS": str(min(INPUTS, SUBSET_INPUTS)),
                   "UN_OPS": ",".join(op.name.lower() for op in ops)},
    )


def test_constructor_errors():
    with pytest.raises(ValueError, match="lanes must be from 1 to 64, not 0"):
        Fp16Unary(lanes=0)
    with pytest.raises(TypeError, match="lanes must be an integer, not '4'"):
        Fp16Unary(lanes="4")
    with pytest.raises(ValueError, match="op must be a UnaryOp or one of .*, not 'sqrt'"):
        Fp16Unary(lanes=4, ops=["exp", "sqrt"])
    with pytest.raises(TypeError, match="ops must be a collection of UnaryOp, not 'exp'"):
        Fp16Unary(lanes=4, ops="exp")
    with pytest.raises(ValueError, match="ops must name at least one unary op"):
        Fp16Unary(lanes=4, ops=[])


def test_build_properties():
    dut = Fp16Unary(lanes=4, ops=[UnaryOp.EXP, "relu"])
    assert dut.lanes == 4 and dut.latency == 15
    assert dut.ops == (UnaryOp.RELU, UnaryOp.EXP)
    assert dut.rom_depth == 128
    full = Fp16Unary(lanes=1)
    assert full.rom_depth == 992
    bare = Fp16Unary(lanes=1, ops=[UnaryOp.PASS, UnaryOp.RELU])
    assert bare.rom_depth == 0
    for unit in (dut, full, bare):                 # each elaborates
        Fragment.get(unit, None)
