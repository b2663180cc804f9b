"""The MVM's command check: four pipelined stages in front of the loader
(``docs/mvm.md`` section 5, item 1; section 9 lists what is rejected)."""

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from host.spec.formats import MAX_EXPONENT_CODE, NARROW_WIDTH_MAX

from hw.arith.dsp import DSP_WIDTH, has_ecp5_dsp, registered_product
from hw.mvm.layouts import checked_command_layout, command_layout
from hw.mvm.tile_engine import _check_config, fit_thermometer

__all__ = ["CommandChecker", "STAGES"]

#: Stages of the command check (field checks and G; R*G; slot range; the decision).
STAGES = 4


def _group_divider(config, c_bits):
    """``(mul, shift)`` with ``(x * mul) >> shift == x // T`` for every ``x`` that
    ``C + T - 1`` can take: G = ceil(C/T) without a divider."""
    t = config.tiles
    x_max = (1 << c_bits) - 1 + t - 1
    for shift in range(64):
        mul = -(-(1 << shift) // t)
        if all((x * mul) >> shift == x // t for x in range(x_max + 1)):
            return mul, shift
    raise AssertionError("no reciprocal found")  # pragma: no cover


class CommandChecker(wiring.Component):
    """The command check: V1 (fields, ``G = ceil(C/T)``), V2 (``R*G``, the engines of
    the last group), V3 (the slot range), V4 (the decision).

    One command per cycle; the stages advance together whenever V4 is empty or hands its
    command on (a good one to ``o_stream``, a bad one to ``error``). Every check result
    is a register before V4, whose one decision loads the loader's registers: the
    check's carry chains in front of that fan-out were a routed path of 12.5 ns
    (``docs/mvm.md`` section 11).

    Parameters
    ----------
    config : MvmConfig

    Attributes
    ----------
    cmd : ``In(stream.Signature(command_layout(config)))``
        The MVM's commands. ``ready`` is low while ``hold`` is high.
    hold : ``In(1)``
        An MRF write or read-back is in flight: a command waits until it completes.
    o_stream : ``Out(stream.Signature(checked_command_layout(config)))``
        A good command from V4 with its sequencer parameters (``last_step = R*G - 1``,
        ``last_group = G - 1``, ``lastmask``, and with the narrow check ``k`` and its
        thermometer). ``valid`` is V4's command being good; the payload is a register.
    error : ``Out(1)``
        A bad command leaves V4 (dropped) in this cycle: ``C == 0``, ``C`` above
        ``max_col_tiles``, ``R == 0``, ``base + R*G`` above ``mrf_depth``,
        ``narrow_width`` 0 or above 64, or a static exponent code above 142.
    first_stage : ``Out(1)``
        A command is in V1 (the MRF write gate covers the edge that its one-edge-late
        copy of ``busy`` misses).
    busy : ``Out(1)``
        A command is in one of the four stages.

    Raises
    ------
    TypeError
        ``config`` is not an :class:`~host.spec.config.MvmConfig`.
    """

    def __init__(self, config):
        self._config = c = _check_config(config)
        super().__init__({
            "cmd": In(stream.Signature(command_layout(c))),
            "hold": In(1),
            "o_stream": Out(stream.Signature(checked_command_layout(c))),
            "error": Out(1),
            "first_stage": Out(1),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        c = self._config
        tiles = c.tiles
        cl = command_layout(c)
        c_bits = cl.members["col_tiles"].width
        mul, shift = _group_divider(c, c_bits)
        v1 = Signal(name="cmd_v1")
        v2 = Signal(name="cmd_v2")
        v3 = Signal(name="cmd_v3")
        v4 = Signal(name="cmd_v4")
        f1 = Signal(cl, name="cmd_f1")
        f2 = Signal(cl, name="cmd_f2")
        f3 = Signal(cl, name="cmd_f3")
        f4 = Signal(cl, name="cmd_f4")
        gmax = c.col_groups_max
        r_max = (1 << cl.members["row_tiles"].width) - 1
        g2 = Signal(range(gmax + 1), name="cmd_groups_v2")
        g3 = Signal(range(gmax + 1), name="cmd_groups_v3")
        g4 = Signal(range(gmax + 1), name="cmd_groups_v4")
        err2 = Signal(name="cmd_err_v2")
        err3 = Signal(name="cmd_err_v3")
        err4 = Signal(name="cmd_err_v4")
        therm2 = Signal(c.dot_bits - 1, name="cmd_therm_v2")
        therm3 = Signal(c.dot_bits - 1, name="cmd_therm_v3")
        therm4 = Signal(c.dot_bits - 1, name="cmd_therm_v4")
        rg_shape = range(r_max * gmax + 1)
        rg4 = Signal(rg_shape, name="cmd_slots_v4")
        lastmask3 = Signal(tiles, name="cmd_lastmask_v3")
        lastmask4 = Signal(tiles, name="cmd_lastmask_v4")

        v4_go = Signal()
        advance_v = Signal()
        m.d.comb += [
            v4_go.eq(v4 & (err4 | self.o_stream.ready)),
            advance_v.eq(~v4 | v4_go),
            # A command waits for MRF writes and reads already accepted; MRF writes and
            # reads wait while a command is offered (so the command is not starved).
            self.cmd.ready.eq(advance_v & ~self.hold),
        ]
        with m.If(advance_v):
            m.d.sync += [
                v1.eq(self.cmd.valid & ~self.hold),
                f1.eq(self.cmd.payload),
                v2.eq(v1), f2.eq(f1),
                v3.eq(v2), f3.eq(f2),
                v4.eq(v3), f4.eq(f3),
            ]
        # V1: field checks, G = ceil(C / T), the narrow-width thermometer.
        cc, rr, kk = f1.col_tiles, f1.row_tiles, f1.narrow_width
        bad_fields = ((cc == 0) | (cc > c.max_col_tiles) | (rr == 0)
                      | (kk == 0) | (kk > NARROW_WIDTH_MAX)
                      | (f1.static & (f1.static_exponent > MAX_EXPONENT_CODE)))
        groups = (((cc + (tiles - 1)) * mul) >> shift)[:g2.shape().width]
        # The narrow width k is checked on every build (the command field exists and a
        # bad one is an error either way); the thermometer is made only with the check.
        narrow_check = c.narrow_check
        with m.If(advance_v):
            m.d.sync += [err2.eq(bad_fields), g2.eq(groups)]
            if narrow_check:
                m.d.sync += therm2.eq(fit_thermometer(kk, c.dot_bits - 1))
        # V2: R*G slots (registered twice: V3 and V4), and which engines the last group
        # uses (C - (G-1)*T of them). On an ECP5 the product is a MULT18X18D with its own
        # registers (they stand for R and G in V2 and for R*G in V3); used without them
        # it was a routed path of 11 ns.
        last_count = f2.col_tiles - (g2 - 1) * tiles
        rg3 = Signal(rg_shape, name="cmd_slots_v3")
        room3 = Signal(range(c.mrf_depth + 1), name="cmd_room_v3")
        if has_ecp5_dsp(platform) and rr.shape().width <= DSP_WIDTH \
                and groups.shape().width <= DSP_WIDTH:
            product = registered_product(m, rr, groups, enable=advance_v, name="cmd_slots")
            m.d.comb += rg3.eq(product)
        else:
            with m.If(advance_v):
                m.d.sync += rg3.eq(f2.row_tiles * g2)
        with m.If(advance_v):
            if narrow_check:
                m.d.sync += therm3.eq(therm2)
            m.d.sync += [
                err3.eq(err2),
                g3.eq(g2),
                lastmask3.eq(Cat(*[last_count > t for t in range(tiles)])),
                # The room V3 compares R*G with (slots base .. base + R*G - 1 exist iff
                # R*G <= mrf_depth - base), so that V3 is one comparison after the
                # product's register.
                room3.eq(c.mrf_depth - f2.base),
            ]
        # V3: the slots exist.
        with m.If(advance_v):
            if narrow_check:
                m.d.sync += therm4.eq(therm3)
            m.d.sync += [
                err4.eq(err3 | (rg3 > room3)),
                g4.eq(g3),
                rg4.eq(rg3),
                lastmask4.eq(lastmask3),
            ]
        # V4: the loader takes a good command; a bad one is dropped here.
        params = self.o_stream.payload.params
        m.d.comb += [
            self.o_stream.valid.eq(v4 & ~err4),
            self.o_stream.payload.command.eq(f4),
            params.base.eq(f4.base),
            params.last_step.eq(rg4 - 1),
            params.last_group.eq(g4 - 1),
            params.lastmask.eq(lastmask4),
            self.error.eq(v4_go & err4),
            self.first_stage.eq(v1),
            self.busy.eq(v1 | v2 | v3 | v4),
        ]
        if narrow_check:
            m.d.comb += [params.k.eq(f4.narrow_width), params.therm.eq(therm4)]
        return m
