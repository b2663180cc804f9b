"""The NPU core: program memory, front end (:class:`hw.core.front_end.FrontEnd`: decoder
and chain checker), scheduler, vector memories, network queues, the MVM
(:class:`hw.mvm.mvm.Mvm`) and the MFU pipeline (:class:`hw.mfu.mfu.MfuPipeline`).

It runs the binary programs of :mod:`host.spec.isa` with the results, memory contents,
counters and error codes of :class:`host.model.core.NpuModel`, bit for bit. ``docs/npu.md``
describes the ports, the pipeline and the timing.

With ``config.lanes`` l < n the MFU side counts beats of l lanes (``B = n / l`` a native
vector): the write bus, the direct buffer, the feeder (an N -> l adapter after the MVM)
and the writer (an assembler in front of the N-wide output queue); the IVRF and the VRF
copies are B banks of one beat, read N wide. The host ports, the MVM's input and the
network queues stay N lanes wide. With ``lanes == n`` none of that is built (Python
``if beats > 1``): the design is the one of before lanes, RTLIL for RTLIL.
"""

from amaranth.hdl import (
    Cat, ClockDomain, ClockSignal, DomainRenamer, Module, ResetSignal, Signal, unsigned,
)
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from host.spec.formats import block_layout
from host.spec.isa import ErrorCode
from host.spec.mfu import vrf_write_layout
from host.spec.counters import MVM_COUNTERS

from hw.mfu.mfu import MfuPipeline
from hw.mvm.mvm import Mvm, mrf_address_layout, mrf_word_layout, weight_row_layout
from hw.core.decode import STORED_WORD_LAYOUT
from hw.core.vectors import checked_config, vector_layout
from hw.core.feeder import Feeder
from hw.core.front_end import FrontEnd
from hw.core.host_access import (
    HOST_ADDR_BITS, PROGRAM_ADDR_BITS, HostAccess, program_write_layout, vector_read_layout,
    vector_space_exists, vector_write_layout,
)
from hw.core.issuer import Issuer
from hw.core.memories import VectorMemories
from hw.core.reader import Reader, memory_spaces
from hw.core.scoreboard import IN_FLIGHT
from hw.core.writer import Writer
from hw.ecp5 import global_buffer

__all__ = [
    "NpuCore", "IN_FLIGHT", "HOST_ADDR_BITS", "PROGRAM_ADDR_BITS", "vector_space_exists",
    "vector_layout", "vector_write_layout", "vector_read_layout", "program_write_layout",
]


class NpuCore(wiring.Component):
    """One NPU core (``docs/npu.md``).

    Parameters
    ----------
    config : host.spec.config.NpuConfig

    Attributes
    ----------
    vec_w : ``In(stream.Signature(vector_write_layout(config)))``
        Host write of one native vector into the IVRF or an MFU VRF. With ``lanes`` l < n
        it takes ``beats`` cycles (one beat each on the write bus; ``ready`` with the
        last); a refused request is answered in one.
    vec_r_req : ``In(stream.Signature(vector_read_layout(config)))``,
    vec_r_resp : ``Out(stream.Signature(vector_layout(config)))``
        Host read of one native vector (an all-zero vector for a refused request).
    mrf_w : ``In(stream.Signature(hw.mvm.mvm.mrf_word_layout(config.mvm)))``
        One packed MRF word (``host.numerics.bfp.pack`` of a tile row) at ``engine, row, slot``.
    w_rows : ``In(stream.Signature(hw.mvm.mvm.weight_row_layout(config.mvm)))``
        One FP16 tile row quantized on chip into the MRF.
    mrf_r_req : ``In(stream.Signature(hw.mvm.mvm.mrf_address_layout(config.mvm)))``,
    mrf_r_resp : ``Out(stream.Signature(block_layout(n, m_w)))``
        MRF read-back (all-zero word for a refused request).
    prog_w : ``In(stream.Signature(program_write_layout(config)))``
        One program word; a write at address 0 starts a new program (its length is one
        more than the highest address written since).
    inq : ``In(stream.Signature(vector_layout(config)))``
        Network input queue push; always ready, a push into a full queue is refused.
    outq : ``Out(stream.Signature(vector_layout(config)))``
        Network output queue pop.
    run : ``In(1)``
        Start the program at instruction 0 (ignored while busy).
    busy : ``Out(1)``, done : ``Out(1)``
        ``busy`` while a program runs; ``done`` from its end (``end`` reached or an
        error) to the next ``run``.
    error : ``Out(ErrorCode)``
        Sticky error of the runs (the first since the last ``error_clear``); a run does
        not start while it is set.
    access_error : ``Out(ErrorCode)``
        Sticky error of refused host requests (the first since the last ``error_clear``).
    error_clear : ``In(1)``
        Clears ``error`` and ``access_error``.
    pc : ``Out(PROGRAM_ADDR_BITS + 1)``
        After a run: index of the ``end`` reached or of the failing instruction.
    cycles : ``Out(32)``
        Clock cycles of the last run, from ``run`` to ``done``.
    inq_level, outq_level : ``Out(range(netq_depth + 1))``
    vector_saturations, vector_nonfinite, weight_saturations, weight_nonfinite,
    narrow_events, output_saturations : ``Out(counter_bits)``
        The MVM's counters.
    mfu_overflow, mfu_nan_created : ``Out(ArrayLayout(unsigned(counter_bits), mfus))``
        Every MFU's counters.
    counters_clear : ``In(1)``
    soft_reset : ``In(1)``
        Everything but the memory contents to its power-on state: run stopped, queues
        empty, program length 0, counters and errors zero.

    Host requests other than ``inq``/``outq`` wait while a program runs, and in the
    cycle of ``run``.

    Raises
    ------
    TypeError
        ``config`` is not an :class:`host.spec.config.NpuConfig`.
    """

    def __init__(self, config):
        config = checked_config(self, config)
        self._config = c = config
        mvm = c.mvm
        cb = c.counter_bits
        counters = data.ArrayLayout(unsigned(cb), c.mfus)
        sig = {
            "vec_w": In(stream.Signature(vector_write_layout(c))),
            "vec_r_req": In(stream.Signature(vector_read_layout(c))),
            "vec_r_resp": Out(stream.Signature(vector_layout(c))),
            "mrf_w": In(stream.Signature(mrf_word_layout(mvm))),
            "w_rows": In(stream.Signature(weight_row_layout(mvm))),
            "mrf_r_req": In(stream.Signature(mrf_address_layout(mvm))),
            "mrf_r_resp": Out(stream.Signature(block_layout(c.n, c.mantissa_bits_w))),
            "prog_w": In(stream.Signature(program_write_layout(c))),
            "inq": In(stream.Signature(vector_layout(c))),
            "outq": Out(stream.Signature(vector_layout(c))),
            "run": In(1),
            "busy": Out(1),
            "done": Out(1),
            "error": Out(ErrorCode),
            "access_error": Out(ErrorCode),
            "error_clear": In(1),
            "pc": Out(PROGRAM_ADDR_BITS + 1),
            "cycles": Out(32),
            "inq_level": Out(range(c.netq_depth + 1)),
            "outq_level": Out(range(c.netq_depth + 1)),
            "mfu_overflow": Out(counters),
            "mfu_nan_created": Out(counters),
            "counters_clear": In(1),
            "soft_reset": In(1),
        }
        for name in MVM_COUNTERS:
            sig[name] = Out(cb)
        super().__init__(sig)

    @property
    def config(self):
        return self._config

    def elaborate(self, platform):
        m = Module()
        core = Module()
        self._build(core)
        # Soft reset: every register of the core (and of the MVM and MFUs) to its
        # power-on value; memory contents are not registers and stay. The core runs in
        # a domain of its own, the sync clock with a reset that is the sync reset or
        # the soft reset, one net that on the ECP5 goes on a global line (hw.ecp5: it
        # reaches the LSR of thousands of flip-flops).
        reset = Signal()
        m.d.comb += reset.eq(ResetSignal("sync", allow_reset_less=True) | self.soft_reset)
        m.domains.core = cd_core = ClockDomain("core", local=True)
        m.d.comb += [cd_core.clk.eq(ClockSignal("sync")),
                     cd_core.rst.eq(global_buffer(m, platform, reset, name="reset_buffer"))]
        m.submodules.core = DomainRenamer("core")(core)
        return m

    # =================================================================================
    def _build(self, m):
        c = self._config
        mcfg = c.mfu
        vec = vector_layout(c)
        beats = c.beats               # beats of a native vector on the MFU side
        vrfs = 2 * c.mfus

        m.submodules.mvm = mvm = Mvm(c.mvm)
        m.submodules.mfu = mfu = MfuPipeline(mcfg)

        # --- counters -------------------------------------------------------------
        for name in MVM_COUNTERS:
            m.d.comb += getattr(self, name).eq(getattr(mvm, name))
        m.d.comb += [
            self.mfu_overflow.eq(mfu.overflow), self.mfu_nan_created.eq(mfu.nan_created),
            mvm.clear.eq(self.counters_clear), mfu.clear.eq(self.counters_clear),
        ]

        # --- run state shared by the parts ------------------------------------------
        m.submodules.front_end = fe = FrontEnd(c)
        running = fe.running          # a program runs (front end not idle)
        be_idle = Signal()            # the back end holds no chain and no instance

        # --- memories ---------------------------------------------------------------
        # Each word with its checks (WordCheck: decoded when the host writes it, so the
        # fetched word needs no decoder logic before the front end's decisions).
        program = Memory(shape=STORED_WORD_LAYOUT, depth=c.program_depth, init=[])
        m.submodules.program = program
        prog_wp = program.write_port()
        prog_rp = program.read_port(domain="sync", transparent_for=())

        # The vector memories (hw.core.memories): the IVRF and the VRF copies, with one
        # read (the reader's while a program runs, else the host's) and the write bus (the
        # writer's, else the host's) into them.
        m.submodules.memories = mems = VectorMemories(c)
        rd, wr = mems.rd, mems.wr
        # The MFU VRFs (inside the pipeline) get every VRF write too, at the beat address.
        vw = data.View(vrf_write_layout(mcfg), mfu.vrf_w.payload)
        m.d.comb += [
            mfu.vrf_w.valid.eq(wr.en & (wr.space >= 2) & (wr.space < 2 + vrfs)),
            vw.mfu.eq((wr.space - 2) >> 1),
            vw.bank.eq(wr.space[0]),
            vw.addr.eq(wr.addr if beats == 1 else Cat(wr.beat, wr.addr)),
            vw.values.eq(wr.data),
        ]

        # --- network queues ---------------------------------------------------------
        m.submodules.inq_fifo = inq = fifo.SyncFIFOBuffered(width=vec.size,
                                                             depth=c.netq_depth)
        m.submodules.outq_fifo = outq = fifo.SyncFIFOBuffered(width=vec.size,
                                                              depth=c.netq_depth)
        m.d.comb += [
            self.inq_level.eq(inq.level), self.outq_level.eq(outq.level),
            self.outq.valid.eq(outq.r_rdy), self.outq.payload.eq(outq.r_data),
            outq.r_en.eq(self.outq.ready),
            inq.w_data.eq(self.inq.payload),
            inq.w_en.eq(self.inq.valid),
            self.inq.ready.eq(1),
        ]
        # Vectors queued and not claimed by a checked chain; room not claimed.
        inq_free = Signal(range(c.netq_depth + 1))
        outq_room = Signal(range(c.netq_depth + 1), init=c.netq_depth)
        inq_claim, outq_claim = fe.inq_claim, fe.outq_claim   # by a chain handed off
        pushed = self.inq.valid & inq.w_rdy
        popped = self.outq.valid & self.outq.ready
        m.d.sync += [inq_free.eq(inq_free + pushed - inq_claim),
                     outq_room.eq(outq_room + popped - outq_claim)]

        # --- errors -----------------------------------------------------------------
        access_err = Signal(ErrorCode)
        access_set = Signal(ErrorCode)
        with m.If(access_set != ErrorCode.NONE):
            with m.If(self.error_clear | (access_err == ErrorCode.NONE)):
                m.d.sync += access_err.eq(access_set)
        with m.Elif(self.error_clear):
            m.d.sync += access_err.eq(ErrorCode.NONE)
        m.d.comb += self.access_error.eq(access_err)
        with m.If(self.inq.valid & ~inq.w_rdy):
            m.d.comb += access_set.eq(ErrorCode.QUEUE_OVERFLOW)

        # =============================================================================
        # Host access (hw.core.host_access): memories, MRF and program, checked, only
        # while no program runs
        # =============================================================================
        m.submodules.host_access = host = HostAccess(c)
        for name in ("vec_w", "vec_r_req", "mrf_w", "w_rows", "mrf_r_req", "prog_w"):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(host, name))
        for name in ("vec_r_resp", "mrf_r_resp"):
            wiring.connect(m, getattr(host, name), wiring.flipped(getattr(self, name)))
        wiring.connect(m, host.mvm_mrf_w, mvm.mrf_w)
        wiring.connect(m, host.mvm_w_rows, mvm.w_stream)
        wiring.connect(m, host.mvm_mrf_r_req, mvm.mrf_r_req)
        wiring.connect(m, mvm.mrf_r_resp, host.mvm_mrf_r_resp)
        prog = host.prog
        # Host requests wait in the cycle of `run` too, so the front end's choice of its
        # first read address needs no term of a program write in that cycle (issue 36,
        # timing: the link's write request through the address compares into the
        # program memory's read address was the board's critical path, 63.00 MHz).
        m.d.comb += [host.open.eq(~running & ~self.run), host.rd_data.eq(mems.rd_data),
                     prog_wp.en.eq(prog.en), prog_wp.addr.eq(prog.addr),
                     prog_wp.data.eq(prog.data)]
        with m.If(host.access_set != ErrorCode.NONE):
            m.d.comb += access_set.eq(host.access_set)

        # =============================================================================
        # Front end (hw.core.front_end): fetch, decode, scalar registers, chain parse
        # and check, and the hand-off of each checked chain
        # =============================================================================
        m.d.comb += [
            fe.run.eq(self.run), fe.error_clear.eq(self.error_clear),
            prog_rp.en.eq(1), prog_rp.addr.eq(fe.prog_addr), fe.prog_data.eq(prog_rp.data),
            fe.prog_w.eq(prog), fe.prog_len.eq(host.prog_len),
            fe.inq_free.eq(inq_free), fe.outq_room.eq(outq_room),
            fe.inq_pushed.eq(pushed), fe.outq_popped.eq(popped),
            fe.be_idle.eq(be_idle),
            self.busy.eq(running), self.done.eq(fe.done), self.error.eq(fe.error),
            self.pc.eq(fe.pc), self.cycles.eq(fe.cycles),
        ]

        # =============================================================================
        # Issuer (hw.core.issuer): one instance per iteration, when its reads are clear
        # of the writes of the instances in flight
        # =============================================================================
        m.submodules.issuer = issuer = Issuer(c)
        wiring.connect(m, fe.chains, issuer.chains)
        # The units' `busy` (each an OR over its unit) is registered before the drain
        # reads it: it crossed the die into the front end's state, the core's critical
        # path (docs/npu.md section 6). Safe because neither unit can turn busy again
        # while the issuer is idle: everything reaches a unit through an instance in
        # flight, and host requests wait while a program runs. No reset: the flop only
        # follows the units, and Yosys 0.70's ABC9 failed an assertion on the form with
        # one (docs/notes/2026-11-28-core-timing-closure.md, section 12).
        units_busy = Signal(reset_less=True)
        m.d.sync += units_busy.eq(mvm.busy | mfu.busy)
        m.d.comb += be_idle.eq(issuer.idle & ~units_busy)
        wiring.connect(m, issuer.mvm, mvm.cmd)

        # =============================================================================
        # Reader (hw.core.reader): the source vectors of each instance (input queue or a
        # vector memory), window by window, into the MVM's buffer or the direct buffer
        # =============================================================================
        m.submodules.reader = reader = Reader(c)
        wiring.connect(m, issuer.reader, reader.instances)
        m.d.comb += [reader.inq.valid.eq(inq.r_rdy), reader.inq.payload.eq(inq.r_data),
                     inq.r_en.eq(reader.inq.ready)]
        for key in memory_spaces(c):
            m.d.comb += getattr(reader, f"{key}_data").eq(getattr(mems, f"{key}_data"))
        m.d.comb += rd.eq(reader.rd)
        wiring.connect(m, reader.x_stream, mvm.x_stream)

        # Host memory access shares the ports while no program runs.
        with m.If(~running):
            m.d.comb += [rd.eq(host.rd), wr.eq(host.wr)]

        # =============================================================================
        # Feeder (hw.core.feeder): each instance's chain configuration, then its L
        # vectors (MVM results or source vectors) into the MFU pipeline
        # =============================================================================
        m.submodules.feeder = feeder = Feeder(c)
        wiring.connect(m, issuer.feeder, feeder.instances)
        wiring.connect(m, reader.direct, feeder.direct)
        wiring.connect(m, mvm.y_stream, feeder.products)
        wiring.connect(m, feeder.chain, mfu.chain)
        wiring.connect(m, feeder.o_stream, mfu.i_stream)

        # =============================================================================
        # Writer (hw.core.writer): every result vector to each destination of its chain,
        # in order; it has the write bus over the host (the host writes only while no
        # program runs)
        # =============================================================================
        m.submodules.writer = writer = Writer(c)
        wiring.connect(m, issuer.writer, writer.instances)
        m.d.comb += [outq.w_en.eq(writer.outq_push), outq.w_data.eq(writer.outq_data)]
        wiring.connect(m, mfu.o_stream, writer.results)
        with m.If(writer.wr.en):
            m.d.comb += wr.eq(writer.wr)
