// Behavioural simulation model of the Lattice ECP5 DP16KD block RAM (18 Kbit, two ports),
// written for this project from the primitive's documented behaviour (Lattice TN1264,
// "ECP5 and ECP5-5G Memory Usage Guide") and from the mapping Yosys's synth_ecp5 makes
// (techlibs/lattice/brams_16kd.txt and brams_map_16kd.v), for gate-level simulation of
// the netlists that place and route consumes (docs/notes/2026-11-28-gatesim-plan.md).
// It is not Lattice's model nor Yosys's (Yosys ships the cell as a black box).
//
// What it models
//   * The array: 1024 words of 18 bits (two 9-bit bytes), initialised from INITVAL_00 ..
//     INITVAL_3F: INITVAL_xx holds words 16*xx .. 16*xx + 15, word i in bits
//     [20*i +: 18] of its 320 bits (the top two bits of each 20-bit slot are unused).
//   * Data widths DATA_WIDTH_A/B of 1, 2, 4, 9 and 18 bits. A port of width w addresses
//     units of w bits with AD[13:k] (k = 0, 1, 2, 3, 4 for w = 1, 2, 4, 9, 18): the word
//     is AD[13:4], and inside it each width is two units of the next narrower width plus,
//     from 9 bits on, the ninth bit (Yosys's memlib.md rule, which its INIT conversion
//     follows): the unit starts at bit AD[3]*9 + AD[2]*4 + AD[1]*2 + AD[0], taking only
//     the address bits the width uses. Width 18 writes bytes [8:0] and [17:9] under the
//     byte enables AD[0] and AD[1]. Read data is on DO[w-1:0]; DO[17:w] read 0.
//   * Width 36, the pseudo-dual-port form Yosys maps its PDPW16KD description to:
//     DATA_WIDTH_A = 36 makes port A a write port of 512 words of 36 bits ({DIB, DIA},
//     address ADA[13:5], byte enables ADA[0..3] for DIA[8:0], DIA[17:9], DIB[8:0],
//     DIB[17:9]); 36-bit word j is 18-bit words 2j (low half) and 2j + 1 (high half).
//     DATA_WIDTH_B = 36 (only with A at 36) makes port B its read port: address
//     ADB[13:5], the low half on DOA, the high half on DOB. With A at 36 and B at 18 or
//     less, port B reads at its own width on DOB.
//   * Per port, on the rising edge of CLK (falling with CLKxMUX = "INV") while CE is 1
//     and CS2..CS0 equal CSDECODE ("0b000": all low): WE 1 writes; the read data register
//     takes the addressed unit; while writing, WRITEMODE decides what it takes:
//     "NORMAL" keeps its value, "WRITETHROUGH" takes the unit as written (new data),
//     "READBEFOREWRITE" the unit before the write (old data).
//   * REGMODE "NOREG": DO is that read data register. "OUTREG": DO is one more register,
//     loaded from it on the clock edge while OCE is 1 (one more cycle of latency).
//   * RST clears the read data register and the output register: with RESETMODE "SYNC"
//     on the clock edge (whatever CE: Yosys's "rdsrst ungated"), with "ASYNC" at once and
//     for as long as it is high. A reset does not stop a write of the same edge; Yosys
//     never resets and writes a port in one cycle ("block_wr"), and the tests do neither.
//     ASYNC_RESET_RELEASE is accepted and has no effect on this model.
//   * Power-on: the registers read 0 (Yosys's "rdinit zero"). GSR and INIT_DATA are
//     accepted and have no effect (there is no GSR net in a simulation).
//
// What it does not model
//   * A read and a write of one word through different ports on the same edge is
//     undefined on the device; here the read returns the word before the write (both
//     ports' registers take their values with non-blocking assignments). Two writes of
//     the same bit on one edge leave whichever the simulator schedules last.
//   * Timing, and the pin inversion parameters other than CLKAMUX/CLKBMUX (DIA0MUX ...):
//     an instance that sets one does not compile, so a netlist that needs more than this
//     model knows fails loudly instead of simulating wrongly.
//
// Checked by tests/hw/test_dp16kd.py (cocotb, Icarus and Verilator) against Amaranth's
// lib.memory.Memory: the netlists Yosys makes of Amaranth memories in every width and
// write mode and of ROMs, and the modes Yosys never emits (OUTREG, resets, chip selects,
// mixed widths) against Amaranth references.

`default_nettype none
// String parameters are compared with literals of other lengths (zero-extended alike),
// a port's unused inputs and parameters are legitimately unused, and the array is
// written from both ports' clocks, as a true dual-port RAM is.
/* verilator lint_off WIDTH */
/* verilator lint_off MULTIDRIVEN */
/* verilator lint_off UNUSEDSIGNAL */
/* verilator lint_off UNUSEDPARAM */
module DP16KD (
    input  wire DIA17, DIA16, DIA15, DIA14, DIA13, DIA12, DIA11, DIA10, DIA9, DIA8, DIA7, DIA6, DIA5, DIA4, DIA3, DIA2, DIA1, DIA0,
    input  wire ADA13, ADA12, ADA11, ADA10, ADA9, ADA8, ADA7, ADA6, ADA5, ADA4, ADA3, ADA2, ADA1, ADA0,
    input  wire CEA, OCEA, CLKA, WEA, CSA0, CSA1, CSA2, RSTA,
    input  wire DIB17, DIB16, DIB15, DIB14, DIB13, DIB12, DIB11, DIB10, DIB9, DIB8, DIB7, DIB6, DIB5, DIB4, DIB3, DIB2, DIB1, DIB0,
    input  wire ADB13, ADB12, ADB11, ADB10, ADB9, ADB8, ADB7, ADB6, ADB5, ADB4, ADB3, ADB2, ADB1, ADB0,
    input  wire CEB, OCEB, CLKB, WEB, CSB0, CSB1, CSB2, RSTB,
    output wire DOA17, DOA16, DOA15, DOA14, DOA13, DOA12, DOA11, DOA10, DOA9, DOA8, DOA7, DOA6, DOA5, DOA4, DOA3, DOA2, DOA1, DOA0,
    output wire DOB17, DOB16, DOB15, DOB14, DOB13, DOB12, DOB11, DOB10, DOB9, DOB8, DOB7, DOB6, DOB5, DOB4, DOB3, DOB2, DOB1, DOB0
);
    parameter DATA_WIDTH_A = 18;
    parameter DATA_WIDTH_B = 18;
    parameter REGMODE_A = "NOREG";
    parameter REGMODE_B = "NOREG";
    parameter RESETMODE = "SYNC";
    parameter ASYNC_RESET_RELEASE = "SYNC";
    parameter CSDECODE_A = "0b000";
    parameter CSDECODE_B = "0b000";
    parameter WRITEMODE_A = "NORMAL";
    parameter WRITEMODE_B = "NORMAL";
    parameter CLKAMUX = "CLKA";
    parameter CLKBMUX = "CLKB";
    parameter GSR = "ENABLED";
    parameter INIT_DATA = "STATIC";
    parameter [319:0] INITVAL_00 = 320'h0;
    parameter [319:0] INITVAL_01 = 320'h0;
    parameter [319:0] INITVAL_02 = 320'h0;
    parameter [319:0] INITVAL_03 = 320'h0;
    parameter [319:0] INITVAL_04 = 320'h0;
    parameter [319:0] INITVAL_05 = 320'h0;
    parameter [319:0] INITVAL_06 = 320'h0;
    parameter [319:0] INITVAL_07 = 320'h0;
    parameter [319:0] INITVAL_08 = 320'h0;
    parameter [319:0] INITVAL_09 = 320'h0;
    parameter [319:0] INITVAL_0A = 320'h0;
    parameter [319:0] INITVAL_0B = 320'h0;
    parameter [319:0] INITVAL_0C = 320'h0;
    parameter [319:0] INITVAL_0D = 320'h0;
    parameter [319:0] INITVAL_0E = 320'h0;
    parameter [319:0] INITVAL_0F = 320'h0;
    parameter [319:0] INITVAL_10 = 320'h0;
    parameter [319:0] INITVAL_11 = 320'h0;
    parameter [319:0] INITVAL_12 = 320'h0;
    parameter [319:0] INITVAL_13 = 320'h0;
    parameter [319:0] INITVAL_14 = 320'h0;
    parameter [319:0] INITVAL_15 = 320'h0;
    parameter [319:0] INITVAL_16 = 320'h0;
    parameter [319:0] INITVAL_17 = 320'h0;
    parameter [319:0] INITVAL_18 = 320'h0;
    parameter [319:0] INITVAL_19 = 320'h0;
    parameter [319:0] INITVAL_1A = 320'h0;
    parameter [319:0] INITVAL_1B = 320'h0;
    parameter [319:0] INITVAL_1C = 320'h0;
    parameter [319:0] INITVAL_1D = 320'h0;
    parameter [319:0] INITVAL_1E = 320'h0;
    parameter [319:0] INITVAL_1F = 320'h0;
    parameter [319:0] INITVAL_20 = 320'h0;
    parameter [319:0] INITVAL_21 = 320'h0;
    parameter [319:0] INITVAL_22 = 320'h0;
    parameter [319:0] INITVAL_23 = 320'h0;
    parameter [319:0] INITVAL_24 = 320'h0;
    parameter [319:0] INITVAL_25 = 320'h0;
    parameter [319:0] INITVAL_26 = 320'h0;
    parameter [319:0] INITVAL_27 = 320'h0;
    parameter [319:0] INITVAL_28 = 320'h0;
    parameter [319:0] INITVAL_29 = 320'h0;
    parameter [319:0] INITVAL_2A = 320'h0;
    parameter [319:0] INITVAL_2B = 320'h0;
    parameter [319:0] INITVAL_2C = 320'h0;
    parameter [319:0] INITVAL_2D = 320'h0;
    parameter [319:0] INITVAL_2E = 320'h0;
    parameter [319:0] INITVAL_2F = 320'h0;
    parameter [319:0] INITVAL_30 = 320'h0;
    parameter [319:0] INITVAL_31 = 320'h0;
    parameter [319:0] INITVAL_32 = 320'h0;
    parameter [319:0] INITVAL_33 = 320'h0;
    parameter [319:0] INITVAL_34 = 320'h0;
    parameter [319:0] INITVAL_35 = 320'h0;
    parameter [319:0] INITVAL_36 = 320'h0;
    parameter [319:0] INITVAL_37 = 320'h0;
    parameter [319:0] INITVAL_38 = 320'h0;
    parameter [319:0] INITVAL_39 = 320'h0;
    parameter [319:0] INITVAL_3A = 320'h0;
    parameter [319:0] INITVAL_3B = 320'h0;
    parameter [319:0] INITVAL_3C = 320'h0;
    parameter [319:0] INITVAL_3D = 320'h0;
    parameter [319:0] INITVAL_3E = 320'h0;
    parameter [319:0] INITVAL_3F = 320'h0;

    // --- parameter checks: a value this model does not know stops the simulation ------
    localparam PDP = DATA_WIDTH_A == 36;
    initial begin
        if (!(DATA_WIDTH_A == 1 || DATA_WIDTH_A == 2 || DATA_WIDTH_A == 4 || DATA_WIDTH_A == 9
              || DATA_WIDTH_A == 18 || DATA_WIDTH_A == 36)) begin
            $display("DP16KD %m: DATA_WIDTH_A %0d is not 1, 2, 4, 9, 18 or 36", DATA_WIDTH_A);
            $finish;
        end
        if (!(DATA_WIDTH_B == 1 || DATA_WIDTH_B == 2 || DATA_WIDTH_B == 4 || DATA_WIDTH_B == 9
              || DATA_WIDTH_B == 18 || (DATA_WIDTH_B == 36 && PDP))) begin
            $display("DP16KD %m: DATA_WIDTH_B %0d is not 1, 2, 4, 9, 18 (or 36 with A at 36)",
                     DATA_WIDTH_B);
            $finish;
        end
        if (!(WRITEMODE_A == "NORMAL" || WRITEMODE_A == "WRITETHROUGH"
              || WRITEMODE_A == "READBEFOREWRITE")
            || !(WRITEMODE_B == "NORMAL" || WRITEMODE_B == "WRITETHROUGH"
                 || WRITEMODE_B == "READBEFOREWRITE")) begin
            $display("DP16KD %m: WRITEMODE_A/B must be NORMAL, WRITETHROUGH or READBEFOREWRITE");
            $finish;
        end
        if (!(REGMODE_A == "NOREG" || REGMODE_A == "OUTREG")
            || !(REGMODE_B == "NOREG" || REGMODE_B == "OUTREG")) begin
            $display("DP16KD %m: REGMODE_A/B must be NOREG or OUTREG");
            $finish;
        end
        if (!(RESETMODE == "SYNC" || RESETMODE == "ASYNC")) begin
            $display("DP16KD %m: RESETMODE must be SYNC or ASYNC");
            $finish;
        end
        if (!(CLKAMUX == "CLKA" || CLKAMUX == "INV") || !(CLKBMUX == "CLKB" || CLKBMUX == "INV")) begin
            $display("DP16KD %m: CLKAMUX/CLKBMUX must be the clock or INV");
            $finish;
        end
    end

    // --- pins as buses ------------------------------------------------------------------
    wire [17:0] dia = {DIA17, DIA16, DIA15, DIA14, DIA13, DIA12, DIA11, DIA10, DIA9, DIA8, DIA7, DIA6, DIA5, DIA4, DIA3, DIA2, DIA1, DIA0};
    wire [17:0] dib = {DIB17, DIB16, DIB15, DIB14, DIB13, DIB12, DIB11, DIB10, DIB9, DIB8, DIB7, DIB6, DIB5, DIB4, DIB3, DIB2, DIB1, DIB0};
    wire [13:0] ada = {ADA13, ADA12, ADA11, ADA10, ADA9, ADA8, ADA7, ADA6, ADA5, ADA4, ADA3, ADA2, ADA1, ADA0};
    wire [13:0] adb = {ADB13, ADB12, ADB11, ADB10, ADB9, ADB8, ADB7, ADB6, ADB5, ADB4, ADB3, ADB2, ADB1, ADB0};
    wire clka = CLKAMUX == "INV" ? ~CLKA : CLKA;
    wire clkb = CLKBMUX == "INV" ? ~CLKB : CLKB;
    // CSDECODE is a string "0bXYZ": its last three characters are CS2, CS1, CS0.
    wire [2:0] cs_a = {CSDECODE_A[23:16] == "1", CSDECODE_A[15:8] == "1", CSDECODE_A[7:0] == "1"};
    wire [2:0] cs_b = {CSDECODE_B[23:16] == "1", CSDECODE_B[15:8] == "1", CSDECODE_B[7:0] == "1"};
    wire en_a = CEA && {CSA2, CSA1, CSA0} == cs_a;
    wire en_b = CEB && {CSB2, CSB1, CSB0} == cs_b;
    wire async_rst_a = RESETMODE == "ASYNC" && RSTA;
    wire async_rst_b = RESETMODE == "ASYNC" && RSTB;

    // --- the array --------------------------------------------------------------------
    localparam [64*320-1:0] INITVALS = {INITVAL_3F, INITVAL_3E, INITVAL_3D, INITVAL_3C,
        INITVAL_3B, INITVAL_3A, INITVAL_39, INITVAL_38,
        INITVAL_37, INITVAL_36, INITVAL_35, INITVAL_34,
        INITVAL_33, INITVAL_32, INITVAL_31, INITVAL_30,
        INITVAL_2F, INITVAL_2E, INITVAL_2D, INITVAL_2C,
        INITVAL_2B, INITVAL_2A, INITVAL_29, INITVAL_28,
        INITVAL_27, INITVAL_26, INITVAL_25, INITVAL_24,
        INITVAL_23, INITVAL_22, INITVAL_21, INITVAL_20,
        INITVAL_1F, INITVAL_1E, INITVAL_1D, INITVAL_1C,
        INITVAL_1B, INITVAL_1A, INITVAL_19, INITVAL_18,
        INITVAL_17, INITVAL_16, INITVAL_15, INITVAL_14,
        INITVAL_13, INITVAL_12, INITVAL_11, INITVAL_10,
        INITVAL_0F, INITVAL_0E, INITVAL_0D, INITVAL_0C,
        INITVAL_0B, INITVAL_0A, INITVAL_09, INITVAL_08,
        INITVAL_07, INITVAL_06, INITVAL_05, INITVAL_04,
        INITVAL_03, INITVAL_02, INITVAL_01, INITVAL_00};
    reg [17:0] mem [0:1023];
    integer i;
    initial
        for (i = 0; i < 1024; i = i + 1)
            mem[i] = INITVALS[(i / 16) * 320 + (i % 16) * 20 +: 18];

    // The unit a port of `width` bits (1..18) addresses: bit offset in word addr[13:4].
    function integer offset_of(input [13:0] addr, input integer width);
        offset_of = (width <= 9 ? addr[3] * 9 : 0) + (width <= 4 ? addr[2] * 4 : 0)
                  + (width <= 2 ? addr[1] * 2 : 0) + (width <= 1 ? addr[0] * 1 : 0);
    endfunction

    // Bits of word addr[13:4] a write of `width` bits (1..18) changes (18: byte enables).
    function [17:0] mask_of(input [13:0] addr, input integer width);
        if (width == 18)
            mask_of = {{9{addr[1]}}, {9{addr[0]}}};
        else
            mask_of = ((18'd1 << width) - 18'd1) << offset_of(addr, width);
    endfunction

    // A port's data placed at its unit (width 1..18).
    function [17:0] place(input [17:0] data, input [13:0] addr, input integer width);
        place = width == 18 ? data : (data & ((18'd1 << width) - 18'd1)) << offset_of(addr, width);
    endfunction

    // The unit of `word` a port of `width` bits (1..18) reads, in its low bits.
    function [17:0] unit_of(input [17:0] word, input [13:0] addr, input integer width);
        unit_of = width == 18 ? word : (word >> offset_of(addr, width)) & ((18'd1 << width) - 18'd1);
    endfunction

    // Writes, bit by bit, so that two ports writing different units of one word on the
    // same edge both take effect. With A at 36 bits, {DIB, DIA} goes into 18-bit words
    // 2j + 1 (wmask_hi) and 2j (wmask_a), bytes enabled by ADA[3:0].
    wire [17:0] wmask_a = PDP ? {{9{ada[1]}}, {9{ada[0]}}} : mask_of(ada, DATA_WIDTH_A);
    wire [17:0] wmask_hi = {{9{ada[3]}}, {9{ada[2]}}};
    wire [17:0] wdata_a = PDP ? dia : place(dia, ada, DATA_WIDTH_A);
    wire [9:0] word_a = PDP ? {ada[13:5], 1'b0} : ada[13:4];
    wire [17:0] wmask_b = mask_of(adb, DATA_WIDTH_B);
    wire [17:0] wdata_b = place(dib, adb, DATA_WIDTH_B);
    integer b;
    always @(posedge clka)
        if (en_a && WEA)
            for (b = 0; b < 18; b = b + 1) begin
                if (wmask_a[b]) mem[word_a][b] <= wdata_a[b];
                if (PDP && wmask_hi[b]) mem[{ada[13:5], 1'b1}][b] <= dib[b];
            end

    integer c;
    always @(posedge clkb)
        if (en_b && WEB && !PDP)
            for (c = 0; c < 18; c = c + 1)
                if (wmask_b[c]) mem[adb[13:4]][c] <= wdata_b[c];

    // --- read data registers ------------------------------------------------------------
    // What a port's register takes on an enabled edge: the unit before a write, after
    // it, or nothing new (NORMAL), as its WRITEMODE says.
    function [17:0] read_value(input [17:0] held, input [17:0] old_word, input [17:0] din,
                               input [13:0] addr, input we, input integer width,
                               input [8*15-1:0] mode);
        reg [17:0] new_word;
        begin
            new_word = (old_word & ~mask_of(addr, width)) | (place(din, addr, width)
                                                             & mask_of(addr, width));
            if (!we)
                read_value = unit_of(old_word, addr, width);
            else if (mode == "NORMAL")
                read_value = held;
            else if (mode == "WRITETHROUGH")
                read_value = unit_of(new_word, addr, width);
            else
                read_value = unit_of(old_word, addr, width);
        end
    endfunction

    reg [17:0] data_a, data_b;                 // read data registers
    reg [17:0] data_b_hi;                      // 36-bit reads: the high half
    reg [17:0] out_a, out_b, out_b_hi;         // OUTREG registers
    initial begin                              // power-on: all read 0
        data_a = 18'd0; data_b = 18'd0; data_b_hi = 18'd0;
        out_a = 18'd0; out_b = 18'd0; out_b_hi = 18'd0;
    end

    always @(posedge clka or posedge async_rst_a)
        if (async_rst_a || (RESETMODE == "SYNC" && RSTA))
            data_a <= 18'd0;
        else if (en_a && !PDP)
            data_a <= read_value(data_a, mem[ada[13:4]], dia, ada, WEA, DATA_WIDTH_A,
                                 WRITEMODE_A);

    always @(posedge clkb or posedge async_rst_b)
        if (async_rst_b || (RESETMODE == "SYNC" && RSTB)) begin
            data_b <= 18'd0;
            data_b_hi <= 18'd0;
        end else if (en_b) begin
            if (DATA_WIDTH_B == 36) begin
                // The read port of the 36-bit form (port A only writes).
                data_b <= mem[{adb[13:5], 1'b0}];
                data_b_hi <= mem[{adb[13:5], 1'b1}];
            end else
                data_b <= read_value(data_b, mem[adb[13:4]], dib, adb, WEB && !PDP,
                                     DATA_WIDTH_B, WRITEMODE_B);
        end

    always @(posedge clka or posedge async_rst_a)
        if (async_rst_a || (RESETMODE == "SYNC" && RSTA))
            out_a <= 18'd0;
        else if (OCEA)
            out_a <= data_a;

    always @(posedge clkb or posedge async_rst_b)
        if (async_rst_b || (RESETMODE == "SYNC" && RSTB)) begin
            out_b <= 18'd0;
            out_b_hi <= 18'd0;
        end else if (OCEB) begin
            out_b <= data_b;
            out_b_hi <= data_b_hi;
        end

    // --- outputs ------------------------------------------------------------------------
    wire [17:0] q_a = REGMODE_A == "OUTREG" ? out_a : data_a;
    wire [17:0] q_b = REGMODE_B == "OUTREG" ? out_b : data_b;
    wire [17:0] q_b_hi = REGMODE_B == "OUTREG" ? out_b_hi : data_b_hi;
    // An asynchronous reset shows at once, before the registers' next edge.
    // (With B at 36 bits, DOA carries the low half of port B's read.)
    wire [17:0] doa = DATA_WIDTH_B == 36 ? (async_rst_b ? 18'd0 : q_b)
                                         : (async_rst_a ? 18'd0 : q_a);
    wire [17:0] dob = async_rst_b ? 18'd0 : DATA_WIDTH_B == 36 ? q_b_hi : q_b;
    assign DOA0 = doa[0];
    assign DOA1 = doa[1];
    assign DOA2 = doa[2];
    assign DOA3 = doa[3];
    assign DOA4 = doa[4];
    assign DOA5 = doa[5];
    assign DOA6 = doa[6];
    assign DOA7 = doa[7];
    assign DOA8 = doa[8];
    assign DOA9 = doa[9];
    assign DOA10 = doa[10];
    assign DOA11 = doa[11];
    assign DOA12 = doa[12];
    assign DOA13 = doa[13];
    assign DOA14 = doa[14];
    assign DOA15 = doa[15];
    assign DOA16 = doa[16];
    assign DOA17 = doa[17];
    assign DOB0 = dob[0];
    assign DOB1 = dob[1];
    assign DOB2 = dob[2];
    assign DOB3 = dob[3];
    assign DOB4 = dob[4];
    assign DOB5 = dob[5];
    assign DOB6 = dob[6];
    assign DOB7 = dob[7];
    assign DOB8 = dob[8];
    assign DOB9 = dob[9];
    assign DOB10 = dob[10];
    assign DOB11 = dob[11];
    assign DOB12 = dob[12];
    assign DOB13 = dob[13];
    assign DOB14 = dob[14];
    assign DOB15 = dob[15];
    assign DOB16 = dob[16];
    assign DOB17 = dob[17];
endmodule
/* verilator lint_on UNUSEDPARAM */
/* verilator lint_on UNUSEDSIGNAL */
/* verilator lint_on MULTIDRIVEN */
/* verilator lint_on WIDTH */

`default_nettype wire
