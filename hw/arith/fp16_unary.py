"""FP16 unary functions of an MFU (relu, sigmoid, tanh, exp, reciprocal, pass), N lanes.

The bit-exact reference is :func:`host.numerics.unary.unary_bits`; the method, the fixed-point
formats, the ROM and the measured error are in ``docs/unary-functions.md``.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from host.spec.formats import FP16_BIAS, check_int
from host.numerics.unary import (
    C0_BITS, C0_FRAC_BITS, C1_BITS, DX_BITS, LOG2E_FRAC_BITS, LOG2E_INT, REGIONS, ROM_WORD_BITS, SIG_TABLES, T_CLAMP_EXP, T_FRAC_BITS, T_INT_BITS, TANH_SMALL_BINADES, Y_BITS, rom_depth, rom_layout, rom_words,
)
from host.spec.ops import UnaryOp, parse_ops
from hw.arith.dsp import has_ecp5_dsp, registered_product

__all__ = ["Fp16Unary", "LATENCY", "LANES_MAX"]

#: Register stages from an accepted input vector to its output (see :class:`Fp16Unary`).
LATENCY = 15
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
    """Apply one :class:`~host.numerics.unary.UnaryOp` to every lane of an FP16 vector per cycle.

    Every output equals :func:`host.numerics.unary.unary_bits` (and the event bits
    :func:`host.numerics.unary.unary_events`) bit for bit, for every op, input and build.

    **Datapath per lane** (``docs/unary-functions.md`` gives the reasons and the error);
    register ``k`` holds what was computed from register ``k - 1``:

    1. the input: ``x`` and the lane's own copy of the op (so the op is decoded next to
       each lane rather than once for all of them from the input register).
       The significand ``sig`` of ``x`` has its own register here, which feeds only
       the multiplier of stage 2.
    2. decode; what the lane's output is if not the datapath's (NaN, +-inf, +-0, relu,
       pass, tanh of tiny x, reciprocal of 0 and of inf); the barrel shift amount;
       ``p = sig * round(log2(e) * 2**17)`` (11 x 18 bits, a DSP block) into a register
       that only feeds register 3. 3. ``p`` again.
    4. ``|t| * 2**16 = p >> (26 - ex - c)`` (barrel shift, clamp for ``|x| * 2**c >= 32``),
       ``i, f`` of ``+-t``; normalized significand of a subnormal (reciprocal; its
       leading zeros are counted in stage 3).
    5. ROM address and segment position ``dx`` of the op's table; exponent ``q``.
    6. ROM read (a ``lib.memory.Memory`` with no write port: block RAM, one read port per
       lane, two lanes per memory); 7. ROM output register.
    8. ``c1`` and ``dx`` again, registers that only feed the multiplier.
    9. ``c1 * dx`` (16 x 11 bits, a DSP block), a register that only feeds register 10;
       10. the product again. So no cycle holds the routing to a DSP block, its
       multiplier and the routing back: the registers before and after each multiplier
       may be placed next to the DSP column (``docs/mfu.md`` section 10).
    11. ``y = c0 + (c1 * dx >> 11)``.
    12. shift amount: subnormal or complement alignment; 13. right shift.
    14. complement ``1 - v`` (sigmoid of x >= 0, tanh of |x| >= 1/2) by inversion,
        normalization, the three possible exponent fields and their overflow tests.
    15. round (one increment) and pick the exponent field; special results, events:
        the output register.

    **Flow control.** Registers 1 to 14 advance together whenever the *skid register*
    (a second output register) is empty; the output register (15) loads when it is empty
    or being read, and otherwise the skid register takes the result, which stops the
    pipeline until the output register has taken it over. So ``i_stream.ready`` is a
    flip-flop (not a function of ``o_stream.ready``: no combinational path through the
    unit, and no wide stall net driven by logic; each lane's registers load on the
    lane's own copies of the skid and output valid bits, flip-flops with the ``keep``
    attribute that the place-and-route flow keeps apart), ``o_stream.valid`` and the
    payload are flip-flops, held while ``o_stream.ready`` is low, and one vector per cycle passes
    while ``o_stream.ready`` is high. Without stalls a vector leaves ``o_stream``
    :data:`LATENCY` (15) cycles after it was accepted. The op is part of each vector's
    payload, so consecutive vectors may use different ops.

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
        # A unit whose parameters were refused is no unused elaboratable worth a warning.
        self._MustUse__silence = True
        self._lanes = check_int("lanes", lanes, 1, LANES_MAX)
        self._ops = parse_ops(ops)
        if not self._ops:
            raise ValueError(f"ops must name at least one unary op, not {ops!r}")
        self._layout = rom_layout(self._ops)
        self._depth = rom_depth(self._ops)
        self._MustUse__silence = False
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

        # The pipeline (every register but the output's) advances whenever the skid
        # register is empty: `advance` is a flip-flop, not a function of o_stream.ready.
        # skid_valid and out_valid have one copy per lane (equal values; `keep` so that
        # synthesis does not merge them), and each lane's registers load on the lane's
        # own copies: no single net drives the enables of every lane across the die.
        skid_valid = Signal()
        out_valid = Signal()
        advance = Signal()
        m.d.comb += [
            advance.eq(~skid_valid),
            self.i_stream.ready.eq(advance),
            self.o_stream.valid.eq(out_valid),
        ]

        # As in hw/mvm/quantizer.py: every value its own signal with one continuous
        # assignment; registers with a feedback multiplexer as their enable.
        def wire(shape, name, value):
            w = Signal(shape, name=name)
            m.d.comb += w.eq(value)
            return w

        def reg_with(enable):
            def reg(shape, name, value):
                r = Signal(shape, name=name, reset_less=True)
                m.d.sync += r.eq(Mux(enable, value, r))
                return r
            return reg

        # Valid bits (reset), shared by all lanes, per stage.
        valid = [self.i_stream.valid]
        for k in range(1, LATENCY):
            v = Signal(name=f"valid{k}")
            m.d.sync += v.eq(Mux(advance, valid[-1], v))
            valid.append(v)
        last = valid[LATENCY - 1]

        # Output register and skid register. While the skid register is empty the
        # pipeline advances, and a result that the output register cannot take (it is
        # full and not being read) is parked in the skid register; that stops the
        # pipeline until the output register has taken it over.
        taken = out_valid & self.o_stream.ready
        skid_next = wire(1, "skid_next", Mux(skid_valid, ~taken,
                                              ~(~out_valid | taken) & last))
        out_next = wire(1, "out_next", Mux(skid_valid | ~(~out_valid | taken),
                                           out_valid, last))
        m.d.sync += [skid_valid.eq(skid_next), out_valid.eq(out_next)]

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
        op_in = self.i_stream.payload.op.as_value()
        for lane in range(lanes):
            # This lane's copies of the control state.
            skid_c = Signal(name=f"l{lane}_skid_valid", attrs={"keep": 1})
            out_c = Signal(name=f"l{lane}_out_valid", attrs={"keep": 1})
            m.d.sync += [skid_c.eq(skid_next), out_c.eq(out_next)]
            lane_advance = wire(1, f"l{lane}_advance", ~skid_c)
            reg = reg_with(lane_advance)
            # The op, registered per lane (`keep`): it is decoded in stage 1 from this
            # copy, next to the lane, instead of once for all lanes from the input.
            ops = {1: Signal(3, name=f"l{lane}_op1", reset_less=True, attrs={"keep": 1})}
            m.d.sync += ops[1].eq(Mux(lane_advance, op_in, ops[1]))
            for k in range(2, LATENCY):
                ops[k] = reg(3, f"l{lane}_op{k}", ops[k - 1])
            res, ovf, nanc = self._lane(m, lane, payload_x[lane], ops, has, layout,
                                        read_ports[lane] if read_ports else None,
                                        lane_advance, wire, reg,
                                        dsp=has_ecp5_dsp(platform))
            layout_l = data.StructLayout({"result": unsigned(16), "overflow": unsigned(1),
                                          "nan_created": unsigned(1)})
            result = Signal(layout_l, name=f"l{lane}_result")
            skid = Signal(layout_l, name=f"l{lane}_skid", reset_less=True)
            out = Signal(layout_l, name=f"l{lane}_out", reset_less=True)
            m.d.comb += [
                result.result.eq(res),
                result.overflow.eq(ovf),
                result.nan_created.eq(nanc),
                self.o_stream.payload.result[lane].eq(out.result),
                self.o_stream.payload.overflow[lane].eq(out.overflow),
                self.o_stream.payload.nan_created[lane].eq(out.nan_created),
            ]
            # The transfer as the lane's copies see it (the same as `taken`).
            taken_c = out_c & self.o_stream.ready
            with m.If(skid_c):
                with m.If(taken_c):
                    m.d.sync += out.eq(skid)
            with m.Elif(~out_c | taken_c):
                with m.If(last):
                    m.d.sync += out.eq(result)
            with m.Else():
                with m.If(last):
                    m.d.sync += skid.eq(result)
        return m

    def _lane(self, m, lane, x_in, ops, has, layout, rp, advance, wire, reg, dsp=False):
        """One lane's pipeline; returns its result, overflow and nan_created, computed
        from the last stage's registers (the output register's input).

        ``ops[k]`` (``k >= 1``) is the lane's copy of the op in register ``k``. With
        ``dsp`` (an ECP5) each multiplier is a MULT18X18D whose own input and output
        registers stand for the operand and product registers
        (:func:`hw.arith.dsp.registered_product`); the stages are the same.
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

        # -- stage 1: the input register (x1 and the lane's op1); stage 2: decode ------
        # The op only exists per lane from register 1 on, so everything that depends on
        # it is decided from x1 and op1 (the value registered in 2); what depends on the
        # input alone (the significand for the multiplier) starts from x0.
        x0 = w(16, "x0", x_in)
        x_s = [x0]
        for k in range(1, LATENCY):
            x_s.append(r(16, f"x{k}", x_s[-1]))
        x1 = x_s[1]
        s1, ef1, fr1 = x1[15], x1[10:15], x1[:10]
        is_nan1 = w(1, "is_nan1", (ef1 == 31) & (fr1 != 0))
        is_inf1 = w(1, "is_inf1", (ef1 == 31) & (fr1 == 0))
        is_zero1 = w(1, "is_zero1", (ef1 == 0) & (fr1 == 0))
        op_tanh1 = is_op(1, UnaryOp.TANH)
        op_exp1 = is_op(1, UnaryOp.EXP)
        op_sig1 = is_op(1, UnaryOp.SIGMOID)
        op_recip1 = is_op(1, UnaryOp.RECIP)
        op_relu1 = is_op(1, UnaryOp.RELU)
        op_pass1 = is_op(1, UnaryOp.PASS)

        kind1 = Signal(3, name=f"l{lane}_kind1")
        with m.If(is_nan1):
            m.d.comb += kind1.eq(_Kind.NAN)
        with m.Elif(op_pass1):
            m.d.comb += kind1.eq(_Kind.X)
        with m.Elif(op_relu1):
            m.d.comb += kind1.eq(Mux(s1, _Kind.ZERO, _Kind.X))
        with m.Elif(op_exp1):
            m.d.comb += kind1.eq(Mux(is_inf1, Mux(s1, _Kind.ZERO, _Kind.INF), _Kind.DP))
        with m.Elif(op_sig1):
            m.d.comb += kind1.eq(Mux(is_inf1, Mux(s1, _Kind.ZERO, _Kind.ONE), _Kind.DP))
        with m.Elif(op_tanh1):
            m.d.comb += kind1.eq(Mux(is_inf1, _Kind.ONE,
                                     Mux(ef1 < _TS_LO, _Kind.X, _Kind.DP)))
        with m.Elif(op_recip1):
            m.d.comb += kind1.eq(Mux(is_zero1, _Kind.INF,
                                     Mux(is_inf1, _Kind.ZERO, _Kind.DP)))
        with m.Else():                                   # an op that was not built
            m.d.comb += kind1.eq(_Kind.NAN)
        signed1 = w(1, "signed1", op_tanh1 | op_recip1)

        kind = {1: kind1}
        sgn = {1: signed1}
        for k in range(2, LATENCY):
            kind[k] = r(3, f"kind{k}", kind[k - 1])
            sgn[k] = r(1, f"signed{k}", sgn[k - 1])

        def fields(k):
            x = x_s[k]
            return x[15], x[10:15], x[:10]

        def delay(name, shape, value, first, last):
            """``value`` (of stage ``first``) registered up to stage ``last``: a dict."""
            out = {first: value}
            for k in range(first + 1, last + 1):
                out[k] = r(shape, f"{name}{k}", out[k - 1])
            return out

        if table:
            # Register stages (the value computed from stage k-1 is held in register k).
            (S_P_DSP, S_P, S_T, S_ADDR, S_ROM, S_ROMR, S_MULIN, S_PROD_DSP, S_PROD, S_Y,
             S_AMT, S_SH, S_G) = range(2, LATENCY)
            # significand of |x| = sig * 2**(ex - 25), from the input (no op needed)
            _, ef0, fr0 = fields(0)
            sig0 = w(11, "sig0", Cat(fr0, ef0 != 0))
            # its exponent, the tanh scale c and the shift, from x1 and op1
            ex1 = w(5, "ex1", Mux(ef1 == 0, 1, ef1))
            c_in = w(1, "c1", op_tanh1)
            ec1 = w(6, "ec1", ex1 + c_in)
            big = delay("big", 1, w(1, "big1", ec1 >= FP16_BIAS + T_CLAMP_EXP), 1, S_P)
            sh = delay("sh", 5, w(5, "sh1", (FP16_BIAS + T_CLAMP_EXP - 1) - ec1), 1, S_P)
            neg = delay("neg", 1, w(1, "neg1", Mux(op_exp1, s1, 1)), 1, S_P)
            c_ = delay("c", 1, c_in, 1, S_T)
            # tanh: small-argument table (ef 9..13) or complement path (ef >= 14)
            tsmall = delay("tsmall", 1, w(1, "tsmall1", op_tanh1 & (ef1 <= _TS_HI)), 1, S_T)

            # -- p = sig * log2(e) (a DSP block) between registers that connect only
            # to it (sig1 and p2), so that placement may put both next to the DSP
            # column; p3 is the copy that the lane's logic reads.
            if log_ops and dsp:
                p_dsp = registered_product(m, sig0, Const(LOG2E_INT), enable=advance,
                                           name=f"l{lane}_sig_log2e")
                p_ = delay("p", _P_BITS, p_dsp, S_P_DSP, S_P)
            elif log_ops:
                sig_in = delay("sig", 11, sig0, 0, S_P_DSP - 1)[S_P_DSP - 1]
                p_ = delay("p", _P_BITS, sig_in * LOG2E_INT, S_P_DSP - 1, S_P)

            # -- |t|, i and f; leading zeros for the reciprocal ------------------------------
            if log_ops:
                k = S_T - 1
                tmag = w(_T_BITS, f"tmag{k}",
                         Mux(big[k], (1 << _T_BITS) - 1, (p_[k] >> _P_SHIFT_BASE) >> sh[k]))
                j = Cat(tmag[_F:], Const(0, 1)).as_signed()
                i_t = r(signed(T_INT_BITS + 1), f"i{S_T}", Mux(neg[k], ~j, j))
                f_t = r(_F, f"f{S_T}", tmag[:_F] ^ neg[k].replicate(_F))
            if has[UnaryOp.RECIP]:
                # leading zeros of a subnormal's fraction, then the normalizing shift, in
                # the two stages before the address; a normal number has none
                k = S_T - 2
                _, ef_z, fr_z = fields(k)
                lz = Signal(4, name=f"l{lane}_lz{k}")
                with m.If(ef_z == 0):
                    for bit in range(10):          # the highest set bit wins
                        with m.If(fr_z[bit]):
                            m.d.comb += lz.eq(10 - bit)
                lz_ = delay("lz", 4, lz, k, S_T)
                _, ef_n, fr_n = fields(k + 1)
                sig_n = w(11, f"sig{k + 1}", Cat(fr_n, ef_n != 0))
                mant = r(10, f"mant{S_T}", (sig_n << lz_[k + 1])[:10])

            # -- ROM address, dx, exponent q, direct or complement -----------------------
            k = S_ADDR - 1
            s_a, ef_a, fr_a = fields(k)
            addr = Signal(10, name=f"l{lane}_addr{k}")
            dx = Signal(DX_BITS, name=f"l{lane}_dx{k}")
            q = Signal(signed(8), name=f"l{lane}_q{k}")
            direct = Signal(name=f"l{lane}_direct{k}")
            m.d.comb += [addr.eq(0), dx.eq(0), q.eq(0), direct.eq(1)]
            if log_ops:
                re = REGIONS["exp2"]
                e_addr = w(10, f"eaddr{k}", layout["exp2"] + f_t[re.dx_bits:])
                e_dx = w(DX_BITS, f"edx{k}", f_t[:re.dx_bits] << (DX_BITS - re.dx_bits))
            if has[UnaryOp.SIGMOID] or has[UnaryOp.TANH]:
                rg = REGIONS["sigmoid"]
                in_g = w(1, f"in_g{k}", i_t >= -SIG_TABLES)
                g_addr = w(10, f"gaddr{k}", layout["sigmoid"]
                           + Cat(f_t[rg.dx_bits:], (~i_t)[:4]))
                g_dx = w(DX_BITS, f"gdx{k}", f_t[:rg.dx_bits] << (DX_BITS - rg.dx_bits))
            with m.Switch(ops[k]):
                if has[UnaryOp.EXP]:
                    with m.Case(UnaryOp.EXP):
                        m.d.comb += [addr.eq(e_addr), dx.eq(e_dx), q.eq(i_t)]
                for op in (UnaryOp.SIGMOID, UnaryOp.TANH):
                    if not has[op]:
                        continue
                    with m.Case(op):
                        m.d.comb += [
                            addr.eq(Mux(in_g, g_addr, e_addr)),
                            dx.eq(Mux(in_g, g_dx, e_dx)),
                            q.eq(i_t + c_[k]),
                            direct.eq(s_a if op is UnaryOp.SIGMOID else 0),
                        ]
                        if op is UnaryOp.TANH:
                            rt = REGIONS["tanh_small"]
                            with m.If(tsmall[k]):
                                m.d.comb += [
                                    addr.eq(layout["tanh_small"]
                                            + Cat(fr_a[rt.dx_bits:], (ef_a - _TS_LO)[:3])),
                                    dx.eq(fr_a[:rt.dx_bits] << (DX_BITS - rt.dx_bits)),
                                    q.eq(ef_a - FP16_BIAS),
                                    direct.eq(1),
                                ]
                if has[UnaryOp.RECIP]:
                    rr = REGIONS["recip"]
                    with m.Case(UnaryOp.RECIP):
                        ex_a = Mux(ef_a == 0, 1, ef_a)
                        m.d.comb += [
                            addr.eq(layout["recip"] + mant[rr.dx_bits:]),
                            dx.eq(mant[:rr.dx_bits] << (DX_BITS - rr.dx_bits)),
                            q.eq(FP16_BIAS + lz_[k] - ex_a),
                        ]
            addr_r = r(10, f"addr{S_ADDR}", addr)
            # On an ECP5 the DSP's input registers stand for c1 and dx of S_MULIN.
            mul_in = S_MULIN - 1 if dsp else S_MULIN
            dx_ = delay("dx", DX_BITS, dx, k, mul_in)
            q_ = delay("q", signed(8), q, k, S_Y - 1)
            direct_ = delay("direct", 1, direct, k, S_SH)

            # -- ROM read; shift limits ----------------------------------------------------
            m.d.comb += [rp.addr.eq(addr_r), rp.en.eq(advance)]
            k = S_ROM - 1
            # u = clip(-13 - q, 0, 15): places below the normal range (subnormal results)
            neg13 = w(signed(9), f"neg13_{k}", -13 - q_[k])
            u_ = delay("u", 4, Mux(neg13 < 0, 0, Mux(neg13 > 15, 15, neg13[:4])), k, S_Y)
            # complement alignment: v * 2**20 = y >> min(-q - 1, 21)
            negq = w(signed(9), f"negq{k}", -1 - q_[k])
            cs_ = delay("cs", 5, Mux(negq > _WF + 2, _WF + 2, Mux(negq < 0, 0, negq[:5])),
                        k, S_Y)

            # -- ROM output register; c1 * dx (a DSP block) ----------------------------------
            # The multiplier sits between registers that connect only to it (c1 and dx
            # of S_MULIN, the product of S_PROD_DSP), so that placement may put them next
            # to the DSP column, far from the lane's logic and its ROM: the routing there
            # and back has a cycle of its own each way (it was the critical path).
            c0_ = delay("c0_", C0_BITS, rp.data[:C0_BITS], S_ROM, S_Y - 1)
            c1_ = delay("c1_", signed(C1_BITS), rp.data[C0_BITS:].as_signed(), S_ROM,
                        mul_in)
            if dsp:
                prod_dsp = registered_product(m, c1_[mul_in], dx_[mul_in], enable=advance,
                                              name=f"l{lane}_c1_dx")
                prod = delay("prod", signed(C1_BITS + DX_BITS + 1), prod_dsp, S_PROD_DSP,
                             S_PROD)
            else:
                prod = delay("prod", signed(C1_BITS + DX_BITS + 1),
                             c1_[S_MULIN] * dx_[S_MULIN], S_MULIN, S_PROD)

            # -- y = c0 + (c1 * dx >> 11); exponent field candidates -----------------------
            k = S_Y - 1
            y_ = delay("y", Y_BITS, (c0_[k] + (prod[k] >> DX_BITS))[:Y_BITS], k, S_AMT)
            # exponent field base max(q - 1 + n, -14) + 14 for n = 0 and n = 1
            bq0 = w(signed(9), f"bq0_{k}", q_[k] + 13)
            bq1 = w(signed(9), f"bq1_{k}", q_[k] + 14)
            base0 = r(7, f"base0_{S_Y}", Mux(bq0 < 0, 0, bq0[:7]))
            base1 = r(7, f"base1_{S_Y}", Mux(bq1 < 0, 0, bq1[:7]))

            # -- shift amount ----------------------------------------------------------------
            k = S_AMT - 1
            n = w(1, f"n{k}", y_[k][_WF])
            # direct: 7 + n + (subnormal places); see host.numerics.unary._round
            u = u_[k]
            rsub = w(4, f"r{k}", Mux(n, Mux(u == 0, 1, u), Mux(u > 14, 14, u)))
            amt = r(5, f"amt{S_AMT}", Mux(direct_[k], rsub + (_WF - 12), cs_[k]))
            base_ = delay("base", 7, Mux(n, base1, base0), k, S_SH)

            # -- right shift ---------------------------------------------------------------------
            ysh = r(Y_BITS, f"ysh{S_SH}", y_[S_AMT] >> amt)

            # -- complement, normalization; exponent field candidates -------------------------
            k = S_G - 1
            # 1 - v = A * 2**-20, A = 2**20 - 1 - floor(v * 2**20): the 20-bit inverse
            a = w(Y_BITS, f"a{k}", ~ysh)
            nc = w(1, f"nc{k}", a[_WF])
            g_c = w(12, f"gc{k}", Mux(nc, a >> (_WF - 11), a >> (_WF - 12)))
            # the kept bits and the guard bit (y < 2**20 shifted by >= 7 + n: 12 bits)
            g = r(12, f"g{S_G}", Mux(direct_[k], ysh[:12], g_c))
            # The significand (g + 1) >> 1 is at most 2048, so it adds 0, 1 or 2 to the
            # exponent field: the three sums and their overflow tests are made here,
            # from the field alone, and the last stage only picks one.
            base = w(7, f"base_sel{k}", Mux(direct_[k], base_[k], 12 + nc))
            fields_g = [r(5, f"field{i}_{S_G}", (base + i)[:5]) for i in range(3)]
            over_g = [r(1, f"over{i}_{S_G}", base + i >= 31) for i in range(3)]

            # -- output register: round, pack, specials --------------------------------------
            k = LATENCY - 1
            sig_o = w(12, f"sig{k}", (g + 1) >> 1)
            carry = sig_o[10:12]
            dp_ovf = w(1, f"dp_ovf{k}", Mux(carry[1], over_g[2],
                                            Mux(carry[0], over_g[1], over_g[0])))
            field = Mux(carry[1], fields_g[2], Mux(carry[0], fields_g[1], fields_g[0]))
            dp_mag = w(15, f"dp_mag{k}", Mux(dp_ovf, 0x7C00, Cat(sig_o[:10], field)))
        else:
            dp_ovf = Const(0, 1)
            dp_mag = Const(0, 15)

        k = LATENCY - 1
        xk = x_s[k]
        sign = w(1, f"sign{k}", xk[15] & sgn[k])
        res = Signal(16, name=f"l{lane}_res{k}")
        with m.Switch(kind[k]):
            with m.Case(_Kind.DP):
                m.d.comb += res.eq(Cat(dp_mag, sign))
            with m.Case(_Kind.X):
                m.d.comb += res.eq(xk)
            with m.Case(_Kind.ZERO):
                m.d.comb += res.eq(Cat(Const(0, 15), sign))
            with m.Case(_Kind.ONE):
                m.d.comb += res.eq(Cat(Const(0x3C00, 15), sign))
            with m.Case(_Kind.INF):
                m.d.comb += res.eq(Cat(Const(0x7C00, 15), sign))
            with m.Default():
                m.d.comb += res.eq(0x7E00)
        x_inf = (xk[10:15] == 31) & (xk[:10] == 0)
        x_nan = (xk[10:15] == 31) & (xk[:10] != 0)
        ovf = w(1, f"ovf{k}", ((kind[k] == _Kind.DP) & dp_ovf)
                | ((kind[k] == _Kind.INF) & ~x_inf))
        nanc = w(1, f"nanc{k}", (kind[k] == _Kind.NAN) & ~x_nan)
        return res, ovf, nanc
