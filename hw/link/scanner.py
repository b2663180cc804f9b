"""The input message processor's receive side: frames found in a byte stream
(``docs/link-hw.md`` section 2).

:class:`FrameScanner` takes request bytes into a circular buffer, hunts for frame headers
on a sliding 8-byte window, checks each payload's CRC-32 as its bytes arrive and re-scans
the buffered bytes after a bad or truncated frame, as ``host.spec.protocol.FrameDecoder``
does. It tells the executor (:class:`hw.link.link.NpuLink`) what it found, one event at a
time, and lends it the buffer's read port to fetch a good frame's payload.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from host.spec import protocol as p
from host.spec.formats import check_int
from host.spec.protocol import MAX_PAYLOAD
from hw.link.crc import CRC16_CCITT_FALSE, CRC32, ByteCrc

__all__ = ["BUFFER_BYTES", "FrameScanner", "frame_header_layout"]

#: Bytes of the IMP's circular receive buffer: a whole frame (8 + 4096 + 4 bytes) and the
#: start of one found while re-scanning it, rounded up to a power of two (four DP16KD).
BUFFER_BYTES = 8192
#: Bits of a buffer place.
BUFFER_ADDR_BITS = ceil_log2(BUFFER_BYTES)

_SYNC0, _SYNC1 = p.SYNC


def frame_header_layout() -> data.StructLayout:
    """The fields of a found header: request ``opcode``, ``tag`` and payload ``length`` in
    bytes (at most ``MAX_PAYLOAD``)."""
    return data.StructLayout({"opcode": 8, "tag": 8,
                              "length": range(MAX_PAYLOAD + 1)})


class FrameScanner(wiring.Component):
    """Byte supply, sliding header window, payload with its CRC-32 check, idle timer.

    The scanner takes bytes only while ``recv`` is high (the executor waits for a
    request), one per cycle from ``rx``, or one every two cycles from the buffer when it
    re-scans. In a cycle with ``recv`` high it reports at most one event:

    * ``bad_length``: a sound header whose length is over ``MAX_PAYLOAD`` (``header``
      holds its opcode and tag from the next cycle); the window slides on.
    * ``frame_end``: a frame's last trailer byte was scanned. The next cycle the executor
      raises ``verify``, and ``crc_ok`` tells whether the CRC-32 register holds the
      residue. Good: ``payload_at`` is the buffer place of the payload from the cycle
      after. Bad: the scanner re-scans from the byte after the frame's sync.
    * ``truncated``: the link went idle (``truncate_cycles`` of silence on ``rx``, or a
      re-scan that reached the buffer's end while flushing) inside a frame; its bytes
      after the sync are re-scanned.

    Parameters
    ----------
    truncate_cycles : int
        Clock cycles of silence inside a frame after which it is ``truncated``, 1 to 2**32.

    Attributes
    ----------
    rx : ``In(stream.Signature(8))``
        Request bytes.
    recv : ``In(1)``
        The executor waits for a request: the scanner may take bytes and report events.
    verify : ``In(1)``
        The cycle after ``frame_end``: check the frame's CRC-32.
    bad_length, frame_end, truncated : ``Out(1)``
        The events above, combinational, only while ``recv`` is high.
    crc_ok : ``Out(1)``
        The CRC-32 register holds the residue of a good frame (valid with ``verify``).
    header : ``Out(frame_header_layout())``
        The last header found.
    prefix : ``Out(64)``
        The first 8 payload bytes of the last frame, the first in the low byte.
    payload_at : ``Out(BUFFER_ADDR_BITS)``
        Buffer place of the payload's first byte of the last good frame.
    read_addr : ``In(BUFFER_ADDR_BITS)``
        The executor's buffer address while ``recv`` is low; ``read_data`` holds that
        byte the next cycle.
    read_data : ``Out(8)``
    idle : ``Out(1)``
        No byte held to scan, none buffered to re-scan, no flush in progress.
    partial : ``Out(1)``
        Bytes of an incomplete frame (or of a possible header) are held.

    Raises
    ------
    TypeError, ValueError
        ``truncate_cycles`` is not an integer in range.
    """

    def __init__(self, *, truncate_cycles: int):
        self._MustUse__silence = True       # refused parameters: no unused-unit warning
        self._truncate_cycles = check_int("truncate_cycles", truncate_cycles, 1, 1 << 32)
        self._MustUse__silence = False
        super().__init__({
            "rx": In(stream.Signature(8)), "recv": In(1), "verify": In(1),
            "bad_length": Out(1), "frame_end": Out(1), "truncated": Out(1),
            "crc_ok": Out(1), "header": Out(frame_header_layout()), "prefix": Out(64),
            "payload_at": Out(BUFFER_ADDR_BITS),
            "read_addr": In(BUFFER_ADDR_BITS), "read_data": Out(8),
            "idle": Out(1), "partial": Out(1)})

    @property
    def truncate_cycles(self) -> int:
        return self._truncate_cycles

    def elaborate(self, platform):
        m = Module()
        abits = BUFFER_ADDR_BITS
        m.submodules.crc = crc = ByteCrc(CRC32)
        m.submodules.buf = buf = Memory(shape=8, depth=BUFFER_BYTES, init=[])
        bw = buf.write_port()
        br = buf.read_port(domain="sync", transparent_for=())
        m.d.comb += self.read_data.eq(br.data)

        R = Signal(abits)             # next byte to supply to the scanner
        F = Signal(abits)             # next free buffer place (R == F: take from rx)
        win = Signal(64)              # the last 8 bytes scanned, newest in the top byte
        win_count = Signal(range(9))  # of which belong to the current scan
        in_body = Signal()
        flushing = Signal()           # answering the link going idle, through the buffer
        start = Signal(abits)         # buffer place of the current header's first byte
        got = Signal(range(MAX_PAYLOAD + 5))
        left = Signal(range(MAX_PAYLOAD + 4))        # body bytes after the one scanned
        timer = Signal(range(self._truncate_cycles + 1))
        # timer == truncate_cycles, a flip-flop (timing closure: the compare fed the
        # scanner's idle decision).
        timed_out = Signal()
        rd_addr_q = Signal(abits)     # buffer address read last cycle

        def winb(i):
            return win.word_select(i, 8)

        # The byte supply (rx, or the buffer when re-scanning) hands the scanner one
        # registered byte (timing closure: the buffer's block RAM output, 5.8 ns
        # clock-to-out on the ECP5, went on through the header check, the CRC-32 and the
        # scanner's decisions in one cycle). The scanner takes it the next cycle. On a
        # byte that may end the scan (a frame's last byte, or one that may complete a
        # header: the sync sits in the window) the supply pauses, so no byte is ever
        # taken that the scan would not reach and ``R`` is the place after it.
        scan_byte = Signal(8)
        scan_v = Signal()             # scan_byte holds a byte to scan this cycle
        scan_at = Signal(abits)       # its buffer place
        # The header window's checks of the bytes already in it, registered as each
        # byte slides in: its bytes 1..6 begin with the sync, their CRC-16, and the
        # length field (bytes 5, 6) is over MAX_PAYLOAD.
        win_sync = Signal()
        win_crc = Signal(16)
        win_len_over = Signal()
        from_buf = R != F
        may_end = scan_v & Mux(in_body, left == 0, (win_count >= 7) & win_sync)
        supply = self.recv & ~may_end
        rx_take = Signal()
        m.d.comb += [
            self.rx.ready.eq(supply & ~from_buf & ~flushing),
            rx_take.eq(self.rx.ready & self.rx.valid),
            br.en.eq(1), br.addr.eq(Mux(self.recv, R, self.read_addr)),
            bw.addr.eq(F), bw.data.eq(self.rx.payload), bw.en.eq(rx_take),
        ]
        m.d.sync += rd_addr_q.eq(br.addr)
        buf_take = supply & from_buf & (rd_addr_q == R)
        m.d.sync += scan_v.eq(rx_take | buf_take)
        with m.If(rx_take | buf_take):
            m.d.sync += [scan_byte.eq(Mux(from_buf, br.data, self.rx.payload)),
                         scan_at.eq(R), R.eq(R + 1)]
        with m.If(rx_take):
            m.d.sync += [F.eq(F + 1), timer.eq(0), timed_out.eq(0)]
        with m.Elif(~timed_out):
            m.d.sync += [timer.eq(timer + 1),
                         timed_out.eq(timer + 1 == self._truncate_cycles)]

        byte = scan_byte
        header_ok = (win_count >= 7) & win_sync & (win_crc == Cat(winb(7), byte))
        new_len = Cat(winb(5), winb(6))
        m.d.comb += crc.data.eq(byte)

        with m.If(self.recv):
            with m.If(scan_v):
                with m.If(~in_body):
                    m.d.sync += [win.eq(Cat(win[8:], byte)),
                                 win_count.eq(Mux(win_count == 8, 8, win_count + 1)),
                                 win_sync.eq((winb(2) == _SYNC0) & (winb(3) == _SYNC1)),
                                 win_crc.eq(CRC16_CCITT_FALSE.of_bytes(
                                     [winb(i) for i in range(2, 8)])),
                                 win_len_over.eq(Cat(winb(6), winb(7)) > MAX_PAYLOAD)]
                    with m.If(header_ok):
                        m.d.sync += [self.header.opcode.eq(winb(3)),
                                     self.header.tag.eq(winb(4)), start.eq(scan_at - 7)]
                        with m.If(win_len_over):
                            m.d.comb += self.bad_length.eq(1)
                        with m.Else():
                            m.d.sync += [in_body.eq(1), got.eq(0),
                                         self.header.length.eq(new_len),
                                         left.eq(new_len + 3)]
                            m.d.comb += crc.clear.eq(1)
                with m.Else():
                    m.d.comb += crc.en.eq(1)
                    m.d.sync += [got.eq(got + 1), left.eq(left - 1)]
                    for i in range(8):
                        with m.If(got == i):
                            m.d.sync += self.prefix.word_select(i, 8).eq(byte)
                    with m.If(left == 0):
                        # The trailer's last byte: the CRC-32 register is checked
                        # against the residue the next cycle (verify).
                        m.d.sync += [in_body.eq(0), win_count.eq(0)]
                        m.d.comb += self.frame_end.eq(1)
            with m.Elif(~from_buf & (flushing | (~self.rx.valid & timed_out))):
                # The link is idle: an incomplete frame is TRUNCATED and the bytes
                # after its sync re-scanned; what cannot start a frame is dropped.
                m.d.sync += win_count.eq(0)
                with m.If(in_body):
                    m.d.sync += [R.eq(start + 1), in_body.eq(0), flushing.eq(1)]
                    m.d.comb += self.truncated.eq(1)
                with m.Else():
                    m.d.sync += flushing.eq(0)

        m.d.comb += self.crc_ok.eq(crc.value == CRC32.residue ^ CRC32.xorout)
        with m.If(self.verify):
            with m.If(self.crc_ok):
                m.d.sync += self.payload_at.eq(start + 8)
            with m.Else():
                m.d.sync += R.eq(start + 1)

        m.d.comb += [self.idle.eq(~scan_v & ~from_buf & ~flushing),
                     self.partial.eq(scan_v | in_body | (win_count != 0))]
        return m
