"""The chain checker's hazard walk: does any iteration of a chain write ahead of a read
of the same memory still to come, or write over another of its own writes?

This is :meth:`host.model.core.NpuModel._check_hazards` in hardware. A chain of ``L``
native vectors an instance has up to ``MAX_WRITES`` write ranges, its read (unless the
MVM takes it: the MVM's input is complete before its first result) and one range per
VRF that a ``vv`` op reads, each ``L`` long, starting at ``start + i * inc`` in
iteration ``i`` (``0 <= i <= last_iter``). A *pair* is two ranges in one memory: two
writes (``ww``: a hazard when their starts differ by less than ``L`` either way), or a
write ``a`` and a read ``b`` (``rw``: a hazard when ``a``'s start is ahead of ``b``'s by
1 to ``L - 1``). Over the iterations the start difference ``d`` moves by the pair's
step ``s = inc_a - inc_b`` from ``d0 = start_a - start_b`` to ``d0 + last_iter * s``.

The walk takes the pairs in one memory one at a time, lowest pair index first
(:func:`pair_keys`' order), in ``PICK``:

* a step shorter than the interval cannot jump over it, so the two ends of the walk
  decide at once (one cycle);
* otherwise ``STEP`` walks the iterations, one a cycle, until ``d`` is in the interval
  (a hazard), past it in the step's direction, or the last iteration is reached; then
  ``PICK`` takes the next pair.

``PICK`` with no pair left ends the walk (``clear``). The cycles a chain takes here are
part of the core's cycle counts, which :class:`host.model.core.NpuModel` predicts.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from host.spec.config import NpuConfig
from host.spec.isa import FIELDS, MAX_WRITES, Space
from hw.core.decode import built_vrfs, iteration_bits
from hw.core.vectors import checked_config

__all__ = ["HazardWalk", "pair_keys", "range_layout", "walk_pairs"]

#: Bits of the signed registers of the walk: the start difference (two 32-bit operands
#: apart, and the steps of the iterations added), the step (two 16-bit increments apart)
#: and the interval's ends (at most 2 ** 12 vectors either way; ``length_bits`` is far
#: below).
_D_BITS = 40
_S_BITS = 18
_BOUND_BITS = 12


def range_layout(config: NpuConfig) -> data.StructLayout:
    """One range of a chain: ``used`` (1: the range takes part), ``space`` (a
    :class:`~host.spec.isa.Space`), ``start`` (iteration 0's first vector, the operand's
    32 bits), ``inc`` (its increment per iteration, 16 bits) and ``prod``
    (``last_iter * inc``, registered by the caller beside its range checks)."""
    inc_bits = FIELDS["inc"][1]
    return data.StructLayout({
        "used": unsigned(1), "space": Space, "start": unsigned(FIELDS["operand"][1]),
        "inc": unsigned(inc_bits), "prod": unsigned(iteration_bits(config) + inc_bits),
    })


def pair_keys(config: NpuConfig) -> list:
    """The ranges, in the order of :class:`HazardWalk`'s ``ranges`` port: the writes
    ``("w", k)`` for ``k < MAX_WRITES``, the read ``("r",)``, the VRFs a ``vv`` op can
    read ``("v", k)`` (the built ones, space ``2 + k``)."""
    return ([("w", k) for k in range(MAX_WRITES)] + [("r",)]
            + [("v", k) for k in built_vrfs(config)])


def walk_pairs(config: NpuConfig) -> list:
    """The pairs ``(kind, a, b)`` the walk checks, in its order (bit ``i`` of its masks):
    every two writes (``"ww"``, ``a`` after ``b``), then every write with every read
    (``"rw"``)."""
    reads = [key for key in pair_keys(config) if key[0] != "w"]
    pairs = [("ww", ("w", k), ("w", j)) for k in range(MAX_WRITES) for j in range(k)]
    pairs += [("rw", ("w", k), rd) for k in range(MAX_WRITES) for rd in reads]
    return pairs


def _lowest(value):
    """The lowest set bit of ``value`` alone (0 when none is set)."""
    return value & (~value + 1)


class HazardWalk(wiring.Component):
    """The hazard walk of one checked chain (module docstring).

    The front end's ``CHECK`` state loads the candidate pairs (the pairs whose two ranges
    are used and in one memory) and, when the chain passes its other checks but the
    vector ranges, starts the walk (and aborts it in its first cycle when a range
    failed); the walk's answer comes in one of the following cycles. Every input must hold
    its chain's final value from the cycle before ``CHECK`` until the walk ends.

    Parameters
    ----------
    config : NpuConfig
        The build; it fixes the ranges (:func:`pair_keys`) and the widths.

    Attributes
    ----------
    ranges : ``In(ArrayLayout(range_layout(config), len(pair_keys(config))))``
        The chain's ranges, in :func:`pair_keys`' order.
    length : ``In(config.mfu.length_bits)``
        ``L``, the native vectors of each range.
    last_iter : ``In(iteration_bits(config))``
        The chain's iterations less one; read a cycle late (registered), so final from
        the cycle of ``to_check``, as ``length`` and ``ranges``.
    to_check : ``In(1)``
        The front end enters ``CHECK`` at the next clock edge.
    start : ``In(1)``
        ``CHECK`` passes: the walk starts at the next clock edge (with the candidates
        loaded in ``CHECK``).
    abort : ``In(1)``
        The front end drops the walk (the chain failed its range check in ``CHECK``,
        :attr:`hw.core.plan.PlanCheck.range_error`), only in the walk's first cycle
        (``PICK``, the cycle after ``start``): the walk is idle at the next clock edge,
        and ``clear`` and ``hazard`` of this cycle mean nothing. Read in no other state,
        so that it stays out of the step's compares.
    clear : ``Out(1)``
        This cycle ends the walk: no hazard. Combinational, as ``hazard``.
    hazard : ``Out(1)``
        This cycle ends the walk: an iteration's write overlaps a range of its pair.

    Raises
    ------
    TypeError
        ``config`` is not an :class:`~host.spec.config.NpuConfig`.
    """

    def __init__(self, config):
        self._config = config = checked_config(self, config)
        super().__init__({
            "ranges": In(data.ArrayLayout(range_layout(config), len(pair_keys(config)))),
            "length": In(config.mfu.length_bits),
            "last_iter": In(iteration_bits(config)),
            "to_check": In(1),
            "start": In(1),
            "abort": In(1),
            "clear": Out(1),
            "hazard": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        c = self._config
        keys = pair_keys(c)
        pairs = walk_pairs(c)
        ranges = {key: self.ranges[i] for i, key in enumerate(keys)}
        prod_bits = range_layout(c)["prod"].shape.width

        # The candidates, registered every cycle (the v_wr's spaces are final the cycle
        # before CHECK, which loads them into haz_mask).
        cand = Signal(len(pairs))
        cand_next = Signal(len(pairs))
        cand_low = Signal(len(pairs))                   # lowest set bit of cand
        for i, (_, ka, kb) in enumerate(pairs):
            a, b = ranges[ka], ranges[kb]
            m.d.comb += cand_next[i].eq(a.used & b.used & (a.space == b.space))
        m.d.sync += [cand.eq(cand_next), cand_low.eq(_lowest(cand_next))]

        # haz_mask: the pairs not decided yet; haz_next its value next cycle: the
        # candidates in CHECK, haz_mask less the pair decided in PICK, else haz_mask.
        # The pair the walk decides next (next_bit, the lowest of haz_next) is picked a
        # cycle ahead: its start difference d, step s and last_iter * s are registered
        # (pick_*), so PICK starts from registers.
        #
        # Neither haz_next nor next_bit reads a state register or finds a lowest bit
        # (timing closure: the state's decode and the lowest-bit carry chain were in
        # front of the pick's selection and subtraction, the core alone's critical path
        # at 57.9 and 56.3 MHz): at_check and at_pick are flip-flops high exactly in
        # CHECK and PICK, and next_bit is one of three registers. In CHECK it is the
        # lowest candidate (cand_low). In PICK, haz_mask is the last haz_next, so the
        # pair decided is its lowest bit (pick_bit, last cycle's next_bit) and the next
        # one its second lowest (second_bit, registered from last cycle's haz_next and
        # next_bit; 0 when haz_mask is). Elsewhere haz_next is haz_mask: pick_bit.
        at_check = Signal()
        at_pick = Signal()
        m.d.sync += [at_check.eq(self.to_check), at_pick.eq(self.start)]
        haz_mask = Signal(len(pairs))
        haz_next = Signal(len(pairs))
        pick_bit = Signal(len(pairs))
        second_bit = Signal(len(pairs))
        m.d.comb += haz_next.eq(Mux(at_check, cand,
                                    Mux(at_pick, haz_mask & ~pick_bit, haz_mask)))
        m.d.sync += haz_mask.eq(haz_next)
        next_bit = Signal(len(pairs))                   # lowest set bit of haz_next
        m.d.comb += next_bit.eq(Mux(at_check, cand_low, Mux(at_pick, second_bit, pick_bit)))
        m.d.sync += second_bit.eq(_lowest(haz_next & ~next_bit))

        def select(side, field):
            """Field ``field`` of range ``a`` (``side`` 1) or ``b`` (2) of the pair in
            ``next_bit`` (an AND-OR over the ranges; 0 when no bit is set)."""
            out = Const(0, 1)
            for key in keys:
                bits = [next_bit[i] for i, p in enumerate(pairs) if p[side] == key]
                if bits:
                    out = out | Mux(Cat(*bits).any(), getattr(ranges[key], field), 0)
            return out

        # The interval of a pair: (-L, L) for two writes, (0, L) for a write and a read.
        # Its terms are registered (timing closure: L's negation and width were carry
        # chains in front of pick_short and the walk's decision, the core alone's
        # critical path at 57.9 MHz once the pick was off it); L is final at least four
        # cycles (v_rd, v_wr, end_chain, CHECK) before PICK, so these registers are
        # final by CHECK, when the pick stage reads them.
        length = self.length
        # The last iteration's index too (timing closure: iters - 1, a carry chain from
        # the chain's ITERATIONS register, was in front of STEP's compare, the core
        # alone's critical path at 67.2 MHz); iters is final before the chain's v_rd.
        walk_last = Signal.like(self.last_iter)
        m.d.sync += walk_last.eq(self.last_iter)
        walk_len = Signal.like(length)
        walk_neg = Signal(signed(len(length) + 1))      # -L
        walk_span2 = Signal(len(length) + 1)            # 2 * L
        m.d.sync += [walk_len.eq(length), walk_neg.eq(-length), walk_span2.eq(length << 1)]

        # The pick stage: the next pair's terms, registered. Besides the differences, the
        # terms PICK's compares take are registered here too, so that PICK's decision
        # starts at its compares (timing closure: `pick_lo`, a multiplexer by the pair's
        # kind in front of the carry chain of `pick_d > pick_lo`, began the board's
        # critical path, 66.4 MHz): both `s = a - b` and `-s = b - a`, the interval's
        # low end and the bound a short step stays under. PICK compares both s and -s
        # with the bound and takes one by s's sign bit: |s| chosen here by that sign put
        # the difference's carry chain and the choice in this stage's cycle (the core
        # alone's critical path at 73.3 MHz).
        next_ww = (next_bit & sum(1 << i for i, p in enumerate(pairs) if p[0] == "ww")) != 0
        inc_a, inc_b = select(1, "inc"), select(2, "inc")
        pick_d = Signal(signed(_D_BITS))
        pick_s = Signal(signed(_S_BITS))
        pick_s_neg = Signal(signed(_S_BITS))            # -s
        pick_r = Signal(signed(prod_bits + 1))          # last_iter * s
        pick_lo = Signal(signed(_BOUND_BITS))
        pick_bound = Signal.like(walk_span2)
        m.d.sync += [pick_d.eq(select(1, "start") - select(2, "start")),
                     pick_s.eq(inc_a - inc_b), pick_s_neg.eq(inc_b - inc_a),
                     pick_r.eq(select(1, "prod") - select(2, "prod")),
                     pick_lo.eq(Mux(next_ww, walk_neg, 0)),
                     pick_bound.eq(Mux(next_ww, walk_span2, walk_len)),
                     pick_bit.eq(next_bit)]
        pick_hi = walk_len
        pick_end = Signal(signed(48))
        m.d.comb += pick_end.eq(pick_d + pick_r)
        # A step shorter than the interval cannot jump over it: the endpoints decide.
        pick_short = Mux(pick_s[-1], pick_s_neg < pick_bound, pick_s < pick_bound)
        # max(d, end) > lo and min(d, end) < hi.
        pick_hit = (((pick_d > pick_lo) | (pick_end > pick_lo))
                    & ((pick_d < pick_hi) | (pick_end < pick_hi)))

        hz_d = Signal(signed(_D_BITS))
        hz_s = Signal(signed(_S_BITS))
        hz_lo = Signal(signed(_BOUND_BITS))
        hz_hi = Signal(signed(_BOUND_BITS))
        hz_i = Signal(len(self.last_iter))
        # STEP's decisions on hz_d and hz_i, registered with them: each is computed on
        # the value that goes into hz_d (PICK's pick_d, STEP's hz_d + hz_s) and hz_i, so
        # that STEP decides from flip-flops (timing closure: hz_d's compares and the
        # decisions' priority were in front of the clock enables of hz_d and hz_i, the
        # core alone's critical path at 71.02 MHz).
        hz_hit = Signal()                 # lo < hz_d < hi: the pair overlaps here
        hz_past = Signal()                # hz_d reached or passed the interval
        hz_last = Signal()                # hz_i == walk_last
        d_next = Signal.like(hz_d)        # STEP: hz_d a step on
        m.d.comb += d_next.eq(hz_d + hz_s)

        def step_flags(d, s, lo, hi, last):
            """hz_hit, hz_past and hz_last for the difference ``d`` of step ``s``."""
            return [hz_hit.eq((d > lo) & (d < hi)),
                    hz_past.eq(((s > 0) & (d >= hi)) | ((s < 0) & (d <= lo))),
                    hz_last.eq(last)]
        with m.FSM(name="walk"):
            with m.State("IDLE"), m.If(self.start):
                m.next = "PICK"
            with m.State("PICK"):
                # haz_next drops the pair decided here (at_pick).
                with m.If(self.abort):
                    m.next = "IDLE"
                with m.Elif(haz_mask == 0):
                    m.d.comb += self.clear.eq(1)
                    m.next = "IDLE"
                with m.Elif(pick_short):
                    with m.If(pick_hit):
                        m.d.comb += self.hazard.eq(1)
                        m.next = "IDLE"
                    with m.Else():
                        m.d.sync += at_pick.eq(1)
                with m.Else():
                    m.d.sync += [hz_d.eq(pick_d), hz_s.eq(pick_s), hz_lo.eq(pick_lo),
                                 hz_hi.eq(pick_hi), hz_i.eq(0),
                                 *step_flags(pick_d, pick_s, pick_lo, pick_hi, walk_last == 0)]
                    m.next = "STEP"
            with m.State("STEP"):
                # The step is at least the interval: walk the iterations until the
                # difference reaches or passes the interval. (No abort here: it comes
                # only in the walk's first cycle, PICK.)
                with m.If(hz_hit):
                    m.d.comb += self.hazard.eq(1)
                    m.next = "IDLE"
                with m.Elif(hz_last | hz_past):
                    m.d.sync += at_pick.eq(1)
                    m.next = "PICK"
                with m.Else():
                    m.d.sync += [hz_d.eq(d_next), hz_i.eq(hz_i + 1),
                                 *step_flags(d_next, hz_s, hz_lo, hz_hi,
                                             hz_i + 1 == walk_last)]
        return m
