// Behavioural model of the Lattice ECP5 MULT18X18D, for simulation only, in the two
// configurations this project's designs use:
//
// * registered, as hw/arith/dsp.py instantiates it: operand registers A and B and the
//   output register on CLK0/CE0, no pipeline register, no reset in use, SIGNEDA/SIGNEDB
//   held constant;
// * combinational, as Yosys's synth_ecp5 maps a `$mul` to it (techmap dsp_map.v, every
//   REG_*_CLK "NONE", the primitive's defaults): P is the product of the inputs now.
//
// In both, no cascade or shift inputs (SOURCEA/SOURCEB low, C unused). Any other
// parameter value stops the simulation at time 0, so that a change of the instance
// cannot be simulated by a model that does not describe it.
//
// Yosys ships this primitive as a black box only (share/ecp5/cells_bb.v), which is why the
// project carries its own model. What it assumes of the primitive (Lattice TN1267, ECP5
// sysDSP usage guide): P = A * B, 36 bits, each operand signed when its SIGNED input is
// high; the operand registers and the output register load on the rising edge of CLK0
// while CE0 is high; with both enabled, P is the product of the operands presented two
// enabled edges earlier. tests/hw/test_dsp_hw.py tests the registered form,
// tests/hw/test_ecp5_cells.py the combinational one (against Amaranth's `*`).
/* verilator lint_off UNUSEDSIGNAL */
/* verilator lint_off UNUSEDPARAM */
module MULT18X18D (
    input A0, A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11, A12, A13, A14, A15, A16, A17,
    input B0, B1, B2, B3, B4, B5, B6, B7, B8, B9, B10, B11, B12, B13, B14, B15, B16, B17,
    input C0, C1, C2, C3, C4, C5, C6, C7, C8, C9, C10, C11, C12, C13, C14, C15, C16, C17,
    input SIGNEDA, SIGNEDB, SOURCEA, SOURCEB,
    input CLK0, CE0, RST0,
    output P0, P1, P2, P3, P4, P5, P6, P7, P8, P9, P10, P11, P12, P13, P14, P15, P16, P17, P18, P19, P20, P21, P22, P23, P24, P25, P26, P27, P28, P29, P30, P31, P32, P33, P34, P35
);
    parameter REG_INPUTA_CLK = "NONE";
    parameter REG_INPUTA_CE = "CE0";
    parameter REG_INPUTA_RST = "RST0";
    parameter REG_INPUTB_CLK = "NONE";
    parameter REG_INPUTB_CE = "CE0";
    parameter REG_INPUTB_RST = "RST0";
    parameter REG_PIPELINE_CLK = "NONE";
    parameter REG_OUTPUT_CLK = "NONE";
    parameter REG_OUTPUT_CE = "CE0";
    parameter REG_OUTPUT_RST = "RST0";
    parameter GSR = "ENABLED";
    parameter RESETMODE = "SYNC";

    // Combinational: no register at all; registered: inputs and output on CLK0/CE0.
    localparam COMB = REG_INPUTA_CLK == "NONE" && REG_INPUTB_CLK == "NONE"
                      && REG_OUTPUT_CLK == "NONE" && REG_PIPELINE_CLK == "NONE";
    initial begin
        if (!COMB && (REG_INPUTA_CLK != "CLK0" || REG_INPUTB_CLK != "CLK0" || REG_OUTPUT_CLK != "CLK0"
                || REG_PIPELINE_CLK != "NONE" || REG_INPUTA_CE != "CE0"
                || REG_INPUTB_CE != "CE0" || REG_OUTPUT_CE != "CE0")) begin
            $display("MULT18X18D model: only no registers, or registered inputs and output on CLK0/CE0, are modelled");
            $finish;
        end
    end

    wire [17:0] a = {A17, A16, A15, A14, A13, A12, A11, A10, A9, A8, A7, A6, A5, A4, A3, A2, A1, A0};
    wire [17:0] b = {B17, B16, B15, B14, B13, B12, B11, B10, B9, B8, B7, B6, B5, B4, B3, B2, B1, B0};
    reg [17:0] a_reg, b_reg;
    reg a_signed, b_signed;
    reg [35:0] p_reg;
    // Operands extended to 36 bits by their own signedness; the low 36 bits of the
    // product are the 36-bit product whatever the signs.
    wire [35:0] a_ext = {{18{a_signed & a_reg[17]}}, a_reg};
    wire [35:0] b_ext = {{18{b_signed & b_reg[17]}}, b_reg};
    wire [35:0] product = a_ext * b_ext;
    wire [35:0] a_now = {{18{SIGNEDA & a[17]}}, a};
    wire [35:0] b_now = {{18{SIGNEDB & b[17]}}, b};
    wire [35:0] p = COMB ? a_now * b_now : p_reg;

    always @(posedge CLK0) begin
        if (CE0) begin
            a_reg <= a;
            b_reg <= b;
            a_signed <= SIGNEDA;
            b_signed <= SIGNEDB;
            p_reg <= product;
        end
    end
    assign P0 = p[0];
    assign P1 = p[1];
    assign P2 = p[2];
    assign P3 = p[3];
    assign P4 = p[4];
    assign P5 = p[5];
    assign P6 = p[6];
    assign P7 = p[7];
    assign P8 = p[8];
    assign P9 = p[9];
    assign P10 = p[10];
    assign P11 = p[11];
    assign P12 = p[12];
    assign P13 = p[13];
    assign P14 = p[14];
    assign P15 = p[15];
    assign P16 = p[16];
    assign P17 = p[17];
    assign P18 = p[18];
    assign P19 = p[19];
    assign P20 = p[20];
    assign P21 = p[21];
    assign P22 = p[22];
    assign P23 = p[23];
    assign P24 = p[24];
    assign P25 = p[25];
    assign P26 = p[26];
    assign P27 = p[27];
    assign P28 = p[28];
    assign P29 = p[29];
    assign P30 = p[30];
    assign P31 = p[31];
    assign P32 = p[32];
    assign P33 = p[33];
    assign P34 = p[34];
    assign P35 = p[35];
endmodule
