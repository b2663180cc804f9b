// Behavioural model of the Lattice ECP5 LUT4 (a 4-input look-up table), for simulating
// Yosys netlists: Z is bit {D, C, B, A} of INIT. Written for this project; the netlists
// of tests/hw/test_dp16kd.py need it for the enable gates Yosys puts beside block RAMs.
// A full gate-level simulation needs the other fabric cells too
// (docs/notes/2026-11-28-gatesim-plan.md).
/* verilator lint_off UNUSEDPARAM */
module LUT4 (input A, B, C, D, output Z);
    parameter [15:0] INIT = 16'h0000;
    assign Z = INIT[{D, C, B, A}];
endmodule
/* verilator lint_on UNUSEDPARAM */
