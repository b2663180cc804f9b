"""Reply bodies of fixed shape (``docs/link-hw.md`` section 3, "Templates").

INFO, STATUS, READ_COUNTERS and RUN's entries are byte strings whose shape the build
fixes: :class:`TemplateRom` lays them out as one ROM of bytes, each either a constant
(entry names and lengths, the whole INFO body) or byte ``j`` of a live value (a counter,
a level), and :class:`ReplyTemplate` reads them out, the names from the ROM and the values
from the core.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

__all__ = ["ReplyTemplate", "TemplateRom"]


class TemplateRom:
    """The template bytes, built segment by segment at elaboration.

    ``rom`` lists ``(constant byte, source index)``, source 0 meaning the constant;
    ``sources[i]`` is ``(key, j)``: byte ``j`` (least significant first) of live value
    ``key``; ``segments[name]`` is the segment's ``(start, end)`` in ``rom``.
    """

    def __init__(self):
        self.rom = []
        self.sources = [None]
        self._index = {}
        self.segments = {}

    def _source(self, key, j):
        if (key, j) not in self._index:
            self._index[key, j] = len(self.sources)
            self.sources.append((key, j))
        return self._index[key, j]

    def segment(self, name, items):
        """Append segment ``name``. ``items``: ints (constant bytes) or
        ``(key, width_bytes)`` for a little-endian field of live value ``key``."""
        start = len(self.rom)
        for item in items:
            if isinstance(item, int):
                self.rom.append((item, 0))
            else:
                key, size = item
                self.rom += [(0, self._source(key, j)) for j in range(size)]
        self.segments[name] = (start, len(self.rom))

    @staticmethod
    def entries(names):
        """Entry-list items (``host.spec.protocol.pack_entries`` form) of live values
        ``names``, each 8 bytes."""
        items = []
        for name in names:
            raw = name.encode("ascii")
            items += [len(raw), *raw, (name, 8)]
        return items

    def length(self, name):
        """Bytes of segment ``name``."""
        start, end = self.segments[name]
        return end - start

    def live_keys(self):
        """The live values the segments read, in order of first use."""
        return list(dict.fromkeys(key for key, _ in self.sources[1:]))


class ReplyTemplate(wiring.Component):
    """The bytes of a :class:`TemplateRom`, each three cycles after its place.

    ``byte`` holds template byte ``pos`` (a constant, or its byte of the ``live`` value
    it names) three cycles after ``pos`` is set, when ``pos`` and the live values held
    meanwhile. The three registers (timing closure: the ROM and the multiplexer over
    every live byte fed the OMP's CRC-32 in one cycle): the ROM entry as read (Yosys
    makes the ROM a block RAM), that entry again, the byte it names.

    Parameters
    ----------
    rom : TemplateRom
    widths : dict
        Bits of each live value of ``rom.live_keys()`` (at most 64).

    Attributes
    ----------
    pos : ``In(range(len(rom.rom) + 1))``
    live : ``In(data.StructLayout(widths))``
    byte : ``Out(8)``

    Raises
    ------
    ValueError
        ``widths`` does not name each live value of ``rom``, or one is over 64 bits.
    """

    def __init__(self, rom: TemplateRom, widths: dict):
        # A unit whose parameters were refused is no unused elaboratable worth a warning.
        self._MustUse__silence = True
        missing = [key for key in rom.live_keys() if key not in widths]
        wide = {key: w for key, w in widths.items() if not 0 < w <= 64}
        if missing or wide:
            raise ValueError(f"widths must give 1 to 64 bits for each live value: "
                             f"missing {missing}, out of range {wide}")
        self._MustUse__silence = False
        self._rom = rom
        super().__init__({"pos": In(range(len(rom.rom) + 1)),
                          "live": In(data.StructLayout(widths)), "byte": Out(8)})

    def elaborate(self, platform):
        m = Module()
        t = self._rom
        src_bits = bits_for(len(t.sources) - 1)
        m.submodules.rom = rom = Memory(shape=8 + src_bits, depth=len(t.rom),
                                        init=[const | src << 8 for const, src in t.rom])
        rp = rom.read_port(domain="comb")
        read = Signal(8 + src_bits)
        entry = Signal(8 + src_bits)
        pick = Signal(8)
        m.d.comb += rp.addr.eq(self.pos)
        m.d.sync += [read.eq(rp.data), entry.eq(read), self.byte.eq(pick)]
        with m.Switch(entry[8:]):
            with m.Case(0):
                m.d.comb += pick.eq(entry[:8])
            for index, (key, j) in enumerate(t.sources[1:], start=1):
                with m.Case(index):
                    m.d.comb += pick.eq(Cat(self.live[key], Const(0, 64))[8 * j:8 * j + 8])
        return m
