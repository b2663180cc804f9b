"""The chain checker's plan checks: does a parsed chain fit the build and the queues?

This is the part of :meth:`host.model.core.NpuModel._plan_checked` after the MFU
allocation, in hardware: a space the build does not have (ILLEGAL_FIELD), a window
wider than ``max_col_tiles`` (SIZE_RANGE), a static exponent code above
:data:`~host.spec.formats.MAX_EXPONENT_CODE` (REGISTER_VALUE), the MRF slots of the
last iteration beyond ``mrf_depth`` (ADDRESS_RANGE), too few vectors queued or too
little room in the output queue (QUEUE_UNDERFLOW, QUEUE_OVERFLOW), and a vector range
beyond its memory in any iteration (ADDRESS_RANGE), in that order. :class:`PlanCheck`
also forms the chain's sizes that the hand-off and the hazard walk take.

The front end (:class:`hw.core.front_end.FrontEnd`) fills :func:`parsed_chain_layout` from
``v_rd`` to ``end_chain`` and keeps the scalar registers; both stop changing before its
``CHECK`` state, which reads ``error`` and ``error_at``. The checks' terms are
registers loaded every cycle, so ``CHECK`` only picks among flags and the products and
sums before the compares have cycles of their own (issue 36, timing closure): each is a
function of values that stop changing before ``CHECK`` and do not change again until
the next ``v_rd``.

* the scalar registers (``s_wr``, outside chains), the ``v_rd``'s fields and the ops'
  are final at least two cycles before ``CHECK`` (at least one ``v_wr`` and the
  ``end_chain`` follow them); their sums and products are registered, then compared;
* the ``v_wr``'s fields are final one cycle before ``CHECK`` (the last ``v_wr`` is the
  cycle before ``end_chain``); their products are registered and compared in ``CHECK``.

So in ``CHECK``, in the hazard walk and in the hand-off every output holds its function
of the chain's final values, as combinational checks would, and no cycle count changes.
The queue checks compare with the queues' levels of the cycle itself, on the counts'
low bits (whether a high bit is set is registered with each count).
"""

from amaranth.hdl import Const, Module, Mux, Shape, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import bits_for

from host.spec.config import NpuConfig
from host.spec.formats import MAX_EXPONENT_CODE
from host.spec.isa import FIELDS, MAX_WRITES, ErrorCode, Reg, Space, register_limits
from hw.core.decode import built_vrfs, iteration_bits
from hw.core.host_access import PROGRAM_ADDR_BITS, vector_space_depth, vector_space_exists
from hw.core.vectors import checked_config, count_bits

__all__ = ["PlanCheck", "any_of", "parsed_chain_layout", "plan_registers_layout"]

#: The scalar registers the plan reads, by port field name.
PLAN_REGISTERS = {
    "rows": Reg.ROWS, "cols": Reg.COLS, "iters": Reg.ITERATIONS, "win_w": Reg.WIN_W,
    "win_h": Reg.WIN_H, "pitch": Reg.WIN_PITCH, "q_static": Reg.Q_STATIC,
    "q_exponent": Reg.Q_EXPONENT,
}

#: Bits of ``pushes``: up to MAX_WRITES times ``length * ITERATIONS``.
_PUSH_BITS = 40


def any_of(values):
    """The OR of ``values`` (a 1-bit 0 for none)."""
    result = Const(0, 1)
    for v in values:
        result = result | v
    return result


def plan_registers_layout(config: NpuConfig) -> data.StructLayout:
    """The scalar registers of :data:`PLAN_REGISTERS`, each as wide as the values
    ``s_wr`` accepts for it (:func:`host.spec.isa.register_limits`)."""
    limits = register_limits(config)
    return data.StructLayout({name: range(limits[reg][1] + 1)
                              for name, reg in PLAN_REGISTERS.items()})


def parsed_chain_layout(config: NpuConfig) -> data.StructLayout:
    """A chain as the front end parses it: ``at`` (the index of its ``v_rd``), the
    ``v_rd``'s ``rd_space``, ``rd_op`` and ``rd_inc``; ``has_mv`` and the ``mv_mul``'s
    ``mv_op`` and ``mv_inc``; per VRF ``2m + bank`` a ``vv`` op reads (``vv_used``, a
    bit each) its ``vv_op`` and ``vv_inc``; ``n_wr`` writes, each with ``w_space``,
    ``w_op``, ``w_inc`` and ``w_at`` (its index). Operands are the instruction fields'
    32 bits, increments 16, spaces 4 (unchecked: the plan checks them)."""
    vrfs = 2 * config.mfus
    op_bits, inc_bits = FIELDS["operand"][1], FIELDS["inc"][1]
    at = unsigned(PROGRAM_ADDR_BITS + 1)
    return data.StructLayout({
        "at": at, "rd_space": unsigned(4), "rd_op": unsigned(op_bits),
        "rd_inc": unsigned(inc_bits),
        "has_mv": unsigned(1), "mv_op": unsigned(op_bits), "mv_inc": unsigned(inc_bits),
        "vv_used": unsigned(vrfs), "vv_op": data.ArrayLayout(unsigned(op_bits), vrfs),
        "vv_inc": data.ArrayLayout(unsigned(inc_bits), vrfs),
        "n_wr": range(MAX_WRITES + 1),
        "w_space": data.ArrayLayout(unsigned(4), MAX_WRITES),
        "w_op": data.ArrayLayout(unsigned(op_bits), MAX_WRITES),
        "w_inc": data.ArrayLayout(unsigned(inc_bits), MAX_WRITES),
        "w_at": data.ArrayLayout(at, MAX_WRITES),
    })


class PlanCheck(wiring.Component):
    """The plan checks of a parsed chain, and its sizes.

    Parameters
    ----------
    config : host.spec.config.NpuConfig

    Ports
    -----
    chain : ``In(parsed_chain_layout(config))``
    regs : ``In(plan_registers_layout(config))``
        The scalar registers.
    inq_free : ``In(range(netq_depth + 1))``
        Input-queue vectors not claimed by a chain handed off.
    outq_room : ``In(range(netq_depth + 1))``
        Output-queue room not claimed.
    inq_pushed, outq_popped : ``In(1)``
        A vector is pushed onto the input queue, popped off the output queue, this
        cycle: ``inq_free`` and ``outq_room`` are one more in the next (the queue checks
        are registered from next cycle's levels).
    error : ``Out(ErrorCode)``
        The first check that fails but the last, NONE when they pass; valid in the
        front end's ``CHECK`` (see the module's docstring).
    error_at : ``Out(PROGRAM_ADDR_BITS + 1)``
        The instruction it names: the ``v_rd``, the ``mv_mul`` (the static exponent and
        the MRF range) or the ``v_wr`` (a space that does not exist).
    range_error : ``Out(1)``
        The last check, apart: a vector range beyond its memory (ADDRESS_RANGE, naming
        the ``v_rd``), valid in ``CHECK``. The front end reads it only when ``error`` is
        NONE, and only as one flag's input: its compares are the last (the writes'
        products are final only by ``CHECK``), and the check's code, index and next
        state were the board's critical path behind them (issue 36, 70.97 MHz).
    length : ``Out(mfu.length_bits)``
        Native vectors of a row tile, ``ceil(ROWS / n)``, a cycle after ROWS.
    lanes_last : ``Out(mfu.lanes_bits)``
        Lanes of the last one.
    pix : ``Out(count_bits)``, reset 1
        Column tiles of a pixel, ``ceil(COLS / n)``, a cycle after COLS.
    lanes_cols : ``Out(bits_for(n))``
        Lanes of a pixel's last column tile.
    cols_t : column tiles of the window, ``pix * WIN_W * WIN_H`` (two cycles after).
    c_in : ``Out(count_bits)``
        Input vectors an iteration takes: ``cols_t`` with an ``mv_mul``, else ``length``.
    extent : ``Out(64)``
        Vectors of a read's range: the window's extent with an ``mv_mul``, else ``length``.
    last_iter : ``Out(iteration_bits)``
        ITERATIONS - 1.
    in_need, pushes : the vectors the chain pops from the input queue and pushes to the
        output queue over all its iterations (the hand-off claims them).
    rd_prod, vv_prod, w_prod : ``last_iter * inc`` of the read, of each VRF (built ones;
        the others 0) and of each write, for the hazard walk.

    Raises
    ------
    TypeError
        ``config`` is not an :class:`host.spec.config.NpuConfig`.
    """

    def __init__(self, config):
        config = checked_config(self, config)
        self._config = c = config
        regs = plan_registers_layout(c)
        reg_bits = {name: Shape.cast(regs[name].shape).width for name in PLAN_REGISTERS}
        inc_bits = FIELDS["inc"][1]
        self._prod_bits = prod_bits = iteration_bits(c) + inc_bits
        win_area_bits = reg_bits["win_w"] + reg_bits["win_h"]
        level = range(c.netq_depth + 1)
        super().__init__({
            "chain": In(parsed_chain_layout(c)),
            "regs": In(regs),
            "inq_free": In(level),
            "outq_room": In(level),
            "inq_pushed": In(1),
            "outq_popped": In(1),
            "error": Out(ErrorCode),
            "error_at": Out(PROGRAM_ADDR_BITS + 1),
            "range_error": Out(1),
            "length": Out(c.mfu.length_bits),
            "lanes_last": Out(c.mfu.lanes_bits),
            "pix": Out(count_bits(c), init=1),
            "lanes_cols": Out(bits_for(c.n)),
            "cols_t": Out(count_bits(c) + win_area_bits),
            "c_in": Out(count_bits(c)),
            "extent": Out(64),
            "last_iter": Out(iteration_bits(c)),
            "in_need": Out(reg_bits["iters"] + count_bits(c)),
            "pushes": Out(_PUSH_BITS),
            "rd_prod": Out(prod_bits),
            "vv_prod": Out(data.ArrayLayout(prod_bits, 2 * c.mfus)),
            "w_prod": Out(data.ArrayLayout(prod_bits, MAX_WRITES)),
        })

    @property
    def config(self):
        return self._config

    def elaborate(self, platform):
        m = Module()
        c = self._config
        log2n = c.mvm.log2_n
        ch, r = self.chain, self.regs
        length, last_iter, pix = self.length, self.last_iter, self.pix
        has_mv = ch.has_mv

        def space_exists(space):
            return vector_space_exists(c, space)

        def space_depth(space):
            return vector_space_depth(c, space)

        # --- sizes --------------------------------------------------------------------
        # pix (the column tiles of a pixel) is registered, and the window products after
        # it: only chains with an mv_mul read them (cols_t, window_extent and what is
        # formed from them), and there s_wr writes COLS and the window registers at
        # least four cycles (v_rd, mv_mul, v_wr, end_chain) before CHECK; pix is final a
        # cycle after the register, the products a cycle later, the registered checks
        # formed from them (e_cols, in_need, mrf_base then e_mrf, rd_base then top_rd)
        # by CHECK. Combinational, cols - 1, the shift and the increment went into the
        # products' multiplier in one cycle with them (the core alone's critical path at
        # 53.7 MHz). length (the row tiles) is registered the same way: s_wr runs only
        # outside chains, so ROWS is final at least three cycles before CHECK (s_wr,
        # v_rd, v_wr, end_chain), length two, and the products formed from it
        # (len_iters, then pushes; mrf_base, then e_mrf; in_need) by CHECK.
        # Combinational, rows - 1, the shift and the increment went into len_iters's
        # multiplier in one cycle with it (the core alone's critical path at 63.5 MHz).
        m.d.sync += [pix.eq(((r.cols - 1) >> log2n) + 1),
                     length.eq(((r.rows - 1) >> log2n) + 1)]
        m.d.comb += [
            self.lanes_last.eq(r.rows - ((length - 1) << log2n)),
            self.lanes_cols.eq(r.cols - ((pix - 1) << log2n)),
        ]
        # The two window products are registered (see pix). Combinational, they put two
        # multipliers in front of the plan checks' own (24.8 MHz on the ULX3S,
        # docs/link-hw.md section 5). Each holds one product in its cycle (a product of
        # three, or two products and a sum, was the core alone's path at 52.2 and 54.5
        # MHz): win_area is final with pix, a cycle after the registers, so cols_t is
        # final when pix * win_w * win_h was; win_rows (after win_h - 1, a register of
        # its own: the decrement in front of the multiplier was the core alone's path at
        # 61.8 MHz, synthesized without keep_flops) and win_cols (after pix) are final
        # two cycles after the registers, so their sum is final when the registered
        # sum was. pitch enters win_rows's multiplier from a register of its own too, so
        # both operands are a cycle from the registers and the route to the
        # MULT18X18D has a cycle of its own: the placer put it across the die from both
        # pitch and win_rows (the core alone's critical path at 67.93 MHz, 9 ns of
        # routing), and win_rows is still final two cycles after the registers.
        win_area = Signal(len(r.win_w) + len(r.win_h))           # win_w * win_h
        m.d.sync += win_area.eq(r.win_w * r.win_h)
        cols_t = self.cols_t
        m.d.sync += cols_t.eq(pix * win_area)
        win_h_less = Signal(signed(len(r.win_h) + 1))             # win_h - 1
        win_rows = Signal(len(r.win_h) + len(r.pitch))            # (win_h - 1) * pitch
        win_cols = Signal(len(r.win_w) + len(pix))                # win_w * pix
        pitch = Signal.like(r.pitch)
        m.d.sync += [win_h_less.eq(r.win_h - 1), pitch.eq(r.pitch),
                     win_rows.eq(win_h_less * pitch),
                     win_cols.eq(r.win_w * pix)]
        window_extent = Signal(max(len(win_rows), len(win_cols)) + 1)
        m.d.comb += window_extent.eq(win_rows + win_cols)
        groups = Signal(range(c.max_col_tiles + 1))
        m.d.comb += groups.eq((cols_t[:bits_for(c.max_col_tiles)] + c.tiles - 1) // c.tiles)
        m.d.comb += last_iter.eq(r.iters - 1)
        # C, the input vectors an iteration takes, as the hand-off keeps it: cols_t is
        # wider, but a chain with cols_t > max_col_tiles fails e_cols, which is tested
        # before the only check reading c_in (e_under), and never reaches the hand-off.
        # A 40-bit C made iters * C a product tree on the way into e_under.
        m.d.comb += [self.c_in.eq(Mux(has_mv, cols_t, length)),
                     self.extent.eq(Mux(has_mv, window_extent, length))]

        # --- checks, in host.model.core.NpuModel._plan_checked's order ---------------
        prod_bits = self._prod_bits
        e_space_rd = ~space_exists(ch.rd_space) & (ch.rd_space != Space.NETQ)
        e_space_w = [(k < ch.n_wr) & ~space_exists(ch.w_space[k])
                     & (ch.w_space[k] != Space.NETQ) for k in range(MAX_WRITES)]
        e_space = Signal()
        e_space_at = Signal(PROGRAM_ADDR_BITS + 1)
        m.d.sync += [e_space.eq(any_of([e_space_rd] + e_space_w)), e_space_at.eq(ch.at)]
        with m.If(~e_space_rd):
            for k in reversed(range(MAX_WRITES)):
                with m.If(e_space_w[k]):
                    m.d.sync += e_space_at.eq(ch.w_at[k])
        at_next = Signal(PROGRAM_ADDR_BITS + 1)         # at + 1: the mv_mul
        m.d.sync += at_next.eq(ch.at + 1)
        e_cols = Signal()
        m.d.sync += e_cols.eq(has_mv & (cols_t > c.max_col_tiles))
        e_static = Signal()
        m.d.sync += e_static.eq(has_mv & r.q_static & (r.q_exponent > MAX_EXPONENT_CODE))
        # iters - 1 registered for the products by last_iter (the decrement's carry chain
        # in front of a product's multiplier was the core alone's path at 60.0 MHz for
        # mrf_prod and at 68.8 MHz for the ranges' products, synthesized without
        # keep_flops). ITERATIONS is written outside chains only, so iters_less is final
        # from the cycle after the chain's v_rd: mrf_prod is then final two cycles after
        # the registers, no later than mrf_base (three: pix, cols_t, mrf_base), and each
        # range's product (below) in the cycle after its increment, as before.
        iters_less = Signal.like(last_iter)
        mrf_prod = Signal(prod_bits)
        mrf_base = Signal(len(ch.mv_op) + len(length) + len(groups) + 1)
        m.d.sync += [iters_less.eq(r.iters - 1), mrf_prod.eq(iters_less * ch.mv_inc),
                     mrf_base.eq(ch.mv_op + length * groups)]
        e_mrf = Signal()
        m.d.sync += e_mrf.eq(has_mv & (mrf_prod + mrf_base > c.mrf_depth))
        # iters * C (the vectors the chain takes from the input queue), length * iters.
        # The queue checks compare with the levels of CHECK's cycle itself; a level is
        # below 2^level_bits, so a count above it fails on its high bits alone. Each
        # check is a register, computed from the count's next value and the level's:
        # the level is this cycle's plus the push (pop) of this cycle, less the claim
        # of a chain handed off, and the cycle before CHECK is CHAIN's, which hands off
        # nothing. The push (pop) selects between two compares at the last gate. So no
        # compare is left in front of CHECK's decision (issue 36, timing: the level
        # compares there were the core alone's critical path at 73.58 MHz).
        level_bits = len(self.inq_free)
        in_need = self.in_need
        in_need_next = Signal(len(in_need))
        # Both products of C's choices are registers, and has_mv selects between them
        # after: has_mv's multiplexer in front of the MULT18X18D was the core alone's
        # critical path at 61.72 MHz, and the product's way into under_q's compare (a
        # MULT18X18D placed across the die) at 52.99 MHz. cols_t is final when has_mv
        # is (set by the mv_mul, at least two cycles before CHECK) and length at least
        # two cycles before CHECK, so the products are final a cycle later and in_need
        # by CHECK, as e_mrf after mrf_base and pushes after len_iters. Each factor is
        # cut to c_in's width, as the hand-off keeps C (above).
        c_bits = len(self.c_in)
        iters_cols = Signal(len(in_need))
        iters_length = Signal(len(in_need))
        m.d.sync += [iters_cols.eq(r.iters * cols_t[:c_bits]),
                     iters_length.eq(r.iters * length[:c_bits])]
        m.d.comb += in_need_next.eq(Mux(has_mv, iters_cols, iters_length))

        def over(count_next, level, gained):
            """``count > level`` next cycle, for a level that gains one with ``gained``."""
            low = count_next[:level_bits]
            return (count_next[level_bits:] != 0) | Mux(gained, low > level + 1, low > level)

        under_q = Signal()
        m.d.sync += [in_need.eq(in_need_next),
                     under_q.eq(over(in_need_next, self.inq_free, self.inq_pushed))]
        len_iters = Signal(len(length) + len(r.iters))
        m.d.sync += len_iters.eq(length * r.iters)
        e_under = (ch.rd_space == Space.NETQ) & under_q
        # The writes to the output queue (at most MAX_WRITES) times length * iters: each
        # multiple k * length * iters is formed (shifts, and adds for the odd ones) and
        # checked against the queue's room, and the writes' count selects among them at
        # the last gates. A multiplier put a MULT18X18D, across the die, between the last
        # v_wr's fields and this register (the core alone's critical path at 50.9 MHz);
        # the count, added up from the v_wr's fields, in front of the multiple's adds
        # and the room's compare put the hazard walk's ranges (the same fields) in series
        # with them (the core alone's critical path at 75.30 MHz). The count's decode
        # (a function of MAX_WRITES bits) is now beside the adds and compares.
        n_netq = Signal(range(MAX_WRITES + 1))
        m.d.comb += n_netq.eq(sum((k < ch.n_wr) & (ch.w_space[k] == Space.NETQ)
                                  for k in range(MAX_WRITES)))
        pushes = self.pushes
        pushes_next = Signal(len(pushes))
        over_k = []                                     # k * length * iters overflows
        for k in range(1, MAX_WRITES + 1):
            multiple = Signal(len(pushes), name=f"pushes_{k}")
            over_at_k = Signal(name=f"over_{k}")
            m.d.comb += [multiple.eq(sum(len_iters << b for b in range(k.bit_length())
                                         if k >> b & 1)),
                         over_at_k.eq(over(multiple, self.outq_room, self.outq_popped))]
            with m.If(n_netq == k):
                m.d.comb += pushes_next.eq(multiple)
            over_k.append((n_netq == k) & over_at_k)
        e_over = Signal()
        m.d.sync += [pushes.eq(pushes_next), e_over.eq(any_of(over_k))]
        # last_iter * increment of every range: the range checks' and the hazard walk's
        # (from iters_less, above).
        rd_base = Signal(len(self.extent) + 1)
        m.d.sync += [self.rd_prod.eq(iters_less * ch.rd_inc),
                     rd_base.eq(ch.rd_op + self.extent)]
        tops = []
        top_rd = Signal()
        m.d.sync += top_rd.eq((ch.rd_space != Space.NETQ)
                              & (self.rd_prod + rd_base > space_depth(ch.rd_space)))
        tops.append(top_rd)
        for k in built_vrfs(c):
            base = Signal(len(ch.vv_op[k]) + 1, name=f"vv_base{k}")
            m.d.sync += [self.vv_prod[k].eq(iters_less * ch.vv_inc[k]),
                         base.eq(ch.vv_op[k] + length)]
            top = Signal(name=f"top_vv{k}")
            m.d.sync += top.eq(ch.vv_used[k] & (self.vv_prod[k] + base > c.vrf_depth))
            tops.append(top)
        for k in range(MAX_WRITES):
            # w_op + last_iter * w_inc + length > depth, as last_iter * w_inc > room.
            room = Signal(signed(len(ch.w_op[k]) + len(length) + 2), name=f"w_room{k}")
            on = Signal(name=f"w_ranged{k}")
            m.d.sync += [self.w_prod[k].eq(iters_less * ch.w_inc[k]),
                         room.eq(space_depth(ch.w_space[k]) - ch.w_op[k] - length),
                         on.eq((k < ch.n_wr) & (ch.w_space[k] != Space.NETQ))]
            tops.append(on & (self.w_prod[k] > room))
        m.d.comb += self.range_error.eq(any_of(tops))

        checks = [
            (e_space, ErrorCode.ILLEGAL_FIELD, e_space_at),
            (e_cols, ErrorCode.SIZE_RANGE, ch.at),
            (e_static, ErrorCode.REGISTER_VALUE, at_next),
            (e_mrf, ErrorCode.ADDRESS_RANGE, at_next),
            (e_under, ErrorCode.QUEUE_UNDERFLOW, ch.at),
            (e_over, ErrorCode.QUEUE_OVERFLOW, ch.at),
        ]
        m.d.comb += self.error.eq(ErrorCode.NONE)
        for cond, code, index in reversed(checks):     # the first failing one wins
            with m.If(cond):
                m.d.comb += [self.error.eq(code), self.error_at.eq(index)]
        return m
