"""FP16 element-wise add, subtract, multiply and maximum for the multifunction units.

The bit-exact reference is :mod:`host.fp16` (``docs/numerics.md`` section 6); the design
notes are in ``docs/mfu-arith.md``. The operation codes are :class:`host.fp16.BinaryOp`.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from host.fp16 import CANONICAL_NAN, BinaryOp
from host.formats import FP16_BITS, FP16_EXP_BITS, FP16_FRAC_BITS, check_int

__all__ = ["Fp16Binary", "LATENCY", "input_layout", "output_layout"]

#: Register stages from an accepted input to its output (see :class:`Fp16Binary`).
LATENCY = 6

LANES_MAX = 64

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
#: The normalizing shift is sh = min(lz, Z - 1) (lz: leading zeros), -13 <= sh <= 22;
#: it is applied as a left shift by u = sh + 13 of the significand, whose 13 lowest
#: result bits then fall below the 22-bit window (a right shift, into the sticky bit).
_U_OFFSET = 13
_U_BITS = 6


def input_layout(lanes):
    """``i_stream`` payload: ``a`` and ``b`` (FP16 lanes) and the vector's ``op``.

    Bits: ``a`` lane ``i`` at ``[16i, 16i+16)``, ``b`` lane ``i`` at
    ``[16(lanes+i), 16(lanes+i)+16)``, ``op`` (3 bits) at ``32*lanes``.
    """
    return data.StructLayout({
        "a": data.ArrayLayout(FP16_BITS, lanes),
        "b": data.ArrayLayout(FP16_BITS, lanes),
        "op": BinaryOp,
    })


def output_layout(lanes):
    """``o_stream`` payload: ``result`` (FP16 lanes), then one ``overflow`` and one
    ``nan_created`` bit per lane (at ``16*lanes + i`` and ``17*lanes + i``)."""
    return data.StructLayout({
        "result": data.ArrayLayout(FP16_BITS, lanes),
        "overflow": data.ArrayLayout(1, lanes),
        "nan_created": data.ArrayLayout(1, lanes),
    })


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


class Fp16Binary(wiring.Component):
    """Element-wise IEEE 754 binary16 ``op(a, b)`` on ``lanes`` lanes, one vector per cycle.

    Each vector carries its :class:`host.fp16.BinaryOp` in the payload, so an MFU stage
    can change the operation from one vector to the next. Results are those of
    :func:`host.fp16.binary_bits`, bit for bit, and the two flags those of
    :func:`host.fp16.binary_events_bits`:

    * ``ADD``, ``A_SUB_B`` (``a - b``), ``B_SUB_A`` (``b - a``), ``MUL``: round to nearest,
      ties to even, subnormal inputs and results, overflow to +-inf, IEEE signed zeros;
    * ``MAX``: IEEE 754-2019 ``maximum`` (NaN if either is a NaN, ``+0 > -0``);
    * every NaN result is ``0x7E00``;
    * ``overflow``: the result is +-inf and no input was an infinity;
      ``nan_created``: the result is a NaN and no input was a NaN.

    Codes 5 to 7 of the ``op`` field are not operations; the unit treats them as ``ADD``.

    **Datapath** (per lane, ``docs/mfu-arith.md``). The operands are ordered by magnitude
    (``x`` the larger); the multiplier uses the same ordered pair, since it commutes.
    An addition aligns ``y`` to ``x`` keeping three extra bits with a sticky bit jammed
    into the lowest, adds or subtracts (15 bits, exact up to the jammed bit); a product is
    the exact 22-bit product of the significands. Either one then goes through the same
    back end: leading-zero count, one shift that normalizes (left) or denormalizes a tiny
    product (right, into the sticky bit), round to nearest even by one increment of the
    packed exponent and fraction. Infinities, NaNs and ``MAX`` are decided in the first
    stage and carried to the end.

    **Pipeline.** :data:`LATENCY` (6) register stages, all advancing together when the
    output register is empty or being read (a global stall):

    1. decode, magnitude compare (operand order and ``MAX``), exponent difference and
       back-end exponent code, special results;
    2. align ``y`` (shift right by up to 15, sticky) | multiply the significands;
    3. add or subtract | select the sum or the product for the back end;
    4. leading-zero count, shift amount (normal or subnormal result), sign of a zero;
    5. shift; exponent field of a normal result;
    6. sticky, round, overflow, pack; substitute the special result.

    With ``o_stream.ready`` high a vector leaves ``o_stream`` 6 cycles after it was
    accepted, and one vector is accepted every cycle. ``i_stream.ready`` depends
    combinationally on ``o_stream.ready`` (never the other way round); ``o_stream.valid``
    only on state, and the output payload is held while ``o_stream.ready`` is low.

    Parameters
    ----------
    lanes : int, 1..64
        FP16 values per vector.

    Attributes
    ----------
    i_stream : ``In(stream.Signature(input_layout(lanes)))``
        ``{a: ArrayLayout(16, lanes), b: ArrayLayout(16, lanes), op: BinaryOp}``.
    o_stream : ``Out(stream.Signature(output_layout(lanes)))``
        ``{result: ArrayLayout(16, lanes), overflow: ArrayLayout(1, lanes),
        nan_created: ArrayLayout(1, lanes)}``.
    lanes : int
    latency : int
        :data:`LATENCY`, cycles from input transfer to output valid without stalls.

    Raises
    ------
    TypeError
        ``lanes`` is not an integer.
    ValueError
        ``lanes`` is out of range.
    """

    def __init__(self, *, lanes):
        self._lanes = check_int("lanes", lanes, 1, LANES_MAX)
        super().__init__({
            "i_stream": In(stream.Signature(input_layout(self._lanes))),
            "o_stream": Out(stream.Signature(output_layout(self._lanes))),
        })

    @property
    def lanes(self):
        """FP16 values per vector."""
        return self._lanes

    @property
    def latency(self):
        """Cycles from an input transfer to its output being valid, without stalls."""
        return LATENCY

    def elaborate(self, platform):
        m = Module()

        # --- one enable for the whole pipeline --------------------------------------------
        advance = Signal()
        m.d.comb += [
            advance.eq(~self.o_stream.valid | self.o_stream.ready),
            self.i_stream.ready.eq(advance),
        ]

        def reg(shape, name, value):
            r = Signal(shape, name=name, reset_less=True)
            with m.If(advance):
                m.d.sync += r.eq(value)
            return r

        valid = self.i_stream.valid
        for k in range(1, LATENCY):
            v = Signal(name=f"s{k}_valid")
            with m.If(advance):
                m.d.sync += v.eq(valid)
            valid = v
        with m.If(advance):
            m.d.sync += self.o_stream.valid.eq(valid)

        # --- the operation, decoded once for all lanes -------------------------------------
        op = self.i_stream.payload.op
        is_mul = Signal(name="is_mul")
        is_max = Signal(name="is_max")
        flip_a = Signal(name="flip_a")           # b - a = (-a) + b
        flip_b = Signal(name="flip_b")           # a - b = a + (-b)
        m.d.comb += [
            is_mul.eq(op == BinaryOp.MUL),
            is_max.eq(op == BinaryOp.MAX),
            flip_a.eq(op == BinaryOp.B_SUB_A),
            flip_b.eq(op == BinaryOp.A_SUB_B),
        ]
        out = self.o_stream.payload
        for i in range(self._lanes):
            self._lane(m, reg, advance, i, self.i_stream.payload.a[i],
                       self.i_stream.payload.b[i], is_mul, is_max, flip_a, flip_b, out)
        return m

    @staticmethod
    def _lane(m, reg, advance, i, a, b, is_mul, is_max, flip_a, flip_b, out):
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
        ex = comb(FP16_EXP_BITS, "ex", Mux(a_gt, xa, xb))
        ey = comb(FP16_EXP_BITS, "ey", Mux(a_gt, xb, xa))
        # Signs of the addends (a subtraction flips one operand).
        sa_add, sb_add = sa ^ flip_a, sb ^ flip_b
        eff_sub = sa_add ^ sb_add
        # Back-end exponent code K = Z + 12 (see the module constants):
        #   sum: the 15-bit sum's bit 14 is one place above x's hidden bit, Z = ex + 1;
        #   product: value ma*mb * 2**(xa + xb - 50), leading one at bit 21 means exponent
        #   field xa + xb - 14 = Z.
        k_code = Mux(is_mul, xa + xb + (_K_OFFSET - 14), ex + (_K_OFFSET + 1))
        sign = Mux(is_mul, sa ^ sb, Mux(a_gt, sa_add, sb_add))

        # Special results: NaNs, infinities, MAX.
        any_nan = a_nan | b_nan
        add_invalid = a_inf & b_inf & eff_sub                    # inf - inf
        mul_invalid = (a_inf & b_zero) | (a_zero & b_inf)        # 0 * inf
        invalid = ~any_nan & ~is_max & Mux(is_mul, mul_invalid, add_invalid)
        inf_sign = Mux(is_mul, sa ^ sb, Mux(a_inf, sa_add, sb_add))
        # maximum: the positive one if the signs differ, else the larger magnitude
        # (positive) or the smaller (negative); equal magnitudes have equal bits.
        a_wins = Mux(sa != sb, ~sa, Mux(sa, ~a_gt, a_gt))
        special = is_max | any_nan | a_inf | b_inf
        special_bits = Mux(any_nan | invalid, CANONICAL_NAN,
                           Mux(is_max, Mux(a_wins, a, b), Cat(Const(_INF_MAG, 15), inf_sign)))

        d = ex - ey                                               # 0..29
        s1_mx = reg(_SIG, f"s1_mx{i}", mx)
        s1_my = reg(_SIG, f"s1_my{i}", my)
        s1_d = reg(FP16_EXP_BITS, f"s1_d{i}", d)
        s1_k = reg(_K_BITS, f"s1_k{i}", k_code)
        s1_sign = reg(1, f"s1_sign{i}", sign)
        s1_sub = reg(1, f"s1_sub{i}", eff_sub & ~is_mul)
        s1_mul = reg(1, f"s1_mul{i}", is_mul)
        s1_special = reg(1, f"s1_special{i}", special)
        s1_sbits = reg(FP16_BITS, f"s1_special_bits{i}", special_bits)
        s1_invalid = reg(1, f"s1_invalid{i}", invalid)

        # --- stage 2: align y | multiply ------------------------------------------------------
        # A shift of 15 or more leaves nothing of y's 14 bits but the sticky bit.
        d_sat = Mux(s1_d[4], 15, s1_d[:4])
        wide = comb(15 + _ADD_W, "align",
                    Cat(Const(0, 15 + _EXTRA), s1_my) >> d_sat)
        product = comb(_BE_W, "product", s1_mx * s1_my)
        s2_mx = reg(_SIG, f"s2_mx{i}", s1_mx)
        s2_y = reg(_ADD_W, f"s2_y{i}", wide[15:])
        s2_sticky = reg(1, f"s2_sticky{i}", wide[:15].any())
        s2_prod = reg(_BE_W, f"s2_prod{i}", product)
        s2_k = reg(_K_BITS, f"s2_k{i}", s1_k)
        s2_sign = reg(1, f"s2_sign{i}", s1_sign)
        s2_sub = reg(1, f"s2_sub{i}", s1_sub)
        s2_mul = reg(1, f"s2_mul{i}", s1_mul)
        s2_special = reg(1, f"s2_special{i}", s1_special)
        s2_sbits = reg(FP16_BITS, f"s2_special_bits{i}", s1_sbits)
        s2_invalid = reg(1, f"s2_invalid{i}", s1_invalid)

        # --- stage 3: add or subtract | select the back end's input --------------------------
        # The sticky bit is jammed into y's lowest bit: y lies strictly between two even
        # multiples of that bit exactly when the jammed y does, and every rounding point
        # of the result is an even multiple (the guard bit is at least one place up).
        x15 = Cat(Const(0, _EXTRA), s2_mx, Const(0, 1))
        y15 = Cat(s2_y[0] | s2_sticky, s2_y[1:], Const(0, 1))
        total = comb(_ADD_W + 1, "sum",
                     x15 + (y15 ^ s2_sub.replicate(_ADD_W + 1)) + s2_sub)
        sig = Mux(s2_mul, s2_prod, Cat(Const(0, _BE_W - _ADD_W - 1), total))
        s3_sig = reg(_BE_W, f"s3_sig{i}", sig)
        s3_sticky = reg(1, f"s3_sticky{i}", s2_sticky & ~s2_mul)
        s3_k = reg(_K_BITS, f"s3_k{i}", s2_k)
        s3_sign = reg(1, f"s3_sign{i}", s2_sign)
        s3_sub = reg(1, f"s3_sub{i}", s2_sub)
        s3_special = reg(1, f"s3_special{i}", s2_special)
        s3_sbits = reg(FP16_BITS, f"s3_special_bits{i}", s2_sbits)
        s3_invalid = reg(1, f"s3_invalid{i}", s2_invalid)

        # --- stage 4: leading zeros, shift amount -------------------------------------------
        # Ones below the 22 bits bound the count by 22 (reached only by a zero significand).
        padded = Cat(Const((1 << 10) - 1, 10), s3_sig)
        _, lz = _leading_zeros(padded, 32)
        lz_u = comb(_U_BITS, "lz_u", lz + _U_OFFSET)
        # u = min(lz, Z - 1) + 13 = min(lz + 13, K): normalize, but not below field 1.
        u = Mux(lz_u < s3_k, lz_u, s3_k)
        # An exact zero sum of opposite signs is +0 (x + (-x) = +0, round to nearest).
        zero = ~s3_sig.any()
        s4_sig = reg(_BE_W, f"s4_sig{i}", s3_sig)
        s4_u = reg(_U_BITS, f"s4_u{i}", u)
        s4_k = reg(_K_BITS, f"s4_k{i}", s3_k)
        s4_sticky = reg(1, f"s4_sticky{i}", s3_sticky)
        s4_sign = reg(1, f"s4_sign{i}", s3_sign & ~(zero & s3_sub))
        s4_special = reg(1, f"s4_special{i}", s3_special)
        s4_sbits = reg(FP16_BITS, f"s4_special_bits{i}", s3_sbits)
        s4_invalid = reg(1, f"s4_invalid{i}", s3_invalid)

        # --- stage 5: shift; exponent field if normal ---------------------------------------
        shifted = comb(_U_OFFSET + _BE_W, "shifted",
                       (s4_sig << s4_u)[:_U_OFFSET + _BE_W])
        # Z - sh = K + 1 - u >= 1; the result is normal iff bit 21 is set after the shift.
        field = s4_k + 1 - s4_u
        s5_sig = reg(_BE_W, f"s5_sig{i}", shifted[_U_OFFSET:])
        s5_sticky = reg(1, f"s5_sticky{i}", s4_sticky | shifted[:_U_OFFSET].any())
        s5_field = reg(_K_BITS, f"s5_field{i}", field)
        s5_sign = reg(1, f"s5_sign{i}", s4_sign)
        s5_special = reg(1, f"s5_special{i}", s4_special)
        s5_sbits = reg(FP16_BITS, f"s5_special_bits{i}", s4_sbits)
        s5_invalid = reg(1, f"s5_invalid{i}", s4_invalid)

        # --- stage 6: round, overflow, pack ---------------------------------------------------
        # Significand s5_sig[11:22] (hidden bit 21), guard bit 10, sticky below.
        hidden = s5_sig[_BE_W - 1]
        lsb = s5_sig[_BE_W - _SIG]
        guard = s5_sig[_BE_W - _SIG - 1]
        sticky = s5_sticky | s5_sig[:_BE_W - _SIG - 1].any()
        round_up = guard & (sticky | lsb)
        # A carry out of the fraction moves to the next binade (or from the largest
        # subnormal to the smallest normal, or from 65504 to inf) through the field.
        packed = comb(15, "packed",
                      Cat(s5_sig[_BE_W - _SIG:_BE_W - 1],
                          Mux(hidden, s5_field[:FP16_EXP_BITS], 0)) + round_up)
        big = hidden & (s5_field >= _EXP_ALL)
        over = big | packed[FP16_FRAC_BITS:].all()
        with m.If(advance):
            m.d.sync += [
                out.result[i].eq(Mux(s5_special, s5_sbits,
                                     Cat(Mux(big, _INF_MAG, packed), s5_sign))),
                out.overflow[i].eq(~s5_special & over),
                out.nan_created[i].eq(s5_special & s5_invalid),
            ]
