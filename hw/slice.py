"""A register slice: a stream stage whose outputs are all flip-flops (``docs/link-hw.md``
section 3, ``docs/npu.md``, "Reader").

The link puts one on its MRF word port into the core: the link's executor and the MVM's
MRF writer sit far apart on the die, and without the slice the writer's ``ready`` (which
depends on the word's address) fed the executor's address counters in the same cycle
as the executor's state fed the writer, a combinational round trip across the die
(``docs/notes/2026-11-board-build.md``, the seventh build). A second one on its MRF
read-back request port cuts the same kind of round trip through the core's read-back
range check (the ninth build). The core's reader puts one after its direct buffer, whose
block RAM has no output register (``hw.core.reader``).
"""

from __future__ import annotations

from amaranth.hdl import Module, Shape, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["RegisterSlice"]


class RegisterSlice(wiring.Component):
    """Two registers between two streams, cutting every combinational path through them.

    ``o_stream``'s valid and payload and ``i_stream``'s ready are registers, so neither
    side's logic reaches the other's in one cycle. An item offered on ``i_stream`` is on
    ``o_stream`` the next cycle; with ``o_stream`` always ready one item passes per
    cycle. A second register (the skid) takes the item that arrives in the cycle the
    output stalls, so ``i_stream.ready`` can be last cycle's ``~skid_valid``. Items leave
    in order, none lost or repeated.

    Parameters
    ----------
    shape : shape-castable
        The payload's shape (for example a ``data.StructLayout``).

    Attributes
    ----------
    i_stream : ``In(stream.Signature(shape))``
    o_stream : ``Out(stream.Signature(shape))``
    empty : ``Out(1)``
        No item is inside (both registers empty): everything taken has left.

    Raises
    ------
    TypeError
        ``shape`` is not shape-castable.
    """

    def __init__(self, shape):
        try:
            Shape.cast(shape)
        except TypeError:
            self._MustUse__silence = True    # refused: not an unused elaboratable
            raise TypeError(f"shape must be shape-castable, not {shape!r}") from None
        self._shape = shape
        super().__init__({"i_stream": In(stream.Signature(shape)),
                          "o_stream": Out(stream.Signature(shape)),
                          "empty": Out(1)})

    def elaborate(self, platform):
        m = Module()
        out_valid = Signal()
        out = Signal(self._shape)
        skid_valid = Signal()
        skid = Signal(self._shape)
        take_in = self.i_stream.valid & ~skid_valid
        out_free = ~out_valid | self.o_stream.ready
        m.d.comb += [
            self.i_stream.ready.eq(~skid_valid),
            self.o_stream.valid.eq(out_valid),
            self.o_stream.payload.eq(out),
            self.empty.eq(~out_valid & ~skid_valid),
        ]
        with m.If(out_free):
            # The output register takes the oldest item inside: the skid's, else the one
            # arriving (the skid is empty then, so ready was high), else it empties.
            with m.If(skid_valid):
                m.d.sync += [out.eq(skid), out_valid.eq(1), skid_valid.eq(0)]
            with m.Else():
                m.d.sync += [out.eq(self.i_stream.payload), out_valid.eq(take_in)]
        with m.Elif(take_in):
            m.d.sync += [skid.eq(self.i_stream.payload), skid_valid.eq(1)]
        return m
