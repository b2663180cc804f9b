"""The NPU core's front end (``docs/npu.md`` section 2): fetch and decode, the scalar
registers, the chain parse with its MFU allocation, the plan checks
(:class:`hw.core.plan.PlanCheck`) and the hazard walk (:class:`hw.core.hazard.HazardWalk`),
and the hand-off of each checked chain to the issuer.

One instruction per cycle from ``EXEC`` and ``CHAIN``; a chain is checked in ``CHECK``
and ``HAZARD`` and handed off in ``HANDOFF``; an error or ``end`` waits in ``DRAIN`` for
the back end to empty, and the run ends there with ``done``.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from host.spec.config import NpuConfig
from host.spec.isa import MAX_WRITES, REG_DEFAULTS, ErrorCode, Reg, Space, register_limits
from host.spec.mfu import UNITS, MfuUnit, mfu_layout
from hw.core.decode import (
    STORED_WORD_LAYOUT,
    built_vrfs,
    unit_of,
    vrf_space,
    word_error,
)
from hw.core.hazard import HazardWalk, pair_keys
from hw.core.host_access import PROGRAM_ADDR_BITS, program_port_layout
from hw.core.issuer import checked_chain_layout, vrf_base
from hw.core.plan import PLAN_REGISTERS, PlanCheck, parsed_chain_layout
from hw.core.vectors import checked_config

__all__ = ["FrontEnd"]


class FrontEnd(wiring.Component):
    """The front end of an NPU core: it runs the program's scalar instructions and hands
    the issuer one checked chain at a time.

    Parameters
    ----------
    config : host.spec.config.NpuConfig

    Attributes
    ----------
    run : ``In(1)``
        Start the program at instruction 0 (ignored unless idle).
    error_clear : ``In(1)``
        Clears ``error``.
    prog_addr : ``Out(ceil_log2(program_depth))``
        The program memory's read address.
    prog_data : ``In(hw.core.decode.STORED_WORD_LAYOUT)``
        Its read data, the word at the address of the cycle before (a registered read,
        not transparent): the word's fields and its checks.
    prog_w : ``In(hw.core.host_access.program_port_layout(config))``
        The host's write of the program memory this cycle; never in the cycle of
        ``run`` (the core's host requests wait then). A run starts with no fetch cycle
        only when the cycle before did not write the first word.
    prog_len : ``In(range(program_depth + 1))``
        The program's length; fetching at or beyond it is PROGRAM_RANGE.
    inq_free, outq_room : ``In(range(netq_depth + 1))``
        Input-queue vectors and output-queue room not claimed by a chain handed off.
    inq_pushed, outq_popped : ``In(1)``
        A vector pushed onto the input queue, popped off the output queue, this cycle.
    inq_claim, outq_claim : ``Out(range(netq_depth + 1))``
        What the chain handed off this cycle claims of them.
    be_idle : ``In(1)``
        The back end holds no chain and no instance (the run ends only then).
    chains : ``Out(stream.Signature(hw.core.issuer.checked_chain_layout(config)))``
        The checked chains, in program order.
    running : ``Out(1)``
        A program runs: from ``run`` until ``done``.
    done : ``Out(1)``, error : ``Out(ErrorCode)``, pc : ``Out(PROGRAM_ADDR_BITS + 1)``,
    cycles : ``Out(32)``
        The core's ports of the same names (:class:`hw.core.npu.NpuCore`).

    Raises
    ------
    TypeError
        ``config`` is not an :class:`host.spec.config.NpuConfig`.
    """

    def __init__(self, config: NpuConfig):
        self._config = c = checked_config(self, config)
        queue = range(c.netq_depth + 1)
        super().__init__({
            "run": In(1),
            "error_clear": In(1),
            "prog_addr": Out(ceil_log2(c.program_depth)),
            "prog_data": In(STORED_WORD_LAYOUT),
            "prog_w": In(program_port_layout(c)),
            "prog_len": In(range(c.program_depth + 1)),
            "inq_free": In(queue),
            "outq_room": In(queue),
            "inq_pushed": In(1),
            "outq_popped": In(1),
            "inq_claim": Out(queue),
            "outq_claim": Out(queue),
            "be_idle": In(1),
            "chains": Out(stream.Signature(checked_chain_layout(c))),
            "running": Out(1),
            "done": Out(1),
            "error": Out(ErrorCode),
            "pc": Out(PROGRAM_ADDR_BITS + 1),
            "cycles": Out(32),
        })

    @property
    def config(self):
        return self._config

    def elaborate(self, platform):
        m = Module()
        c = self._config
        n = c.n
        mcfg = c.mfu
        vrfs = 2 * c.mfus
        # The VRFs (index 2m + bank) that the unit sets build: every one without them.
        vrf_built = built_vrfs(c)
        running = self.running
        prog_addr = self.prog_addr

        # The scalar registers, at their defaults when a run starts.
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
        # A hazard the walk found is flagged here (HAZARD) and moved into pend_code and
        # pend_index by DRAIN, which always follows: the walk's answer then reaches one
        # flip-flop, not the failure's code and index multiplexers (timing closure: with
        # them it ended the core's critical path, 66.7 MHz). `pc` and the run's error
        # read through the flag, so every output has the value of every cycle it had.
        hz_fail = Signal()
        # The same for the plan's last check, the vector ranges (PlanCheck.range_error):
        # CHECK passes to HAZARD whatever it says and sets this flag from it, and HAZARD
        # with the flag set drops the walk and is the first cycle of DRAIN, which moves
        # the flag into pend_code and pend_index (timing closure: the check's compares,
        # final only in CHECK, through the code and index multiplexers into pend_code,
        # were the board's critical path, 70.97 MHz).
        rg_fail = Signal()
        m.d.comb += [self.error.eq(err_code), self.done.eq(done), self.cycles.eq(cycles)]
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
        # read it) and wrote nothing there (no write comes with the pulse: prog_w): iw
        # then holds word 0 and the pulse's cycle reads word 1, each with the writes the
        # unregistered read saw. Otherwise (a run right after a reset, a refused run or
        # such a write) FETCH reads them as before: one cycle more.
        advance = Signal()                # the instruction at pc is consumed
        # The fetched word's fields and checks (hw.core.decode.STORED_WORD_LAYOUT: its error
        # code is the one stored with it, WordCheck's), and the terms
        # the decisions below test (its opcode's class, whether it is legal, its unit's
        # one-hot), stored with it: they come from iw's flip-flops, with no compare after
        # the block RAM's read (issue 36, timing: the read through the terms' decode
        # was the core alone's critical path at seed 2, 73.76 MHz). Each flag of an
        # opcode is set for a legal word only, so EXEC and CHAIN test them before
        # `illegal`, in an order that changes no decision.
        iw = Signal(STORED_WORD_LAYOUT)
        m.d.sync += iw.eq(self.prog_data)
        m.d.comb += prog_addr.eq(pc)
        checked = iw.checks
        word = checked.terms
        illegal = ~word.legal
        error = word_error(m, checked)
        read0 = Signal()                  # this cycle reads address 0 (IDLE, DRAIN)
        fetched0 = Signal()               # and the last did, with no write there
        m.d.sync += fetched0.eq(read0 & ~(self.prog_w.en & (self.prog_w.addr == 0)))
        # pc_out is `pc >= self.prog_len`, registered: the compare runs on this cycle's pc + 1
        # and the late `advance` only selects it, so the carry chain is not in front of
        # EXEC's and CHAIN's decisions (issue 36, timing). self.prog_len changes only on host
        # writes, which a run refuses (HostAccess.open); the run's start sets the flag from the
        # length that cycle's write (if any) leaves, and EXEC and CHAIN read it only
        # within the run.
        pc_out = Signal()
        with m.If(advance):
            m.d.sync += [pc.eq(pc + 1), pc_out.eq(pc + 1 >= self.prog_len)]

        # Chain being parsed (hw.core.plan.parsed_chain_layout), and its MFU allocation.
        chain = Signal(parsed_chain_layout(c))
        at = chain.at                               # index of its v_rd
        m.d.comb += self.pc.eq(Mux(hz_fail | rg_fail, at, pend_index))
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
        m.d.comb += [plan.chain.eq(chain), plan.inq_free.eq(self.inq_free),
                     plan.outq_room.eq(self.outq_room), plan.inq_pushed.eq(self.inq_pushed),
                     plan.outq_popped.eq(self.outq_popped)]
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
        # rg_fail is set only in CHECK, for HAZARD's first cycle, which clears it.
        m.d.comb += walk.abort.eq(rg_fail)

        # Hand-off register: a checked chain for the issuer.
        desc_valid, desc = self.chains.valid, self.chains.payload
        desc_take = self.chains.valid & self.chains.ready

        fe_fail = Signal()
        fail_code = Signal(ErrorCode)
        fail_at = Signal(PROGRAM_ADDR_BITS + 1)
        with m.If(fe_fail):
            m.d.sync += [pend_code.eq(fail_code), pend_index.eq(fail_at)]

        with m.If(running):
            m.d.sync += cycles.eq(cycles + 1)

        def drain():
            """A cycle of DRAIN: the run ends when the back end is empty."""
            m.d.comb += [prog_addr.eq(0), read0.eq(1)]
            flagged = Mux(hz_fail, ErrorCode.HAZARD, ErrorCode.ADDRESS_RANGE)
            with m.If(hz_fail | rg_fail):
                m.d.sync += [pend_code.eq(flagged), pend_index.eq(at), hz_fail.eq(0),
                             rg_fail.eq(0)]
            with m.If(self.be_idle & ~desc_valid):
                m.d.sync += [running.eq(0), done.eq(1),
                             err_code.eq(Mux(hz_fail | rg_fail, flagged, pend_code))]
                m.next = "IDLE"
            with m.Else():
                m.next = "DRAIN"

        func = iw.func
        with m.FSM(name="fe"):
            with m.State("IDLE"):
                with m.If(self.run):
                    m.d.sync += [done.eq(0), cycles.eq(1)]
                    with m.If(err_code != ErrorCode.NONE):
                        m.d.sync += [done.eq(1), pend_index.eq(0), cycles.eq(0)]
                        m.d.comb += [prog_addr.eq(0), read0.eq(1)]
                    with m.Else():
                        m.d.sync += [running.eq(1), pc.eq(0),
                                     pc_out.eq(self.prog_len == 0)]
                        for reg in Reg:
                            m.d.sync += regs[reg].eq(regs[reg].init)
                        with m.If(fetched0):
                            m.d.comb += prog_addr.eq(1)
                            m.next = "EXEC"
                        with m.Else():
                            m.d.comb += prog_addr.eq(0)
                            m.next = "FETCH"
                with m.Else():
                    m.d.comb += [prog_addr.eq(0), read0.eq(1)]
            with m.State("FETCH"):
                m.d.comb += prog_addr.eq(1)
                m.next = "EXEC"
            with m.State("EXEC"):
                m.d.comb += prog_addr.eq(pc + 2)
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
                                    m.d.sync += regs[reg].eq(iw.operand)
                with m.Elif(word.v_rd):
                    m.d.comb += advance.eq(1)
                    m.d.sync += [
                        at.eq(pc), rd_space.eq(iw.space), rd_op.eq(iw.operand),
                        rd_inc.eq(iw.inc), has_mv.eq(0), n_ops.eq(0), cur_m.eq(0),
                        alloc_fail.eq(0), unbuilt.eq(0), vv_used.eq(0), n_wr.eq(0),
                        mcfg_regs.eq(0),
                    ]
                    m.d.sync += [u.eq(0) for u in used] + [s.eq(0) for s in slots]
                    m.next = "CHAIN"
                with m.Elif(illegal):
                    m.d.comb += [fe_fail.eq(1), fail_code.eq(error), fail_at.eq(pc)]
                    m.next = "DRAIN"
                with m.Else():
                    m.d.comb += [fe_fail.eq(1), fail_code.eq(ErrorCode.CHAIN_STRUCTURE),
                                 fail_at.eq(pc)]
                    m.next = "DRAIN"
            with m.State("CHAIN"):
                m.d.comb += prog_addr.eq(pc + 2)
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
                        self._allocate(m, c, iw, checked, word.unit_bit, pc, cur_m, used,
                                       slots, alloc_fail, unbuilt, unbuilt_at, mcfg_regs,
                                       vv_used, vv_op, vv_inc)
                with m.Elif(word.mv_mul):
                    with m.If(has_mv | (n_ops != 0) | (n_wr != 0)):
                        m.d.comb += structure.eq(1)
                    with m.Else():
                        m.d.comb += advance.eq(1)
                        m.d.sync += [has_mv.eq(1), mv_op.eq(iw.operand), mv_inc.eq(iw.inc)]
                with m.Elif(word.v_wr):
                    with m.If(n_wr == MAX_WRITES):
                        m.d.comb += structure.eq(1)
                    with m.Else():
                        m.d.comb += advance.eq(1)
                        m.d.sync += n_wr.eq(n_wr + 1)
                        for k in range(MAX_WRITES):
                            with m.If(n_wr == k):
                                m.d.sync += [w_space[k].eq(iw.space), w_op[k].eq(iw.operand),
                                             w_inc[k].eq(iw.inc), w_at[k].eq(pc)]
                with m.Elif(word.end_chain):
                    with m.If(n_wr == 0):
                        m.d.comb += structure.eq(1)
                    with m.Else():
                        m.d.comb += advance.eq(1)
                        m.d.comb += walk.to_check.eq(1)
                        m.next = "CHECK"
                with m.Elif(illegal):
                    m.d.comb += [fe_fail.eq(1), fail_code.eq(error), fail_at.eq(pc)]
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
                    m.d.sync += rg_fail.eq(plan.range_error)
                    m.next = "HAZARD"
            with m.State("HAZARD"):
                with m.If(rg_fail):
                    drain()
                with m.Elif(walk.clear):
                    m.next = "HANDOFF"
                with m.Elif(walk.hazard):
                    m.d.sync += hz_fail.eq(1)
                    m.next = "DRAIN"
            with m.State("HANDOFF"), m.If(~desc_valid):
                m.d.comb += prog_addr.eq(pc + 1)
                m.d.sync += desc_valid.eq(1)
                with m.If(rd_space == Space.NETQ):
                    m.d.comb += self.inq_claim.eq(plan.in_need)
                m.d.comb += self.outq_claim.eq(plan.pushes)
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
                # The read ranges' ends, summed here from the values desc takes (with
                # its widths), so that the issuer compares registers.
                m.d.sync += desc.rd_end.eq(rd_op[:len(desc.rd_addr)]
                                           + plan.extent[:len(desc.extent)])
                for k in range(vrfs):
                    m.d.sync += [desc.vv_inc[k].eq(vv_inc[k]),
                                 desc.vv_end[k].eq(vrf_base(mcfg_regs, k) + length)]
                for k in range(MAX_WRITES):
                    m.d.sync += [
                        desc.w_valid[k].eq(k < n_wr), desc.w_space[k].eq(w_space[k]),
                        desc.w_addr[k].eq(w_op[k]), desc.w_inc[k].eq(w_inc[k]),
                    ]
                m.next = "EXEC"
            with m.State("DRAIN"):
                drain()

        with m.If(desc_take):
            m.d.sync += desc_valid.eq(0)
        return m

    @staticmethod
    def _allocate(m, c, iw, checked, unit_bit, pc, cur_m, used, slots, alloc_fail, unbuilt,
                  unbuilt_at, mcfg_regs, vv_used, vv_op, vv_inc):
        """One op of the chain: ``host.spec.mfu.allocate``'s rule, one op per cycle. The op
        stays in the current MFU ``k`` if ``k`` builds its unit and has not used it yet;
        else it goes to the first MFU after ``k`` that builds the unit (a constant of ``k``
        and the unit, from the unit sets), and where there is none the chain fails."""
        func = iw.func
        # The op's unit and whether its function is built: decoded when the word was
        # written (hw.core.decode.WordCheck), the unit as its one-hot (unit_bit).
        unit = Signal(MfuUnit)
        m.d.comb += unit.eq(unit_of(unit_bit))
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
                                                     entry.addsub_addr.eq(iw.operand),
                                                     vv_used[2 * t].eq(1),
                                                     vv_op[2 * t].eq(iw.operand),
                                                     vv_inc[2 * t].eq(iw.inc)]
                                if MfuUnit.MUL in units_t:
                                    with m.Case(MfuUnit.MUL):
                                        m.d.sync += [entry.mul_addr.eq(iw.operand),
                                                     vv_used[2 * t + 1].eq(1),
                                                     vv_op[2 * t + 1].eq(iw.operand),
                                                     vv_inc[2 * t + 1].eq(iw.inc)]
                                if MfuUnit.ACT in units_t:
                                    with m.Case(MfuUnit.ACT):
                                        m.d.sync += entry.act_op.eq(func)
                                if MfuUnit.REDUCE in units_t:
                                    with m.Case(MfuUnit.REDUCE):
                                        m.d.sync += entry.reduce_op.eq(func)
