// Behavioural model of the Lattice ECP5 MULT18X18D, for simulation only, in the one
// configuration hw/dsp.py instantiates: operand registers A and B and the output
// register on CLK0/CE0, no pipeline register, no reset in use, SIGNEDA/SIGNEDB held
// constant, no cascade or shift inputs (SOURCEA/SOURCEB low, C unused). Any other
// parameter value stops the simulation at time 0, so that a change of the instance
// cannot be simulated by a model that does not describe it.
//
// Yosys ships this primitive as a black box only (share/ecp5/cells_bb.v), which is why the
// project carries its own model. What it assumes of the primitive (Lattice TN1267, ECP5
// sysDSP usage guide): P = A * B, 36 bits, each operand signed when its SIGNED input is
// high; the operand registers and the output register load on the rising edge of CLK0
// while CE0 is high; with both enabled, P is the product of the operands presented two
// enabled edges earlier.
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

    initial begin
        if (REG_INPUTA_CLK != "CLK0" || REG_INPUTB_CLK != "CLK0" || REG_OUTPUT_CLK != "CLK0"
                || REG_PIPELINE_CLK != "NONE" || REG_INPUTA_CE != "CE0"
                || REG_INPUTB_CE != "CE0" || REG_OUTPUT_CE != "CE0") begin
            $display("MULT18X18D model: only registered inputs and output on CLK0/CE0 are modelled");
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

    always @(posedge CLK0) begin
        if (CE0) begin
            a_reg <= a;
            b_reg <= b;
            a_signed <= SIGNEDA;
            b_signed <= SIGNEDB;
            p_reg <= product;
        end
    end
    assign P0 = p_reg[0];
    assign P1 = p_reg[1];
    assign P2 = p_reg[2];
    assign P3 = p_reg[3];
    assign P4 = p_reg[4];
    assign P5 = p_reg[5];
    assign P6 = p_reg[6];
    assign P7 = p_reg[7];
    assign P8 = p_reg[8];
    assign P9 = p_reg[9];
    assign P10 = p_reg[10];
    assign P11 = p_reg[11];
    assign P12 = p_reg[12];
    assign P13 = p_reg[13];
    assign P14 = p_reg[14];
    assign P15 = p_reg[15];
    assign P16 = p_reg[16];
    assign P17 = p_reg[17];
    assign P18 = p_reg[18];
    assign P19 = p_reg[19];
    assign P20 = p_reg[20];
    assign P21 = p_reg[21];
    assign P22 = p_reg[22];
    assign P23 = p_reg[23];
    assign P24 = p_reg[24];
    assign P25 = p_reg[25];
    assign P26 = p_reg[26];
    assign P27 = p_reg[27];
    assign P28 = p_reg[28];
    assign P29 = p_reg[29];
    assign P30 = p_reg[30];
    assign P31 = p_reg[31];
    assign P32 = p_reg[32];
    assign P33 = p_reg[33];
    assign P34 = p_reg[34];
    assign P35 = p_reg[35];
endmodule
