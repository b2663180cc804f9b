"""FP16 element-wise add, subtract, multiply and maximum for the multifunction units.

The bit-exact reference is :mod:`host.numerics.fp16` (``docs/numerics.md`` section 6); the design
notes are in ``docs/mfu-arith.md``. The operation codes are :class:`host.numerics.fp16.BinaryOp`.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from host.spec.formats import CANONICAL_NAN
from host.spec.ops import BinaryOp
from host.spec.formats import FP16_BITS, FP16_EXP_BITS, FP16_FRAC_BITS, check_int
from hw.arith.dsp import has_ecp5_dsp, registered_product

__all__ = ["Fp16Binary", "LATENCY", "SIDE_MAX", "input_layout", "output_layout"]

#: Register stages from an accepted input to its output (see :class:`Fp16Binary`).
LATENCY = 6

LANES_MAX = 64
#: Widest side band (bits) a unit carries beside its lanes.
SIDE_MAX = 64

_SIG = FP16_FRAC_BITS + 1                  # significand with its hidden bit: 11
_EXP_ALL = (1 << FP16_EXP_BITS) - 1        # exponent field of inf and NaN: 31
_INF_MAG = _EXP_ALL << FP16_FRAC_BITS      # 0x7C00
#: Adder: significands carry 3 extra bits (guard, round, sticky) below their last place.
_EXTRA = 3
_ADD_W = _SIG + _EXTRA                     # 14: aligned operands; the sum has 15 bits
#: Back end: a 22-bit significand (the product's width; the sum sits in its top 15).
_BE_W = 2 * _SIG                           # 22
#: Back-end exponent code K = Z + 12, where Z is the result's exponent field if the
#: significand's leading one were bit 21. Z >= -12 (smallest product), so K >= 0.
_K_OFFSET = 12
_K_BITS = 6                                # K <= 58 (largest product)
#: The normalizing shift is sh = min(leading zeros, Z - 1), -13 <= sh <= 22. It is one
#: left shift of a 35-bit word whose bits 13..34 are the result window: the significand
#: placed at bit 13 and shifted by sh >= 0, or placed at bit 0 and shifted by sh + 13 = K
#: (a right shift by -sh relative to the window; what falls below it is sticky).
_U_OFFSET = 13


def input_layout(lanes, side=0):
    """``i_stream`` payload: ``a`` and ``b`` (FP16 lanes) and the vector's ``op``, then
    (if ``side`` > 0) a ``side`` band of ``side`` bits.

    Bits: ``a`` lane ``i`` at ``[16i, 16i+16)``, ``b`` lane ``i`` at
    ``[16(lanes+i), 16(lanes+i)+16)``, ``op`` (3 bits) at ``32*lanes``, ``side`` at
    ``32*lanes + 3``.
    """
    fields = {
        "a": data.ArrayLayout(FP16_BITS, lanes),
        "b": data.ArrayLayout(FP16_BITS, lanes),
        "op": BinaryOp,
    }
    if side:
        fields["side"] = side
    return data.StructLayout(fields)


def output_layout(lanes, side=0):
    """``o_stream`` payload: ``result`` (FP16 lanes), then one ``overflow`` and one
    ``nan_created`` bit per lane (at ``16*lanes + i`` and ``17*lanes + i``), then (if
    ``side`` > 0) the ``side`` band of ``side`` bits at ``18*lanes``."""
    fields = {
        "result": data.ArrayLayout(FP16_BITS, lanes),
        "overflow": data.ArrayLayout(1, lanes),
        "nan_created": data.ArrayLayout(1, lanes),
    }
    if side:
        fields["side"] = side
    return data.StructLayout(fields)


def _leading_zeros(bits, width):
    """``(all zero, leading zeros)`` of ``bits`` (``width`` a power of two, >= 2).

    A balanced tree: at each node the upper half's count wins unless it is all zero.
    The count is ``width - 1`` for an all-zero input (callers guarantee a one).
    """
    if width == 2:
        return ~(bits[0] | bits[1]), ~bits[1]
    half = width // 2
    hi_zero, hi_lz = _leading_zeros(bits[half:], half)
    lo_zero, lo_lz = _leading_zeros(bits[:half], half)
    return hi_zero & lo_zero, Cat(Mux(hi_zero, lo_lz, hi_lz), hi_zero)


def _parse_ops(ops):
    """The ops of a build, sorted by code; ``None`` means every op.

    Raises ``TypeError`` (naming the value) unless ``ops`` is a collection of
    :class:`BinaryOp`, ``ValueError`` if it is empty.
    """
    if ops is None:
        return tuple(BinaryOp)
    if isinstance(ops, (str, BinaryOp)) or not hasattr(ops, "__iter__"):
        raise TypeError(f"ops must be a collection of BinaryOp, not {ops!r}")
    ops = tuple(ops)
    for op in ops:
        if not isinstance(op, BinaryOp):
            raise TypeError(f"ops must be a collection of BinaryOp; {op!r} is not a BinaryOp")
    if not ops:
        raise ValueError(f"ops must name at least one BinaryOp, not {ops!r}")
    return tuple(sorted(set(ops), key=lambda op: op.value))


class Fp16Binary(wiring.Component):
    """Element-wise IEEE 754 binary16 ``op(a, b)`` on ``lanes`` lanes, one vector per cycle.

    Each vector carries its :class:`host.numerics.fp16.BinaryOp` in the payload, so an MFU stage
    can change the operation from one vector to the next. Results are those of
    :func:`host.numerics.fp16.binary_bits`, bit for bit, and the two flags those of
    :func:`host.numerics.fp16.binary_events_bits`:

    * ``ADD``, ``A_SUB_B`` (``a - b``), ``B_SUB_A`` (``b - a``), ``MUL``: round to nearest,
      ties to even, subnormal inputs and results, overflow to +-inf, IEEE signed zeros;
    * ``MAX``: IEEE 754-2019 ``maximum`` (NaN if either is a NaN, ``+0 > -0``);
    * every NaN result is ``0x7E00``;
    * ``overflow``: the result is +-inf and no input was an infinity;
      ``nan_created``: the result is a NaN and no input was a NaN.

    Codes 5 to 7 of the ``op`` field are not operations; the unit treats them as ``ADD``,
    and so it treats an op left out of ``ops``.

    **Datapath** (per lane, ``docs/mfu-arith.md``). The operands are ordered by magnitude
    (``x`` the larger); the multiplier uses the same ordered pair, since it commutes.
    An addition aligns ``y`` to ``x`` keeping three extra bits with a sticky bit jammed
    into the lowest, adds or subtracts (15 bits, exact up to the jammed bit); a product is
    the exact 22-bit product of the significands. Either one then goes through the same
    back end: leading-zero count, one shift that normalizes (left) or denormalizes a tiny
    product (right, into the sticky bit), round to nearest even by one increment of the
    packed exponent and fraction. Infinities, NaNs and ``MAX`` are decided in the first
    two stages and carried to the end.

    **Pipeline.** :data:`LATENCY` (6) register stages; stages 1 to 5 advance together
    whenever the skid register (below) is empty:

    1. decode, magnitude compare (operand order and ``MAX``), exponent difference,
       operand kinds; the lane's copy of the op;
    2. the op decoded: signs, special results | align ``y`` (shift right by up to 15,
       sticky) | multiply the significands; back-end exponent code;
    3. add or subtract | select the sum or the product for the back end; marker bit;
    4. leading-zero count (stopped at the subnormal boundary by a marker bit placed in
       stage 3), shift amount, sign of a zero result;
    5. shift; sticky bit; exponent field of a normal result;
    6. round, overflow, pack; substitute the special result: the output register.

    **Flow control.** The output register loads when it is empty or being read;
    otherwise the *skid register* (a second output register) takes stage 6's result,
    which stops stages 1 to 5 until the output register has taken it over. So
    ``i_stream.ready`` (``~skid_valid``) is a flip-flop: no combinational path runs from
    ``o_stream`` to ``i_stream``, and ``o_stream.ready`` reaches only the output and skid
    registers. Each lane's registers load on the lane's own copies of the skid and
    output valid bits (flip-flops with the ``keep`` attribute, which the place-and-route
    flow keeps apart, ``docs/fpga-flow.md``): the copies hold the same value, so the
    lanes advance together, but no single net drives every enable across the die.

    With ``o_stream.ready`` high a vector leaves ``o_stream`` 6 cycles after it was
    accepted, and one vector is accepted every cycle. ``o_stream.valid`` and the payload
    are flip-flops, held while ``o_stream.ready`` is low. The optional side band
    (``side`` bits of the payload, opaque to the unit) leaves with its vector.

    Parameters
    ----------
    lanes : int, 1..64
        FP16 values per vector.
    ops : collection of BinaryOp, default all
        The ops built. Without ``MUL`` the unit has no multiplier (no DSP block) and
        without ``MAX``, ``A_SUB_B`` or ``B_SUB_A`` none of their selection logic; a
        vector carrying an op that was not built is added (as codes 5 to 7 are).
    side : int, 0..64, default 0
        Bits of a side band carried unchanged beside each vector, in the ``side`` field
        of both payloads (no field if 0).

    Attributes
    ----------
    i_stream : ``In(stream.Signature(input_layout(lanes, side)))``
        ``{a: ArrayLayout(16, lanes), b: ArrayLayout(16, lanes), op: BinaryOp[, side]}``.
    o_stream : ``Out(stream.Signature(output_layout(lanes, side)))``
        ``{result: ArrayLayout(16, lanes), overflow: ArrayLayout(1, lanes),
        nan_created: ArrayLayout(1, lanes)[, side]}``.
    lanes : int
    ops : tuple of BinaryOp
        The ops built, sorted by code.
    side : int
    latency : int
        :data:`LATENCY`, cycles from input transfer to output valid without stalls.

    Raises
    ------
    TypeError
        ``lanes`` or ``side`` is not an integer; ``ops`` is not a collection of
        ``BinaryOp``.
    ValueError
        ``lanes`` or ``side`` is out of range; ``ops`` is empty.
    """

    def __init__(self, *, lanes, ops=None, side=0):
        # A unit whose parameters were refused is no unused elaboratable worth a warning.
        self._MustUse__silence = True
        self._lanes = check_int("lanes", lanes, 1, LANES_MAX)
        self._ops = _parse_ops(ops)
        self._side = check_int("side", side, 0, SIDE_MAX)
        self._MustUse__silence = False
        super().__init__({
            "i_stream": In(stream.Signature(input_layout(self._lanes, self._side))),
            "o_stream": Out(stream.Signature(output_layout(self._lanes, self._side))),
        })

    @property
    def lanes(self):
        """FP16 values per vector."""
        return self._lanes

    @property
    def ops(self):
        """The ops built (a tuple of :class:`host.numerics.fp16.BinaryOp`, sorted by code)."""
        return self._ops

    @property
    def side(self):
        """Bits of the side band carried beside the lanes (0: none)."""
        return self._side

    @property
    def latency(self):
        """Cycles from an input transfer to its output being valid, without stalls."""
        return LATENCY

    def elaborate(self, platform):
        m = Module()
        lanes = self._lanes

        # --- flow control: output register and skid register ------------------------------
        # Stages 1 to 5 advance whenever the skid register is empty, so i_stream.ready
        # and every enable of those stages are flip-flops: o_stream.ready only reaches
        # the output and skid registers. The output register loads when it is empty or
        # being read; otherwise the skid register takes stage 6's result, which stops
        # stages 1 to 5 until the output register has taken it over.
        skid_valid = Signal()
        out_valid = Signal()
        m.d.comb += [
            self.i_stream.ready.eq(~skid_valid),
            self.o_stream.valid.eq(out_valid),
        ]
        valid = self.i_stream.valid
        for k in range(1, LATENCY):
            v = Signal(name=f"s{k}_valid")
            with m.If(~skid_valid):
                m.d.sync += v.eq(valid)
            valid = v
        ready = self.o_stream.ready
        stalled = out_valid & ~ready                  # the output register stays full
        skid_next = Signal()
        out_next = Signal()
        m.d.comb += [
            skid_next.eq(Mux(skid_valid, stalled, stalled & valid)),
            out_next.eq(Mux(skid_valid | stalled, out_valid, valid)),
        ]
        m.d.sync += [skid_valid.eq(skid_next), out_valid.eq(out_next)]

        def hold(name, skid_full, out_full, value):
            """The output and skid registers of ``value`` as the copies ``skid_full`` and
            ``out_full`` of the two valid bits see them; returns the output register."""
            out = Signal.like(value, name=f"{name}_out", reset_less=True)
            skid = Signal.like(value, name=f"{name}_skid", reset_less=True)
            # A value loaded while stage 5 is empty is never marked valid: no valid bit
            # on these enables, which would be one more net to every lane.
            with m.If(skid_full):
                with m.If(ready):
                    m.d.sync += out.eq(skid)
            with m.Elif(out_full & ~ready):
                m.d.sync += skid.eq(value)
            with m.Else():
                m.d.sync += out.eq(value)
            return out

        # The side band: registers beside the lanes', on the same (global) enables.
        if self._side:
            side = self.i_stream.payload.side
            for k in range(1, LATENCY):
                r = Signal(self._side, name=f"s{k}_side", reset_less=True)
                with m.If(~skid_valid):
                    m.d.sync += r.eq(side)
                side = r
            m.d.comb += self.o_stream.payload.side.eq(
                hold("side", skid_valid, out_valid, side))

        # --- the lanes ----------------------------------------------------------------------
        # The two valid bits have one copy per lane (equal values, `keep` so that
        # synthesis does not merge them), and each lane's registers load on its own
        # copies: no single net drives the enables of every lane across the die. The op
        # is registered once per lane (`keep`: copies, not merged) and decoded in stage 2
        # by each lane from its copy: stage 1 does not depend on it. An op that was not
        # built decodes as ADD: its flag is a constant 0.
        built = set(self._ops)
        out = self.o_stream.payload
        for i in range(lanes):
            skid_c = Signal(name=f"skid_valid_copy{i}", attrs={"keep": 1})
            out_c = Signal(name=f"o_valid_copy{i}", attrs={"keep": 1})
            m.d.sync += [skid_c.eq(skid_next), out_c.eq(out_next)]
            en = Signal(name=f"advance{i}")
            m.d.comb += en.eq(~skid_c)

            def reg(shape, name, value):
                r = Signal(shape, name=name, reset_less=True)
                with m.If(en):
                    m.d.sync += r.eq(value)
                return r
            op1 = Signal(BinaryOp, name=f"s1_op{i}", attrs={"keep": 1})
            with m.If(en):
                m.d.sync += op1.eq(self.i_stream.payload.op)

            def is_op(o, name):
                s = Signal(name=f"{name}{i}")
                if o in built:
                    m.d.comb += s.eq(op1 == o)
                return s
            ops = (is_op(BinaryOp.MUL, "s1_is_mul"), is_op(BinaryOp.MAX, "s1_is_max"),
                   is_op(BinaryOp.B_SUB_A, "s1_flip_a"),      # b - a = (-a) + b
                   is_op(BinaryOp.A_SUB_B, "s1_flip_b"))      # a - b = a + (-b)
            result = self._lane(m, reg, i, self.i_stream.payload.a[i],
                                self.i_stream.payload.b[i], ops, BinaryOp.MUL in built,
                                dsp_enable=en if has_ecp5_dsp(platform) else None)
            held = hold(f"lane{i}", skid_c, out_c, result)
            m.d.comb += [
                out.result[i].eq(held[:FP16_BITS]),
                out.overflow[i].eq(held[FP16_BITS]),
                out.nan_created[i].eq(held[FP16_BITS + 1]),
            ]
        return m

    @staticmethod
    def _lane(m, reg, i, a, b, ops, has_mul, dsp_enable=None):
        """One lane; ``ops`` are the decode flags (``is_mul``, ``is_max``, ``flip_a``,
        ``flip_b``) of the lane's op register, valid in stage 2; without ``has_mul`` no
        multiplier is built. With ``dsp_enable`` (the lane's register enable, given on an
        ECP5) the multiplier is a MULT18X18D whose own registers stand for the operand
        registers and ``s2_prod`` (:func:`hw.arith.dsp.registered_product`). Returns stage 6's
        output, 18 bits: the result, then the ``overflow`` and ``nan_created`` flags."""
        def comb(shape, name, value):
            s = Signal(shape, name=f"{name}{i}")
            m.d.comb += s.eq(value)
            return s

        # --- stage 1: decode, order, exponents, special results -----------------------------
        ea, eb = a[FP16_FRAC_BITS:15], b[FP16_FRAC_BITS:15]
        fa, fb = a[:FP16_FRAC_BITS], b[:FP16_FRAC_BITS]
        sa, sb = a[15], b[15]
        a_norm, b_norm = ea.any(), eb.any()
        # Significand with hidden bit; exponent field with subnormals at 1 (same scale).
        ma, mb = Cat(fa, a_norm), Cat(fb, b_norm)
        xa, xb = ea | ~a_norm, eb | ~b_norm
        a_top, b_top = ea.all(), eb.all()
        a_nan, b_nan = a_top & fa.any(), b_top & fb.any()
        a_inf, b_inf = a_top & ~fa.any(), b_top & ~fb.any()
        a_zero, b_zero = ~a[:15].any(), ~b[:15].any()

        # One comparator orders the magnitudes for the adder, the multiplier and MAX.
        a_gt = comb(1, "a_gt", a[:15] > b[:15])
        mx = comb(_SIG, "mx", Mux(a_gt, ma, mb))
        my = comb(_SIG, "my", Mux(a_gt, mb, ma))
        # Both differences are formed beside the comparator, which only selects: the
        # comparator's carry chain is the first stage's long path.
        d = comb(FP16_EXP_BITS, "d", Mux(a_gt, xa - xb, xb - xa))     # ex - ey, 0..29
        # What the special results need, but not the op yet (decoded in stage 2): the
        # signs, the kinds of operand, and the maximum if the op is MAX. The maximum is
        # the positive one if the signs differ, else the larger magnitude (positive) or
        # the smaller (negative); equal magnitudes have equal bits.
        any_nan = a_nan | b_nan
        a_wins = Mux(sa != sb, ~sa, Mux(sa, ~a_gt, a_gt))

        s1_mx = reg(_SIG, f"s1_mx{i}", mx)
        s1_my = reg(_SIG, f"s1_my{i}", my)
        s1_d = reg(FP16_EXP_BITS, f"s1_d{i}", d)
        s1_xa = reg(FP16_EXP_BITS, f"s1_xa{i}", xa)
        s1_xb = reg(FP16_EXP_BITS, f"s1_xb{i}", xb)
        s1_a_gt = reg(1, f"s1_a_gt{i}", a_gt)
        s1_sa = reg(1, f"s1_sa{i}", sa)
        s1_sb = reg(1, f"s1_sb{i}", sb)
        s1_a_inf = reg(1, f"s1_a_inf{i}", a_inf)
        s1_b_inf = reg(1, f"s1_b_inf{i}", b_inf)
        s1_a_zero = reg(1, f"s1_a_zero{i}", a_zero)
        s1_b_zero = reg(1, f"s1_b_zero{i}", b_zero)
        s1_max_bits = reg(FP16_BITS, f"s1_max_bits{i}", Mux(a_wins, a, b))
        s1_nan = reg(1, f"s1_nan{i}", any_nan)

        # --- stage 2: the op; signs, special results -------------------------------------
        s1_mul, is_max, flip_a, flip_b = ops
        # Signs of the addends (a subtraction flips one operand).
        sa_add, sb_add = s1_sa ^ flip_a, s1_sb ^ flip_b
        eff_sub = sa_add ^ sb_add
        sign = Mux(s1_mul, s1_sa ^ s1_sb, Mux(s1_a_gt, sa_add, sb_add))
        add_invalid = s1_a_inf & s1_b_inf & eff_sub                         # inf - inf
        mul_invalid = (s1_a_inf & s1_b_zero) | (s1_a_zero & s1_b_inf)       # 0 * inf
        invalid = ~s1_nan & ~is_max & Mux(s1_mul, mul_invalid, add_invalid)
        inf_sign = Mux(s1_mul, s1_sa ^ s1_sb, Mux(s1_a_inf, sa_add, sb_add))
        special = is_max | s1_nan | s1_a_inf | s1_b_inf
        special_bits = Mux(s1_nan | invalid, CANONICAL_NAN,
                           Mux(is_max, s1_max_bits, Cat(Const(_INF_MAG, 15), inf_sign)))

        # --- stage 2: align y | multiply ------------------------------------------------------
        # A shift of 14 or more leaves nothing of y's 14 bits but the sticky bit.
        d_sat = Mux(s1_d[4], 15, s1_d[:4])
        aligned = comb(_ADD_W, "aligned", Cat(Const(0, _EXTRA), s1_my) >> d_sat)
        # Bit j of y (weight j + 3 in the 14-bit aligned word) is shifted out iff
        # j + 3 < d: the sticky bit straight from y and d, beside the shifter.
        align_sticky = Cat(s1_my[j] & (s1_d > j + _EXTRA) for j in range(_SIG)).any()
        use_dsp = has_mul and dsp_enable is not None
        if not use_dsp:
            product = comb(_BE_W, "product", s1_mx * s1_my if has_mul else 0)
        # Back-end exponent code K = Z + 12 (see the module constants):
        #   sum: the 15-bit sum's bit 14 is one place above x's hidden bit, Z = ex + 1;
        #   product: value ma*mb * 2**(xa + xb - 50), leading one at bit 21 means exponent
        #   field xa + xb - 14 = Z.
        k_code = Mux(s1_mul, s1_xa + s1_xb + (_K_OFFSET - 14),
                     Mux(s1_a_gt, s1_xa, s1_xb) + (_K_OFFSET + 1))
        s2_mx = reg(_SIG, f"s2_mx{i}", s1_mx)
        s2_y = reg(_ADD_W, f"s2_y{i}", aligned)
        s2_sticky = reg(1, f"s2_sticky{i}", align_sticky)
        if use_dsp:
            # The DSP's input registers load the significands as they come (the product
            # commutes: ma * mb = mx * my), not the ordered mx and my, so the magnitude
            # comparator is not in front of the routing to the DSP column; its output
            # register is s2_prod, and no cycle holds the DSP and its routing.
            s2_prod = registered_product(m, ma, mb, enable=dsp_enable, name=f"mul{i}")
        else:
            s2_prod = reg(_BE_W, f"s2_prod{i}", product)
        s2_k = reg(_K_BITS, f"s2_k{i}", k_code)
        s2_sign = reg(1, f"s2_sign{i}", sign)
        s2_sub = reg(1, f"s2_sub{i}", eff_sub & ~s1_mul)
        s2_mul = reg(1, f"s2_mul{i}", s1_mul)
        s2_special = reg(1, f"s2_special{i}", special)
        s2_sbits = reg(FP16_BITS, f"s2_special_bits{i}", special_bits)
        s2_invalid = reg(1, f"s2_invalid{i}", invalid)

        # --- stage 3: add or subtract | select the back end's input --------------------------
        # The sticky bit is jammed into y's lowest bit: y lies strictly between two even
        # multiples of that bit exactly when the jammed y does, and every rounding point
        # of the result is an even multiple (the guard bit is at least one place up).
        x15 = Cat(Const(0, _EXTRA), s2_mx, Const(0, 1))
        y15 = Cat(s2_y[0] | s2_sticky, s2_y[1:], Const(0, 1))
        total = comb(_ADD_W + 1, "sum",
                     x15 + (y15 ^ s2_sub.replicate(_ADD_W + 1)) + s2_sub)
        sig = Mux(s2_mul, s2_prod, Cat(Const(0, _BE_W - _ADD_W - 1), total))
        # The normalizing left shift may not go below exponent field 1: at most Z - 1
        # = K - 13 places. A one at bit 21 - (K - 13) of the word the leading zeros are
        # counted in (not of the significand) stops the count there. K < 13 asks for a
        # right shift (a tiny product): u = K then, whatever the count.
        marker = Cat(s2_k == (_BE_W - 1 + _U_OFFSET - j) for j in range(_BE_W))
        s3_sig = reg(_BE_W, f"s3_sig{i}", sig)
        s3_lz_in = reg(_BE_W, f"s3_lz_in{i}", sig | marker)
        s3_right = reg(1, f"s3_right{i}", s2_k < _U_OFFSET)
        s3_sticky = reg(1, f"s3_sticky{i}", s2_sticky & ~s2_mul)
        s3_k = reg(_K_BITS, f"s3_k{i}", s2_k)
        s3_sign = reg(1, f"s3_sign{i}", s2_sign)
        s3_sub = reg(1, f"s3_sub{i}", s2_sub)
        s3_special = reg(1, f"s3_special{i}", s2_special)
        s3_sbits = reg(FP16_BITS, f"s3_special_bits{i}", s2_sbits)
        s3_invalid = reg(1, f"s3_invalid{i}", s2_invalid)

        # --- stage 4: leading zeros, shift amount -------------------------------------------
        # Left shift by lz = min(leading zeros, Z - 1) (normal, or subnormal at field 0),
        # or right shift by Z - 1 < 0 (K < 13). Both become one left shift of a 35-bit
        # word: the significand at bit 13 (left) or at bit 0 (right, by 13 - (Z - 1) = K
        # less than left), shifted by lz or by K; the window is bits 13..34 of the result.
        # Ones below the 22 bits bound the count by 22 (zero significand and K >= 35).
        _, lz = _leading_zeros(Cat(Const((1 << 10) - 1, 10), s3_lz_in), 32)
        amount = Mux(s3_right, s3_k[:4], lz)                  # 0..22
        base = Mux(s3_right, s3_sig, Cat(Const(0, _U_OFFSET), s3_sig))
        # An exact zero sum of opposite signs is +0 (x + (-x) = +0, round to nearest).
        zero = ~s3_sig.any()
        s4_base = reg(_BE_W + _U_OFFSET, f"s4_base{i}", base)
        s4_amount = reg(FP16_EXP_BITS, f"s4_amount{i}", amount)
        s4_right = reg(1, f"s4_right{i}", s3_right)
        s4_k = reg(_K_BITS, f"s4_k{i}", s3_k)
        s4_sticky = reg(1, f"s4_sticky{i}", s3_sticky)
        s4_sign = reg(1, f"s4_sign{i}", s3_sign & ~(zero & s3_sub))
        s4_special = reg(1, f"s4_special{i}", s3_special)
        s4_sbits = reg(FP16_BITS, f"s4_special_bits{i}", s3_sbits)
        s4_invalid = reg(1, f"s4_invalid{i}", s3_invalid)

        # --- stage 5: shift; exponent field if normal ---------------------------------------
        width = _BE_W + _U_OFFSET                              # 35
        shifted = comb(width, "shifted", (s4_base << s4_amount)[:width])
        # Window bits 13..34: significand 24..34 (hidden bit 34), guard 23, sticky below.
        # Base bit p lands at p + amount, under the guard bit iff p + amount < 23:
        # formed from the base and the amount beside the shifter.
        guard_at = width - _SIG - 1                            # 23
        sticky = s4_sticky | Cat(s4_base[p] & (s4_amount < guard_at - p)
                                 for p in range(guard_at)).any()
        # Exponent field if the result is normal: Z - lz = K - 12 - lz; a right-shifted
        # result is subnormal unless rounding carries it to field 1.
        field = Mux(s4_right, 1, s4_k - _K_OFFSET - s4_amount)
        s5_sig = reg(_SIG + 1, f"s5_sig{i}", shifted[guard_at:])
        s5_sticky = reg(1, f"s5_sticky{i}", sticky)
        s5_field = reg(_K_BITS, f"s5_field{i}", field)
        s5_sign = reg(1, f"s5_sign{i}", s4_sign)
        s5_special = reg(1, f"s5_special{i}", s4_special)
        s5_sbits = reg(FP16_BITS, f"s5_special_bits{i}", s4_sbits)
        s5_invalid = reg(1, f"s5_invalid{i}", s4_invalid)

        # --- stage 6: round, overflow, pack ---------------------------------------------------
        # s5_sig: the guard bit, then the significand (the hidden bit on top).
        hidden = s5_sig[_SIG]
        lsb = s5_sig[1]
        guard = s5_sig[0]
        round_up = guard & (s5_sticky | lsb)
        # A carry out of the fraction moves to the next binade (or from the largest
        # subnormal to the smallest normal, or from 65504 to inf) through the field.
        packed = comb(15, "packed",
                      Cat(s5_sig[1:_SIG],
                          Mux(hidden, s5_field[:FP16_EXP_BITS], 0)) + round_up)
        big = hidden & (s5_field >= _EXP_ALL)
        over = big | packed[FP16_FRAC_BITS:].all()
        return comb(FP16_BITS + 2, "result",
                    Cat(Mux(s5_special, s5_sbits, Cat(Mux(big, _INF_MAG, packed), s5_sign)),
                        ~s5_special & over, s5_special & s5_invalid))
