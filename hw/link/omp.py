"""The output message processor (OMP): replies framed onto the link's ``tx`` byte stream
(``docs/link-hw.md`` section 4)."""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from host.spec import protocol as p
from host.spec.protocol import MAX_PAYLOAD
from hw.link.crc import CRC16_CCITT_FALSE, CRC32, ByteCrc

__all__ = ["ReplyFramer", "reply_command_layout"]

_SYNC0, _SYNC1 = p.SYNC


def reply_command_layout() -> data.StructLayout:
    """:class:`ReplyFramer` command: the request's ``opcode`` and ``tag`` and the reply's
    payload ``length`` in bytes (status byte included)."""
    return data.StructLayout({"opcode": 8, "tag": 8, "length": 16})


class ReplyFramer(wiring.Component):
    """The output message processor: frames replies onto the ``tx`` byte stream.

    For each ``cmd`` it sends the header (sync, ``opcode | REPLY``, tag, length, CRC-16 of
    those six bytes), then exactly ``length`` bytes taken from ``body`` with their CRC-32
    computed on the way, then the CRC-32 (least significant byte first). One byte per
    cycle when ``tx`` is ready.

    Attributes
    ----------
    cmd : ``In(stream.Signature(reply_command_layout()))``
    body : ``In(stream.Signature(8))``
    tx : ``Out(stream.Signature(8))``
    idle : ``Out(1)``
        No reply in progress.
    """

    def __init__(self):
        super().__init__({"cmd": In(stream.Signature(reply_command_layout())),
                          "body": In(stream.Signature(8)),
                          "tx": Out(stream.Signature(8)), "idle": Out(1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.crc = crc = ByteCrc(CRC32)
        opcode = Signal(8)
        tag = Signal(8)
        length = Signal(16)
        head = [Const(_SYNC0, 8), Const(_SYNC1, 8), opcode | p.REPLY, tag,
                length[:8], length[8:]]
        check = CRC16_CCITT_FALSE.of_bytes(head)
        head += [check[:8], check[8:]]
        k = Signal(range(MAX_PAYLOAD + 1))
        with m.FSM():
            with m.State("START"):
                # One cycle out of reset: a state change, so that simulators that run
                # variable initialisers before processes (Icarus, -g2012) evaluate the
                # combinational outputs at all instead of leaving them X.
                m.next = "IDLE"
            with m.State("IDLE"):
                m.d.comb += [self.cmd.ready.eq(1), self.idle.eq(1), crc.clear.eq(1)]
                with m.If(self.cmd.valid):
                    m.d.sync += [opcode.eq(self.cmd.payload.opcode),
                                 tag.eq(self.cmd.payload.tag),
                                 length.eq(self.cmd.payload.length), k.eq(0)]
                    m.next = "HEADER"
            with m.State("HEADER"):
                m.d.comb += [self.tx.valid.eq(1), self.tx.payload.eq(Cat(head).word_select(
                    k[:3], 8))]
                with m.If(self.tx.ready):
                    m.d.sync += k.eq(k + 1)
                    with m.If(k == 7):
                        m.d.sync += k.eq(0)
                        with m.If(length == 0):
                            m.next = "TRAILER"
                        with m.Else():
                            m.next = "BODY"
            with m.State("BODY"):
                m.d.comb += [self.tx.valid.eq(self.body.valid),
                             self.tx.payload.eq(self.body.payload),
                             self.body.ready.eq(self.tx.ready),
                             crc.data.eq(self.body.payload),
                             crc.en.eq(self.body.valid & self.tx.ready)]
                with m.If(self.body.valid & self.tx.ready):
                    m.d.sync += k.eq(k + 1)
                    with m.If(k == length - 1):
                        m.d.sync += k.eq(0)
                        m.next = "TRAILER"
            with m.State("TRAILER"):
                m.d.comb += [self.tx.valid.eq(1),
                             self.tx.payload.eq(crc.value.word_select(k[:2], 8))]
                with m.If(self.tx.ready):
                    m.d.sync += k.eq(k + 1)
                    with m.If(k == 3):
                        m.next = "IDLE"
        return m
