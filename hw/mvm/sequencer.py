"""The MVM's writer (quantized vector blocks into the ping-pong vector buffer) and its
compute sequencer with the output credits (``docs/mvm.md`` section 5, items 4 to 6)."""

from amaranth.hdl import Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from hw.mvm.layouts import params_layout, tag_layout
from hw.mvm.tile_engine import NARROW_WIDTH_BITS, TileEngine, _check_config

__all__ = ["VectorWriter", "Sequencer", "group_layout"]


def group_layout(config):
    """What the accumulator needs of a group, beside its tile products: ``valid``, the
    row block's ``first`` and ``last`` group, ``engines`` (bit ``t``: engine ``t``'s
    column tile exists), and with the narrow check ``k`` (7 bits)."""
    fields = {
        "valid": unsigned(1),
        "first": unsigned(1),
        "last": unsigned(1),
        "engines": unsigned(config.tiles),
    }
    if config.narrow_check:
        fields["k"] = unsigned(NARROW_WIDTH_BITS)
    return data.StructLayout(fields)


class VectorWriter(wiring.Component):
    """Writes each quantized vector block into the vector buffer: bank ``c % T`` at
    ``{half, c // T}``, but only into a half the sequencer no longer uses (ping-pong:
    two halves of ``2**vbuf_half_bits`` blocks per bank); the last block of a command
    marks its half full, and the sequencer's ``release`` empties it again.

    The blocks wait for their half in the block FIFO after the vector quantizer, which
    therefore runs free; their tags (from the loader) wait in the tag FIFO, written
    before and read with their blocks. One block per cycle.

    Parameters
    ----------
    config : MvmConfig

    Attributes
    ----------
    block_r_rdy : ``In(1)``, block_r_data : ``In(config.vector_block_bits)``,
    block_r_en : ``Out(1)``
        The read side of the block FIFO.
    tag : ``In(tag_layout(config))``, tag_r_en : ``Out(1)``
        The read side of the tag FIFO (a block in the FIFO always has its tag).
    vwr_addr : ``Out(TileEngine.vbuf_addr_bits(config))``,
    vwr_data : ``Out(config.vector_block_bits)``, vwr_en : ``Out(config.tiles)``
        Vector-buffer write; bit ``t`` of ``vwr_en`` writes bank ``t`` (tile engine ``t``).
    release : ``In(2)``
        Bit ``h``: the sequencer is done with half ``h`` (it wins over a block's ``last``
        in the same cycle, which never happens for the same half).
    full : ``Out(2)``
        Bit ``h``: half ``h`` holds all blocks of a command the sequencer has not done.

    Raises
    ------
    TypeError
        ``config`` is not an :class:`~host.spec.config.MvmConfig`.
    """

    def __init__(self, config):
        self._config = c = _check_config(config)
        super().__init__({
            "block_r_rdy": In(1),
            "block_r_data": In(c.vector_block_bits),
            "block_r_en": Out(1),
            "tag": In(tag_layout(c)),
            "tag_r_en": Out(1),
            "vwr_addr": Out(TileEngine.vbuf_addr_bits(c)),
            "vwr_data": Out(c.vector_block_bits),
            "vwr_en": Out(c.tiles),
            "release": In(2),
            "full": Out(2),
        })

    def elaborate(self, platform):
        m = Module()
        c = self._config
        full = [Signal(name=f"half{h}_full") for h in range(2)]
        tag = self.tag
        w_fire = Signal()
        half_bits = TileEngine.vbuf_half_bits(c)
        m.d.comb += [
            w_fire.eq(self.block_r_rdy & ~Mux(tag.half, full[1], full[0])),
            self.block_r_en.eq(w_fire),
            self.tag_r_en.eq(w_fire),
            self.vwr_addr.eq(Cat(tag.group[:half_bits], tag.half)),
            self.vwr_data.eq(self.block_r_data),
            self.vwr_en.eq(Cat(*[w_fire & (tag.bank == t) for t in range(c.tiles)])),
            self.full.eq(Cat(*full)),
        ]
        for h in range(2):
            with m.If(w_fire & tag.last & (tag.half == h)):
                m.d.sync += full[h].eq(1)
        for h in range(2):
            with m.If(self.release[h]):
                m.d.sync += full[h].eq(0)
        return m


class Sequencer(wiring.Component):
    """The compute sequencer: one group of T tiles per cycle, and the output credits.

    When the next half of the vector buffer is full it takes the command's parameters
    from the params FIFO and reads one group per cycle: for ``r in 0..R-1``,
    ``g in 0..G-1`` all engines read slot ``base + r*G + g`` and the vector block
    ``c = g*T + t`` of the half (an engine with ``c >= C`` is not enabled: its vector
    copy is zeroed). After the last read it releases the half and, if the next half is
    full, starts the next command in the same cycle.

    A group is read only while fewer than ``credits`` row blocks are reserved (issued
    and not yet taken from ``y_stream``): every row block has a place in the output FIFO
    before its last group is read, so the datapath after the MRF never stalls. A taken
    vector frees its place one edge late (the count's adder then starts from
    registers only).

    Parameters
    ----------
    config : MvmConfig
    credits : int
        Row blocks the output FIFO holds (:func:`hw.mvm.mvm.output_fifo_depth`).

    Attributes
    ----------
    params_r_rdy : ``In(1)``, params_r_data : ``In(params_layout(config))``,
    params_r_en : ``Out(1)``
        The read side of the params FIFO.
    full : ``In(2)``, release : ``Out(2)``
        The halves of the vector buffer (:class:`VectorWriter`).
    reading : ``Out(1)``
        A command is being read (the MRF read address is the sequencer's).
    slot : ``Out(TileEngine.slot_bits(config))``,
    vrd_addr : ``Out(TileEngine.vbuf_addr_bits(config))``
        The MRF slot and the vector-buffer address of the group read in this cycle.
    enable : ``Out(config.tiles)``
        Bit ``t``: engine ``t`` computes the group read in this cycle.
    therm : ``Out(config.dot_bits - 1)``
        The command's fit thermometer (narrow check only; else 0).
    group : ``Out(group_layout(config))``
        The side information of the group read ``TileEngine.dot_latency_of(config)``
        cycles earlier, when its tile products leave the engines.
    fire : ``Out(1)``
        A group is read in this cycle.
    out_taken : ``In(1)``
        A vector is taken from ``y_stream`` in this cycle.
    reserved : ``Out(range(credits + 1))``
        Row blocks issued and not yet taken (one edge late).

    Raises
    ------
    TypeError
        ``config`` is not an :class:`~host.spec.config.MvmConfig`.
    """

    def __init__(self, config, *, credits):
        self._config = c = _check_config(config)
        self._credits = credits
        super().__init__({
            "params_r_rdy": In(1),
            "params_r_data": In(params_layout(c)),
            "params_r_en": Out(1),
            "full": In(2),
            "release": Out(2),
            "reading": Out(1),
            "slot": Out(TileEngine.slot_bits(c)),
            "vrd_addr": Out(TileEngine.vbuf_addr_bits(c)),
            "enable": Out(c.tiles),
            "therm": Out(c.dot_bits - 1),
            "group": Out(group_layout(c)),
            "fire": Out(1),
            "out_taken": In(1),
            "reserved": Out(range(credits + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        c = self._config
        tiles = c.tiles
        gmax = c.col_groups_max
        depth = self._credits
        narrow_check = c.narrow_check
        s_valid = Signal(name="seq_valid")
        s_half = Signal(name="seq_half")
        s_next = Signal(name="seq_next_half")
        s_slot = Signal(TileEngine.slot_bits(c), name="seq_slot")
        s_group = Signal(range(max(2, gmax)), name="seq_group")
        s_left = Signal(range(max(2, c.mrf_depth)), name="seq_steps_left")
        s_params = Signal(params_layout(c), name="seq_params")
        reserved = Signal(range(depth + 1), name="output_reserved")
        fire = Signal()
        final = Signal()
        start = Signal()
        last_group = Signal()
        full = self.full
        # The comparisons of the step and group counters are registers of their own
        # (updated with the counters), so that `start`, which loads the sequencer from
        # the params FIFO, is two LUT levels from flip-flops.
        s_end = Signal(name="seq_at_last_step")           # s_left == 0
        next_full = Mux(s_next, full[1], full[0])
        m.d.comb += [
            fire.eq(s_valid & (reserved < depth)),
            final.eq(fire & s_end),
            start.eq(next_full & (~s_valid | final)),
        ]
        s_lastg = Signal(name="seq_at_last_group")        # s_group == last_group
        m.d.comb += last_group.eq(s_lastg)
        with m.If(fire):
            m.d.sync += [
                s_slot.eq(s_slot + 1),
                s_group.eq(Mux(last_group, 0, s_group + 1)),
                s_lastg.eq(Mux(last_group, s_params.last_group == 0,
                               s_group + 1 == s_params.last_group)),
                s_left.eq(s_left - 1),
                s_end.eq(s_left == 1),
            ]
        with m.If(final):
            m.d.sync += s_valid.eq(0)
        m.d.comb += self.release.eq(Cat(*[final & (s_half == h) for h in range(2)]))
        m.d.comb += self.params_r_en.eq(start)
        with m.If(start):
            nxt = self.params_r_data
            m.d.sync += [
                s_valid.eq(1), s_half.eq(s_next), s_next.eq(~s_next),
                s_slot.eq(nxt.base), s_group.eq(0), s_left.eq(nxt.last_step),
                s_params.eq(nxt),
                s_end.eq(nxt.last_step == 0), s_lastg.eq(nxt.last_group == 0),
            ]

        half_bits = TileEngine.vbuf_half_bits(c)
        enables = Cat(*[~last_group | s_params.lastmask[t] for t in range(tiles)])
        m.d.comb += [
            self.reading.eq(s_valid),
            self.slot.eq(s_slot),
            self.vrd_addr.eq(Cat(s_group[:half_bits], s_half)),
            self.enable.eq(Cat(*[fire & enables[t] for t in range(tiles)])),
            self.fire.eq(fire),
        ]
        if narrow_check:
            m.d.comb += self.therm.eq(s_params.therm)

        # Side information of each group, delayed to meet its tile products (k only
        # with the narrow check).
        side = Cat(fire, s_group == 0, last_group, fire.replicate(tiles) & enables,
                   *([s_params.k] if narrow_check else []))
        for j in range(TileEngine.dot_latency_of(c)):
            r = Signal(len(side), name=f"group_side_d{j + 1}")
            m.d.sync += r.eq(side)
            side = r
        m.d.comb += self.group.as_value().eq(side)

        # A taken vector frees its place one edge late: the credit count's adder then
        # starts from registers only, not from y_stream.ready (an input from wherever
        # the consumer is). The FIFO has room for this edge (output_fifo_depth).
        y_taken = Signal(name="output_taken", reset_less=True)
        m.d.sync += [
            y_taken.eq(self.out_taken),
            reserved.eq(reserved + (fire & last_group) - y_taken),
        ]
        m.d.comb += self.reserved.eq(reserved)
        return m
