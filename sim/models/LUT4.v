// Behavioural model of the Lattice ECP5 LUT4 (a 4-input look-up table), for simulating
// Yosys netlists: Z is bit {D, C, B, A} of INIT. Written for this project; the netlists
// of tests/hw/test_dp16kd.py need it for the enable gates Yosys puts beside block RAMs,
// make gatesim (sim/gatesim.py) with the other fabric cells of ecp5_cells.v for the
// board's netlist; tests/hw/test_ecp5_cells.py checks it against Amaranth.
/* verilator lint_off UNUSEDPARAM */
module LUT4 (input A, B, C, D, output Z);
    parameter [15:0] INIT = 16'h0000;
    assign Z = INIT[{D, C, B, A}];
endmodule
/* verilator lint_on UNUSEDPARAM */
