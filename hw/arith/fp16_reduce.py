"""FP16 max and sum over a logical vector, broadcast: the MFUs' REDUCE unit.

The bit-exact reference is :mod:`host.numerics.reduction` (``docs/numerics.md`` section 6); the
design notes, cycle behaviour and measurements are in ``docs/reductions.md``. The
operation codes are :class:`host.numerics.reduction.ReduceOp`; every tree node is a
:class:`hw.arith.fp16_arith.Fp16Binary` lane computing ``ADD`` or ``MAX``.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, exact_log2

from host.spec.formats import FP16_BITS, check_int
from host.spec.ops import BinaryOp
from host.spec.ops import IDENTITY, ReduceOp
from hw.arith.fp16_arith import LATENCY as NODE_LATENCY
from hw.arith.fp16_arith import Fp16Binary

__all__ = [
    "Fp16Reduce", "LANES_MAX", "MAX_LENGTH_MAX", "input_layout", "output_layout",
    "lane_mask",
]

LANES_MAX = 64
#: Most items of ``lanes`` lanes in one logical vector. An MFU of ``l`` lanes builds the
#: unit with ``max_length * n / l`` of them (``hw.mfu.mfu``): 256 native vectors of
#: ``n = 64`` lanes at the fewest lanes a build takes (``host.spec.mfu.LANES_MIN``, 2).
MAX_LENGTH_MAX = 256 * LANES_MAX // 2
#: Results waiting for the broadcast stage. Two keep the output busy every cycle when
#: logical vectors of one item follow each other, while the write side's ready
#: is a register (``w_rdy`` depends on the FIFO level only), which cuts the ready path
#: from ``o_stream`` to ``i_stream``.
RESULT_FIFO_DEPTH = 2


def lane_mask(lanes: int, valid: int) -> int:
    """``keep`` for a vector whose first ``valid`` lanes (1 to ``lanes``) take part:
    ``valid`` low bits set. Raises :class:`ValueError` for ``valid`` out of range."""
    check_int("valid", valid, 1, lanes)
    return (1 << valid) - 1


def input_layout(lanes: int) -> data.StructLayout:
    """``i_stream`` payload of a ``lanes``-lane unit.

    ``values``
        ``ArrayLayout(unsigned(16), lanes)``: FP16 bit patterns, lane ``i`` at bits
        ``[16i, 16i + 16)``.
    ``op``
        :class:`ReduceOp` (1 bit), the same on every item of a logical vector.
    ``last``
        1 on the last item of the logical vector.
    ``keep``
        ``unsigned(lanes)``, on every item: lane ``i`` takes part if bit ``i`` is set
        and is replaced by the operation's identity otherwise. A logical vector of native
        vectors sends all ones, then ``lane_mask(lanes, lanes_last)`` on its ``last``
        item. In beats (an MFU of ``l < N`` lanes), each beat of the last native vector
        carries its ``l`` bits of the N-lane mask, so the beats wholly past
        ``lanes_last`` carry zeros, and every other beat all ones. A mask per lane rather
        than a count: the sender can register each lane's bit, so no net fans out from
        one flip-flop to every lane (``docs/reductions.md``).
    """
    return data.StructLayout({
        "values": data.ArrayLayout(unsigned(FP16_BITS), lanes),
        "op": ReduceOp,
        "last": unsigned(1),
        "keep": unsigned(lanes),
    })


def output_layout(lanes: int) -> data.StructLayout:
    """``o_stream`` payload: ``values`` (``lanes`` FP16 lanes, all equal to the result)
    and ``last`` (1 on the final vector of the broadcast) at bit ``16 * lanes``."""
    return data.StructLayout({
        "values": data.ArrayLayout(unsigned(FP16_BITS), lanes),
        "last": unsigned(1),
    })


def _check_power_of_two(name, value, hi):
    value = check_int(name, value, 1, hi)
    if value & (value - 1):
        raise ValueError(f"{name} must be a power of two from 1 to {hi}, not {value}")
    return value


def _tree_sum(m, name, bits):
    """Balanced adder tree over 1-bit values (a population count); returns a Value."""
    level = list(bits)
    if not level:
        return Const(0, 1)
    depth = 0
    while len(level) > 1:
        nxt = []
        for k in range(0, len(level) - 1, 2):
            s = Signal(bits_for(2 << depth), name=f"{name}_d{depth}_{k // 2}")
            m.d.comb += s.eq(level[k] + level[k + 1])
            nxt.append(s)
        if len(level) % 2:
            nxt.append(level[-1])
        level, depth = nxt, depth + 1
    return level[0]


class Fp16Reduce(wiring.Component):
    """IEEE 754 binary16 ``max`` or ``sum`` over a logical vector, broadcast to its length.

    A logical vector of ``n`` elements arrives as ``L = ceil(n / lanes)`` *items* of
    ``lanes`` lanes (``L <= max_length``), the last flagged ``last``, its lanes past the
    ``n``-th masked off in ``keep``.
    After it, ``o_stream`` carries ``L`` items whose every lane is the result of
    :func:`host.numerics.reduction.reduce_bits`, ``last`` on the final one. The result is the
    model's, bit for bit, for every ``lanes`` and ``max_length``: the unit computes the
    tree of the definition padded to ``lanes * max_length`` leaves, which gives the same
    bits (``docs/reductions.md``).

    An item is a native vector of ``N = lanes`` lanes, or a *beat* of an MFU of ``l < N``
    lanes, which builds the unit with ``lanes = l`` and ``max_length = M * N / l`` (``M``
    native vectors) and sends every beat of every native vector in lane order, the last
    native vector's trailing beats too (all masked off). The beats of a native vector are
    then the leaves of an aligned subtree, the first ``log2(N / l)`` vector-tree levels
    are the top of the N-lane tree, and the unit computes the N-lane build's tree node
    for node: the same bits, the same events and the same :attr:`latency`
    (``docs/reductions.md`` section 2).

    **Datapath.**

    * Input register: lanes whose ``keep`` bit is 0 become the identity (``-0`` for
      ``SUM``, ``-inf`` for ``MAX``).
    * Lane tree: ``log2(lanes)`` levels of :class:`Fp16Binary` computing ``ADD`` or
      ``MAX`` (``lanes / 2``, ``lanes / 4``, ... 1 lanes; ``lanes - 1`` nodes), level 1
      combining lanes ``(0, 1), (2, 3), ...``: one item in per cycle, its sum or maximum
      out.
    * Vector tree, time-shared: ``log2(max_length)`` one-lane levels, one per level of
      the tree over the per-item results. A level holds the first (left) operand of a
      pair until the second arrives; an item flagged ``last`` with no partner is paired
      with the identity. So level ``j`` computes exactly the level-``j`` nodes of the
      tree padded to ``max_length`` leaves that have a real leaf under them (the others
      are the identity and would only pass values through unchanged), in the same
      order. A build with ``lanes = max_length = 1`` gets one such level all the same,
      so that every element meets at least one node (as the model's ``P >= 2`` says).
    * A two-entry result FIFO, then the broadcast register, which repeats the result
      ``L`` times.

    **Cycle behaviour.** The input register advances when it is empty or being taken,
    and every level (a pipeline of :data:`hw.arith.fp16_arith.LATENCY` registers with a skid
    register behind its output) while its skid register is empty, so a stalled level
    stops the ones before it and bubbles collapse. Every level's ``i_stream.ready`` is a
    flip-flop; every level but the last is followed by a two-register buffer whose ready
    towards the level is a register; the last feeds the result FIFO, whose ``w_rdy`` is
    a register too. So the ready logic never spans more than one level, and
    ``i_stream.ready`` depends combinationally on the input register and the first
    level's ready flip-flop only, never on ``o_stream.ready``.
    ``o_stream.valid`` and its payload depend on state only. One item is
    accepted per cycle while nothing downstream is stalled, also while earlier results
    are being broadcast: input and output overlap, and the output sends one item per
    cycle, so a steady stream of logical vectors of one length runs at one item per
    cycle in and out. Without stalls the first output item is valid :attr:`latency`
    cycles after the input's ``last`` item was taken.

    **Events.** ``overflow_events`` and ``nan_events`` count the tree nodes that passed
    an output with the ``overflow`` (respectively ``nan_created``) flag of
    :class:`Fp16Binary` on, two cycles earlier (a register of the flags, then one of
    their sum). Every node passes each output on exactly once, so summed over time they
    count every event of :func:`host.numerics.reduction.reduce_bits` once; the events of a
    logical vector are all reported no later than the cycle in which its first output
    vector is valid.

    A logical vector of more than ``max_length`` items is outside the contract: the
    stream rules still hold and the unit does not stop, but the value and the number of
    output items are unspecified.

    Parameters
    ----------
    lanes : int, a power of two from 1 to 64
        FP16 lanes per item (``N``, or an MFU's ``l``).
    max_length : int, a power of two from 1 to :data:`MAX_LENGTH_MAX` (8192)
        Most items in one logical vector (``M``, or ``M * N / l``).

    Attributes
    ----------
    i_stream : ``In(stream.Signature(input_layout(lanes)))``
    o_stream : ``Out(stream.Signature(output_layout(lanes)))``
    overflow_events, nan_events : ``Out(unsigned(event_bits))``
    lanes, max_length : int
    lane_levels, vector_levels : int
        Levels of the lane tree and of the vector tree.
    event_bits : int
        Width of the event outputs: ``bits_for(lanes - 1 + vector_levels)``, enough for
        every node reporting in the same cycle.
    latency : int
        ``7 * (lane_levels + vector_levels) + 2`` (6 per level, 1 per buffer, the input
        register, the FIFO and the broadcast register): cycles from taking the ``last``
        input item to the first output item being valid, without stalls.

    Raises
    ------
    TypeError
        ``lanes`` or ``max_length`` is not an integer.
    ValueError
        ``lanes`` or ``max_length`` is out of range or not a power of two.
    """

    def __init__(self, *, lanes, max_length):
        self._lanes = _check_power_of_two("lanes", lanes, LANES_MAX)
        self._max_length = _check_power_of_two("max_length", max_length, MAX_LENGTH_MAX)
        self._lane_levels = exact_log2(self._lanes)
        self._count_bits = exact_log2(self._max_length)
        self._vector_levels = max(self._count_bits, 1 if self._lanes == 1 else 0)
        self._event_bits = bits_for(self._lanes - 1 + self._vector_levels)
        super().__init__({
            "i_stream": In(stream.Signature(input_layout(self._lanes))),
            "o_stream": Out(stream.Signature(output_layout(self._lanes))),
            "overflow_events": Out(self._event_bits),
            "nan_events": Out(self._event_bits),
        })

    @property
    def lanes(self):
        """FP16 lanes per item."""
        return self._lanes

    @property
    def max_length(self):
        """Most items in one logical vector."""
        return self._max_length

    @property
    def lane_levels(self):
        """Levels of the lane tree: ``log2(lanes)``."""
        return self._lane_levels

    @property
    def vector_levels(self):
        """Levels of the vector tree: ``log2(max_length)``, or 1 if ``lanes`` and
        ``max_length`` are both 1."""
        return self._vector_levels

    @property
    def event_bits(self):
        """Width of ``overflow_events`` and ``nan_events``."""
        return self._event_bits

    @property
    def latency(self):
        """Cycles from the ``last`` input item's transfer to the first output item,
        without stalls."""
        return (NODE_LATENCY + 1) * (self._lane_levels + self._vector_levels) + 2

    def elaborate(self, platform):
        m = Module()
        nodes = []                     # every Fp16Binary, for the event counts
        side_layout = data.StructLayout({
            "op": ReduceOp, "last": unsigned(1), "count": unsigned(self._count_bits),
        })

        def identity(op):
            return Mux(op == ReduceOp.MAX, IDENTITY[ReduceOp.MAX], IDENTITY[ReduceOp.SUM])

        def level(name, width, valid, a, b, side):
            """``width`` nodes combining ``a[i]`` and ``b[i]``; ``side`` (a view of
            ``side_layout``) travels beside them. Returns ``(node, side out)``."""
            # The node carries the side band beside the lanes (through its output and
            # skid registers), so it stays level with the payload under any stall.
            node = Fp16Binary(lanes=width, ops=(BinaryOp.ADD, BinaryOp.MAX),
                              side=side_layout.size)
            m.submodules[name] = node
            nodes.append(node)
            payload = node.i_stream.payload
            m.d.comb += [
                node.i_stream.valid.eq(valid),
                payload.op.eq(Mux(side.op == ReduceOp.MAX, BinaryOp.MAX, BinaryOp.ADD)),
                payload.side.eq(side),
            ]
            for i in range(width):
                m.d.comb += [payload.a[i].eq(a[i]), payload.b[i].eq(b[i])]
            return node, data.View(side_layout, node.o_stream.payload.side)

        last_level = self._lane_levels + self._vector_levels

        def buffer(name, level_number, valid, ready, values, side):
            """After every level but the last (which feeds the result FIFO): two
            registers whose upstream ready is a register, so that the ready path does
            not run through the whole tree. Drives ``ready``; returns the stream out."""
            if level_number == last_level:
                return valid, ready, values, side
            layout = data.StructLayout({
                "values": data.ArrayLayout(unsigned(FP16_BITS), len(values)),
                "side": side_layout,
            })
            incoming = Signal(layout, name=f"{name}_in")
            m.d.comb += incoming.side.eq(side)
            for i, v in enumerate(values):
                m.d.comb += incoming.values[i].eq(v)
            out_valid = Signal(name=f"{name}_valid")
            out_ready = Signal(name=f"{name}_ready")
            out = Signal(layout, name=f"{name}_out", reset_less=True)
            skid_valid = Signal(name=f"{name}_skid_valid")
            skid = Signal(layout, name=f"{name}_skid", reset_less=True)
            m.d.comb += ready.eq(~skid_valid)
            with m.If(~out_valid | out_ready):
                with m.If(skid_valid):
                    m.d.sync += [out.eq(skid), out_valid.eq(1), skid_valid.eq(0)]
                with m.Else():
                    m.d.sync += [out.eq(incoming), out_valid.eq(valid)]
            with m.Elif(valid & ~skid_valid):
                # The output register is full and stays so: park the item.
                m.d.sync += [skid.eq(incoming), skid_valid.eq(1)]
            return (out_valid, out_ready, [out.values[i] for i in range(len(values))],
                    out.side)

        # --- input register: identity in the lanes masked off ------------------------------
        # A register stage of its own: the lane masks in front of the first level's
        # comparator were the critical path. Each lane's mask bit comes from the sender,
        # a flip-flop per lane there; decoding a count here made one net from the
        # sender's `last` to every lane, which was the critical path of the MFU.
        inp = self.i_stream.payload
        valid = Signal(name="in_valid")
        ready = Signal(name="in_ready")
        side = Signal(side_layout, name="in_side", reset_less=True)
        advance = ~valid | ready
        m.d.comb += self.i_stream.ready.eq(advance)
        with m.If(advance):
            m.d.sync += [valid.eq(self.i_stream.valid), side.op.eq(inp.op),
                         side.last.eq(inp.last)]
        values = []
        for i in range(self._lanes):
            v = Signal(FP16_BITS, name=f"in_value{i}", reset_less=True)
            with m.If(advance):
                m.d.sync += v.eq(Mux(inp.keep[i], inp.values[i], identity(inp.op)))
            values.append(v)
        # From here on, (valid, ready, values, side) is the stream into the next level:
        # its valid, the ready the next level drives, its FP16 values and side band.

        # --- lane tree -------------------------------------------------------------------
        for t in range(1, self._lane_levels + 1):
            width = self._lanes >> t
            node, side = level(f"lane_level{t}", width, valid, values[0::2], values[1::2],
                               side)
            m.d.comb += ready.eq(node.i_stream.ready)
            valid, ready, values, side = buffer(
                f"lane_level{t}_buffer", t, node.o_stream.valid, node.o_stream.ready,
                [node.o_stream.payload.result[i] for i in range(width)], side)
        value = values[0]

        # --- vector tree: one time-shared node per level --------------------------------
        if self._vector_levels:
            # Index of each per-item result in its logical vector (L - 1 on the last).
            index = Signal(self._count_bits, name="vector_index")
            counted = Signal(side_layout, name="counted_side")
            m.d.comb += [counted.eq(side), counted.count.eq(index)]
            with m.If(valid & ready):
                m.d.sync += index.eq(Mux(side.last, 0, index + 1))
            side = counted
        for j in range(1, self._vector_levels + 1):
            held_valid = Signal(name=f"vector_level{j}_held_valid")
            held = Signal(FP16_BITS, name=f"vector_level{j}_held", reset_less=True)
            # A pair is complete with a held left operand, or with an unpaired last item
            # (whose partner in the padded tree is the identity).
            pair = Signal(name=f"vector_level{j}_pair")
            m.d.comb += pair.eq(held_valid | side.last)
            node, out_side = level(
                f"vector_level{j}", 1, valid & pair, [Mux(held_valid, held, value)],
                [Mux(held_valid, value, identity(side.op))], side)
            m.d.comb += ready.eq(~pair | node.i_stream.ready)
            with m.If(valid & ready):
                m.d.sync += held_valid.eq(~pair)
                with m.If(~pair):
                    m.d.sync += held.eq(value)
            valid, ready, values, side = buffer(
                f"vector_level{j}_buffer", self._lane_levels + j, node.o_stream.valid,
                node.o_stream.ready, [node.o_stream.payload.result[0]], out_side)
            value = values[0]

        # --- result FIFO and broadcast ---------------------------------------------------
        result_layout = data.StructLayout({
            "value": unsigned(FP16_BITS), "count": unsigned(self._count_bits),
        })
        m.submodules.results = results = fifo.SyncFIFO(width=result_layout.size,
                                                       depth=RESULT_FIFO_DEPTH)
        w_data = Signal(result_layout, name="result_in")
        m.d.comb += [
            w_data.value.eq(value), w_data.count.eq(side.count),
            results.w_data.eq(w_data),
            # Only an item flagged last is a result; others reach here only from logical
            # vectors longer than max_length (out of contract) and are dropped.
            results.w_en.eq(valid & side.last),
            ready.eq(results.w_rdy | ~side.last),
        ]
        r_data = data.View(result_layout, results.r_data)
        busy = Signal(name="broadcast_busy")
        remaining = Signal(self._count_bits, name="broadcast_remaining", reset_less=True)
        result = Signal(FP16_BITS, name="broadcast_value", reset_less=True)
        out = self.o_stream
        final = remaining == 0
        m.d.comb += [
            out.valid.eq(busy),
            out.payload.last.eq(final),
            results.r_en.eq(~busy | (out.ready & final)),
        ]
        for i in range(self._lanes):
            m.d.comb += out.payload.values[i].eq(result)
        with m.If(out.valid & out.ready):
            m.d.sync += remaining.eq(remaining - 1)
            with m.If(final):
                m.d.sync += busy.eq(0)
        with m.If(results.r_en & results.r_rdy):
            m.d.sync += [busy.eq(1), result.eq(r_data.value), remaining.eq(r_data.count)]

        # --- events ----------------------------------------------------------------------
        over, nan = [], []
        for node in nodes:
            taken = node.o_stream.valid & node.o_stream.ready
            for i in range(node.lanes):
                over.append(node.o_stream.payload.overflow[i] & taken)
                nan.append(node.o_stream.payload.nan_created[i] & taken)
        # Two register stages: the flags of the nodes' transfers, then their sum (the
        # ready path into the flags and the adder tree together were the critical path).
        over_taken = Signal(len(over), name="overflow_taken")
        nan_taken = Signal(len(nan), name="nan_taken")
        m.d.sync += [
            over_taken.eq(Cat(*over)),
            nan_taken.eq(Cat(*nan)),
            self.overflow_events.eq(_tree_sum(m, "overflow_sum", list(over_taken))),
            self.nan_events.eq(_tree_sum(m, "nan_sum", list(nan_taken))),
        ]
        return m
