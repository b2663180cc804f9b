"""The feeder: each chain instance's configuration, then its ``L`` vectors (the MVM's
results or the reader's source vectors) into the MFU pipeline (``docs/npu.md``,
"Feeder")."""

from amaranth.hdl import Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from host.spec.config import NpuConfig
from host.spec.mfu import chain_layout
from hw.core.vectors import beat_layout, beat_select, last_beat, last_beat_index, vector_layout

__all__ = ["Feeder", "feeder_layout"]


def feeder_layout(config: NpuConfig) -> data.StructLayout:
    """What the feeder takes of an instance: ``chain`` (the MFU pipeline's chain word,
    :func:`host.spec.mfu.chain_layout`, with this iteration's VRF addresses) and ``to_mvm``
    (1: its vectors are the MVM's results, 0: the reader's, from the direct buffer)."""
    return data.StructLayout({"chain": chain_layout(config.mfu), "to_mvm": unsigned(1)})


class Feeder(wiring.Component):
    """Per instance, its chain into ``chain``, then exactly ``L`` native vectors (``L *
    beats`` beats) into ``o_stream``, from ``products`` (``to_mvm``) or ``direct``.

    From the MVM it takes beat ``f_count mod beats`` of the row block at the head of
    ``products`` and takes the block with its last beat (the N -> l adapter: a
    multiplexer, no register); from the direct buffer one beat per beat. The instance is
    taken (``instances.ready``) with its chain, and what its beats need of it (the
    source, the last beat's index) is kept until its last beat. Nothing else here is
    registered but the beat count: the adapter adds no cycle.

    Parameters
    ----------
    config : NpuConfig
        The build; it fixes the widths and ``beats``.

    Attributes
    ----------
    instances : ``In(stream.Signature(feeder_layout(config)))``
        The instances issued, oldest first (the head of the feeder queue).
    products : ``In(stream.Signature(vector_layout(config)))``
        The MVM's result vectors (``Mvm.y_stream``).
    direct : ``In(stream.Signature(beat_layout(config)))``
        The source beats of chains without a product (the direct buffer).
    chain : ``Out(stream.Signature(chain_layout(config.mfu)))``
        To ``MfuPipeline.chain``.
    o_stream : ``Out(stream.Signature(beat_layout(config)))``
        To ``MfuPipeline.i_stream``.
    """

    def __init__(self, config: NpuConfig):
        self._config = config
        super().__init__({
            "instances": In(stream.Signature(feeder_layout(config))),
            "products": In(stream.Signature(vector_layout(config))),
            "direct": In(stream.Signature(beat_layout(config))),
            "chain": Out(stream.Signature(chain_layout(config.mfu))),
            "o_stream": Out(stream.Signature(beat_layout(config))),
        })

    def elaborate(self, platform):
        c = self._config
        m = Module()
        head = self.instances.payload
        # The instance leaves the feeder queue with its chain, not with its last beat:
        # the queue's read enable is then the chain's handshake (two flip-flops and the
        # queue's own valid), not the beats' handshake with the MFU pipeline, a round trip
        # across the die that ended the core's critical path (issue 36, timing). No cycle
        # changes: the queue never holds more instances than the scoreboard lets be in
        # flight, and the next instance's chain waits for `configured` to fall as before.
        configured = Signal()             # an instance's chain is given; beats to feed
        from_mvm = Signal()               # its vectors are the MVM's
        f_last = Signal(len(last_beat_index(c, head.chain.length)))
        f_count = Signal(c.mfu.length_bits + c.beat_bits)      # beats of the instance fed
        m.d.comb += [self.chain.valid.eq(self.instances.valid & ~configured),
                     self.chain.payload.eq(head.chain),
                     self.instances.ready.eq(self.chain.ready & ~configured)]
        with m.If(self.chain.valid & self.chain.ready):
            m.d.sync += [configured.eq(1), f_count.eq(0), from_mvm.eq(head.to_mvm),
                         f_last.eq(last_beat_index(c, head.chain.length))]
        y_data = self.products.payload.as_value()
        src_valid = Mux(from_mvm, self.products.valid, self.direct.valid)
        src_data = Mux(from_mvm, beat_select(c, y_data, f_count), self.direct.payload)
        y_ready = configured & from_mvm & self.o_stream.ready
        m.d.comb += [
            self.o_stream.valid.eq(configured & src_valid),
            self.o_stream.payload.eq(src_data),
            self.products.ready.eq(y_ready if c.beats == 1
                                   else y_ready & last_beat(c, f_count)),
            self.direct.ready.eq(configured & ~from_mvm & self.o_stream.ready),
        ]
        with m.If(self.o_stream.valid & self.o_stream.ready):
            m.d.sync += f_count.eq(f_count + 1)
            with m.If(f_count == f_last):
                m.d.sync += configured.eq(0)
        return m
