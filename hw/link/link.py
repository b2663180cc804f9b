"""The host link in gateware: input and output message processors (``docs/link-hw.md``).

:class:`NpuLink` speaks ``host.spec.protocol`` over a byte stream and executes requests
against the host ports of an :class:`hw.core.npu.NpuCore`, reply for reply and byte for byte
what ``host.runtime.server.ProtocolServer`` answers over ``host.model.core.NpuModel`` (the RUN reply
reports the core's measured ``cycles`` and ``pc`` instead of the model's prediction).

* The input message processor (IMP) hunts for frames on a sliding 8-byte header window
  (sync and CRC-16 checked in one cycle), buffers the payload with its CRC-32 trailer in
  an 8 KiB circular byte buffer, checks the CRC-32 as the bytes arrive, and executes a
  frame only once it is known good. After a bad CRC or a truncation it re-scans the
  buffered bytes from the one after the failed frame's sync, as ``FrameDecoder`` does.
* :class:`ReplyFramer`, the output message processor (OMP), turns a reply header
  command and a stream of body bytes into a frame: sync, header, CRC-16, body, CRC-32.

Requests run one at a time, to the end: the link takes no new byte while it executes a
request or sends its reply (a FIFO in front of ``rx`` absorbs a UART meanwhile), and a
RUN waits for the program's end, so the device is never busy when a request arrives, as
the model.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for, ceil_log2

from host.spec import protocol as p
from host.spec.config import NpuConfig
from host.spec.formats import MAX_EXPONENT_CODE, block_bytes, check_int
from host.spec.isa import ErrorCode, Space, vector_spaces
from host.spec.counters import MVM_COUNTERS, counter_names
from host.spec.protocol import MAX_PAYLOAD, Opcode, Status

from hw.link.crc import CRC16_CCITT_FALSE, CRC32, ByteCrc
from hw.core.npu import HOST_ADDR_BITS, PROGRAM_ADDR_BITS, NpuCore, vector_space_exists

__all__ = ["NpuLink", "ReplyFramer", "reply_command_layout", "RUN_ENTRIES", "BUFFER_BYTES",
           "counter_names"]

#: Bytes of the IMP's circular receive buffer: a whole frame (8 + 4096 + 4 bytes) and the
#: start of one found while re-scanning it, rounded up to a power of two (four DP16KD).
BUFFER_BYTES = 8192
#: Entries of the RUN reply, in order: clock cycles from ``run`` to ``done`` as the core
#: counted them, and the index of the ``end`` reached or of the failing instruction.
RUN_ENTRIES = ("cycles", "pc")

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


class _Template:
    """Reply bodies of fixed shape (INFO, STATUS, READ_COUNTERS, RUN entries) as one ROM
    of bytes, each either a constant or byte ``j`` of a live value (a counter, a level),
    so the entry names stream from the ROM and the values from the core."""

    def __init__(self):
        self.rom = []                 # (constant byte, source index); source 0: constant
        self.sources = [None]
        self._index = {}
        self.segments = {}

    def _source(self, key, j):
        if (key, j) not in self._index:
            self._index[key, j] = len(self.sources)
            self.sources.append((key, j))
        return self._index[key, j]

    def segment(self, name, items):
        """``items``: ints (constant bytes) or ``(key, width_bytes)`` for a little-endian
        field of live value ``key``."""
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
        """Entry-list items (``pack_entries`` form) of live values ``names``."""
        items = []
        for name in names:
            raw = name.encode("ascii")
            items += [len(raw), *raw, (name, 8)]
        return items

    def length(self, name):
        start, end = self.segments[name]
        return end - start


class NpuLink(wiring.Component):
    """IMP and OMP between a byte stream and the host ports of an NPU core.

    Parameters
    ----------
    config : host.spec.config.NpuConfig
        The build of the core behind the link (INFO reports it; sizes every check).
    truncate_cycles : int
        Clock cycles of silence inside a frame after which it is answered TRUNCATED (the
        board computes it from ``host.spec.protocol.TRUNCATE_TIMEOUT`` and its clock), 1 to
        2**32.

    Attributes
    ----------
    rx : ``In(stream.Signature(8))``
        Request bytes. Taken only while the IMP scans; a UART needs a FIFO in front.
    tx : ``Out(stream.Signature(8))``
        Reply bytes.
    core : ``Out(NpuCore(config).signature.flip())``
        To be connected to the core (``wiring.connect(m, link.core, core)``).
    waiting : ``Out(1)``
        The link waits for request bytes: nothing being executed or sent, no buffered
        bytes left to re-scan.
    partial : ``Out(1)``
        Bytes of an incomplete frame (or of a possible header) are held: silence of
        ``truncate_cycles`` would answer or drop them.

    Raises
    ------
    TypeError, ValueError
        ``config`` is not an ``NpuConfig``; ``truncate_cycles`` is not an integer in
        range.
    """

    def __init__(self, config: NpuConfig, *, truncate_cycles: int):
        if not isinstance(config, NpuConfig):
            raise TypeError(f"config must be an NpuConfig, not {config!r}")
        self._config = config
        self._truncate_cycles = check_int("truncate_cycles", truncate_cycles, 1, 1 << 32)
        probe = NpuCore(config)          # only for its signature
        probe._MustUse__silence = True
        core_sig = probe.signature
        super().__init__({"rx": In(stream.Signature(8)), "tx": Out(stream.Signature(8)),
                          "core": Out(core_sig.flip()),
                          "waiting": Out(1), "partial": Out(1)})

    @property
    def config(self) -> NpuConfig:
        return self._config

    @property
    def truncate_cycles(self) -> int:
        return self._truncate_cycles

    # ------------------------------------------------------------------------------------
    def _template(self):
        c = self._config
        t = _Template()
        info = p.pack_info(p.info_entries(c))
        t.segment("info", list(info))
        t.segment("status", [("error", 1), ("flags", 1), 0, 0, ("input_level", 4),
                             ("output_level", 4)])
        t.segment("counters", t.entries(counter_names(c)))
        t.segment("run", t.entries(RUN_ENTRIES))
        return t

    def elaborate(self, platform):
        m = Module()
        c = self._config
        core = self.core
        n = c.n
        vb = 2 * n                                   # bytes of a native vector
        mb = block_bytes(n, c.mantissa_bits_w)       # bytes of an MRF word
        m_bits = c.weight_block_bits
        wb_max = max(vb, mb, 8)
        excess_mask = ((1 << (8 * mb - m_bits)) - 1) << (8 - (8 * mb - m_bits)) & 0xFF
        vrf_spaces = 2 * c.mfus
        log2n = ceil_log2(n)
        abits = ceil_log2(BUFFER_BYTES)

        m.submodules.omp = omp = ReplyFramer()
        wiring.connect(m, omp.tx, wiring.flipped(self.tx))
        m.submodules.rx_crc = rx_crc = ByteCrc(CRC32)

        buf = Memory(shape=8, depth=BUFFER_BYTES, init=[])
        m.submodules.buf = buf
        bw = buf.write_port()
        br = buf.read_port(domain="sync", transparent_for=())
        staging = Memory(shape=64, depth=c.program_depth, init=[])
        m.submodules.staging = staging
        sw = staging.write_port()
        sr = staging.read_port(domain="sync", transparent_for=())

        # --- template ROM ---------------------------------------------------------------
        t = self._template()
        live = {
            "error": Value.cast(core.error), "flags": core.busy,
            "input_level": core.inq_level, "output_level": core.outq_level,
            "cycles": core.cycles, "pc": core.pc,
        }
        for name in MVM_COUNTERS:
            live[name] = getattr(core, name)
        for k in range(c.mfus):
            live[f"mfu{k}_overflow"] = core.mfu_overflow[k]
            live[f"mfu{k}_nan_created"] = core.mfu_nan_created[k]
        src_bits = bits_for(len(t.sources) - 1)
        rom = Memory(shape=8 + src_bits, depth=len(t.rom),
                     init=[const | src << 8 for const, src in t.rom])
        m.submodules.template = rom
        # A template byte takes four cycles (timing closure: the ROM and the multiplexer
        # over every live byte fed the OMP's CRC-32 in one cycle): T_ROM reads the ROM
        # entry (Yosys makes it a block RAM), T_HOLD registers it, T_PICK the byte it
        # names, E_TMPL sends it. The core is idle, so its values hold meanwhile.
        rom_rp = rom.read_port(domain="comb")
        tmpl_read = Signal(8 + src_bits)
        tmpl_entry = Signal(8 + src_bits)
        tmpl_byte = Signal(8)
        tmpl_pick = Signal(8)
        with m.Switch(tmpl_entry[8:]):
            with m.Case(0):
                m.d.comb += tmpl_pick.eq(tmpl_entry[:8])
            for index, (key, j) in enumerate(t.sources[1:], start=1):
                with m.Case(index):
                    m.d.comb += tmpl_pick.eq(Cat(Value.cast(live[key]), Const(0, 64))
                                             [8 * j:8 * j + 8])

        # =================================================================================
        # IMP receive side: byte supply, sliding header window, payload, CRC-32
        # =================================================================================
        R = Signal(abits)             # next byte to supply to the scanner
        F = Signal(abits)             # next free buffer place (R == F: take from rx)
        win = Signal(64)              # the last 8 bytes scanned, newest in the top byte
        win_count = Signal(range(9))  # of which belong to the current scan
        in_body = Signal()
        flushing = Signal()           # answering the link going idle, through the buffer
        start = Signal(abits)         # buffer place of the current header's first byte
        h_op = Signal(8)
        h_tag = Signal(8)
        h_len = Signal(range(MAX_PAYLOAD + 1))
        got = Signal(range(MAX_PAYLOAD + 5))
        left = Signal(range(MAX_PAYLOAD + 4))        # body bytes after the one scanned
        prefix = Signal(64)           # the payload's first 8 bytes
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
        recv = Signal()               # the FSM is in RECV
        may_end = scan_v & Mux(in_body, left == 0, (win_count >= 7) & win_sync)
        supply = recv & ~may_end
        rx_take = Signal()
        m.d.comb += [
            self.rx.ready.eq(supply & ~from_buf & ~flushing),
            rx_take.eq(self.rx.ready & self.rx.valid),
            br.en.eq(1),
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
        m.d.comb += [rx_crc.data.eq(byte)]

        # =================================================================================
        # Executor state
        # =================================================================================
        st = Signal(8)                # reply status
        code = Signal(8)              # DEVICE_ERROR code byte
        has_code = Signal()
        rlen = Signal(16)             # reply payload length
        t_pos = Signal(range(len(t.rom) + 1))
        t_end = Signal(range(len(t.rom) + 1))
        then_data = Signal()          # READ/POP: the words follow the status byte
        m.d.comb += rom_rp.addr.eq(t_pos)

        payload_at = Signal(abits)    # buffer place of the payload's first byte
        acc = data.View(p.ACCESS_LAYOUT, prefix)
        prg = data.View(p.PROGRAM_LAYOUT, prefix)
        pop = data.View(p.POP_LAYOUT, prefix[:16])

        count = Signal(16)            # words of the request
        idx = Signal(16)              # words done
        # idx == count - 1, a cycle late (timing closure: the compare fed the reply's
        # registers). Every use comes at least a cycle after idx or count last changed
        # (a word's LOAD, or the READ/POP request and response, lie in between).
        idx_last = Signal()
        wb = Signal(range(wb_max + 1))
        word = Signal(8 * wb_max)
        bp = Signal(abits)            # buffer read pointer of the loader
        iss = Signal(range(wb_max + 1))
        ld_v = Signal()
        ld_k = Signal(range(wb_max + 1))
        # LOAD puts each byte into the word the cycle after the block RAM gives it
        # (timing closure: the RAM's output went through the word's input multiplexer).
        ld_byte = Signal(8)
        ld_put = Signal()
        ld_put_k = Signal(range(wb_max + 1))
        space = Signal(8)
        vaddr = Signal(HOST_ADDR_BITS)
        eng = Signal(max(1, ceil_log2(c.tiles)))
        row = Signal(max(1, log2n))
        slot = Signal(range(c.mrf_depth))
        prog_off = Signal(PROGRAM_ADDR_BITS + 1)
        staged = Signal(PROGRAM_ADDR_BITS + 1)
        staged_total = Signal(32)
        staged_last = Signal()        # P_SWRITE: the last staged word
        bad = Signal()
        phase = Signal()
        ps_v = Signal()
        ps_last = Signal()
        # PRESCAN checks each byte the cycle after the block RAM gives it (timing closure).
        ps_byte = Signal(8)
        ps_check = Signal()
        ps_check_last = Signal()
        zs = Signal(8)                # RESET: space being zeroed
        job = Signal(4)
        J_WVEC, J_WMRF, J_STAGE, J_PROG, J_PUSH, J_RVEC, J_RMRF, J_POP = range(1, 9)

        m.d.sync += [ld_v.eq(0), ld_put.eq(0), ps_v.eq(0), ps_check.eq(0),
                     idx_last.eq(idx == count - 1)]

        def mrf_advance():
            """Next flat MRF address: row, then engine, then slot (``isa.mrf_address``)."""
            with m.If(row == n - 1):
                m.d.sync += row.eq(0)
                with m.If(eng == c.tiles - 1):
                    m.d.sync += [eng.eq(0), slot.eq(slot + 1)]
                with m.Else():
                    m.d.sync += eng.eq(eng + 1)
            with m.Else():
                m.d.sync += row.eq(row + 1)

        def reply(status, length=1, segment=None, code_value=None, data_follows=False):
            m.d.sync += [st.eq(status.value if isinstance(status, Status) else status),
                         rlen.eq(length), then_data.eq(data_follows),
                         has_code.eq(code_value is not None)]
            if code_value is not None:
                m.d.sync += code.eq(code_value)
            if segment is not None:
                lo, hi = t.segments[segment]
                m.d.sync += [t_pos.eq(lo), t_end.eq(hi)]
            else:
                m.d.sync += [t_pos.eq(0), t_end.eq(0)]
            m.next = "E_CMD"

        def refuse(status):
            reply(status)

        def load(next_job):
            m.d.sync += [job.eq(next_job), iss.eq(0)]
            m.next = "LOAD"

        def after_emit():
            with m.If(then_data):
                m.next = "D_REQ"
            with m.Else():
                m.next = "RECV"

        def halted():
            return Value.cast(core.error) != ErrorCode.NONE.value

        core_error = Value.cast(core.error)

        # Sizes by space (WRITE/READ): depth in words, word bytes.
        sp = acc.space
        is_mrf = sp == Space.MRF.value
        is_vec = vector_space_exists(c, sp)
        depth = Mux(is_mrf, c.mrf_words, Mux(sp == Space.IVRF.value, c.ivrf_depth,
                                             c.vrf_depth))
        flat = acc.addr[:bits_for(c.mrf_words)]
        rest = flat >> log2n
        L = h_len
        is_read = h_op == Opcode.READ.value
        words = (L - 8) >> 3                         # LOAD_PROGRAM
        vectors = L >> ceil_log2(vb)                 # PUSH_INPUT

        # The checks take three cycles once a frame is known good (timing closure: the
        # sizes came out of a MULT18X18D into adders, comparators and the priority chain
        # in one cycle): SIZES registers the products and sums of the header and prefix,
        # CHECKS every comparison as one flag, and DECIDE only chooses among the flags.
        # The core is idle meanwhile (no RUN is in progress), so its levels hold.
        data_bytes = Signal(16 + bits_for(wb_max))   # WRITE/READ: count words' bytes
        access_end = Signal(33)                      # addr + count
        access_depth = Signal(range(max(c.mrf_words, c.ivrf_depth, c.vrf_depth) + 1))
        program_end = Signal(33)                     # offset + words
        pop_bytes = Signal(16 + bits_for(vb))        # POP_OUTPUT: count vectors' bytes
        inq_after = Signal(len(core.inq_level) + 16)
        bad_length = Signal()         # the length does not fit the opcode
        bad_space = Signal()
        bad_count = Signal()
        bad_size = Signal()           # WRITE: the length is not the words'
        bad_address = Signal()
        program_more = Signal()       # LOAD_PROGRAM: not the last chunk
        queue_full = Signal()
        queue_empty = Signal()
        halted_at = Signal()          # the core's error was set (halting rule)

        with m.FSM(name="link"):
            with m.State("START"):
                m.next = "RECV"           # as ReplyFramer's START
            # --- scanning -------------------------------------------------------------
            with m.State("RECV"):
                m.d.comb += [recv.eq(1), br.addr.eq(R)]
                with m.If(scan_v):
                    with m.If(~in_body):
                        m.d.sync += [win.eq(Cat(win[8:], byte)),
                                     win_count.eq(Mux(win_count == 8, 8, win_count + 1)),
                                     win_sync.eq((winb(2) == _SYNC0) & (winb(3) == _SYNC1)),
                                     win_crc.eq(CRC16_CCITT_FALSE.of_bytes(
                                         [winb(i) for i in range(2, 8)])),
                                     win_len_over.eq(Cat(winb(6), winb(7)) > MAX_PAYLOAD)]
                        with m.If(header_ok):
                            m.d.sync += [h_op.eq(winb(3)), h_tag.eq(winb(4)),
                                         start.eq(scan_at - 7)]
                            with m.If(win_len_over):
                                refuse(Status.BAD_LENGTH)
                            with m.Else():
                                m.d.sync += [in_body.eq(1), got.eq(0), h_len.eq(new_len),
                                             left.eq(new_len + 3)]
                                m.d.comb += rx_crc.clear.eq(1)
                    with m.Else():
                        m.d.comb += rx_crc.en.eq(1)
                        m.d.sync += [got.eq(got + 1), left.eq(left - 1)]
                        for i in range(8):
                            with m.If(got == i):
                                m.d.sync += prefix.word_select(i, 8).eq(byte)
                        with m.If(left == 0):
                            # The trailer's last byte: the CRC-32 register is checked
                            # against the residue the next cycle (VERIFY).
                            m.d.sync += [in_body.eq(0), win_count.eq(0)]
                            m.next = "VERIFY"
                with m.Elif(~from_buf & (flushing | (~self.rx.valid
                                                    & timed_out))):
                    # The link is idle: an incomplete frame is TRUNCATED and the bytes
                    # after its sync re-scanned; what cannot start a frame is dropped.
                    m.d.sync += win_count.eq(0)
                    with m.If(in_body):
                        m.d.sync += [R.eq(start + 1), in_body.eq(0), flushing.eq(1)]
                        refuse(Status.TRUNCATED)
                    with m.Else():
                        m.d.sync += flushing.eq(0)

            with m.State("VERIFY"):
                with m.If(rx_crc.value == CRC32.residue ^ CRC32.xorout):
                    m.d.sync += payload_at.eq(start + 8)
                    m.next = "SIZES"
                with m.Else():
                    m.d.sync += R.eq(start + 1)
                    refuse(Status.BAD_CRC)

            # --- checks, in ProtocolServer's order ---------------------------------------
            with m.State("SIZES"):
                m.d.sync += [data_bytes.eq(Mux(is_mrf, acc.count * mb, acc.count * vb)),
                             access_end.eq(acc.addr + acc.count), access_depth.eq(depth),
                             program_end.eq(prg.offset + words),
                             pop_bytes.eq(pop.count * vb),
                             inq_after.eq(core.inq_level + vectors)]
                m.next = "CHECKS"
            with m.State("CHECKS"):
                m.d.sync += halted_at.eq(halted())
                with m.Switch(h_op):
                    with m.Case(Opcode.WRITE, Opcode.READ):
                        m.d.sync += [
                            bad_length.eq((L < 8) | (is_read & (L != 8))),
                            bad_space.eq(~is_mrf & ~is_vec),
                            bad_count.eq((acc.count == 0)
                                         | (is_read & (1 + data_bytes > MAX_PAYLOAD))),
                            bad_size.eq(~is_read & (L != 8 + data_bytes)),
                            bad_address.eq(access_end > access_depth)]
                    with m.Case(Opcode.LOAD_PROGRAM):
                        expect = Mux(prg.offset == 0, 0, staged)
                        m.d.sync += [
                            bad_length.eq((L < 8) | (L[:3] != 0)),
                            bad_count.eq((words == 0) | (prg.total == 0)
                                         | (prg.total > c.program_depth)),
                            bad_address.eq((prg.offset != expect)
                                           | ((prg.offset != 0) & (prg.total != staged_total))
                                           | (program_end > prg.total)),
                            program_more.eq(program_end < prg.total)]
                    with m.Case(Opcode.PUSH_INPUT):
                        m.d.sync += [bad_length.eq((L == 0) | (L[:ceil_log2(vb)] != 0)),
                                     queue_full.eq(inq_after > c.netq_depth)]
                    with m.Case(Opcode.POP_OUTPUT):
                        m.d.sync += [bad_length.eq(L != 2),
                                     bad_count.eq((pop.count == 0)
                                                  | (1 + pop_bytes > MAX_PAYLOAD)),
                                     queue_empty.eq(core.outq_level < pop.count)]
                    with m.Default():
                        m.d.sync += bad_length.eq(L != 0)
                m.next = "DECIDE"
            with m.State("DECIDE"):
                m.d.sync += [bad.eq(0), idx.eq(0), bp.eq(payload_at + 8)]
                with m.Switch(h_op):
                    with m.Case(Opcode.WRITE, Opcode.READ):
                        m.d.sync += [space.eq(sp), count.eq(acc.count),
                                     vaddr.eq(acc.addr), row.eq(flat[:log2n] if log2n else 0),
                                     eng.eq(rest % c.tiles), slot.eq(rest // c.tiles),
                                     wb.eq(Mux(is_mrf, mb, vb))]
                        with m.If(bad_length):
                            refuse(Status.BAD_LENGTH)
                        with m.Elif(bad_space):
                            refuse(Status.BAD_SPACE)
                        with m.Elif(bad_count):
                            refuse(Status.BAD_COUNT)
                        with m.Elif(bad_size):
                            refuse(Status.BAD_LENGTH)
                        with m.Elif(bad_address):
                            refuse(Status.BAD_ADDRESS)
                        with m.Elif(is_read):
                            m.d.sync += job.eq(Mux(is_mrf, J_RMRF, J_RVEC))
                            reply(Status.OK, 1 + data_bytes, data_follows=True)
                        with m.Elif(is_mrf):
                            m.d.sync += [phase.eq(0), bp.eq(payload_at + 8)]
                            m.next = "PRESCAN"
                        with m.Else():
                            load(J_WVEC)
                    with m.Case(Opcode.LOAD_PROGRAM):
                        m.d.sync += [count.eq(words), prog_off.eq(prg.offset),
                                     wb.eq(8)]
                        with m.If(bad_length):
                            refuse(Status.BAD_LENGTH)
                        with m.Elif(bad_count):
                            refuse(Status.BAD_COUNT)
                        with m.Elif(bad_address):
                            refuse(Status.BAD_ADDRESS)
                        with m.Elif(program_more):
                            with m.If(prg.offset == 0):
                                m.d.sync += staged_total.eq(prg.total)
                            load(J_STAGE)
                        with m.Else():
                            m.d.sync += vaddr.eq(0)
                            with m.If(prg.offset == 0):
                                load(J_PROG)
                            with m.Else():
                                m.next = "P_SREAD"
                    with m.Case(Opcode.PUSH_INPUT):
                        m.d.sync += [count.eq(vectors), wb.eq(vb), bp.eq(payload_at)]
                        with m.If(bad_length):
                            refuse(Status.BAD_LENGTH)
                        with m.Elif(halted_at):
                            reply(Status.DEVICE_ERROR, 2, code_value=core_error)
                        with m.Elif(queue_full):
                            refuse(Status.QUEUE_FULL)
                        with m.Else():
                            load(J_PUSH)
                    with m.Case(Opcode.RUN):
                        with m.If(bad_length):
                            refuse(Status.BAD_LENGTH)
                        with m.Elif(halted_at):
                            reply(Status.DEVICE_ERROR, 2, code_value=core_error)
                        with m.Else():
                            m.d.comb += core.run.eq(1)
                            m.next = "RUN_START"
                    with m.Case(Opcode.POP_OUTPUT):
                        m.d.sync += [count.eq(pop.count), wb.eq(vb), job.eq(J_POP)]
                        with m.If(bad_length):
                            refuse(Status.BAD_LENGTH)
                        with m.Elif(halted_at):
                            reply(Status.DEVICE_ERROR, 2, code_value=core_error)
                        with m.Elif(bad_count):
                            refuse(Status.BAD_COUNT)
                        with m.Elif(queue_empty):
                            refuse(Status.QUEUE_EMPTY)
                        with m.Else():
                            reply(Status.OK, 1 + pop_bytes, data_follows=True)
                    # The requests without a payload.
                    with m.Case(Opcode.INFO, Opcode.READ_COUNTERS, Opcode.CLEAR_COUNTERS,
                                Opcode.RESET, Opcode.STATUS, Opcode.CLEAR_ERROR):
                        with m.If(bad_length):
                            refuse(Status.BAD_LENGTH)
                        with m.Elif(h_op == Opcode.INFO.value):
                            reply(Status.OK, 1 + t.length("info"), "info")
                        with m.Elif(h_op == Opcode.READ_COUNTERS.value):
                            reply(Status.OK, 1 + t.length("counters"), "counters")
                        with m.Elif(h_op == Opcode.STATUS.value):
                            reply(Status.OK, 1 + t.length("status"), "status")
                        with m.Elif(h_op == Opcode.RESET.value):
                            m.d.comb += core.soft_reset.eq(1)
                            m.d.sync += [staged.eq(0), zs.eq(Space.IVRF.value),
                                         vaddr.eq(0)]
                            m.next = "Z_VEC"
                        with m.Else():
                            with m.If(h_op == Opcode.CLEAR_COUNTERS.value):
                                m.d.comb += core.counters_clear.eq(1)
                            with m.Else():
                                m.d.comb += core.error_clear.eq(1)
                            reply(Status.OK)
                    with m.Default():
                        refuse(Status.UNKNOWN_OPCODE)

            # --- words from the buffer ----------------------------------------------------
            with m.State("LOAD"):
                issue = iss < wb
                m.d.comb += br.addr.eq(bp)
                with m.If(issue):
                    m.d.sync += [bp.eq(bp + 1), iss.eq(iss + 1)]
                m.d.sync += [ld_v.eq(issue), ld_k.eq(iss)]
                with m.If(ld_v):
                    m.d.sync += [ld_byte.eq(br.data), ld_put.eq(1), ld_put_k.eq(ld_k)]
                with m.If(ld_put):
                    for i in range(wb_max):
                        with m.If(ld_put_k == i):
                            m.d.sync += word.word_select(i, 8).eq(ld_byte)
                    with m.If(ld_put_k == wb - 1):
                        with m.Switch(job):
                            with m.Case(J_WVEC):
                                m.next = "W_VEC"
                            with m.Case(J_WMRF):
                                m.next = "W_MRF"
                            with m.Case(J_STAGE):
                                m.next = "STAGE"
                            with m.Case(J_PROG):
                                m.next = "PROG"
                            with m.Case(J_PUSH):
                                m.next = "PUSH"

            def next_word(state_after):
                m.d.sync += [idx.eq(idx + 1), iss.eq(0)]
                with m.If(idx_last):
                    state_after()
                with m.Else():
                    m.next = "LOAD"

            def ok():
                reply(Status.OK)

            with m.State("W_VEC"):
                m.d.comb += [core.vec_w.valid.eq(1),
                             core.vec_w.payload.space.eq(space),
                             core.vec_w.payload.addr.eq(vaddr),
                             core.vec_w.payload.values.eq(word[:16 * n])]
                with m.If(core.vec_w.ready):
                    m.d.sync += vaddr.eq(vaddr + 1)
                    next_word(ok)

            # MRF words: every word checked before any is written (the model refuses the
            # whole request with MRF_WORD, nothing written).
            with m.State("PRESCAN"):
                m.d.comb += br.addr.eq(Mux(phase, bp + mb - 1, bp))
                more = idx != count
                with m.If(more):
                    m.d.sync += [ps_v.eq(1), ps_last.eq(phase)]
                    # With padding bits in the last byte, each word's last byte is read
                    # too (they must be zero: the model's word width check).
                    word_done = phase if excess_mask else Const(1)
                    if excess_mask:
                        m.d.sync += phase.eq(~phase)
                    with m.If(word_done):
                        m.d.sync += [bp.eq(bp + mb), idx.eq(idx + 1)]
                with m.If(ps_v):
                    m.d.sync += [ps_byte.eq(br.data), ps_check.eq(1),
                                 ps_check_last.eq(ps_last)]
                with m.If(ps_check):
                    with m.If(~ps_check_last & (ps_byte > MAX_EXPONENT_CODE)):
                        m.d.sync += bad.eq(1)
                    with m.If(ps_check_last & ((ps_byte & excess_mask) != 0)):
                        m.d.sync += bad.eq(1)
                with m.If(~more & ~ps_v & ~ps_check):
                    with m.If(bad):
                        reply(Status.DEVICE_ERROR, 2, code_value=ErrorCode.MRF_WORD.value)
                    with m.Else():
                        m.d.sync += [idx.eq(0), bp.eq(payload_at + 8)]
                        load(J_WMRF)

            with m.State("W_MRF"):
                m.d.comb += [core.mrf_w.valid.eq(1),
                             core.mrf_w.payload.engine.eq(eng),
                             core.mrf_w.payload.row.eq(row),
                             core.mrf_w.payload.slot.eq(slot),
                             core.mrf_w.payload.block.eq(word[:m_bits])]
                with m.If(core.mrf_w.ready):
                    mrf_advance()
                    next_word(ok)

            # --- program load -----------------------------------------------------------
            with m.State("STAGE"):
                m.d.comb += [sw.addr.eq(prog_off + idx), sw.data.eq(word[:64]), sw.en.eq(1)]

                def staged_done():
                    m.d.sync += staged.eq(prog_off + count)
                    ok()
                next_word(staged_done)

            # The staged words to the core; the last one is known in P_SREAD, a cycle
            # before it is needed (timing closure).
            with m.State("P_SREAD"):
                m.d.comb += sr.addr.eq(vaddr)
                m.d.sync += staged_last.eq(vaddr + 1 == prog_off)
                m.next = "P_SWRITE"
            with m.State("P_SWRITE"):
                m.d.comb += [sr.addr.eq(vaddr), core.prog_w.valid.eq(1),
                             core.prog_w.payload.addr.eq(vaddr),
                             core.prog_w.payload.word.eq(sr.data)]
                with m.If(core.prog_w.ready):
                    m.d.sync += vaddr.eq(vaddr + 1)
                    with m.If(staged_last):
                        load(J_PROG)
                    with m.Else():
                        m.next = "P_SREAD"
            with m.State("PROG"):
                m.d.comb += [core.prog_w.valid.eq(1),
                             core.prog_w.payload.addr.eq(prog_off + idx),
                             core.prog_w.payload.word.eq(word[:64])]
                with m.If(core.prog_w.ready):
                    def loaded():
                        m.d.sync += staged.eq(0)
                        ok()
                    next_word(loaded)

            # --- queues and runs --------------------------------------------------------
            with m.State("PUSH"):
                m.d.comb += [core.inq.valid.eq(1), core.inq.payload.eq(word[:16 * n])]
                with m.If(core.inq.ready):
                    next_word(ok)

            with m.State("RUN_START"):
                m.next = "RUN_WAIT"       # done falls the cycle after run
            with m.State("RUN_WAIT"):
                with m.If(core.done):
                    with m.If(halted()):
                        reply(Status.DEVICE_ERROR, 2 + t.length("run"), "run",
                              code_value=core_error)
                    with m.Else():
                        reply(Status.OK, 1 + t.length("run"), "run")

            # --- RESET: the core's registers, then every memory word to zero -------------
            def zero_next_space():
                m.d.sync += [vaddr.eq(0), zs.eq(zs + 1)]
                with m.If(zs == Space.IVRF.value + vrf_spaces):
                    m.d.sync += [eng.eq(0), row.eq(0), slot.eq(0)]
                    m.next = "Z_MRF"

            def zero_space():
                m.d.comb += [core.vec_w.valid.eq(1), core.vec_w.payload.space.eq(zs),
                             core.vec_w.payload.addr.eq(vaddr)]
                with m.If(core.vec_w.ready):
                    m.d.sync += vaddr.eq(vaddr + 1)
                    last = vaddr == Mux(zs == Space.IVRF.value, c.ivrf_depth,
                                        c.vrf_depth) - 1
                    with m.If(last):
                        zero_next_space()

            with m.State("Z_VEC"):
                if len(vector_spaces(c)) == 1 + vrf_spaces:
                    zero_space()
                else:
                    # A VRF the unit sets leave out: nothing to zero (the core would
                    # refuse the writes).
                    with m.If(~vector_space_exists(c, zs)):
                        zero_next_space()
                    with m.Else():
                        zero_space()
            with m.State("Z_MRF"):
                m.d.comb += [core.mrf_w.valid.eq(1), core.mrf_w.payload.engine.eq(eng),
                             core.mrf_w.payload.row.eq(row), core.mrf_w.payload.slot.eq(slot)]
                with m.If(core.mrf_w.ready):
                    mrf_advance()
                    with m.If((row == n - 1) & (eng == c.tiles - 1)
                              & (slot == c.mrf_depth - 1)):
                        ok()

            # --- reply: header command, status, code, template, then data words ----------
            with m.State("E_CMD"):
                m.d.comb += [omp.cmd.valid.eq(1), omp.cmd.payload.opcode.eq(h_op),
                             omp.cmd.payload.tag.eq(h_tag), omp.cmd.payload.length.eq(rlen)]
                with m.If(omp.cmd.ready):
                    m.next = "E_STATUS"
            def template_or_after():
                with m.If(t_pos != t_end):
                    m.next = "T_ROM"
                with m.Else():
                    after_emit()

            with m.State("E_STATUS"):
                m.d.comb += [omp.body.valid.eq(1), omp.body.payload.eq(st)]
                with m.If(omp.body.ready):
                    with m.If(has_code):
                        m.next = "E_CODE"
                    with m.Else():
                        template_or_after()
            with m.State("E_CODE"):
                m.d.comb += [omp.body.valid.eq(1), omp.body.payload.eq(code)]
                with m.If(omp.body.ready):
                    template_or_after()
            with m.State("T_ROM"):
                m.d.sync += tmpl_read.eq(rom_rp.data)
                m.next = "T_HOLD"
            with m.State("T_HOLD"):
                m.d.sync += tmpl_entry.eq(tmpl_read)
                m.next = "T_PICK"
            with m.State("T_PICK"):
                m.d.sync += tmpl_byte.eq(tmpl_pick)
                m.next = "E_TMPL"
            with m.State("E_TMPL"):
                m.d.comb += [omp.body.valid.eq(1), omp.body.payload.eq(tmpl_byte)]
                with m.If(omp.body.ready):
                    m.d.sync += t_pos.eq(t_pos + 1)
                    with m.If(t_pos + 1 == t_end):
                        after_emit()
                    with m.Else():
                        m.next = "T_ROM"

            with m.State("D_REQ"):
                m.d.sync += iss.eq(0)
                with m.Switch(job):
                    with m.Case(J_RVEC):
                        m.d.comb += [core.vec_r_req.valid.eq(1),
                                     core.vec_r_req.payload.space.eq(space),
                                     core.vec_r_req.payload.addr.eq(vaddr)]
                        with m.If(core.vec_r_req.ready):
                            m.d.sync += vaddr.eq(vaddr + 1)
                            m.next = "D_WAIT"
                    with m.Case(J_RMRF):
                        m.d.comb += [core.mrf_r_req.valid.eq(1),
                                     core.mrf_r_req.payload.engine.eq(eng),
                                     core.mrf_r_req.payload.row.eq(row),
                                     core.mrf_r_req.payload.slot.eq(slot)]
                        with m.If(core.mrf_r_req.ready):
                            mrf_advance()
                            m.next = "D_WAIT"
                    with m.Default():
                        m.next = "D_WAIT"
            with m.State("D_WAIT"):
                with m.Switch(job):
                    with m.Case(J_RVEC):
                        m.d.comb += core.vec_r_resp.ready.eq(1)
                        with m.If(core.vec_r_resp.valid):
                            m.d.sync += word.eq(core.vec_r_resp.payload)
                            m.next = "D_EMIT"
                    with m.Case(J_RMRF):
                        m.d.comb += core.mrf_r_resp.ready.eq(1)
                        with m.If(core.mrf_r_resp.valid):
                            m.d.sync += word.eq(core.mrf_r_resp.payload)
                            m.next = "D_EMIT"
                    with m.Default():
                        m.d.comb += core.outq.ready.eq(1)
                        with m.If(core.outq.valid):
                            m.d.sync += word.eq(core.outq.payload)
                            m.next = "D_EMIT"
            with m.State("D_EMIT"):
                m.d.comb += [omp.body.valid.eq(1), omp.body.payload.eq(word[:8])]
                with m.If(omp.body.ready):
                    m.d.sync += [word.eq(word >> 8), iss.eq(iss + 1)]
                    with m.If(iss == wb - 1):
                        m.d.sync += idx.eq(idx + 1)
                        with m.If(idx_last):
                            m.next = "RECV"
                        with m.Else():
                            m.next = "D_REQ"

        m.d.comb += [
            self.waiting.eq(recv & ~scan_v & ~from_buf & ~flushing & omp.idle),
            self.partial.eq(scan_v | in_body | (win_count != 0)),
        ]
        return m
