"""The NPU core: program memory, decoder and chain checker, scheduler, vector memories,
network queues, the MVM (:class:`hw.mvm.mvm.Mvm`) and the MFU pipeline
(:class:`hw.mfu.mfu.MfuPipeline`).

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
    Cat, ClockDomain, ClockSignal, DomainRenamer, Module, Mux, ResetSignal, Signal,
    unsigned,
)
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from host.spec.formats import block_layout
from host.spec.isa import (
    MAX_WRITES, REG_DEFAULTS, ErrorCode, Reg, Space, register_limits,
)
from host.spec.mfu import UNITS, MfuUnit, mfu_layout, vrf_write_layout
from host.spec.counters import MVM_COUNTERS

from hw.mfu.mfu import MfuPipeline
from hw.mvm.mvm import Mvm, mrf_address_layout, mrf_word_layout, weight_row_layout
from hw.core.decode import (
    PREDECODE_LAYOUT, FetchedTerms, InstructionDecoder, built_vrfs, verdict_error, vrf_space,
)
from hw.core.vectors import checked_config, vector_layout
from hw.core.feeder import Feeder
from hw.core.host_access import (
    HOST_ADDR_BITS, PROGRAM_ADDR_BITS, HostAccess, program_write_layout, vector_read_layout,
    vector_space_depth, vector_space_exists, vector_write_layout,
)
from hw.core.hazard import HazardWalk, pair_keys
from hw.core.issuer import Issuer, checked_chain_layout
from hw.core.memories import VectorMemories
from hw.core.plan import PLAN_REGISTERS, PlanCheck, parsed_chain_layout
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

    Host requests other than ``inq``/``outq`` wait while a program runs.

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
        n = c.n
        mcfg = c.mfu
        vec = vector_layout(c)
        beats = c.beats               # beats of a native vector on the MFU side
        vrfs = 2 * c.mfus
        # The VRFs (index 2m + bank) that the unit sets build: every one without them.
        vrf_built = built_vrfs(c)

        m.submodules.mvm = mvm = Mvm(c.mvm)
        m.submodules.mfu = mfu = MfuPipeline(mcfg)
        # The fetched word's fields (its error code is the one stored with it: WordCheck).
        m.submodules.decoder = dec = InstructionDecoder()

        # --- counters -------------------------------------------------------------
        for name in MVM_COUNTERS:
            m.d.comb += getattr(self, name).eq(getattr(mvm, name))
        m.d.comb += [
            self.mfu_overflow.eq(mfu.overflow), self.mfu_nan_created.eq(mfu.nan_created),
            mvm.clear.eq(self.counters_clear), mfu.clear.eq(self.counters_clear),
        ]

        # --- run state shared by the parts ------------------------------------------
        running = Signal()            # a program runs (front end not idle)
        be_idle = Signal()            # the back end holds no chain and no instance

        # --- memories ---------------------------------------------------------------
        # Each word with its checks (WordCheck: decoded when the host writes it, so the
        # fetched word needs no decoder logic before the front end's decisions).
        program = Memory(shape=64 + PREDECODE_LAYOUT.size, depth=c.program_depth, init=[])
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

        def space_exists(space):
            return vector_space_exists(c, space)

        def space_depth(space):
            return vector_space_depth(c, space)

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
        inq_claim = Signal(range(c.netq_depth + 1))
        outq_claim = Signal(range(c.netq_depth + 1))
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
        prog_len = host.prog_len
        m.d.comb += [host.open.eq(~running), host.rd_data.eq(mems.rd_data),
                     prog_wp.en.eq(prog.en), prog_wp.addr.eq(prog.addr),
                     prog_wp.data.eq(prog.data)]
        with m.If(host.access_set != ErrorCode.NONE):
            m.d.comb += access_set.eq(host.access_set)

        # =============================================================================
        # Front end: fetch, decode, scalar registers, chain parse and check
        # =============================================================================
        regs = {}
        limits = register_limits(c)
        for reg in Reg:
            hi = limits[reg][1]
            init = REG_DEFAULTS[reg]
            regs[reg] = Signal(range(hi + 1), name=f"reg_{reg.name.lower()}",
                               init=n if init is None else init)

        pc = Signal(PROGRAM_ADDR_BITS + 1)
        err_code = Signal(ErrorCode)      # the run's error, set at the end of the run
        pend_code = Signal(ErrorCode)     # an error found, waiting for the back end
        pend_index = Signal(PROGRAM_ADDR_BITS + 1)
        done = Signal()
        cycles = Signal(32)
        m.d.comb += [self.error.eq(err_code), self.pc.eq(pend_index), self.done.eq(done),
                     self.cycles.eq(cycles), self.busy.eq(running)]
        with m.If(self.error_clear):
            m.d.sync += err_code.eq(ErrorCode.NONE)

        # Fetch. The program memory's output is registered (iw) before the decoder, so
        # that the block RAM's clock-to-output delay and the decoder and the front end's
        # decisions are in different cycles (issue 36, timing). The read runs a cycle
        # further ahead instead, independent of the word decoded: pc + 2 in EXEC and
        # CHAIN, which take one instruction per cycle (each cycle either consumes the
        # one at pc or leaves for DRAIN); pc from CHECK on, and pc + 1 in the cycle
        # HANDOFF hands off, so EXEC finds the instruction at pc in iw and the next one
        # in the read port, as the unregistered read had them. A run goes to EXEC at
        # once when the cycle before its `run` pulse read address 0 (IDLE and DRAIN
        # read it) and wrote nothing there, and no write to address 1 comes with the
        # pulse: iw then holds word 0 and the pulse's cycle reads word 1, each with the
        # writes the unregistered read saw. Otherwise (a run right after a reset, a
        # refused run or such a write) FETCH reads them as before: one cycle more.
        advance = Signal()                # the instruction at pc is consumed
        iw = Signal(len(prog_rp.data))
        m.d.sync += iw.eq(prog_rp.data)
        # The terms of iw's word that the decisions below test (its opcode's class, its
        # verdict, its unit's one-hot), registered from the same read data as iw: the
        # compares are then not in front of CHAIN's MFU allocation (issue 36, timing).
        # Each flag of an opcode is set for a legal word only, so EXEC and CHAIN test
        # them before `word` (illegal), in an order that changes no decision.
        m.submodules.fetched = fetched = FetchedTerms()
        m.d.comb += fetched.stored.eq(prog_rp.data)
        word = fetched.terms
        m.d.comb += [prog_rp.en.eq(1), dec.word.eq(iw[:64]), prog_rp.addr.eq(pc)]
        # The word's checks as stored (hw.core.decode.PREDECODE_LAYOUT).
        checked = data.View(PREDECODE_LAYOUT, iw[64:])
        word_error = verdict_error(m, checked.verdict)
        read0 = Signal()                  # this cycle reads address 0 (IDLE, DRAIN)
        fetched0 = Signal()               # and the last did, with no write there
        m.d.sync += fetched0.eq(read0 & ~(prog.en & (prog.addr == 0)))
        write1 = prog.en & (prog.addr == 1)
        # pc_out is `pc >= prog_len`, registered: the compare runs on this cycle's pc + 1
        # and the late `advance` only selects it, so the carry chain is not in front of
        # EXEC's and CHAIN's decisions (issue 36, timing). prog_len changes only on host
        # writes, which a run refuses (HostAccess.open); the run's start sets the flag from the
        # length that cycle's write (if any) leaves, and EXEC and CHAIN read it only
        # within the run.
        pc_out = Signal()
        with m.If(advance):
            m.d.sync += [pc.eq(pc + 1), pc_out.eq(pc + 1 >= prog_len)]

        # Chain being parsed (hw.core.plan.parsed_chain_layout), and its MFU allocation.
        chain = Signal(parsed_chain_layout(c))
        at = chain.at                               # index of its v_rd
        rd_space, rd_op, rd_inc = chain.rd_space, chain.rd_op, chain.rd_inc
        has_mv, mv_op, mv_inc = chain.has_mv, chain.mv_op, chain.mv_inc
        vv_used = chain.vv_used
        vv_op = [chain.vv_op[k] for k in range(vrfs)]
        vv_inc = [chain.vv_inc[k] for k in range(vrfs)]
        n_wr = chain.n_wr
        w_space = [chain.w_space[k] for k in range(MAX_WRITES)]
        w_op = [chain.w_op[k] for k in range(MAX_WRITES)]
        w_inc = [chain.w_inc[k] for k in range(MAX_WRITES)]
        w_at = [chain.w_at[k] for k in range(MAX_WRITES)]
        n_ops = Signal(range(4 * c.mfus + 2))
        cur_m = Signal(range(c.mfus))
        used = [Signal(4, name=f"alloc_used{k}") for k in range(c.mfus)]
        slots = [Signal(3, name=f"alloc_slots{k}") for k in range(c.mfus)]
        alloc_fail = Signal()
        unbuilt = Signal()
        unbuilt_at = Signal(PROGRAM_ADDR_BITS + 1)
        mcfg_regs = Signal(data.ArrayLayout(mfu_layout(mcfg), c.mfus))

        # The plan checks and the chain's sizes (hw.core.plan): registered terms, final
        # by CHECK.
        m.submodules.plan = plan = PlanCheck(c)
        m.d.comb += [plan.chain.eq(chain), plan.inq_free.eq(inq_free),
                     plan.outq_room.eq(outq_room)]
        m.d.comb += [getattr(plan.regs, name).eq(regs[reg])
                     for name, reg in PLAN_REGISTERS.items()]
        iters = regs[Reg.ITERATIONS]
        win_w, win_h, pitch = regs[Reg.WIN_W], regs[Reg.WIN_H], regs[Reg.WIN_PITCH]
        length, last_iter = plan.length, plan.last_iter

        # The hazard walk (hw.core.hazard): the chain's ranges, each final by CHECK.
        ranges = {("r",): (~has_mv & (rd_space != Space.NETQ), rd_space, rd_op, rd_inc,
                           plan.rd_prod)}
        for k in range(MAX_WRITES):
            ranges[("w", k)] = ((k < n_wr) & (w_space[k] != Space.NETQ), w_space[k],
                                w_op[k], w_inc[k], plan.w_prod[k])
        for k in vrf_built:
            ranges[("v", k)] = (vv_used[k], vrf_space(k), vv_op[k], vv_inc[k],
                                plan.vv_prod[k])
        m.submodules.hazard_walk = walk = HazardWalk(c)
        for port, key in zip(walk.ranges, pair_keys(c), strict=True):
            r_used, r_space, r_start, r_inc, r_prod = ranges[key]
            m.d.comb += [port.used.eq(r_used), port.space.eq(r_space),
                         port.start.eq(r_start), port.inc.eq(r_inc), port.prod.eq(r_prod)]
        m.d.comb += [walk.length.eq(length), walk.last_iter.eq(last_iter)]

        # Hand-off register: a checked chain for the issuer.
        desc_valid = Signal()
        desc = Signal(checked_chain_layout(c))
        desc_take = Signal()

        fe_fail = Signal()
        fail_code = Signal(ErrorCode)
        fail_at = Signal(PROGRAM_ADDR_BITS + 1)
        with m.If(fe_fail):
            m.d.sync += [pend_code.eq(fail_code), pend_index.eq(fail_at)]

        with m.If(running):
            m.d.sync += cycles.eq(cycles + 1)

        func = dec.func
        with m.FSM(name="fe"):
            with m.State("IDLE"):
                with m.If(self.run):
                    m.d.sync += [done.eq(0), cycles.eq(1)]
                    with m.If(err_code != ErrorCode.NONE):
                        m.d.sync += [done.eq(1), pend_index.eq(0), cycles.eq(0)]
                        m.d.comb += [prog_rp.addr.eq(0), read0.eq(1)]
                    with m.Else():
                        m.d.sync += [running.eq(1), pc.eq(0),
                                     pc_out.eq((prog_len == 0) & ~prog.en)]
                        for reg in Reg:
                            m.d.sync += regs[reg].eq(regs[reg].init)
                        with m.If(fetched0 & ~write1):
                            m.d.comb += prog_rp.addr.eq(1)
                            m.next = "EXEC"
                        with m.Else():
                            m.d.comb += prog_rp.addr.eq(0)
                            m.next = "FETCH"
                with m.Else():
                    m.d.comb += [prog_rp.addr.eq(0), read0.eq(1)]
            with m.State("FETCH"):
                m.d.comb += prog_rp.addr.eq(1)
                m.next = "EXEC"
            with m.State("EXEC"):
                m.d.comb += prog_rp.addr.eq(pc + 2)
                with m.If(pc_out):
                    m.d.comb += [fe_fail.eq(1), fail_code.eq(ErrorCode.PROGRAM_RANGE),
                                 fail_at.eq(pc)]
                    m.next = "DRAIN"
                with m.Elif(word.end):
                    m.d.sync += [pend_code.eq(ErrorCode.NONE), pend_index.eq(pc)]
                    m.next = "DRAIN"
                with m.Elif(word.s_wr):
                    with m.If(checked.s_wr_out_of_range):
                        m.d.comb += [fe_fail.eq(1), fail_code.eq(ErrorCode.REGISTER_VALUE),
                                     fail_at.eq(pc)]
                        m.next = "DRAIN"
                    with m.Else():
                        m.d.comb += advance.eq(1)
                        with m.Switch(func):
                            for reg in Reg:
                                with m.Case(reg.value):
                                    m.d.sync += regs[reg].eq(dec.operand)
                with m.Elif(word.v_rd):
                    m.d.comb += advance.eq(1)
                    m.d.sync += [
                        at.eq(pc), rd_space.eq(dec.space), rd_op.eq(dec.operand),
                        rd_inc.eq(dec.inc), has_mv.eq(0), n_ops.eq(0), cur_m.eq(0),
                        alloc_fail.eq(0), unbuilt.eq(0), vv_used.eq(0), n_wr.eq(0),
                        mcfg_regs.eq(0),
                    ]
                    m.d.sync += [u.eq(0) for u in used] + [s.eq(0) for s in slots]
                    m.next = "CHAIN"
                with m.Elif(word.illegal):
                    m.d.comb += [fe_fail.eq(1), fail_code.eq(word_error), fail_at.eq(pc)]
                    m.next = "DRAIN"
                with m.Else():
                    m.d.comb += [fe_fail.eq(1), fail_code.eq(ErrorCode.CHAIN_STRUCTURE),
                                 fail_at.eq(pc)]
                    m.next = "DRAIN"
            with m.State("CHAIN"):
                m.d.comb += prog_rp.addr.eq(pc + 2)
                structure = Signal()
                with m.If(pc_out):
                    m.d.comb += [fe_fail.eq(1), fail_code.eq(ErrorCode.PROGRAM_RANGE),
                                 fail_at.eq(pc)]
                    m.next = "DRAIN"
                with m.Elif(word.mfu_op):
                    with m.If(n_wr != 0):
                        m.d.comb += structure.eq(1)
                    with m.Else():
                        m.d.comb += advance.eq(1)
                        m.d.sync += n_ops.eq(n_ops + 1)
                        self._allocate(m, c, dec, checked, word.unit_bit, pc, cur_m, used,
                                       slots, alloc_fail, unbuilt, unbuilt_at, mcfg_regs,
                                       vv_used, vv_op, vv_inc)
                with m.Elif(word.mv_mul):
                    with m.If(has_mv | (n_ops != 0) | (n_wr != 0)):
                        m.d.comb += structure.eq(1)
                    with m.Else():
                        m.d.comb += advance.eq(1)
                        m.d.sync += [has_mv.eq(1), mv_op.eq(dec.operand), mv_inc.eq(dec.inc)]
                with m.Elif(word.v_wr):
                    with m.If(n_wr == MAX_WRITES):
                        m.d.comb += structure.eq(1)
                    with m.Else():
                        m.d.comb += advance.eq(1)
                        m.d.sync += n_wr.eq(n_wr + 1)
                        for k in range(MAX_WRITES):
                            with m.If(n_wr == k):
                                m.d.sync += [w_space[k].eq(dec.space), w_op[k].eq(dec.operand),
                                             w_inc[k].eq(dec.inc), w_at[k].eq(pc)]
                with m.Elif(word.end_chain):
                    with m.If(n_wr == 0):
                        m.d.comb += structure.eq(1)
                    with m.Else():
                        m.d.comb += advance.eq(1)
                        m.d.comb += walk.to_check.eq(1)
                        m.next = "CHECK"
                with m.Elif(word.illegal):
                    m.d.comb += [fe_fail.eq(1), fail_code.eq(word_error), fail_at.eq(pc)]
                    m.next = "DRAIN"
                with m.Else():
                    m.d.comb += structure.eq(1)
                with m.If(structure):
                    m.d.comb += [fe_fail.eq(1), fail_code.eq(ErrorCode.CHAIN_STRUCTURE),
                                 fail_at.eq(pc)]
                    m.next = "DRAIN"
            with m.State("CHECK"):
                # haz_mask takes the candidates whatever the checks decide (at_check): it
                # is read only in the hazard states, which only a passing CHECK enters,
                # and the checks stay off the path into it and the pick registers.
                checks = [
                    (unbuilt, ErrorCode.ILLEGAL_OPCODE, unbuilt_at),
                    (alloc_fail, ErrorCode.CHAIN_STRUCTURE, at),
                    (plan.error != ErrorCode.NONE, plan.error, plan.error_at),
                ]
                with m.If(checks[0][0]):
                    m.d.comb += [fe_fail.eq(1), fail_code.eq(checks[0][1]),
                                 fail_at.eq(checks[0][2])]
                    m.next = "DRAIN"
                for cond, code, index in checks[1:]:
                    with m.Elif(cond):
                        m.d.comb += [fe_fail.eq(1), fail_code.eq(code), fail_at.eq(index)]
                        m.next = "DRAIN"
                with m.Else():
                    m.d.comb += walk.start.eq(1)
                    m.next = "HAZARD"
            with m.State("HAZARD"):
                with m.If(walk.clear):
                    m.next = "HANDOFF"
                with m.Elif(walk.hazard):
                    m.d.comb += [fe_fail.eq(1), fail_code.eq(ErrorCode.HAZARD),
                                 fail_at.eq(at)]
                    m.next = "DRAIN"
            with m.State("HANDOFF"):
                with m.If(~desc_valid):
                    m.d.comb += prog_rp.addr.eq(pc + 1)
                    m.d.sync += desc_valid.eq(1)
                    with m.If(rd_space == Space.NETQ):
                        m.d.comb += inq_claim.eq(plan.in_need)
                    m.d.comb += outq_claim.eq(plan.pushes)
                    m.d.sync += [
                        desc.rd_space.eq(rd_space), desc.rd_addr.eq(rd_op),
                        desc.rd_inc.eq(rd_inc), desc.has_mv.eq(has_mv),
                        desc.mv_slot.eq(mv_op), desc.mv_inc.eq(mv_inc),
                        desc.pix.eq(Mux(has_mv, plan.pix, length)),
                        desc.win_w.eq(Mux(has_mv, win_w, 1)),
                        desc.win_h.eq(Mux(has_mv, win_h, 1)),
                        desc.pitch.eq(pitch), desc.lanes_cols.eq(plan.lanes_cols),
                        desc.cols.eq(plan.cols_t), desc.c_in.eq(plan.c_in),
                        desc.extent.eq(plan.extent),
                        desc.length.eq(length), desc.lanes_last.eq(plan.lanes_last),
                        desc.iters.eq(iters), desc.rounding.eq(regs[Reg.ROUNDING]),
                        desc.static.eq(regs[Reg.Q_STATIC]),
                        desc.q_exponent.eq(regs[Reg.Q_EXPONENT]),
                        desc.narrow.eq(regs[Reg.NARROW]),
                        desc.mfu.eq(mcfg_regs), desc.vv_used.eq(vv_used),
                    ]
                    for k in range(vrfs):
                        m.d.sync += desc.vv_inc[k].eq(vv_inc[k])
                    for k in range(MAX_WRITES):
                        m.d.sync += [
                            desc.w_valid[k].eq(k < n_wr), desc.w_space[k].eq(w_space[k]),
                            desc.w_addr[k].eq(w_op[k]), desc.w_inc[k].eq(w_inc[k]),
                        ]
                    m.next = "EXEC"
            with m.State("DRAIN"):
                m.d.comb += [prog_rp.addr.eq(0), read0.eq(1)]
                with m.If(be_idle & ~desc_valid):
                    m.d.sync += [running.eq(0), done.eq(1), err_code.eq(pend_code)]
                    m.next = "IDLE"

        with m.If(desc_take):
            m.d.sync += desc_valid.eq(0)

        # =============================================================================
        # Issuer (hw.core.issuer): one instance per iteration, when its reads are clear
        # of the writes of the instances in flight
        # =============================================================================
        m.submodules.issuer = issuer = Issuer(c)
        m.d.comb += [issuer.chains.valid.eq(desc_valid), issuer.chains.payload.eq(desc),
                     desc_take.eq(issuer.chains.valid & issuer.chains.ready)]
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
        with m.If(reader.rd.en):
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

    @staticmethod
    def _allocate(m, c, dec, checked, unit_bit, pc, cur_m, used, slots, alloc_fail, unbuilt,
                  unbuilt_at, mcfg_regs, vv_used, vv_op, vv_inc):
        """One op of the chain: ``host.spec.mfu.allocate``'s rule, one op per cycle. The op
        stays in the current MFU ``k`` if ``k`` builds its unit and has not used it yet;
        else it goes to the first MFU after ``k`` that builds the unit (a constant of ``k``
        and the unit, from the unit sets), and where there is none the chain fails."""
        func = dec.func
        # The op's unit and whether its function is built: decoded when the word was
        # written (hw.core.decode.WordCheck); unit_bit, its one-hot, is registered with
        # the word (FetchedTerms).
        unit = checked.unit
        with m.If(checked.unary_unbuilt & ~unbuilt):
            m.d.sync += [unbuilt.eq(1), unbuilt_at.eq(pc)]

        def is_one_of(units):
            """The op's unit is one of ``units`` (None when that is all four: always)."""
            if len(units) == UNITS:
                return None
            return (unit_bit & sum(1 << u.value for u in units)) != 0

        def unit_in(units, cond):
            """``cond`` where the op's unit is one of ``units``."""
            here = is_one_of(units)
            return cond if here is None else cond & here

        with m.If(~alloc_fail):
            for k in range(c.mfus):
                with m.If(cur_m == k):
                    clash = (used[k] & unit_bit) != 0
                    # It moves on when its unit is used here or not built here.
                    here = is_one_of(c.units(k))
                    stay = ~clash if here is None else here & ~clash
                    moves = clash if here is None else clash | ~here
                    # Each unit's MFU when it moves on: the first later one building it.
                    later = {}
                    for u in MfuUnit:
                        to = next((t for t in range(k + 1, c.mfus) if u in c.units(t)), None)
                        later.setdefault(to, []).append(u)
                    if None in later:
                        with m.If(unit_in(later.pop(None), moves)):
                            m.d.sync += alloc_fail.eq(1)
                    place_at = [(k, stay)] + [(t, unit_in(us, moves))
                                              for t, us in sorted(later.items())]
                    for t, cond in place_at:
                        with m.If(cond):
                            if t != k:
                                m.d.sync += cur_m.eq(t)
                            slot = 0 if t != k else slots[k]
                            entry = mcfg_regs[t]
                            for s in range(4):
                                if t != k:
                                    if s == 0:
                                        m.d.sync += [entry.order[s].unit.eq(unit),
                                                     entry.order[s].used.eq(1)]
                                    continue
                                with m.If(slot == s):
                                    m.d.sync += [entry.order[s].unit.eq(unit),
                                                 entry.order[s].used.eq(1)]
                            m.d.sync += [used[t].eq((used[t] if t == k else 0) | unit_bit),
                                         slots[t].eq(slot + 1)]
                            units_t = c.units(t)
                            with m.Switch(unit):
                                if MfuUnit.ADDSUB in units_t:
                                    with m.Case(MfuUnit.ADDSUB):
                                        m.d.sync += [entry.addsub_op.eq(func),
                                                     entry.addsub_addr.eq(dec.operand),
                                                     vv_used[2 * t].eq(1),
                                                     vv_op[2 * t].eq(dec.operand),
                                                     vv_inc[2 * t].eq(dec.inc)]
                                if MfuUnit.MUL in units_t:
                                    with m.Case(MfuUnit.MUL):
                                        m.d.sync += [entry.mul_addr.eq(dec.operand),
                                                     vv_used[2 * t + 1].eq(1),
                                                     vv_op[2 * t + 1].eq(dec.operand),
                                                     vv_inc[2 * t + 1].eq(dec.inc)]
                                if MfuUnit.ACT in units_t:
                                    with m.Case(MfuUnit.ACT):
                                        m.d.sync += entry.act_op.eq(func)
                                if MfuUnit.REDUCE in units_t:
                                    with m.Case(MfuUnit.REDUCE):
                                        m.d.sync += entry.reduce_op.eq(func)
