"""cocotb bench of ``tests/sim/test_smoke_sim.py::Time0Comb``: its combinational output is
defined (``0b1010``) at time 0, before any clock edge or input change."""

import cocotb
from cocotb.triggers import Timer


@cocotb.test()
async def test_output_defined_without_events(dut):
    await Timer(1, unit="ns")
    value = dut.o.value
    assert value.is_resolvable, f"o is {value} at 1 ns: a combinational block never ran"
    assert value.to_unsigned() == 0b1010, f"o is {value}, expected 1010"
