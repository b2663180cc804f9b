"""The FP16 reduction unit (:class:`hw.arith.fp16_reduce.Fp16Reduce`) under an HDL simulator.

The cocotb bench is ``sim/test_fp16_reduce.py`` (what it checks is listed there): random
and directed logical vectors, both ops, with and without idle input cycles and output
back-pressure, every output vector and the event totals against
:func:`host.numerics.reduction.reduce_vectors_bits`; throughput and latency. Two builds, as the
brief for the MFU asks: 4 and 16 lanes, logical vectors of up to 8 native vectors.
"""

import pytest

from hw.arith.fp16_reduce import Fp16Reduce
from sim.runner import run_cocotb

MAX_LENGTH = 8


@pytest.mark.parametrize("lanes", [4, 16])
def test_fp16_reduce(simulator, lanes):
    # Verilator runs the bench about ten times faster than Icarus; the 16-lane build is
    # the slower one to simulate (and to build), so it gets fewer.
    count = (1500 if lanes == 4 else 600) if simulator == "verilator" else 300
    run_cocotb(
        name=f"fp16_reduce_l{lanes}_m{MAX_LENGTH}",
        component=Fp16Reduce(lanes=lanes, max_length=MAX_LENGTH),
        test_module="sim.test_fp16_reduce",
        simulator=simulator,
        extra_env={"RED_LANES": str(lanes), "RED_MAX_LENGTH": str(MAX_LENGTH),
                   "RED_COUNT": str(count)},
    )
