"""The MVM's loader and the vector quantizer's input register (``docs/mvm.md`` section 5,
items 2 and 3)."""

from amaranth.hdl import Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from host.spec.formats import FP16_BITS, Rounding

from hw.mvm.layouts import (
    checked_command_layout, command_layout, params_layout, tag_layout, weight_row_layout,
)
from hw.mvm.quantizer import LATENCY as QUANTIZER_LATENCY
from hw.mvm.tile_engine import _check_config

__all__ = ["Loader", "INPUT_STAGES", "TAG_DEPTH"]

#: Register stages in front of the vector quantizer (the vector's input register).
INPUT_STAGES = 1
#: Depth of the FIFO that carries the buffer places of vector blocks beside the vector
#: quantizer. A tag is written when its vector is in the input register (one edge after
#: it is taken from x_stream) and read when its block is written into the buffer; x_stream
#: is ready only while the FIFO has room for the tag of the vector in the input register
#: as well, so the tags also bound the blocks in the input register, the quantizer and
#: the block FIFO after it, which therefore never overflows. Room for
#: every block in flight at one per cycle (x_stream taken to buffer write is
#: INPUT_STAGES + QUANTIZER_LATENCY + 2 edges), so that it never throttles a stream.
TAG_DEPTH = 1 << ceil_log2(INPUT_STAGES + QUANTIZER_LATENCY + 2)


class Loader(wiring.Component):
    """Takes each good command and its C vectors, feeds the vectors to the vector
    quantizer through the input register and tags each with where its block goes.

    A command is taken from ``cmd`` once the last vector of the one before is accounted
    for (on that edge at the earliest) and the params FIFO has room; its sequencer
    parameters are written into that FIFO on the same edge. Its ``C`` vectors are then
    taken from ``x_stream`` whenever the tag FIFO has room for one more tag beside the
    one of the vector in the input register: ``x_stream.ready`` is a LUT of loader
    registers, the input register's valid and ``tag_level``, nothing else. A taken
    vector is accounted for (counted, tagged, and its command ended if it was the last)
    one edge later, from the input register's valid, so that ``x_stream.valid`` drives
    one flip-flop and no enable (in the routed one-engine build that handshake was the
    slowest path: ``docs/mvm.md`` section 11). The input register loads on every edge,
    taken or not.

    With ``shared`` (one quantizer for vectors and weight rows, ``m_v == m_w``) a weight
    row taken from ``w_stream`` is loaded into the input register instead of a vector,
    chosen per lane by a kept copy of ``~weight_mode_src`` one edge late, and enters the
    quantizer as source 1.

    Parameters
    ----------
    config : MvmConfig
    shared : bool
        The input register also takes the weight rows (ports ``w_row``, ``w_taken``,
        ``weight_mode_src`` and ``q_source`` exist only then).

    Attributes
    ----------
    cmd : ``In(stream.Signature(checked_command_layout(config)))``
        Good commands from :class:`hw.mvm.command.CommandChecker`.
    x_stream : ``In(stream.Signature(ArrayLayout(unsigned(16), n)))``
        The MVM's input vectors, C per command.
    params_w_en : ``Out(1)``, params_w_data : ``Out(params_layout(config))``,
    params_w_rdy : ``In(1)``
        The write side of the params FIFO (the sequencer reads it).
    tag_w_en : ``Out(1)``, tag_w_data : ``Out(tag_layout(config))``,
    tag_level : ``In(range(TAG_DEPTH + 1))``
        The write side of the tag FIFO: half (alternating per command from 0), bank
        ``c % T``, group ``c // T``, last; ``tag_level`` is its level.
    q_valid : ``Out(1)``, q_payload : ``Out(ArrayLayout(unsigned(16), n))``,
    q_rounding : ``Out(Rounding)``, q_static : ``Out(1)``, q_static_exponent : ``Out(8)``
        The input register, to the vector quantizer's ``i_stream`` and settings.
    q_source : ``Out(1)``
        ``shared`` only: the input register holds a weight row (quantizer source 1).
    w_row : ``In(weight_row_layout(config))``, w_taken : ``In(1)``
        ``shared`` only: ``w_stream``'s payload, and a row is taken in this cycle.
    weight_mode_src : ``In(1)``
        ``shared`` only: a command is in the MVM, one edge late (``cmd_busy_r``); the
        lanes' mode copies load its complement. A row is taken only while it has been
        low for an edge, a vector only while it has been high.
    busy : ``Out(1)``
        Vectors of the current command are still to be accounted for.

    Raises
    ------
    TypeError
        ``config`` is not an :class:`~host.spec.config.MvmConfig`.
    """

    def __init__(self, config, *, shared):
        self._config = c = _check_config(config)
        self._shared = bool(shared)
        vectors = data.ArrayLayout(unsigned(FP16_BITS), c.n)
        ports = {
            "cmd": In(stream.Signature(checked_command_layout(c))),
            "x_stream": In(stream.Signature(vectors)),
            "params_w_en": Out(1),
            "params_w_data": Out(params_layout(c)),
            "params_w_rdy": In(1),
            "tag_w_en": Out(1),
            "tag_w_data": Out(tag_layout(c)),
            "tag_level": In(range(TAG_DEPTH + 1)),
            "q_valid": Out(1),
            "q_payload": Out(vectors),
            "q_rounding": Out(Rounding),
            "q_static": Out(1),
            "q_static_exponent": Out(8),
            "busy": Out(1),
        }
        if self._shared:
            ports.update({
                "q_source": Out(1),
                "w_row": In(weight_row_layout(c)),
                "w_taken": In(1),
                "weight_mode_src": In(1),
            })
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        c = self._config
        n, tiles = c.n, c.tiles
        gmax = c.col_groups_max
        cl = command_layout(c)
        l_count = Signal(range(c.max_col_tiles + 1), name="loader_count")
        l_total = Signal(range(c.max_col_tiles + 1), name="loader_total")
        # Half of the command being loaded: toggles with every command, from 0.
        l_half = Signal(name="loader_half", init=1)
        l_bank = Signal(range(tiles), name="loader_bank")
        l_group = Signal(range(max(2, gmax)), name="loader_group")
        l_cmd = Signal(cl, name="loader_cmd")
        # The loader's state describes the next vector to account for: vectors left
        # (l_more), the next is the command's last (l_last), its bank, group and half.
        l_more = Signal(name="loader_more")
        l_last = Signal(name="loader_last")
        x_taken = Signal()
        # Vectors are registered on their way into the vector quantizer (its first stage
        # decodes all N lanes and ORs across them), with the command's quantizer setting.
        x_in_valid = Signal(name="x_in_valid")
        x_in = Signal.like(self.x_stream.payload, name="x_in")
        x_in_cmd = Signal(cl, name="x_in_cmd")
        # The vector in the input register is its command's last: the loader is done with
        # the command once that is accounted for on this edge.
        l_ending = Signal()
        # Room in the tag FIFO for one more vector beside the one in the input register,
        # whose tag is written on this edge: the tags then still bound the blocks in
        # flight, and the block FIFO, as deep, never overflows.
        tag_room = Signal()
        take = self.cmd.valid & self.cmd.ready
        new = self.cmd.payload.command
        m.d.comb += [
            l_ending.eq(x_in_valid & l_last),
            tag_room.eq(self.tag_level < TAG_DEPTH - 1),
            # A LUT from flip-flops: loader state, the input register's valid and the
            # tag FIFO's level. The quantizer never stalls (see the writer), so its
            # enable does not join this handshake.
            self.x_stream.ready.eq(l_more & ~l_ending & tag_room),
            x_taken.eq(self.x_stream.valid & self.x_stream.ready),
            self.cmd.ready.eq((~l_more | l_ending) & self.params_w_rdy),
            self.q_payload.eq(x_in),
            self.q_rounding.eq(x_in_cmd.rounding),
            self.q_static.eq(x_in_cmd.static),
            self.q_static_exponent.eq(x_in_cmd.static_exponent),
            # Block c of the command: bank c % T, group c // T of the command's half.
            self.tag_w_en.eq(x_in_valid),
            self.tag_w_data.eq(Cat(l_half, l_bank, l_group, l_last)),
            self.params_w_en.eq(take),
            self.params_w_data.eq(self.cmd.payload.params),
            self.busy.eq(l_more),
        ]
        # The input register takes the payload and the loader's command on every edge,
        # taken or not, so that no enable fans out to its bits; x_in_valid marks a vector
        # that was taken. l_cmd is the taken vector's command: a command is loaded only
        # once the vectors of the one before are all taken, and its own come later.
        m.d.sync += x_in_valid.eq(x_taken)
        if self._shared:
            # A row taken from w_stream goes through the input register: each lane's
            # copy of the mode (~cmd_busy two edges late, a kept flip-flop loaded from
            # cmd_busy_r: loaded from cmd_busy's wide OR, the copies spread over the
            # lanes were a routed critical path) selects what the register loads. A row
            # is taken only with the MRF writes open, which needs ~cmd_busy two edges
            # late; a vector only with l_more, which, or the V3 and V4 before it, kept
            # cmd_busy high two edges before.
            w_in = self.w_row
            w_in_valid = Signal(name="w_in_valid")
            weights = [Signal(name=f"quantizer_weights{i}", attrs={"keep": 1})
                       for i in range(n)]
            m.d.sync += [w.eq(~self.weight_mode_src) for w in weights]
            m.d.sync += [x_in[i].eq(Mux(weights[i], w_in.values[i], self.x_stream.payload[i]))
                         for i in range(n)]
            m.d.sync += [
                w_in_valid.eq(self.w_taken),
                x_in_cmd.rounding.eq(Mux(weights[0], w_in.rounding, l_cmd.rounding)),
                x_in_cmd.static.eq(Mux(weights[0], w_in.static, l_cmd.static)),
                x_in_cmd.static_exponent.eq(Mux(weights[0], w_in.static_exponent,
                                                l_cmd.static_exponent)),
            ]
            m.d.comb += [self.q_valid.eq(x_in_valid | w_in_valid),
                         self.q_source.eq(w_in_valid)]
        else:
            m.d.comb += self.q_valid.eq(x_in_valid)
            m.d.sync += [x_in.eq(self.x_stream.payload), x_in_cmd.eq(l_cmd)]
        with m.If(x_in_valid):
            m.d.sync += [
                l_count.eq(l_count + 1),
                l_last.eq(l_count + 2 == l_total),
            ]
            with m.If(l_last):
                m.d.sync += l_more.eq(0)
            with m.If(l_bank == tiles - 1):
                m.d.sync += [l_bank.eq(0), l_group.eq(l_group + 1)]
            with m.Else():
                m.d.sync += l_bank.eq(l_bank + 1)
        # A command is taken once the last vector of the one before is accounted for, on
        # that edge at the earliest; its loading wins over that accounting.
        with m.If(take):
            m.d.sync += [
                l_more.eq(1), l_last.eq(new.col_tiles == 1),
                l_count.eq(0), l_total.eq(new.col_tiles), l_cmd.eq(new),
                l_bank.eq(0), l_group.eq(0), l_half.eq(~l_half),
            ]
        return m
