"""The host link in gateware: input and output message processors (``docs/link-hw.md``).

:class:`NpuLink` speaks ``host.spec.protocol`` over a byte stream and executes requests
against the host ports of an :class:`hw.core.npu.NpuCore`, reply for reply and byte for byte
what ``host.runtime.server.ProtocolServer`` answers over ``host.model.core.NpuModel`` (the RUN reply
reports the core's measured ``cycles`` and ``pc`` instead of the model's prediction).

* The input message processor (IMP): :class:`hw.link.scanner.FrameScanner` hunts for
  frames on a sliding 8-byte header window (sync and CRC-16 checked in one cycle),
  buffers the payload with its CRC-32 trailer in an 8 KiB circular byte buffer and checks
  the CRC-32 as the bytes arrive; after a bad CRC or a truncation it re-scans the buffered
  bytes from the one after the failed frame's sync, as ``FrameDecoder`` does.
  :class:`NpuLink`'s state machine, the executor, executes a frame only once it is known
  good, after :class:`hw.link.checks.RequestChecks` has checked it; the byte-level work
  (payload words, the MRF prescan, the reply's bytes, read-back words) is done by the
  components of :mod:`hw.link.executor`.
* :class:`hw.link.omp.ReplyFramer`, the output message processor (OMP), turns a reply
  header command and a stream of body bytes into a frame: sync, header, CRC-16, body,
  CRC-32. The fixed-shape bodies come from :class:`hw.link.template.ReplyTemplate`.

Requests run one at a time, to the end: the link takes no new byte while it executes a
request or sends its reply (a FIFO in front of ``rx`` absorbs a UART meanwhile), and a
RUN waits for the program's end, so the device is never busy when a request arrives, as
the model.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from host.spec import protocol as p
from host.spec.config import NpuConfig
from host.spec.formats import block_bytes, check_int
from host.spec.isa import ErrorCode, Space, vector_spaces
from host.spec.counters import MVM_COUNTERS, counter_names
from host.spec.protocol import Opcode, Status

from hw.core.host_access import vector_space_depth
from hw.core.npu import HOST_ADDR_BITS, PROGRAM_ADDR_BITS, NpuCore, vector_space_exists
from hw.link.checks import RequestChecks
from hw.link.executor import (MrfCursor, MrfPrescan, ReadBack, ReadSource, ReplyEmitter,
                              WordLoader, word_bytes_max)
from hw.link.omp import ReplyFramer, reply_command_layout
from hw.link.scanner import BUFFER_BYTES, FrameScanner
from hw.slice import RegisterSlice
from hw.link.template import ReplyTemplate, TemplateRom

__all__ = ["NpuLink", "ReplyFramer", "reply_command_layout", "RUN_ENTRIES", "BUFFER_BYTES",
           "counter_names"]

#: Entries of the RUN reply, in order: clock cycles from ``run`` to ``done`` as the core
#: counted them, and the index of the ``end`` reached or of the failing instruction.
RUN_ENTRIES = ("cycles", "pc")

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
        t = TemplateRom()
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
        vrf_spaces = 2 * c.mfus
        core_error = Value.cast(core.error)
        halted = core_error != ErrorCode.NONE.value     # the core's sticky error

        m.submodules.omp = omp = ReplyFramer()
        wiring.connect(m, omp.tx, wiring.flipped(self.tx))
        m.submodules.scanner = scanner = FrameScanner(truncate_cycles=self._truncate_cycles)
        wiring.connect(m, wiring.flipped(self.rx), scanner.rx)
        m.submodules.checks = checks = RequestChecks(c, level_bits=len(core.inq_level))
        # MRF words reach the core through a register slice (both directions registered):
        # the executor and the MVM's MRF writer are far apart on the die. A request that
        # writes the MRF is answered once the slice is empty (MRF_DRAIN), so the next
        # request (a RUN, a read-back) finds every word written.
        m.submodules.mrf_slice = mrf_slice = RegisterSlice(core.mrf_w.payload.shape())
        wiring.connect(m, mrf_slice.o_stream, wiring.flipped(core.mrf_w))
        mrf_w = mrf_slice.i_stream
        # MRF read-back requests likewise: the core's ready for one depends on its address
        # (the range check) and fed the executor's engine and slot counters in the cycle
        # the executor's state drove the request. The read-back waits for each response
        # (D_WAIT), so the slice adds a cycle to a read word and never holds two requests.
        m.submodules.mrf_r_slice = mrf_r_slice = RegisterSlice(core.mrf_r_req.payload.shape())
        wiring.connect(m, mrf_r_slice.o_stream, wiring.flipped(core.mrf_r_req))
        staging = Memory(shape=64, depth=c.program_depth, init=[])
        m.submodules.staging = staging
        sw = staging.write_port()
        sr = staging.read_port(domain="sync", transparent_for=())

        t = self._template()
        live = {"error": core_error, "flags": core.busy, "input_level": core.inq_level,
                "output_level": core.outq_level, "cycles": core.cycles, "pc": core.pc}
        for name in MVM_COUNTERS:
            live[name] = getattr(core, name)
        for k in range(c.mfus):
            live[f"mfu{k}_overflow"] = core.mfu_overflow[k]
            live[f"mfu{k}_nan_created"] = core.mfu_nan_created[k]
        live = {key: Value.cast(live[key]) for key in t.live_keys()}
        m.submodules.template = template = ReplyTemplate(
            t, {key: len(value) for key, value in live.items()})
        m.d.comb += [template.live[key].eq(value) for key, value in live.items()]

        header = scanner.header
        h_op = header.opcode
        recv = Signal()               # the FSM is in RECV
        verify = Signal()             # the FSM is in VERIFY
        m.d.comb += [scanner.recv.eq(recv), scanner.verify.eq(verify),
                     checks.header.eq(header), checks.prefix.eq(scanner.prefix),
                     checks.inq_level.eq(core.inq_level),
                     checks.outq_level.eq(core.outq_level),
                     checks.halted.eq(halted)]
        payload_at = scanner.payload_at

        # The executor's parts (hw.link.executor).
        m.submodules.loader = loader = WordLoader(c)
        m.submodules.prescan = prescan = MrfPrescan(c)
        m.submodules.cursor = cursor = MrfCursor(c)
        m.submodules.emitter = emitter = ReplyEmitter(len(t.rom))
        m.submodules.read_back = read_back = ReadBack(c)
        in_load, in_prescan, in_read_back = Signal(), Signal(), Signal()
        m.d.comb += [loader.data.eq(scanner.read_data), prescan.data.eq(scanner.read_data),
                     loader.run.eq(in_load), prescan.run.eq(in_prescan),
                     emitter.opcode.eq(h_op), emitter.tag.eq(header.tag),
                     template.pos.eq(emitter.pos), emitter.byte.eq(template.byte)]
        # The buffer's read port is the loader's in LOAD, the prescan's in PRESCAN.
        with m.If(in_load):
            m.d.comb += scanner.read_addr.eq(loader.addr)
        with m.Elif(in_prescan):
            m.d.comb += scanner.read_addr.eq(prescan.addr)
        # The OMP takes the emitter's bytes, then the read-back's.
        wiring.connect(m, emitter.omp_cmd, omp.cmd)
        with m.If(in_read_back):
            m.d.comb += [omp.body.valid.eq(read_back.body.valid),
                         omp.body.payload.eq(read_back.body.payload),
                         read_back.body.ready.eq(omp.body.ready)]
        with m.Else():
            m.d.comb += [omp.body.valid.eq(emitter.body.valid),
                         omp.body.payload.eq(emitter.body.payload),
                         emitter.body.ready.eq(omp.body.ready)]
        wiring.connect(m, read_back.vec_r_req, wiring.flipped(core.vec_r_req))
        wiring.connect(m, wiring.flipped(core.vec_r_resp), read_back.vec_r_resp)
        wiring.connect(m, read_back.mrf_r_req, mrf_r_slice.i_stream)
        wiring.connect(m, wiring.flipped(core.mrf_r_resp), read_back.mrf_r_resp)
        wiring.connect(m, wiring.flipped(core.outq), read_back.outq)
        m.d.comb += [read_back.row.eq(cursor.row), read_back.engine.eq(cursor.engine),
                     read_back.slot.eq(cursor.slot), cursor.step.eq(read_back.mrf_step)]

        # =================================================================================
        # Executor state
        # =================================================================================
        acc = data.View(p.ACCESS_LAYOUT, scanner.prefix)
        prg = data.View(p.PROGRAM_LAYOUT, scanner.prefix)
        pop = data.View(p.POP_LAYOUT, scanner.prefix[:16])

        count = Signal(16)            # words of the request
        idx = Signal(16)              # words done
        # idx == count - 1, a cycle late (timing closure: the compare fed the reply's
        # registers). Every use comes at least a cycle after idx or count last changed
        # (a word's LOAD lies in between).
        idx_last = Signal()
        wb = Signal(range(word_bytes_max(c) + 1))
        word = loader.word
        space = Signal(8)
        vaddr = Signal(HOST_ADDR_BITS)
        prog_off = Signal(PROGRAM_ADDR_BITS + 1)
        staged = Signal(PROGRAM_ADDR_BITS + 1)
        staged_total = Signal(32)
        staged_last = Signal()        # P_SWRITE: the last staged word
        staged_word = Signal(64)      # P_SWRITE: the staged word, registered
        prog_req = Signal()           # P_SWRITE, PROG: the core's program-write request
        m.d.comb += [checks.staged.eq(staged), checks.staged_total.eq(staged_total)]
        source = Signal(ReadSource)   # READ/POP: where the words come from
        job = Signal(3)               # what the loaded words are for
        J_WVEC, J_WMRF, J_STAGE, J_PROG, J_PUSH = range(1, 6)
        m.d.comb += [loader.bytes.eq(wb), prescan.count.eq(count), prescan.at.eq(payload_at + 8),
                     read_back.source.eq(source), read_back.count.eq(count),
                     read_back.bytes.eq(wb), read_back.space.eq(space),
                     read_back.addr.eq(vaddr)]
        m.d.sync += idx_last.eq(idx == count - 1)
        # A vector write's space and address straight from their registers, whatever the
        # state (W_VEC's request; RESET zeroes `space` after `space`, from IVRF): the
        # core's `ready` for the write checks the address against the space's depth, and
        # fed this FSM's registers in the same cycle with the state's multiplexer in front
        # of the check (issue 36, timing: the board's critical path at 62.26 MHz).
        m.d.comb += [core.vec_w.payload.space.eq(space), core.vec_w.payload.addr.eq(vaddr)]
        with m.If(read_back.addr_step):
            m.d.sync += vaddr.eq(vaddr + 1)
        # A program write's request from flip-flops too, whatever the state: `prog_req`
        # is set on the way into P_SWRITE and PROG and cleared by the write, and vaddr is
        # the word's address in both (below the program's depth by the request's
        # checks). The state's decode and the sum prog_off + idx fed the core's address
        # checks and, through them, the program memory's write and the front end's
        # run-start read (issue 36, timing: the board's critical path at 63.00 MHz).
        m.d.comb += [core.prog_w.valid.eq(prog_req), core.prog_w.payload.addr.eq(vaddr)]
        with m.If(prog_req & core.prog_w.ready):
            m.d.sync += [prog_req.eq(0), vaddr.eq(vaddr + 1)]

        def reply(status, length=1, segment=None, code_value=None, data_follows=False):
            """Hand the reply to the emitter; wait in REPLY."""
            cmd = emitter.cmd
            m.d.comb += [emitter.start.eq(1),
                         cmd.status.eq(status.value if isinstance(status, Status) else status),
                         cmd.length.eq(length), cmd.data_follows.eq(data_follows),
                         cmd.has_code.eq(code_value is not None)]
            if code_value is not None:
                m.d.comb += cmd.code.eq(code_value)
            if segment is not None:
                lo, hi = t.segments[segment]
                m.d.comb += [cmd.t_lo.eq(lo), cmd.t_hi.eq(hi)]
            m.next = "REPLY"

        def refuse(status):
            reply(status)

        def ok():
            reply(Status.OK)

        def load(next_job):
            m.d.sync += job.eq(next_job)
            m.next = "LOAD"

        def seek(at):
            m.d.comb += [loader.seek.eq(1), loader.at.eq(at)]

        def next_word(state_after):
            m.d.sync += idx.eq(idx + 1)
            with m.If(idx_last):
                state_after()
            with m.Else():
                m.next = "LOAD"

        def mrf_written():
            """The last MRF word is in the slice: answer OK once it has left."""
            m.next = "MRF_DRAIN"

        # WRITE/READ: the space.
        sp = acc.space
        is_mrf = sp == Space.MRF.value
        is_read = h_op == Opcode.READ.value

        # RESET's soft reset comes from a flip-flop, a cycle after the decode: the
        # request's checks and the reply's hold logic would otherwise drive the core's
        # reset buffer, and from it the reset's loads off the global line (hw.ecp5),
        # across the die. Z_VEC waits out that cycle, the core's reset.
        soft_reset = Signal()
        m.d.sync += soft_reset.eq(0)
        m.d.comb += core.soft_reset.eq(soft_reset)
        # RUN, CLEAR_COUNTERS and CLEAR_ERROR reach the core from flip-flops too, a cycle
        # after the decode, for the same reason: the run's start resets the front end's
        # registers across the die, and the request's checks in front of it ended the
        # board's critical path (59.52 MHz). The core counts a run's cycles from the
        # pulse it sees; RUN_START is the pulse's cycle, and `done` falls after it.
        run, counters_clear, error_clear = Signal(), Signal(), Signal()
        m.d.sync += [run.eq(0), counters_clear.eq(0), error_clear.eq(0)]
        m.d.comb += [core.run.eq(run), core.counters_clear.eq(counters_clear),
                     core.error_clear.eq(error_clear)]

        with m.FSM(name="link"):
            with m.State("START"):
                m.next = "RECV"           # as ReplyFramer's START
            # --- a request: the scanner's events -----------------------------------------
            with m.State("RECV"):
                m.d.comb += recv.eq(1)
                with m.If(scanner.bad_length):
                    refuse(Status.BAD_LENGTH)
                with m.Elif(scanner.frame_end):
                    m.next = "VERIFY"
                with m.Elif(scanner.truncated):
                    refuse(Status.TRUNCATED)
            with m.State("VERIFY"):
                m.d.comb += verify.eq(1)
                with m.If(scanner.crc_ok):
                    m.next = "SIZES"
                with m.Else():
                    refuse(Status.BAD_CRC)

            # --- checks, in ProtocolServer's order: RequestChecks's flags two cycles
            # after the frame (SIZES, CHECKS), chosen among in DECIDE ------------------
            with m.State("SIZES"):
                m.next = "CHECKS"
            with m.State("CHECKS"):
                m.next = "DECIDE"
            with m.State("DECIDE"):
                m.d.sync += idx.eq(0)
                seek(payload_at + 8)
                with m.Switch(h_op):
                    with m.Case(Opcode.WRITE, Opcode.READ):
                        m.d.sync += [space.eq(sp), count.eq(acc.count), vaddr.eq(acc.addr),
                                     wb.eq(Mux(is_mrf, mb, vb))]
                        m.d.comb += [cursor.load.eq(1),
                                     cursor.flat.eq(acc.addr[:len(cursor.flat)])]
                        with m.If(checks.bad_length):
                            refuse(Status.BAD_LENGTH)
                        with m.Elif(checks.bad_space):
                            refuse(Status.BAD_SPACE)
                        with m.Elif(checks.bad_count):
                            refuse(Status.BAD_COUNT)
                        with m.Elif(checks.bad_size):
                            refuse(Status.BAD_LENGTH)
                        with m.Elif(checks.bad_address):
                            refuse(Status.BAD_ADDRESS)
                        with m.Elif(is_read):
                            m.d.sync += source.eq(Mux(is_mrf, ReadSource.MRF,
                                                      ReadSource.VECTOR))
                            reply(Status.OK, 1 + checks.data_bytes, data_follows=True)
                        with m.Elif(is_mrf):
                            m.d.comb += prescan.start.eq(1)
                            m.next = "PRESCAN"
                        with m.Else():
                            load(J_WVEC)
                    with m.Case(Opcode.LOAD_PROGRAM):
                        m.d.sync += [count.eq(checks.words), prog_off.eq(prg.offset),
                                     wb.eq(8)]
                        with m.If(checks.bad_length):
                            refuse(Status.BAD_LENGTH)
                        with m.Elif(checks.bad_count):
                            refuse(Status.BAD_COUNT)
                        with m.Elif(checks.bad_address):
                            refuse(Status.BAD_ADDRESS)
                        with m.Elif(checks.program_more):
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
                        m.d.sync += [count.eq(checks.vectors), wb.eq(vb)]
                        seek(payload_at)
                        with m.If(checks.bad_length):
                            refuse(Status.BAD_LENGTH)
                        with m.Elif(checks.halted_at):
                            reply(Status.DEVICE_ERROR, 2, code_value=core_error)
                        with m.Elif(checks.queue_full):
                            refuse(Status.QUEUE_FULL)
                        with m.Else():
                            load(J_PUSH)
                    with m.Case(Opcode.RUN):
                        with m.If(checks.bad_length):
                            refuse(Status.BAD_LENGTH)
                        with m.Elif(checks.halted_at):
                            reply(Status.DEVICE_ERROR, 2, code_value=core_error)
                        with m.Else():
                            m.d.sync += run.eq(1)
                            m.next = "RUN_START"
                    with m.Case(Opcode.POP_OUTPUT):
                        m.d.sync += [count.eq(pop.count), wb.eq(vb),
                                     source.eq(ReadSource.OUTPUT)]
                        with m.If(checks.bad_length):
                            refuse(Status.BAD_LENGTH)
                        with m.Elif(checks.halted_at):
                            reply(Status.DEVICE_ERROR, 2, code_value=core_error)
                        with m.Elif(checks.bad_count):
                            refuse(Status.BAD_COUNT)
                        with m.Elif(checks.queue_empty):
                            refuse(Status.QUEUE_EMPTY)
                        with m.Else():
                            reply(Status.OK, 1 + checks.pop_bytes, data_follows=True)
                    # The requests without a payload.
                    with m.Case(Opcode.INFO, Opcode.READ_COUNTERS, Opcode.CLEAR_COUNTERS,
                                Opcode.RESET, Opcode.STATUS, Opcode.CLEAR_ERROR):
                        with m.If(checks.bad_length):
                            refuse(Status.BAD_LENGTH)
                        with m.Elif(h_op == Opcode.INFO.value):
                            reply(Status.OK, 1 + t.length("info"), "info")
                        with m.Elif(h_op == Opcode.READ_COUNTERS.value):
                            reply(Status.OK, 1 + t.length("counters"), "counters")
                        with m.Elif(h_op == Opcode.STATUS.value):
                            reply(Status.OK, 1 + t.length("status"), "status")
                        with m.Elif(h_op == Opcode.RESET.value):
                            # The MRF cursor goes to word 0 here, for Z_MRF: nothing
                            # moves it while the vectors are zeroed, and so its clear is
                            # not behind the vector writes' handshake.
                            m.d.comb += cursor.clear.eq(1)
                            m.d.sync += [soft_reset.eq(1), staged.eq(0),
                                         space.eq(Space.IVRF.value),
                                         vaddr.eq(0)]
                            m.next = "Z_VEC"
                        with m.Else():
                            with m.If(h_op == Opcode.CLEAR_COUNTERS.value):
                                m.d.sync += counters_clear.eq(1)
                            with m.Else():
                                m.d.sync += error_clear.eq(1)
                            reply(Status.OK)
                    with m.Default():
                        refuse(Status.UNKNOWN_OPCODE)

            # --- a word from the buffer, then where it goes ---------------------------
            with m.State("LOAD"):
                m.d.comb += in_load.eq(1)
                with m.If(loader.done):
                    with m.Switch(job):
                        with m.Case(J_WVEC):
                            m.next = "W_VEC"
                        with m.Case(J_WMRF):
                            m.next = "W_MRF"
                        with m.Case(J_STAGE):
                            m.next = "STAGE"
                        with m.Case(J_PROG):
                            m.d.sync += prog_req.eq(1)
                            m.next = "PROG"
                        with m.Case(J_PUSH):
                            m.next = "PUSH"

            with m.State("W_VEC"):
                m.d.comb += [core.vec_w.valid.eq(1),
                             core.vec_w.payload.values.eq(word[:16 * n])]
                with m.If(core.vec_w.ready):
                    m.d.sync += vaddr.eq(vaddr + 1)
                    next_word(ok)

            # MRF words: every word checked before any is written (the model refuses the
            # whole request with MRF_WORD, nothing written).
            with m.State("PRESCAN"):
                m.d.comb += in_prescan.eq(1)
                with m.If(prescan.done):
                    with m.If(prescan.bad):
                        reply(Status.DEVICE_ERROR, 2, code_value=ErrorCode.MRF_WORD.value)
                    with m.Else():
                        seek(payload_at + 8)
                        load(J_WMRF)

            with m.State("W_MRF"):
                m.d.comb += [mrf_w.valid.eq(1),
                             mrf_w.payload.engine.eq(cursor.engine),
                             mrf_w.payload.row.eq(cursor.row),
                             mrf_w.payload.slot.eq(cursor.slot),
                             mrf_w.payload.block.eq(word[:m_bits])]
                with m.If(mrf_w.ready):
                    m.d.comb += cursor.step.eq(1)
                    next_word(mrf_written)
            with m.State("MRF_DRAIN"):
                with m.If(mrf_slice.empty):
                    ok()

            # --- program load -----------------------------------------------------------
            with m.State("STAGE"):
                m.d.comb += [sw.addr.eq(prog_off + idx), sw.data.eq(word[:64]), sw.en.eq(1)]

                def staged_done():
                    m.d.sync += staged.eq(prog_off + count)
                    ok()
                next_word(staged_done)

            # The staged words to the core, one every three cycles: the address (P_SREAD),
            # the block RAM's output into a register (P_SDATA), the word from that register
            # (P_SWRITE). Timing closure: the RAM's output has no register of its own and
            # the core's checks of a program word are across the die. The last word is
            # known in P_SREAD, before it is needed.
            with m.State("P_SREAD"):
                m.d.comb += sr.addr.eq(vaddr)
                m.d.sync += staged_last.eq(vaddr + 1 == prog_off)
                m.next = "P_SDATA"
            with m.State("P_SDATA"):
                m.d.sync += [staged_word.eq(sr.data), prog_req.eq(1)]
                m.next = "P_SWRITE"
            with m.State("P_SWRITE"):
                m.d.comb += core.prog_w.payload.word.eq(staged_word)
                with m.If(core.prog_w.ready):
                    with m.If(staged_last):
                        load(J_PROG)
                    with m.Else():
                        m.next = "P_SREAD"
            # vaddr is prog_off + idx here: zero for a load at offset 0, prog_off after
            # the staged words.
            with m.State("PROG"):
                m.d.comb += core.prog_w.payload.word.eq(word[:64])
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
                m.next = "RUN_WAIT"       # the core sees `run`; done falls after it
            with m.State("RUN_WAIT"):
                with m.If(core.done):
                    with m.If(halted):
                        reply(Status.DEVICE_ERROR, 2 + t.length("run"), "run",
                              code_value=core_error)
                    with m.Else():
                        reply(Status.OK, 1 + t.length("run"), "run")

            # --- RESET: the core's registers, then every memory word to zero -------------
            def zero_next_space():
                m.d.sync += [vaddr.eq(0), space.eq(space + 1)]
                with m.If(space == Space.IVRF.value + vrf_spaces):
                    m.next = "Z_MRF"

            def zero_space():
                m.d.comb += core.vec_w.valid.eq(1)
                with m.If(core.vec_w.ready):
                    m.d.sync += vaddr.eq(vaddr + 1)
                    last = vaddr == vector_space_depth(c, space) - 1
                    with m.If(last):
                        zero_next_space()

            with m.State("Z_VEC"):
                with m.If(~soft_reset):     # else the core is in reset this cycle
                    if len(vector_spaces(c)) == 1 + vrf_spaces:
                        zero_space()
                    else:
                        # A VRF the unit sets leave out: nothing to zero (the core
                        # would refuse the writes).
                        with m.If(~vector_space_exists(c, space)):
                            zero_next_space()
                        with m.Else():
                            zero_space()
            with m.State("Z_MRF"):
                m.d.comb += [mrf_w.valid.eq(1), mrf_w.payload.engine.eq(cursor.engine),
                             mrf_w.payload.row.eq(cursor.row),
                             mrf_w.payload.slot.eq(cursor.slot)]
                with m.If(mrf_w.ready):
                    m.d.comb += cursor.step.eq(1)
                    with m.If(cursor.last):
                        mrf_written()

            # --- the reply (ReplyEmitter), then READ's and POP's words (ReadBack) ----------
            with m.State("REPLY"):
                with m.If(emitter.done):
                    with m.If(emitter.data_follows):
                        m.d.comb += read_back.start.eq(1)
                        m.next = "READ_BACK"
                    with m.Else():
                        m.next = "RECV"
            with m.State("READ_BACK"):
                m.d.comb += in_read_back.eq(1)
                with m.If(read_back.done):
                    m.next = "RECV"

        m.d.comb += [
            self.waiting.eq(recv & scanner.idle & omp.idle),
            self.partial.eq(scanner.partial),
        ]
        return m
