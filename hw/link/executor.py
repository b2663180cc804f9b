"""The executor's parts (``docs/link-hw.md`` section 3).

:class:`hw.link.link.NpuLink`'s state machine, the executor, decides what a request does
and hands the byte-level work to these components, each holding a handful of the
executor's old states:

* :class:`WordLoader` (``LOAD``): one word of the request's payload from the receive
  buffer, a byte a cycle;
* :class:`MrfPrescan` (``PRESCAN``): every MRF word's exponent byte (and padding bits)
  checked before any word is written;
* :class:`MrfCursor`: a flat MRF address as row, engine and slot, stepped without
  dividing;
* :class:`ReplyEmitter` (``E_CMD``, ``E_STATUS``, ``E_CODE``, ``T_*``, ``E_TMPL``): a
  reply's header command, status, error code and template bytes into the OMP;
* :class:`ReadBack` (``D_REQ``, ``D_WAIT``, ``D_EMIT``): READ's and POP_OUTPUT's words
  from the core, least significant byte first, into the OMP.

The hand-offs keep the executor's cycles: a part starts in the cycle after its ``start``
(or, for the loader and the prescan, runs while ``run`` is high), and its ``done`` is
combinational, high in the cycle whose clock edge ends its work, so the executor moves on
at that edge as its single state machine did.
"""

from __future__ import annotations

from amaranth.hdl import Const, Module, Mux, Signal
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from host.spec.config import NpuConfig
from host.spec.formats import MAX_EXPONENT_CODE, block_bytes, block_layout
from hw.core.host_access import HOST_ADDR_BITS, vector_read_layout
from hw.core.vectors import vector_layout
from hw.link.omp import reply_command_layout
from hw.link.scanner import BUFFER_ADDR_BITS
from hw.mvm.mvm import mrf_address_layout

__all__ = ["MrfCursor", "MrfPrescan", "ReadBack", "ReadSource", "ReplyEmitter",
           "WordLoader", "reply_start_layout", "word_bytes_max"]


def word_bytes_max(config: NpuConfig) -> int:
    """Bytes of the widest word the link moves: a native vector, an MRF word or a program
    word (8)."""
    return max(2 * config.n, block_bytes(config.n, config.mantissa_bits_w), 8)


class MrfCursor(wiring.Component):
    """A flat MRF address as row, engine and slot (``host.spec.isa.mrf_address``).

    Attributes
    ----------
    flat : ``In(bits_for(config.mrf_words))``
        The address ``load`` takes: ``row = flat % n``, ``engine = (flat // n) % T``,
        ``slot = flat // (n T)``.
    load, clear, step : ``In(1)``
        Take ``flat``; go to address 0; go to the next address (row, then engine, then
        slot). At most one is high in a cycle.
    row, engine, slot : ``Out``
        The address (registers), as ``hw.mvm.mvm.mrf_address_layout``'s fields.
    last : ``Out(1)``
        The address is the MRF's last word (combinational).
    """

    def __init__(self, config: NpuConfig):
        self._config = config
        address = mrf_address_layout(config.mvm).members
        super().__init__({
            "flat": In(bits_for(config.mrf_words)),
            "load": In(1), "clear": In(1), "step": In(1),
            "row": Out(address["row"]), "engine": Out(address["engine"]),
            "slot": Out(address["slot"]), "last": Out(1)})

    def elaborate(self, platform):
        m = Module()
        c = self._config
        n, log2n = c.n, ceil_log2(c.n)
        row, eng, slot = self.row, self.engine, self.slot
        rest = self.flat >> log2n
        with m.If(self.load):
            m.d.sync += [row.eq(self.flat[:log2n] if log2n else 0),
                         eng.eq(rest % c.tiles), slot.eq(rest // c.tiles)]
        with m.Elif(self.clear):
            m.d.sync += [row.eq(0), eng.eq(0), slot.eq(0)]
        with m.Elif(self.step):
            with m.If(row == n - 1):
                m.d.sync += row.eq(0)
                with m.If(eng == c.tiles - 1):
                    m.d.sync += [eng.eq(0), slot.eq(slot + 1)]
                with m.Else():
                    m.d.sync += eng.eq(eng + 1)
            with m.Else():
                m.d.sync += row.eq(row + 1)
        m.d.comb += self.last.eq((row == n - 1) & (eng == c.tiles - 1)
                                 & (slot == c.mrf_depth - 1))
        return m


class WordLoader(wiring.Component):
    """One word of a request's payload from the receive buffer into ``word``.

    While ``run`` is high it reads the buffer from its pointer, one byte a cycle,
    ``bytes`` of them; each byte is registered as the block RAM gives it and put into the
    word the cycle after (timing closure: the RAM's output went through the word's input
    multiplexer). The pointer moves on across words; ``seek`` sets it.

    Attributes
    ----------
    seek : ``In(1)``
        Set the buffer pointer to ``at``.
    at : ``In(BUFFER_ADDR_BITS)``
    run : ``In(1)``
        The executor is in ``LOAD``.
    bytes : ``In(range(word_bytes_max(config) + 1))``
        Bytes of the word, 1 or more, held while ``run``.
    addr : ``Out(BUFFER_ADDR_BITS)``
        The buffer's read address (the pointer).
    data : ``In(8)``
        The buffer's read data, the cycle after ``addr``.
    word : ``Out(8 * word_bytes_max(config))``
        The word, byte ``i`` at bits ``8 i``; complete the cycle after ``done``.
    done : ``Out(1)``
        The word's last byte goes in at this clock edge (combinational).
    """

    def __init__(self, config: NpuConfig):
        wb_max = word_bytes_max(config)
        self._wb_max = wb_max
        super().__init__({
            "seek": In(1), "at": In(BUFFER_ADDR_BITS), "run": In(1),
            "bytes": In(range(wb_max + 1)),
            "addr": Out(BUFFER_ADDR_BITS), "data": In(8),
            "word": Out(8 * wb_max), "done": Out(1)})

    def elaborate(self, platform):
        m = Module()
        wb_max, wb = self._wb_max, self.bytes
        bp = self.addr
        iss = Signal(range(wb_max + 1))      # bytes asked for
        got = Signal()                       # the buffer gives byte got_k
        got_k = Signal(range(wb_max + 1))
        byte = Signal(8)                     # byte put_k, registered
        put = Signal()
        put_k = Signal(range(wb_max + 1))

        issue = self.run & (iss < wb)
        with m.If(self.seek):
            m.d.sync += bp.eq(self.at)
        with m.Elif(issue):
            m.d.sync += bp.eq(bp + 1)
        with m.If(issue):
            m.d.sync += iss.eq(iss + 1)
        m.d.sync += [got.eq(issue), got_k.eq(iss), put.eq(got)]
        with m.If(got):
            m.d.sync += [byte.eq(self.data), put_k.eq(got_k)]
        with m.If(put):
            for i in range(wb_max):
                with m.If(put_k == i):
                    m.d.sync += self.word.word_select(i, 8).eq(byte)
        m.d.comb += self.done.eq(put & (put_k == wb - 1))
        with m.If(self.done):
            m.d.sync += iss.eq(0)
        return m


class MrfPrescan(wiring.Component):
    """Every MRF word of a WRITE checked before any is written.

    The model refuses the whole request with MRF_WORD, nothing written, when a word's
    exponent code is above ``MAX_EXPONENT_CODE`` or, where the word's last byte has
    padding bits, one of them is set. So each word's first byte is read (and its last,
    when it has padding), and each byte checked the cycle after the block RAM gives it
    (timing closure).

    Attributes
    ----------
    start : ``In(1)``
        Begin at buffer address ``at``; clears ``bad``.
    at : ``In(BUFFER_ADDR_BITS)``
    count : ``In(16)``
        Words to check, held from ``start`` to ``done``.
    run : ``In(1)``
        The executor is in ``PRESCAN``.
    addr : ``Out(BUFFER_ADDR_BITS)``
        The buffer's read address.
    data : ``In(8)``
        The buffer's read data, the cycle after ``addr``.
    done : ``Out(1)``
        Every word is checked (combinational, while ``run``).
    bad : ``Out(1)``
        A word failed (valid with ``done``).
    """

    def __init__(self, config: NpuConfig):
        self._config = config
        super().__init__({
            "start": In(1), "at": In(BUFFER_ADDR_BITS), "count": In(16), "run": In(1),
            "addr": Out(BUFFER_ADDR_BITS), "data": In(8),
            "done": Out(1), "bad": Out(1)})

    def elaborate(self, platform):
        m = Module()
        c = self._config
        mb = block_bytes(c.n, c.mantissa_bits_w)       # bytes of an MRF word
        pad = 8 * mb - c.weight_block_bits
        excess_mask = ((1 << pad) - 1) << (8 - pad) & 0xFF
        bp = Signal(BUFFER_ADDR_BITS)
        idx = Signal(16)                      # words done
        phase = Signal()                      # reading a word's last byte
        asked, asked_last = Signal(), Signal()
        byte, check, check_last = Signal(8), Signal(), Signal()

        m.d.comb += self.addr.eq(Mux(phase, bp + mb - 1, bp))
        more = idx != self.count
        m.d.sync += [asked.eq(0), check.eq(0)]
        with m.If(self.start):
            m.d.sync += [bp.eq(self.at), idx.eq(0), phase.eq(0), self.bad.eq(0)]
        with m.Elif(self.run):
            with m.If(more):
                m.d.sync += [asked.eq(1), asked_last.eq(phase)]
                # With padding bits in the last byte, each word's last byte is read too.
                word_done = phase if excess_mask else Const(1)
                if excess_mask:
                    m.d.sync += phase.eq(~phase)
                with m.If(word_done):
                    m.d.sync += [bp.eq(bp + mb), idx.eq(idx + 1)]
            with m.If(asked):
                m.d.sync += [byte.eq(self.data), check.eq(1), check_last.eq(asked_last)]
            with m.If(check):
                with m.If(~check_last & (byte > MAX_EXPONENT_CODE)):
                    m.d.sync += self.bad.eq(1)
                with m.If(check_last & ((byte & excess_mask) != 0)):
                    m.d.sync += self.bad.eq(1)
        m.d.comb += self.done.eq(self.run & ~more & ~asked & ~check)
        return m


def reply_start_layout(rom_entries: int) -> data.StructLayout:
    """What :class:`ReplyEmitter` takes with ``start``: the status byte, the reply's
    length in bytes, the DEVICE_ERROR code byte and whether it is sent, the template
    entries ``[t_lo, t_hi)`` of ``rom_entries``, and whether data words follow."""
    pos = range(rom_entries + 1)
    return data.StructLayout({"status": 8, "length": 16, "code": 8, "has_code": 1,
                              "t_lo": pos, "t_hi": pos, "data_follows": 1})


class ReplyEmitter(wiring.Component):
    """A reply's start: the header command, the status byte, the error code byte, then
    template bytes from :class:`hw.link.template.ReplyTemplate`.

    A template byte takes four cycles: ``pos`` (``T_ROM``), the template's two register
    stages (``T_HOLD``, ``T_PICK``), then the byte (``E_TMPL``).

    Parameters
    ----------
    rom_entries : int
        Entries of the template ROM.

    Attributes
    ----------
    start : ``In(1)``
        Begin the reply ``cmd`` (ignored unless idle; the executor starts one reply at
        a time and waits for ``done``).
    cmd : ``In(reply_start_layout(rom_entries))``
    opcode, tag : ``In(8)``
        The request's, held by the frame scanner until the reply is sent.
    omp_cmd : ``Out(stream.Signature(reply_command_layout()))``
    body : ``Out(stream.Signature(8))``
        To the OMP.
    pos : ``Out(range(rom_entries + 1))``
        The template entry; ``byte`` is its byte three cycles later.
    byte : ``In(8)``
    done : ``Out(1)``
        The reply's last byte from here is taken at this edge (combinational).
    data_follows : ``Out(1)``
        ``cmd.data_follows`` of the reply (a register).
    """

    def __init__(self, rom_entries: int):
        self._rom_entries = rom_entries
        super().__init__({
            "start": In(1), "cmd": In(reply_start_layout(rom_entries)),
            "opcode": In(8), "tag": In(8),
            "omp_cmd": Out(stream.Signature(reply_command_layout())),
            "body": Out(stream.Signature(8)),
            "pos": Out(range(rom_entries + 1)), "byte": In(8),
            "done": Out(1), "data_follows": Out(1)})

    def elaborate(self, platform):
        m = Module()
        held = Signal(reply_start_layout(self._rom_entries))
        pos = self.pos
        m.d.comb += self.data_follows.eq(held.data_follows)

        def after_status():
            with m.If(pos != held.t_hi):
                m.next = "T_ROM"
            with m.Else():
                m.d.comb += self.done.eq(1)
                m.next = "IDLE"

        with m.FSM(name="reply"):
            with m.State("START"):
                m.next = "IDLE"           # as ReplyFramer's START (Icarus)
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [held.eq(self.cmd), pos.eq(self.cmd.t_lo)]
                    m.next = "E_CMD"
            with m.State("E_CMD"):
                m.d.comb += [self.omp_cmd.valid.eq(1),
                             self.omp_cmd.payload.opcode.eq(self.opcode),
                             self.omp_cmd.payload.tag.eq(self.tag),
                             self.omp_cmd.payload.length.eq(held.length)]
                with m.If(self.omp_cmd.ready):
                    m.next = "E_STATUS"
            with m.State("E_STATUS"):
                m.d.comb += [self.body.valid.eq(1), self.body.payload.eq(held.status)]
                with m.If(self.body.ready):
                    with m.If(held.has_code):
                        m.next = "E_CODE"
                    with m.Else():
                        after_status()
            with m.State("E_CODE"):
                m.d.comb += [self.body.valid.eq(1), self.body.payload.eq(held.code)]
                with m.If(self.body.ready):
                    after_status()
            with m.State("T_ROM"):
                m.next = "T_HOLD"
            with m.State("T_HOLD"):
                m.next = "T_PICK"
            with m.State("T_PICK"):
                m.next = "E_TMPL"
            with m.State("E_TMPL"):
                m.d.comb += [self.body.valid.eq(1), self.body.payload.eq(self.byte)]
                with m.If(self.body.ready):
                    m.d.sync += pos.eq(pos + 1)
                    with m.If(pos + 1 == held.t_hi):
                        m.d.comb += self.done.eq(1)
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "T_ROM"
        return m


class ReadSource(enum.Enum, shape=2):
    """Where :class:`ReadBack` takes its words from."""
    VECTOR = 0      # READ of the IVRF or a VRF: vec_r_req / vec_r_resp
    MRF = 1         # READ of the MRF: mrf_r_req / mrf_r_resp
    OUTPUT = 2      # POP_OUTPUT: the output queue


class ReadBack(wiring.Component):
    """READ's and POP_OUTPUT's words, after the reply's status: per word a request
    (``D_REQ``; none for the output queue), its response into a shift register
    (``D_WAIT``; the output queue's through a register first, ``D_OUTQ``), its bytes out
    least significant first (``D_EMIT``).

    Attributes
    ----------
    start : ``In(1)``
        Begin; ``source``, ``count``, ``bytes``, ``space`` are held until ``done``.
    source : ``In(ReadSource)``
    count : ``In(16)``
        Words, 1 or more.
    bytes : ``In(range(word_bytes_max(config) + 1))``
        Bytes of a word, 1 or more.
    space : ``In(8)``
        The vector space of a VECTOR read.
    addr : ``In(HOST_ADDR_BITS)``
        The next vector address, which the executor steps on ``addr_step``.
    addr_step : ``Out(1)``
    row, engine, slot : ``In``
        The next MRF address, which the executor's :class:`MrfCursor` steps on
        ``mrf_step``.
    mrf_step : ``Out(1)``
    vec_r_req, vec_r_resp, mrf_r_req, mrf_r_resp, outq
        The core's read ports (``mrf_r_req`` through the link's register slice).
    body : ``Out(stream.Signature(8))``
        To the OMP.
    done : ``Out(1)``
        The last byte is taken at this edge (combinational).
    """

    def __init__(self, config: NpuConfig):
        self._config = config
        wb_max = word_bytes_max(config)
        self._wb_max = wb_max
        mrf_addr = mrf_address_layout(config.mvm)
        super().__init__({
            "start": In(1), "source": In(ReadSource), "count": In(16),
            "bytes": In(range(wb_max + 1)), "space": In(8),
            "addr": In(HOST_ADDR_BITS), "addr_step": Out(1),
            "row": In(mrf_addr.members["row"]), "engine": In(mrf_addr.members["engine"]),
            "slot": In(mrf_addr.members["slot"]), "mrf_step": Out(1),
            "vec_r_req": Out(stream.Signature(vector_read_layout(config))),
            "vec_r_resp": In(stream.Signature(vector_layout(config))),
            "mrf_r_req": Out(stream.Signature(mrf_addr)),
            "mrf_r_resp": In(stream.Signature(block_layout(config.n,
                                                           config.mantissa_bits_w))),
            "outq": In(stream.Signature(vector_layout(config))),
            "body": Out(stream.Signature(8)), "done": Out(1)})

    def elaborate(self, platform):
        m = Module()
        wb_max = self._wb_max
        word = Signal(8 * wb_max)
        iss = Signal(range(wb_max + 1))    # bytes of the word sent
        idx = Signal(16)                   # words sent
        # idx == count - 1, a cycle late (timing closure); a word's request and response
        # lie between idx's change and its use.
        idx_last = Signal()
        m.d.sync += idx_last.eq(idx == self.count - 1)
        # The output queue's vector, as it comes: the queue's block RAM has no output
        # register (5.6 to 5.8 ns from the clock to the data), and through the word's
        # choice of source and shift into `word` it was four LUT levels in one cycle.
        outq_word = Signal(vector_layout(self._config))

        with m.FSM(name="read_back"):
            with m.State("START"):
                m.next = "IDLE"           # as ReplyFramer's START (Icarus)
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += idx.eq(0)
                    m.next = "D_REQ"
            with m.State("D_REQ"):
                m.d.sync += iss.eq(0)
                with m.Switch(self.source):
                    with m.Case(ReadSource.VECTOR):
                        m.d.comb += [self.vec_r_req.valid.eq(1),
                                     self.vec_r_req.payload.space.eq(self.space),
                                     self.vec_r_req.payload.addr.eq(self.addr),
                                     self.addr_step.eq(self.vec_r_req.ready)]
                        with m.If(self.vec_r_req.ready):
                            m.next = "D_WAIT"
                    with m.Case(ReadSource.MRF):
                        m.d.comb += [self.mrf_r_req.valid.eq(1),
                                     self.mrf_r_req.payload.engine.eq(self.engine),
                                     self.mrf_r_req.payload.row.eq(self.row),
                                     self.mrf_r_req.payload.slot.eq(self.slot),
                                     self.mrf_step.eq(self.mrf_r_req.ready)]
                        with m.If(self.mrf_r_req.ready):
                            m.next = "D_WAIT"
                    with m.Default():
                        m.next = "D_WAIT"
            with m.State("D_WAIT"):
                with m.Switch(self.source):
                    with m.Case(ReadSource.VECTOR):
                        m.d.comb += self.vec_r_resp.ready.eq(1)
                        with m.If(self.vec_r_resp.valid):
                            m.d.sync += word.eq(self.vec_r_resp.payload)
                            m.next = "D_EMIT"
                    with m.Case(ReadSource.MRF):
                        m.d.comb += self.mrf_r_resp.ready.eq(1)
                        with m.If(self.mrf_r_resp.valid):
                            m.d.sync += word.eq(self.mrf_r_resp.payload)
                            m.next = "D_EMIT"
                    with m.Default():
                        m.d.comb += self.outq.ready.eq(1)
                        with m.If(self.outq.valid):
                            m.d.sync += outq_word.eq(self.outq.payload)
                            m.next = "D_OUTQ"
            with m.State("D_OUTQ"):
                m.d.sync += word.eq(outq_word)
                m.next = "D_EMIT"
            with m.State("D_EMIT"):
                m.d.comb += [self.body.valid.eq(1), self.body.payload.eq(word[:8])]
                with m.If(self.body.ready):
                    m.d.sync += [word.eq(word >> 8), iss.eq(iss + 1)]
                    with m.If(iss == self.bytes - 1):
                        m.d.sync += idx.eq(idx + 1)
                        with m.If(idx_last):
                            m.d.comb += self.done.eq(1)
                            m.next = "IDLE"
                        with m.Else():
                            m.next = "D_REQ"
        return m
