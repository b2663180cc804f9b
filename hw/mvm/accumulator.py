"""BFP-long accumulation of the matrix-vector multiplier (``docs/numerics.md`` section 4)
and its cross-tile narrow-accumulator check (section 5, rule 3). See ``docs/mvm.md``.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from hw.mvm.tile_engine import (
    NARROW_WIDTH_BITS, _check_config, pipelined_sum, shift_range, shift_shape,
)

__all__ = ["BfpAccumulator"]

#: The fine part of the term shift (stage 1) covers this many low bits of the amount.
_FINE_SHIFT_BITS = 3
#: Places per group of the cross-tile check: ``p = GROUP * h + l``, ``l < GROUP``.
_CHECK_GROUP_BITS = 3
_CHECK_GROUP = 1 << _CHECK_GROUP_BITS


def _check_decode(p, width):
    """The place ``p`` (0..``width - 1``) as the check's three registered decodes.

    Returns ``(above, at, low)``: ``above[g]`` is ``p < GROUP * g`` (every place of group
    ``g`` is at or above ``p``), ``at[g]`` is ``p // GROUP == g`` (the group ``p`` falls
    in), ``low[j]`` for ``j < GROUP - 1`` is ``p % GROUP <= j`` (place ``j`` of that
    group is at or above ``p``). 2 x groups + 7 bits instead of a ``width``-bit mask: the
    mask of a place is then a function of three of them, which the check's first LUT
    level takes beside the place's own bit.
    """
    hi, lo = p[_CHECK_GROUP_BITS:], p[:_CHECK_GROUP_BITS]
    groups = -(-width // _CHECK_GROUP)
    at = [hi == g for g in range(groups)]
    above = [Const(0, 1)]
    for g in range(1, groups):
        above.append(above[-1] | at[g - 1])
    low = [lo <= j for j in range(_CHECK_GROUP - 1)]
    return Cat(*above), Cat(*at), Cat(*low)


class BfpAccumulator(wiring.Component):
    """The ``N`` BFP-long accumulators: tile products in, one row block of sums out.

    Each cycle with ``valid`` brings one group of column tiles: for every engine ``t``
    (column tile ``c = g*T + t``) and output row ``i`` a tile product ``dot[t][i]`` and
    its shift ``shift[t][i] = E - L`` (:func:`hw.mvm.tile_engine.shift_offset`). Per row:

    1. **Term.** ``P_t = floor(dot * 2**shift)`` on the ``config.acc_bits`` grid: the
       shift is clamped below at ``-(dot_bits - 1)`` (any further right shift of a
       ``dot_bits`` value already gives 0 or -1, so the clamp is exact; the term of a
       clamped shift is ``dot``'s sign, chosen after the shifter), then
       ``dot`` is shifted left by ``shift + dot_bits - 1`` (0..``max_shift + dot_bits -
       1``, in a fine and a coarse stage) and the low ``dot_bits - 1`` bits are dropped,
       which is the floor.
    2. **Prefix sums** ``Q_t = P_0 + ... + P_t`` of the ``T`` terms, a Sklansky tree with
       a register per level (``ceil(log2 T)`` stages), off the loop.
    3. **Loop.** ``S_t = A + Q_t`` for all ``t`` at once, ``A = 0`` on a row block's
       first group, else the last ``S_{T-1}``. ``S_{T-1}`` is the accumulator: the
       loop-carried path is one adder and an AND. Registers hold while ``valid`` is low.
    4. **Check.** ``S_t`` is the running accumulator after tile ``c`` in logical order.
       For ``1 <= c < C`` with ``dot != 0`` it must satisfy ``-2**p <= S_t < 2**p`` with
       ``p = k - 1 + shift`` (``docs/numerics.md`` rule 3 rewritten without the floor;
       ``p < 0`` means ``S_t == 0``): no bit of ``S_t ^ sign`` at a place ``>= p``. ``p``
       is clamped one stage early and decoded beside the loop adder into groups of 8
       places (which groups lie wholly above ``p``, which one holds it, and which places
       of that one count: 31 bits at ``acc_bits`` = 95, not a 94-bit mask); the test
       takes two more stages (per group, then the OR of the groups), then a pipelined
       popcount counts the events. This path only delays the count, never the result.

    On a row block's last group (``last``) the ``N`` values ``S_{T-1}`` are presented on
    ``result`` with ``result_valid`` high for exactly one cycle; the consumer must take
    them in that cycle (the MVM reserves room for every row block before computing it).

    Only the control bits (``valid``, ``first``, ``last``, ``engines``), the check bits
    and the count have a reset. The terms, prefix sums, accumulators, ``p`` and its
    decode have none: ``valid`` and the check bits qualify them, and ``first`` starts
    every row block from 0.

    Without the check (``config.narrow_check`` False) steps 1 to 3 are as above, step 4
    is not built: ``k`` is unused and ``narrow`` is always 0.

    Parameters
    ----------
    config : MvmConfig

    Attributes
    ----------
    dot : ``In(ArrayLayout(ArrayLayout(signed(dot_bits), n), tiles))``
        ``dot[t][i]``: tile product of engine ``t``, row ``i``.
    shift : ``In(ArrayLayout(ArrayLayout(shift_shape(config), n), tiles))``
    valid, first, last : ``In(1)``
        A group is present; it is the first / last group of its row block.
    engines : ``In(tiles)``
        Bit ``t``: engine ``t``'s column tile exists (``c < C``). Products of other
        engines must be zero.
    k : ``In(7)``
        Narrow width, 1..64.
    result : ``Out(ArrayLayout(signed(acc_bits), n))``, result_valid : ``Out(1)``
        The row block's accumulators, in units of ``2**acc_lsb``, :attr:`result_latency`
        cycles after its last group.
    narrow : ``Out(range(n * tiles + 1))``
        Cross-tile events of the group taken :attr:`narrow_latency` cycles earlier.
    """

    def __init__(self, config):
        self._config = c = _check_config(config)
        self._prefix_stages = ceil_log2(c.tiles)
        self._count_stages = ceil_log2(c.n * c.tiles)
        super().__init__({
            "dot": In(data.ArrayLayout(data.ArrayLayout(signed(c.dot_bits), c.n), c.tiles)),
            "shift": In(data.ArrayLayout(data.ArrayLayout(shift_shape(c), c.n), c.tiles)),
            "valid": In(1),
            "first": In(1),
            "last": In(1),
            "engines": In(c.tiles),
            "k": In(NARROW_WIDTH_BITS),
            "result": Out(data.ArrayLayout(signed(c.acc_bits), c.n)),
            "result_valid": Out(1),
            "narrow": Out(range(c.n * c.tiles + 1)),
        })

    @staticmethod
    def result_latency_of(config):
        """Cycles from a group's inputs to ``result``: fine and coarse shift, prefix
        stages, loop."""
        return 2 + ceil_log2(config.tiles) + 1

    @classmethod
    def narrow_latency_of(cls, config):
        """Cycles from a group's inputs to its cross-tile event count."""
        return cls.result_latency_of(config) + 2 + ceil_log2(config.n * config.tiles)

    @property
    def result_latency(self):
        return self.result_latency_of(self._config)

    @property
    def narrow_latency(self):
        return self.narrow_latency_of(self._config)

    def elaborate(self, platform):
        m = Module()
        c = self._config
        n, tiles = c.n, c.tiles
        db = c.dot_bits
        lead = db - 1                          # left shift that maps shift -(db-1) to 0
        amount_max = c.max_shift + lead
        amount_shape = Shape.cast(range(amount_max + 1))
        fine_shape = signed(db + (1 << _FINE_SHIFT_BITS) - 1)
        wide_shape = signed(c.acc_bits + lead)
        # p = k - 1 + shift, for any k of the field and any shift
        s_lo, s_hi = shift_range(c)
        p_shape = Shape.cast(range(s_lo - 1, (1 << NARROW_WIDTH_BITS) - 1 + s_hi))

        # Data stages are reset-less: a register with both a reset and a clear (a Mux
        # to 0) costs a LUT that ORs them, on the reset's one net (docs/mvm.md section 6).
        # Only the control bits, the check bits and the count take `control`: a reset.
        def pipe(value, name, shape=None, keep=False, control=False):
            r = Signal(shape if shape is not None else value.shape(), name=name,
                       attrs={"keep": 1} if keep else {}, reset_less=not control)
            m.d.sync += r.eq(value)
            return r

        def side_stage(side, suffix, final):
            """One register stage of the group's control bits. In the stage that feeds
            the loop, ``valid`` and ``first`` get a register per row (kept apart): as
            one register each, they fanned out to every bit of every loop adder
            (``first``'s AND) and enable, and their routing across the accumulator
            was its critical path."""
            out = {}
            for k, v in side.items():
                if final and k in ("valid", "first"):
                    out[k] = [pipe(v, f"{k}_{suffix}_row{i}", keep=True, control=True)
                              for i in range(n)]
                else:
                    out[k] = pipe(v, f"{k}_{suffix}", control=True)
            return out

        # Without the narrow check (MvmConfig.narrow_check) nothing of the check is made:
        # no non-zero test, no p, no decode, no flags, no count; `narrow` stays 0.
        narrow_check = c.narrow_check

        # --- stage 1: fine shift, clamp flag, non-zero test, p -------------------------
        # The clamp (shift < -lead) is only registered here and applied in stage 2, so
        # that no comparator's carry chain is in front of the fine shifter: the fine
        # amount is the low bits of shift + lead, a 3-bit sum.
        fine, coarse, clamped, negative, nz, p = {}, {}, {}, {}, {}, {}
        for t in range(tiles):
            for i in range(n):
                d = self.dot[t][i]
                s = self.shift[t][i]
                fine_amount = s[:_FINE_SHIFT_BITS] + lead % (1 << _FINE_SHIFT_BITS)
                fine[t, i] = pipe(d << fine_amount[:_FINE_SHIFT_BITS], f"fine_s1_{t}_{i}",
                                  fine_shape)
                amount = (s + lead)[:amount_shape.width]
                coarse[t, i] = pipe(amount[_FINE_SHIFT_BITS:], f"coarse_s1_{t}_{i}")
                clamped[t, i] = pipe(s < -lead, f"clamped_s1_{t}_{i}")
                negative[t, i] = pipe(d[-1], f"negative_s1_{t}_{i}")
                if narrow_check:
                    nz[t, i] = pipe(d != 0, f"nonzero_s1_{t}_{i}")
                    p[t, i] = pipe(self.k - 1 + s, f"p_s1_{t}_{i}", p_shape)
        side = {
            "valid": pipe(self.valid, "valid_s1", control=True),
            "first": pipe(self.first, "first_s1", control=True),
            "last": pipe(self.last, "last_s1", control=True),
            "engines": pipe(self.engines, "engines_s1", control=True),
        }

        # --- stage 2: coarse shift by multiples of 8, drop the low bits (floor) ---------
        terms, pneg = {}, {}
        for t in range(tiles):
            for i in range(n):
                wide = Signal(wide_shape, name=f"wide_{t}_{i}")
                m.d.comb += wide.eq(fine[t, i] << Cat(Const(0, _FINE_SHIFT_BITS),
                                                      coarse[t, i]))
                # Clamped: the shift by 0 that the clamp stands for leaves floor(d / 2**lead),
                # which is -1 or 0 (d has dot_bits = lead + 1 bits): d's sign.
                terms[t, i] = pipe(Mux(clamped[t, i], negative[t, i].replicate(c.acc_bits),
                                       wide[lead:]).as_signed(),
                                   f"term_s2_{t}_{i}", signed(c.acc_bits))
                if not narrow_check:
                    continue
                nz[t, i] = pipe(nz[t, i], f"nonzero_s2_{t}_{i}")
                # Clamp p to 0..acc_bits-1 (p < 0 kept as a flag): the mask of places >= p
                # is then a 7-bit thermometer decode.
                pp = p[t, i]
                pneg[t, i] = pipe(pp < 0, f"p_negative_s2_{t}_{i}")
                p[t, i] = pipe(Mux(pp < 0, 0, Mux(pp > c.acc_bits - 1, c.acc_bits - 1, pp)),
                               f"p_clamped_s2_{t}_{i}", range(c.acc_bits))
        side = side_stage(side, "s2", final=self._prefix_stages == 0)

        # --- prefix sums over the engines (Sklansky), one register per level -----------
        q = dict(terms)
        for level in range(self._prefix_stages):
            span = 1 << level
            nq = {}
            for t in range(tiles):
                for i in range(n):
                    if t & span:
                        src = ((t >> level) << level) - 1
                        value = q[t, i] + q[src, i]
                    else:
                        value = q[t, i]
                    nq[t, i] = pipe(value, f"prefix_l{level}_{t}_{i}", signed(c.acc_bits))
                    if not narrow_check:
                        continue
                    nz[t, i] = pipe(nz[t, i], f"nonzero_l{level}_{t}_{i}")
                    p[t, i] = pipe(p[t, i], f"p_l{level}_{t}_{i}")
                    pneg[t, i] = pipe(pneg[t, i], f"p_negative_l{level}_{t}_{i}")
            q = nq
            side = side_stage(side, f"l{level}", final=level == self._prefix_stages - 1)

        # --- loop: S_t = A + Q_t; A = S_{T-1} ---------------------------------------------
        valid, first, last, engines = side["valid"], side["first"], side["last"], side["engines"]
        acc = {}
        for t in range(tiles):
            for i in range(n):
                acc[t, i] = Signal(signed(c.acc_bits), name=f"sum_{t}_{i}", reset_less=True)
        check, mask_loop, pneg_loop = {}, {}, {}
        for i in range(n):
            base = Mux(first[i], 0, acc[tiles - 1, i])
            with m.If(valid[i]):
                for t in range(tiles):
                    m.d.sync += acc[t, i].eq(base + q[t, i])
            if not narrow_check:
                continue
            for t in range(tiles):
                # Tile c = g*T + t exists, is not c = 0, and has a non-zero product.
                is_c0 = first[i] if t == 0 else Const(0, 1)
                check[t, i] = pipe(valid[i] & engines[t] & nz[t, i] & ~is_c0,
                                   f"check_{t}_{i}", control=True)
                # Which places are >= p, decoded beside the loop adder.
                mask_loop[t, i] = [
                    pipe(v, f"cross_{name}_{t}_{i}")
                    for name, v in zip(("above", "at", "low"),
                                       _check_decode(p[t, i], c.acc_bits - 1))]
                pneg_loop[t, i] = pipe(pneg[t, i], f"p_negative_loop_{t}_{i}")
        m.d.sync += self.result_valid.eq(valid[0] & last)
        m.d.comb += [self.result[i].eq(acc[tiles - 1, i]) for i in range(n)]
        if not narrow_check:
            return m

        # --- check: -2**p <= S < 2**p, in two register stages --------------------------
        # Stage 1, per group of places: any bit of S ^ sign in the group if the group is
        # wholly at or above p, in its places >= p if p falls in it; p < 0 lets only 0
        # fit, and S = -1 (no bit set) is caught by the sign term. Stage 2: their OR.
        w = c.acc_bits
        flags = []
        for t in range(tiles):
            for i in range(n):
                s_ = acc[t, i]
                sign = s_[w - 1]
                x = s_[:w - 1] ^ sign.replicate(w - 1)
                above, at, low = mask_loop[t, i]
                low = Cat(low, Const(1, 1))
                groups = []
                for g in range(len(at)):
                    bits = x[g * _CHECK_GROUP:(g + 1) * _CHECK_GROUP]
                    part_low = (bits & low[:len(bits)]).any()
                    groups.append((above[g] & bits.any()) | (at[g] & part_low))
                part = pipe(Cat(*groups, pneg_loop[t, i] & sign), f"cross_part_{t}_{i}")
                chk = pipe(check[t, i], f"check_c1_{t}_{i}", control=True)
                flags.append(pipe(chk & part.any(), f"cross_flag_{t}_{i}", control=True))

        total, stages = pipelined_sum(m, flags, "cross_count")
        assert stages == self._count_stages
        m.d.comb += self.narrow.eq(total)
        return m
