"""The issuer's scoreboard: the write ranges of the chain instances in flight, and
whether the next iteration's reads overlap any of them.

An instance (one iteration of a chain) enters at its issue with its up to ``MAX_WRITES``
write ranges (vector memories only: pushes onto the output queue are not ranges) and
leaves when the writer has written its last vector (``retire``), oldest first; at most
:data:`IN_FLIGHT` are in flight. The issuer issues the current iteration only when none
of its reads (the chain's read, unless the MVM takes it, and the VRF reads of its ``vv``
ops) overlaps a write still in flight in the same memory: a read must see the writes of
the iterations and chains before it, as the model's sequential run does.

The overlaps are registers computed a cycle ahead (``conflict`` starts from registers;
issue 36, timing: the range compares were the core's critical path). The reads and the
entries change only when an iteration issues (the reads advance by their increments,
the tail entry takes the issued writes) or a chain is taken (the reads start over), and
the two never meet (a chain is taken only when none is current). So the compares run on
next cycle's values, one set of them: the caller's ``reads_next``, and entry ``e`` or,
if ``e`` is the tail and an iteration issues, the issued writes. There is one overlap
register per entry and write slot; a retirement switches the entry's writes off and
clears its registers, so ``conflict`` is their OR.
"""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from host.spec.config import NpuConfig
from host.spec.isa import MAX_WRITES
from hw.core.decode import built_vrfs
from hw.core.vectors import checked_config

__all__ = ["IN_FLIGHT", "Scoreboard", "read_count", "span_layout"]

#: Chain instances issued and not yet completely written (scheduler window).
IN_FLIGHT = 4


def span_layout(config: NpuConfig) -> data.StructLayout:
    """A range of vector addresses ``[lo, hi)`` in one memory: ``on`` (1: the range takes
    part), ``space`` (4 bits, a :class:`~host.spec.isa.Space` code), ``lo`` and ``hi``
    (``vector_addr_bits + 2`` bits each: a range ends at most one past the deepest
    memory, and the read ends are kept that wide)."""
    bits = config.vector_addr_bits + 2
    return data.StructLayout({"on": 1, "space": 4, "lo": bits, "hi": bits})


def read_count(config: NpuConfig) -> int:
    """The read ranges of an iteration: the chain's read and one per VRF the build has
    (:func:`hw.core.decode.built_vrfs`)."""
    return 1 + len(built_vrfs(config))


class Scoreboard(wiring.Component):
    """The write ranges of the instances in flight (module docstring).

    Parameters
    ----------
    config : NpuConfig
        The build; it fixes the widths and the number of read ranges.

    Attributes
    ----------
    issued : ``In(ArrayLayout(span_layout(config), MAX_WRITES))``
        The write ranges of the current iteration (taken when ``issue`` is high).
    reads_next : ``In(ArrayLayout(span_layout(config), read_count(config)))``
        The read ranges of the iteration to issue next: after this cycle's issue, the
        current chain's next iteration; with ``take``, the taken chain's first.
        Compared when ``issue`` or ``take`` is high.
    issue : ``In(1)``
        The current iteration issues: its writes enter at the tail.
    take : ``In(1)``
        A chain becomes current (never in a cycle with ``issue``).
    retire : ``In(1)``
        The oldest instance in flight is written completely: it leaves.
    conflict : ``Out(1)``
        A read of the current iteration overlaps a write in flight (from registers).
    full : ``Out(1)``
        ``IN_FLIGHT`` instances are in flight: none may issue.
    empty : ``Out(1)``
        No instance is in flight.

    Raises
    ------
    TypeError
        ``config`` is not an :class:`~host.spec.config.NpuConfig`.
    """

    def __init__(self, config):
        self._config = config = checked_config(self, config)
        span = span_layout(config)
        super().__init__({
            "issued": In(data.ArrayLayout(span, MAX_WRITES)),
            "reads_next": In(data.ArrayLayout(span, read_count(config))),
            "issue": In(1),
            "take": In(1),
            "retire": In(1),
            "conflict": Out(1),
            "full": Out(1),
            "empty": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        span = span_layout(self._config)
        valid = Signal(IN_FLIGHT)
        head = Signal(range(IN_FLIGHT))
        tail = Signal(range(IN_FLIGHT))
        entries = [Signal(data.ArrayLayout(span, MAX_WRITES), name=f"entry{e}")
                   for e in range(IN_FLIGHT)]

        def overlap(write):
            """Whether ``write`` overlaps any of ``reads_next``."""
            return Cat(*(write.on & r.on & (write.space == r.space) & (write.lo < r.hi)
                         & (r.lo < write.hi) for r in self.reads_next)).any()

        # One `hit` per entry and write slot: whether that write overlaps a read. The issued
        # writes' overlaps are computed once, beside each entry's own, and the entry's next
        # content only selects between the two answers: `take` (from the issuer's
        # `cur_valid`, which fans out widely) then reaches the last gate before each `hit`,
        # not the compares' carry chains in front of it (issue 36, timing: `cur_valid`
        # through `take` into the compares was the core's critical path, 69.56 MHz). A
        # `hit` ORs the reads of one write only, and a retired entry's writes are switched
        # off, so that `conflict` is the OR of the hits without `valid` (an entry's OR of
        # all its writes' and reads' overlaps was the path at 74.19 MHz).
        new_hit = [overlap(w) for w in self.issued]
        hit = Signal(IN_FLIGHT * MAX_WRITES)
        for e in range(IN_FLIGHT):
            # A taken chain leaves every entry as it is; otherwise only an issue reaches
            # the update below, and it writes the tail.
            keep = self.take | (tail != e)
            for k in range(MAX_WRITES):
                bit = hit[e * MAX_WRITES + k]
                with m.If(self.retire & (head == e)):
                    m.d.sync += bit.eq(0)
                with m.Elif(self.take | self.issue):
                    m.d.sync += bit.eq(Mux(keep, overlap(entries[e][k]), new_hit[k]))
        m.d.comb += [self.conflict.eq(hit.any()), self.full.eq(valid.all()),
                     self.empty.eq(valid == 0)]

        for e in range(IN_FLIGHT):
            with m.If(self.issue & (tail == e)):
                m.d.sync += entries[e].eq(self.issued)
            with m.Elif(self.retire & (head == e)):
                m.d.sync += [entries[e][k].on.eq(0) for k in range(MAX_WRITES)]
        with m.If(self.issue):
            m.d.sync += tail.eq(Mux(tail == IN_FLIGHT - 1, 0, tail + 1))
        set_bits = Signal(IN_FLIGHT)
        clr_bits = Signal(IN_FLIGHT)
        for e in range(IN_FLIGHT):
            m.d.comb += [set_bits[e].eq(self.issue & (tail == e)),
                         clr_bits[e].eq(self.retire & (head == e))]
        m.d.sync += valid.eq((valid & ~clr_bits) | set_bits)
        with m.If(self.retire):
            m.d.sync += head.eq(Mux(head == IN_FLIGHT - 1, 0, head + 1))
        return m
