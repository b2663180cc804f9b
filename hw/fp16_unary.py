"""FP16 unary functions of an MFU (relu, sigmoid, tanh, exp, reciprocal, pass), N lanes.

The bit-exact reference is :func:`host.unary.unary_bits`; the method, the fixed-point
formats, the ROM and the measured error are in ``docs/unary-functions.md``.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from host.formats import FP16_BIAS, check_int
from host.unary import (
    C0_BITS, C0_FRAC_BITS, C1_BITS, DX_BITS, LOG2E_FRAC_BITS, LOG2E_INT, REGIONS,
    ROM_WORD_BITS, SIG_TABLES, T_CLAMP_EXP, T_FRAC_BITS, T_INT_BITS, TANH_SMALL_BINADES,
    Y_BITS, UnaryOp, parse_ops, rom_depth, rom_layout, rom_words,
)

__all__ = ["Fp16Unary", "LATENCY", "LANES_MAX"]

#: Register stages from an accepted input vector to its output (see :class:`Fp16Unary`).
LATENCY = 12
LANES_MAX = 64

_F = T_FRAC_BITS
_WF = C0_FRAC_BITS
_T_BITS = _F + T_INT_BITS                       # |t| register: 22 bits
_P_BITS = 11 + LOG2E_INT.bit_length()           # sig * log2(e): 29 bits
#: |t| * 2**16 = p >> (26 - ex - c); the smallest shift (ex + c = 19) is 7.
_P_SHIFT_BASE = 25 + LOG2E_FRAC_BITS - _F - (FP16_BIAS + T_CLAMP_EXP - 1)
#: Exponent fields of tanh's small-argument table, and below it tanh(x) = x.
_TS_LO = FP16_BIAS + TANH_SMALL_BINADES[0]       # 9
_TS_HI = FP16_BIAS + TANH_SMALL_BINADES[1]       # 13


class _Kind:
    """What the output of a lane is, decided from the input alone (3 bits)."""
    DP = 0       # the datapath's result (sign applied for tanh and recip)
    X = 1        # the input itself (pass, relu of x >= 0, tanh of tiny x)
    NAN = 2      # 0x7E00
    ZERO = 3     # +-0
    ONE = 4      # +-1
    INF = 5      # +-inf


def input_layout(lanes):
    """Payload of ``i_stream``: ``x`` (lane ``i`` at bits ``[16i, 16i+16)``) then ``op``."""
    return data.StructLayout({"x": data.ArrayLayout(unsigned(16), lanes), "op": UnaryOp})


def output_layout(lanes):
    """Payload of ``o_stream``: ``result`` (16 bits per lane), then ``overflow`` and
    ``nan_created`` (1 bit per lane each)."""
    return data.StructLayout({
        "result": data.ArrayLayout(unsigned(16), lanes),
        "overflow": data.ArrayLayout(unsigned(1), lanes),
        "nan_created": data.ArrayLayout(unsigned(1), lanes),
    })


class Fp16Unary(wiring.Component):
    """Apply one :class:`~host.unary.UnaryOp` to every lane of an FP16 vector per cycle.

    Every output equals :func:`host.unary.unary_bits` (and the event bits
    :func:`host.unary.unary_events`) bit for bit, for every op, input and build.

    **Datapath per lane** (``docs/unary-functions.md`` gives the reasons and the error):

    1. decode; what the lane's output is if not the datapath's (NaN, +-inf, +-0, relu,
       pass, tanh of tiny x, reciprocal of 0 and of inf).
    2. ``p = sig * round(log2(e) * 2**17)`` (11 x 18 bits, one multiplier).
    3. ``|t| * 2**16 = p >> (26 - ex - c)`` (barrel shift, clamp for ``|x| * 2**c >= 32``),
       ``i, f`` of ``+-t``; leading-zero count of a subnormal's significand (reciprocal).
    4. ROM address and segment position ``dx`` of the op's table; exponent ``q``.
    5. ROM read (a ``lib.memory.Memory`` with no write port: block RAM, one read port per
       lane, two lanes per memory); 6. ROM output register.
    7. ``c1 * dx`` (16 x 11 bits, one multiplier); 8. ``y = c0 + (c1 * dx >> 11)``.
    9. shift amount: subnormal or complement alignment; 10. right shift.
    11. complement ``1 - v`` (sigmoid of x >= 0, tanh of |x| >= 1/2) by inversion,
        normalization.
    12. round (one increment), pick the exponent field and overflow prepared in 11,
        special results, events; output register.

    The pipeline has :data:`LATENCY` (12) register stages that all advance together
    when the output register is empty or being read (a global stall): a vector leaves
    ``o_stream`` 12 cycles after it was accepted when nothing stalls, and one vector is
    accepted per cycle while ``o_stream.ready`` is high. ``i_stream.ready`` depends
    combinationally on ``o_stream.ready`` (never the other way round); ``o_stream.valid``
    only on state; the output payload is held while ``o_stream.ready`` is low. The op is
    part of each vector's payload, so consecutive vectors may use different ops.

    An op missing from ``ops`` (and the unused codes 6 and 7) gives the canonical NaN on
    every lane, with ``nan_created`` set for every non-NaN input.

    Parameters
    ----------
    lanes : int, 1..64
        FP16 values per vector.
    ops : collection of UnaryOp, default all
        The ops built. The ROM holds only the tables they need (exp: 128 words; sigmoid
        adds 448; tanh adds 160 more; reciprocal: 256; all: 992 words of 36 bits); a
        build of relu and pass only has no ROM and no multiplier.

    Attributes
    ----------
    i_stream : ``In(stream.Signature(input_layout(lanes)))``
        ``x``: FP16 bit patterns, lane ``i`` at payload bits ``[16i, 16i+16)``;
        ``op``: :class:`UnaryOp` at bits ``[16*lanes, 16*lanes+3)``.
    o_stream : ``Out(stream.Signature(output_layout(lanes)))``
        ``result`` (lane ``i`` at ``[16i, 16i+16)``), ``overflow`` (bit ``16*lanes+i``:
        a finite input gave +-inf) and ``nan_created`` (bit ``17*lanes+i``: a non-NaN
        input gave NaN).
    lanes : int
    ops : tuple of UnaryOp
    latency : int
        :data:`LATENCY`.
    rom_depth : int
        Words of each lane pair's ROM (0 without table ops).

    Raises
    ------
    TypeError
        ``lanes`` is not an integer; ``ops`` is not a collection of ops.
    ValueError
        ``lanes`` is out of range; an element of ``ops`` is not a unary op; ``ops`` is
        empty.
    """

    def __init__(self, *, lanes, ops=None):
        self._lanes = check_int("lanes", lanes, 1, LANES_MAX)
        self._ops = parse_ops(ops)
        if not self._ops:
            raise ValueError(f"ops must name at least one unary op, not {ops!r}")
        self._layout = rom_layout(self._ops)
        self._depth = rom_depth(self._ops)
        super().__init__({
            "i_stream": In(stream.Signature(input_layout(self._lanes))),
            "o_stream": Out(stream.Signature(output_layout(self._lanes))),
        })

    @property
    def lanes(self):
        return self._lanes

    @property
    def ops(self):
        return self._ops

    @property
    def latency(self):
        return LATENCY

    @property
    def rom_depth(self):
        return self._depth

    def elaborate(self, platform):
        m = Module()
        lanes, built = self._lanes, set(self._ops)
        has = {op: op in built for op in UnaryOp}
        layout = self._layout

        advance = Signal()
        m.d.comb += [
            advance.eq(~self.o_stream.valid | self.o_stream.ready),
            self.i_stream.ready.eq(advance),
        ]

        # As in hw/quantizer.py: every value its own signal with one continuous
        # assignment; registers with a feedback multiplexer as their enable.
        def wire(shape, name, value):
            w = Signal(shape, name=name)
            m.d.comb += w.eq(value)
            return w

        def reg(shape, name, value):
            r = Signal(shape, name=name, reset_less=True)
            m.d.sync += r.eq(Mux(advance, value, r))
            return r

        # Valid bits (reset) and the op, shared by all lanes, per stage.
        valid = [self.i_stream.valid]
        for k in range(1, LATENCY + 1):
            v = Signal(name=f"valid{k}")
            m.d.sync += v.eq(Mux(advance, valid[-1], v))
            valid.append(v)
        m.d.comb += self.o_stream.valid.eq(valid[LATENCY])

        op_in = wire(3, "op0", self.i_stream.payload.op.as_value())
        ops = [op_in]
        for k in range(1, LATENCY):
            ops.append(reg(3, f"op{k}", ops[-1]))

        # One ROM per lane pair.
        read_ports = []
        if self._depth:
            words = rom_words(self._ops)
            for p in range((lanes + 1) // 2):
                rom = Memory(shape=unsigned(ROM_WORD_BITS), depth=self._depth, init=words)
                m.submodules[f"rom{p}"] = rom
                for _ in range(min(2, lanes - 2 * p)):
                    read_ports.append(rom.read_port(domain="sync"))

        payload_x = self.i_stream.payload.x
        out = self.o_stream.payload
        for lane in range(lanes):
            res, ovf, nanc = self._lane(m, lane, payload_x[lane], ops, has, layout,
                                        read_ports[lane] if read_ports else None,
                                        advance, wire, reg)
            m.d.comb += [
                out.result[lane].eq(res),
                out.overflow[lane].eq(ovf),
                out.nan_created[lane].eq(nanc),
            ]
        return m

    def _lane(self, m, lane, x_in, ops, has, layout, rp, advance, wire, reg):
        """One lane's pipeline; returns its output registers (result, overflow, nan).

        ``ops[k]`` is the op of the vector at stage ``k`` (the input of register k+1).
        """
        def is_op(k, op):
            if not has[op]:
                return Const(0, 1)
            return ops[k] == op.value

        def w(shape, name, value):
            return wire(shape, f"l{lane}_{name}", value)

        def r(shape, name, value):
            return reg(shape, f"l{lane}_{name}", value)

        table = rp is not None
        log_ops = has[UnaryOp.EXP] or has[UnaryOp.SIGMOID] or has[UnaryOp.TANH]

        # -- stage 1: decode, special results -------------------------------------------
        x0 = w(16, "x0", x_in)
        s0, ef0, fr0 = x0[15], x0[10:15], x0[:10]
        is_nan0 = w(1, "is_nan0", (ef0 == 31) & (fr0 != 0))
        is_inf0 = w(1, "is_inf0", (ef0 == 31) & (fr0 == 0))
        is_zero0 = w(1, "is_zero0", (ef0 == 0) & (fr0 == 0))
        op_tanh0 = is_op(0, UnaryOp.TANH)
        op_exp0 = is_op(0, UnaryOp.EXP)
        op_sig0 = is_op(0, UnaryOp.SIGMOID)
        op_recip0 = is_op(0, UnaryOp.RECIP)
        op_relu0 = is_op(0, UnaryOp.RELU)
        op_pass0 = is_op(0, UnaryOp.PASS)

        kind0 = Signal(3, name=f"l{lane}_kind0")
        with m.If(is_nan0):
            m.d.comb += kind0.eq(_Kind.NAN)
        with m.Elif(op_pass0):
            m.d.comb += kind0.eq(_Kind.X)
        with m.Elif(op_relu0):
            m.d.comb += kind0.eq(Mux(s0, _Kind.ZERO, _Kind.X))
        with m.Elif(op_exp0):
            m.d.comb += kind0.eq(Mux(is_inf0, Mux(s0, _Kind.ZERO, _Kind.INF), _Kind.DP))
        with m.Elif(op_sig0):
            m.d.comb += kind0.eq(Mux(is_inf0, Mux(s0, _Kind.ZERO, _Kind.ONE), _Kind.DP))
        with m.Elif(op_tanh0):
            m.d.comb += kind0.eq(Mux(is_inf0, _Kind.ONE,
                                     Mux(ef0 < _TS_LO, _Kind.X, _Kind.DP)))
        with m.Elif(op_recip0):
            m.d.comb += kind0.eq(Mux(is_zero0, _Kind.INF,
                                     Mux(is_inf0, _Kind.ZERO, _Kind.DP)))
        with m.Else():                                   # an op that was not built
            m.d.comb += kind0.eq(_Kind.NAN)
        signed0 = w(1, "signed0", op_tanh0 | op_recip0)

        x_s = [x0]
        kind = [kind0]
        sgn = [signed0]
        for k in range(1, LATENCY):
            x_s.append(r(16, f"x{k}", x_s[-1]))
            kind.append(r(3, f"kind{k}", kind[-1]))
            sgn.append(r(1, f"signed{k}", sgn[-1]))

        def fields(k):
            x = x_s[k]
            return x[15], x[10:15], x[:10]

        if table:
            # significand and exponent of |x| = sig * 2**(ex - 25)
            sig0 = w(11, "sig0", Cat(fr0, ef0 != 0))
            ex0 = w(5, "ex0", Mux(ef0 == 0, 1, ef0))
            c0_ = w(1, "c0", op_tanh0)
            ec0 = w(6, "ec0", ex0 + c0_)
            big0 = w(1, "big0", ec0 >= FP16_BIAS + T_CLAMP_EXP)
            sh0 = w(5, "sh0", (FP16_BIAS + T_CLAMP_EXP - 1) - ec0)
            neg0 = w(1, "neg0", Mux(op_exp0, s0, 1))
            # tanh: small-argument table (ef 9..13) or complement path (ef >= 14)
            tsmall0 = w(1, "tsmall0", op_tanh0 & (ef0 <= _TS_HI))
            sig1 = r(11, "sig1", sig0)
            big1 = r(1, "big1", big0)
            sh1 = r(5, "sh1", sh0)
            neg1 = r(1, "neg1", neg0)
            c1 = r(1, "c1", c0_)
            tsmall1 = r(1, "tsmall1", tsmall0)

            # -- stage 2: p = sig * log2(e) ---------------------------------------------
            if log_ops:
                p2 = r(_P_BITS, "p2", sig1 * LOG2E_INT)
            big2 = r(1, "big2", big1)
            sh2 = r(5, "sh2", sh1)
            neg2 = r(1, "neg2", neg1)
            c2 = r(1, "c2", c1)
            tsmall2 = r(1, "tsmall2", tsmall1)

            # -- stage 3: |t|, i and f; leading zeros for the reciprocal -----------------
            if log_ops:
                tmag2 = w(_T_BITS, "tmag2",
                          Mux(big2, (1 << _T_BITS) - 1, (p2 >> _P_SHIFT_BASE) >> sh2))
                j2 = tmag2[_F:]
                frc2 = tmag2[:_F]
                i3 = r(signed(T_INT_BITS + 1), "i3",
                       Mux(neg2, (~Cat(j2, Const(0, 1))).as_signed(),
                           Cat(j2, Const(0, 1)).as_signed()))
                f3 = r(_F, "f3", frc2 ^ neg2.replicate(_F))
            c3 = r(1, "c3", c2)
            tsmall3 = r(1, "tsmall3", tsmall2)
            if has[UnaryOp.RECIP]:
                # leading zeros of a subnormal's fraction (stage 2), normalizing shift
                # (stage 3); a normal number has none
                _, ef1, fr1 = fields(1)
                lz = Signal(4, name=f"l{lane}_lz1")
                with m.If(ef1 == 0):
                    for bit in range(10):          # the highest set bit wins
                        with m.If(fr1[bit]):
                            m.d.comb += lz.eq(10 - bit)
                lz2 = r(4, "lz2", lz)
                lz3 = r(4, "lz3", lz2)
                _, ef2, fr2 = fields(2)
                sig2 = w(11, "sig2", Cat(fr2, ef2 != 0))
                mant3 = r(10, "mant3", (sig2 << lz2)[:10])

            # -- stage 4: ROM address, dx, exponent q, direct or complement --------------
            s3, ef3, fr3 = fields(3)
            addr = Signal(10, name=f"l{lane}_addr3")
            dx = Signal(DX_BITS, name=f"l{lane}_dx3")
            q = Signal(signed(8), name=f"l{lane}_q3")
            direct = Signal(name=f"l{lane}_direct3")
            m.d.comb += [addr.eq(0), dx.eq(0), q.eq(0), direct.eq(1)]
            if log_ops:
                re = REGIONS["exp2"]
                e_addr = w(10, "eaddr3", layout["exp2"] + f3[re.dx_bits:])
                e_dx = w(DX_BITS, "edx3", f3[:re.dx_bits] << (DX_BITS - re.dx_bits))
            if has[UnaryOp.SIGMOID] or has[UnaryOp.TANH]:
                rg = REGIONS["sigmoid"]
                in_g = w(1, "in_g3", i3 >= -SIG_TABLES)
                g_addr = w(10, "gaddr3", layout["sigmoid"]
                           + Cat(f3[rg.dx_bits:], (~i3)[:4]))
                g_dx = w(DX_BITS, "gdx3", f3[:rg.dx_bits] << (DX_BITS - rg.dx_bits))
            with m.Switch(ops[3]):
                if has[UnaryOp.EXP]:
                    with m.Case(UnaryOp.EXP):
                        m.d.comb += [addr.eq(e_addr), dx.eq(e_dx), q.eq(i3)]
                for op in (UnaryOp.SIGMOID, UnaryOp.TANH):
                    if not has[op]:
                        continue
                    with m.Case(op):
                        m.d.comb += [
                            addr.eq(Mux(in_g, g_addr, e_addr)),
                            dx.eq(Mux(in_g, g_dx, e_dx)),
                            q.eq(i3 + c3),
                            direct.eq(s3 if op is UnaryOp.SIGMOID else 0),
                        ]
                        if op is UnaryOp.TANH:
                            rt = REGIONS["tanh_small"]
                            with m.If(tsmall3):
                                m.d.comb += [
                                    addr.eq(layout["tanh_small"]
                                            + Cat(fr3[rt.dx_bits:], (ef3 - _TS_LO)[:3])),
                                    dx.eq(fr3[:rt.dx_bits] << (DX_BITS - rt.dx_bits)),
                                    q.eq(ef3 - FP16_BIAS),
                                    direct.eq(1),
                                ]
                if has[UnaryOp.RECIP]:
                    rr = REGIONS["recip"]
                    with m.Case(UnaryOp.RECIP):
                        ex3 = Mux(ef3 == 0, 1, ef3)
                        m.d.comb += [
                            addr.eq(layout["recip"] + mant3[rr.dx_bits:]),
                            dx.eq(mant3[:rr.dx_bits] << (DX_BITS - rr.dx_bits)),
                            q.eq(FP16_BIAS + lz3 - ex3),
                        ]
            addr4 = r(10, "addr4", addr)
            dx4 = r(DX_BITS, "dx4", dx)
            q4 = r(signed(8), "q4", q)
            direct4 = r(1, "direct4", direct)

            # -- stage 5: ROM read; shift limits ---------------------------------------------
            m.d.comb += [rp.addr.eq(addr4), rp.en.eq(advance)]
            dx5 = r(DX_BITS, "dx5", dx4)
            q5 = r(signed(8), "q5", q4)
            direct5 = r(1, "direct5", direct4)
            # u = clip(-13 - q, 0, 15): places below the normal range (subnormal results)
            neg13 = w(signed(9), "neg13_4", -13 - q4)
            u5 = r(4, "u5", Mux(neg13 < 0, 0, Mux(neg13 > 15, 15, neg13[:4])))
            # complement alignment: v * 2**20 = y >> min(-q - 1, 21)
            negq = w(signed(9), "negq4", -1 - q4)
            cs5 = r(5, "cs5", Mux(negq > _WF + 2, _WF + 2, Mux(negq < 0, 0, negq[:5])))

            # -- stage 6: ROM output register ------------------------------------------------
            c0_6 = r(C0_BITS, "c0_6", rp.data[:C0_BITS])
            c1_6 = r(signed(C1_BITS), "c1_6", rp.data[C0_BITS:].as_signed())
            dx6 = r(DX_BITS, "dx6", dx5)
            q6 = r(signed(8), "q6", q5)
            direct6 = r(1, "direct6", direct5)
            u6 = r(4, "u6", u5)
            cs6 = r(5, "cs6", cs5)

            # -- stage 7: c1 * dx ------------------------------------------------------------
            prod7 = r(signed(C1_BITS + DX_BITS + 1), "prod7", c1_6 * dx6)
            c0_7 = r(C0_BITS, "c0_7", c0_6)
            q7 = r(signed(8), "q7", q6)
            direct7 = r(1, "direct7", direct6)
            u7 = r(4, "u7", u6)
            cs7 = r(5, "cs7", cs6)

            # -- stage 8: y = c0 + (c1 * dx >> 11) --------------------------------------------
            y8 = r(Y_BITS, "y8", (c0_7 + (prod7 >> DX_BITS))[:Y_BITS])
            # exponent field base max(q - 1 + n, -14) + 14 for n = 0 and n = 1
            bq0 = w(signed(9), "bq0_7", q7 + 13)
            bq1 = w(signed(9), "bq1_7", q7 + 14)
            base0_8 = r(7, "base0_8", Mux(bq0 < 0, 0, bq0[:7]))
            base1_8 = r(7, "base1_8", Mux(bq1 < 0, 0, bq1[:7]))
            direct8 = r(1, "direct8", direct7)
            u8 = r(4, "u8", u7)
            cs8 = r(5, "cs8", cs7)

            # -- stage 9: shift amount ---------------------------------------------------------
            n8 = w(1, "n8", y8[_WF])
            # direct: 7 + n + (subnormal places); see host.unary._round
            rr8 = w(4, "r8", Mux(n8, Mux(u8 == 0, 1, u8), Mux(u8 > 14, 14, u8)))
            amt9 = r(5, "amt9", Mux(direct8, rr8 + (_WF - 12), cs8))
            y9 = r(Y_BITS, "y9", y8)
            base9 = r(7, "base9", Mux(n8, base1_8, base0_8))
            direct9 = r(1, "direct9", direct8)

            # -- stage 10: right shift -----------------------------------------------------------
            ysh10 = r(Y_BITS, "ysh10", y9 >> amt9)
            base10 = r(7, "base10", base9)
            direct10 = r(1, "direct10", direct9)

            # -- stage 11: complement, normalization ---------------------------------------------
            # 1 - v = A * 2**-20, A = 2**20 - 1 - floor(v * 2**20): the 20-bit inverse
            a10 = w(Y_BITS, "a10", ~ysh10)
            nc = w(1, "nc10", a10[_WF])
            g_c = w(12, "gc10", Mux(nc, a10 >> (_WF - 11), a10 >> (_WF - 12)))
            # the kept bits and the guard bit (y < 2**20 shifted by >= 7 + n: 12 bits)
            g11 = r(12, "g11", Mux(direct10, ysh10[:12], g_c))
            # The significand (g + 1) >> 1 is at most 2048, so it adds 0, 1 or 2 to the
            # exponent field: the three sums and their overflow tests are made here,
            # from the field alone, and stage 12 only picks one.
            base = w(7, "base_sel10", Mux(direct10, base10, 12 + nc))
            field11 = [r(5, f"field{k}_11", (base + k)[:5]) for k in range(3)]
            over11 = [r(1, f"over{k}_11", base + k >= 31) for k in range(3)]

            # -- stage 12 (output register): round, pack, specials ------------------------------
            sig11 = w(12, "sig11", (g11 + 1) >> 1)
            carry = sig11[10:12]
            dp_ovf = w(1, "dp_ovf11", Mux(carry[1], over11[2],
                                           Mux(carry[0], over11[1], over11[0])))
            field = Mux(carry[1], field11[2], Mux(carry[0], field11[1], field11[0]))
            dp_mag = w(15, "dp_mag11", Mux(dp_ovf, 0x7C00, Cat(sig11[:10], field)))
        else:
            dp_ovf = Const(0, 1)
            dp_mag = Const(0, 15)

        k = LATENCY - 1
        x11 = x_s[k]
        sign11 = w(1, "sign11", x11[15] & sgn[k])
        res = Signal(16, name=f"l{lane}_res11")
        with m.Switch(kind[k]):
            with m.Case(_Kind.DP):
                m.d.comb += res.eq(Cat(dp_mag, sign11))
            with m.Case(_Kind.X):
                m.d.comb += res.eq(x11)
            with m.Case(_Kind.ZERO):
                m.d.comb += res.eq(Cat(Const(0, 15), sign11))
            with m.Case(_Kind.ONE):
                m.d.comb += res.eq(Cat(Const(0x3C00, 15), sign11))
            with m.Case(_Kind.INF):
                m.d.comb += res.eq(Cat(Const(0x7C00, 15), sign11))
            with m.Default():
                m.d.comb += res.eq(0x7E00)
        x_inf = (x11[10:15] == 31) & (x11[:10] == 0)
        x_nan = (x11[10:15] == 31) & (x11[:10] != 0)
        ovf = w(1, "ovf11", ((kind[k] == _Kind.DP) & dp_ovf)
                | ((kind[k] == _Kind.INF) & ~x_inf))
        nanc = w(1, "nanc11", (kind[k] == _Kind.NAN) & ~x_nan)
        return (r(16, "result", res), r(1, "overflow", ovf), r(1, "nan_created", nanc))
