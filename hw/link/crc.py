"""Byte-wide CRC units of the host link (``docs/link-hw.md``, ``docs/protocol.md``).

The two CRCs of ``host.spec.protocol``: CRC-16/CCITT-FALSE over a frame header and CRC-32
(IEEE 802.3, as ``zlib.crc32``) over a payload. A CRC register update is linear over
GF(2) in the register and the data byte, so each bit of the next register is the XOR of
a fixed set of register and data bits; :class:`CrcDef` finds those sets once, in Python,
by running the bit-serial definition on unit vectors, and :func:`CrcDef.step` builds the
XOR network. One byte per cycle, whatever the clock.

The tests (``tests/hw/test_link_crc.py``) check both definitions against
``host.spec.protocol.crc16``/``crc32`` (and their catalogue check values) over random data.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from amaranth.hdl import Cat, Const, Module, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["CrcDef", "CRC16_CCITT_FALSE", "CRC32", "ByteCrc"]


@dataclass(frozen=True)
class CrcDef:
    """One CRC: ``width`` bits, generator ``poly`` (normal form, without the top bit),
    ``init`` register value, ``reflected`` (bits LSB first, as CRC-32) and ``xorout``
    (applied to the register to give the CRC)."""
    name: str
    width: int
    poly: int
    init: int
    reflected: bool
    xorout: int

    @property
    def mask(self) -> int:
        return (1 << self.width) - 1

    def update(self, crc: int, byte: int) -> int:
        """The register after one byte (bit-serial definition, plain Python)."""
        w = self.width
        if self.reflected:
            rpoly = int(f"{self.poly:0{w}b}"[::-1], 2)
            crc ^= byte
            for _ in range(8):
                crc = (crc >> 1) ^ rpoly if crc & 1 else crc >> 1
        else:
            crc ^= byte << (w - 8)
            for _ in range(8):
                crc = ((crc << 1) ^ self.poly) if crc >> (w - 1) & 1 else crc << 1
        return crc & self.mask

    def compute(self, data: bytes) -> int:
        """The CRC of ``data`` (init, every byte, xorout), plain Python."""
        crc = self.init
        for byte in data:
            crc = self.update(crc, byte)
        return crc ^ self.xorout

    @cached_property
    def residue(self) -> int:
        """Register value after a message followed by its own CRC (least significant
        byte first for a reflected CRC, else most significant first): a constant, so a
        receiver checks a trailer without holding it."""
        nbytes = self.width // 8
        crc = self.compute(b"")
        trailer = crc.to_bytes(nbytes, "little" if self.reflected else "big")
        reg = self.init
        for byte in trailer:
            reg = self.update(reg, byte)
        return reg

    @cached_property
    def _taps(self) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
        """Per next-register bit: (register bits, data bits) whose XOR it is."""
        w = self.width
        from_reg = [self.update(1 << i, 0) for i in range(w)]
        from_byte = [self.update(0, 1 << j) for j in range(8)]
        return tuple(
            (tuple(i for i in range(w) if from_reg[i] >> b & 1),
             tuple(j for j in range(8) if from_byte[j] >> b & 1))
            for b in range(w))

    def step(self, crc, byte) -> Value:
        """The register after one byte, as a combinational XOR network.

        ``crc`` is a ``width``-bit value, ``byte`` an 8-bit value."""
        crc, byte = Value.cast(crc), Value.cast(byte)
        bits = []
        for reg_taps, byte_taps in self._taps:
            terms = [crc[i] for i in reg_taps] + [byte[j] for j in byte_taps]
            bit = Const(0, 1)
            for t in terms:
                bit = bit ^ t
            bits.append(bit)
        return Cat(*bits)

    def of_bytes(self, byte_values) -> Value:
        """The CRC (init, the bytes in order, xorout) of a fixed number of 8-bit values,
        combinationally: the header check over a frame's first six bytes.

        The map is affine in the data bits, so each CRC bit is a constant XOR a fixed set
        of data bits, found here in Python (one flat XOR per bit, not ``len`` chained
        steps)."""
        values = [Value.cast(v) for v in byte_values]
        count = len(values)

        def raw(crc, data):
            for byte in data:
                crc = self.update(crc, byte)
            return crc

        base = raw(self.init, bytes(count)) ^ self.xorout
        columns = []
        for k in range(count):
            for j in range(8):
                data = bytearray(count)
                data[k] = 1 << j
                columns.append((values[k][j], raw(0, data)))
        bits = []
        for b in range(self.width):
            bit = Const(base >> b & 1, 1)
            for value_bit, column in columns:
                if column >> b & 1:
                    bit = bit ^ value_bit
            bits.append(bit)
        return Cat(*bits)


#: CRC-16/CCITT-FALSE, the header check of ``host.spec.protocol`` (``crc16``).
CRC16_CCITT_FALSE = CrcDef("crc16", 16, 0x1021, 0xFFFF, False, 0x0000)
#: CRC-32 (IEEE 802.3), the payload check of ``host.spec.protocol`` (``crc32``).
CRC32 = CrcDef("crc32", 32, 0x04C11DB7, 0xFFFFFFFF, True, 0xFFFFFFFF)


class ByteCrc(wiring.Component):
    """A CRC register that takes one byte per cycle.

    Parameters
    ----------
    crc : CrcDef
        Which CRC (:data:`CRC16_CCITT_FALSE` or :data:`CRC32`).

    Attributes
    ----------
    clear : ``In(1)``
        Register back to ``init`` (over ``en`` in the same cycle).
    en : ``In(1)``, data : ``In(8)``
        Take ``data`` this cycle.
    value : ``Out(width)``
        The CRC of the bytes taken since the last ``clear`` (xorout applied).
    residue_next : ``Out(1)``
        The register after this cycle's byte (``en``) equals :attr:`CrcDef.residue`:
        the bytes so far end in their own correct CRC.

    Raises
    ------
    TypeError
        when ``crc`` is not a :class:`CrcDef`.
    """

    def __init__(self, crc: CrcDef):
        # A unit whose parameter was refused is no unused elaboratable worth a warning.
        self._MustUse__silence = True
        if not isinstance(crc, CrcDef):
            raise TypeError(f"crc must be a CrcDef, not {crc!r}")
        self._MustUse__silence = False
        self._crc = crc
        super().__init__({"clear": In(1), "en": In(1), "data": In(8),
                          "value": Out(crc.width), "residue_next": Out(1)})

    @property
    def crc(self) -> CrcDef:
        return self._crc

    def elaborate(self, platform):
        m = Module()
        d = self._crc
        reg = Signal(d.width, init=d.init)
        nxt = d.step(reg, self.data)
        with m.If(self.clear):
            m.d.sync += reg.eq(d.init)
        with m.Elif(self.en):
            m.d.sync += reg.eq(nxt)
        m.d.comb += [self.value.eq(reg ^ d.xorout),
                     self.residue_next.eq(nxt == d.residue)]
        return m
