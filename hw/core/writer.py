"""The writer: every result vector of a chain instance to each destination of its
chain, in order, on the core's write bus or into the output queue (``docs/npu.md``,
"Writer")."""

from amaranth.hdl import Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from host.spec.config import NpuConfig
from host.spec.isa import MAX_WRITES, Space
from hw.core.vectors import beat_layout, last_beat, last_beat_index, vector_layout
from hw.mfu.mfu import output_layout

__all__ = ["Writer", "write_bus_layout", "writer_layout"]


def writer_layout(config: NpuConfig) -> data.StructLayout:
    """What the writer takes of an instance: ``length`` (``L``, native vectors) and its
    ``MAX_WRITES`` destinations, ``valid`` (one bit each), ``space`` and ``addr`` (this
    iteration's first vector address)."""
    a = config.vector_addr_bits
    return data.StructLayout({
        "length": unsigned(config.mfu.length_bits),
        "valid": unsigned(MAX_WRITES),
        "space": data.ArrayLayout(Space, MAX_WRITES),
        "addr": data.ArrayLayout(unsigned(a), MAX_WRITES),
    })


def write_bus_layout(config: NpuConfig) -> data.StructLayout:
    """A write on the core's write bus: ``en``, ``space`` (4 bits, a Space code), ``addr``
    (a vector address), ``beat`` (``beat_bits`` wide: the bank; 0 bits with lanes == n)
    and ``data`` (one beat)."""
    return data.StructLayout({"en": 1, "space": 4, "addr": config.vector_addr_bits,
                              "beat": config.beat_bits, "data": beat_layout(config)})


class Writer(wiring.Component):
    """Each result beat of ``results`` to every destination of the instance at the head
    of ``instances``, one cycle per beat and destination, in the order of the chain's
    ``v_wr``; the beat is taken with its last destination and the instance
    (``instances.ready``, the scoreboard's retire) with its last beat.

    A vector memory gets the beat on ``wr`` at vector address ``addr + beat_index /
    beats``, bank ``beat_index mod beats``. The output queue stays N wide: with lanes < n
    every beat but a vector's last shifts into ``outq_hold`` ((beats - 1) beats) and each
    NETQ destination pushes ``Cat(outq_hold, last beat)`` with the last beat, so a chain
    with two ``v_wr netq`` pushes v0, v0, v1, v1 as the model does. The queue's room was
    claimed when the chain was checked: ``outq_push`` is never refused.

    Parameters
    ----------
    config : NpuConfig
        The build; it fixes the widths and ``beats``.

    Attributes
    ----------
    instances : ``In(stream.Signature(writer_layout(config)))``
        The instances issued, oldest first (the head of the writer queue).
    results : ``In(stream.Signature(hw.mfu.mfu.output_layout(config.mfu)))``
        The MFU pipeline's result beats (``MfuPipeline.o_stream``).
    wr : ``Out(write_bus_layout(config))``
        A vector-memory write this cycle (when ``wr.en``).
    outq_push : ``Out(1)``
        Push ``outq_data`` onto the output queue this cycle.
    outq_data : ``Out(vector_layout(config))``
        The vector pushed.
    """

    def __init__(self, config: NpuConfig):
        self._config = config
        super().__init__({
            "instances": In(stream.Signature(writer_layout(config))),
            "results": In(stream.Signature(output_layout(config.mfu))),
            "wr": Out(write_bus_layout(config)),
            "outq_push": Out(1),
            "outq_data": Out(vector_layout(config)),
        })

    def elaborate(self, platform):
        c = self._config
        beats = c.beats
        beat = beat_layout(c)
        m = Module()
        head = self.instances.payload
        pending = Signal(MAX_WRITES)
        fresh = Signal(init=1)        # pending not loaded yet for this vector
        todo = Signal(MAX_WRITES)
        m.d.comb += todo.eq(Mux(fresh, head.valid, pending))
        w_index = Signal(c.mfu.length_bits + c.beat_bits)     # beat of the instance written
        first = Signal(MAX_WRITES)    # lowest bit of todo
        for k in reversed(range(MAX_WRITES)):
            with m.If(todo[k]):
                m.d.comb += first.eq(1 << k)
        rest = todo & ~first
        o = self.results
        o_values = data.View(beat, o.payload.values)
        writing = o.valid & self.instances.valid
        # The vector and beat written: each beat goes to every destination, one cycle each.
        w_vector = w_index if beats == 1 else w_index[c.beat_bits:]
        with m.If(writing):
            for k in range(MAX_WRITES):
                with m.If(first[k]):
                    with m.If(head.space[k] == Space.NETQ):
                        # The output queue takes whole vectors: with the last beat.
                        m.d.comb += self.outq_push.eq(1 if beats == 1
                                                      else last_beat(c, w_index))
                    with m.Else():
                        m.d.comb += [self.wr.en.eq(1), self.wr.space.eq(head.space[k]),
                                     self.wr.addr.eq(head.addr[k] + w_vector),
                                     self.wr.data.eq(o_values)]
                        if beats > 1:
                            m.d.comb += self.wr.beat.eq(w_index[:c.beat_bits])
            with m.If(rest == 0):
                m.d.comb += o.ready.eq(1)
                m.d.sync += [fresh.eq(1), w_index.eq(w_index + 1)]
                with m.If(w_index == last_beat_index(c, head.length)):
                    m.d.comb += self.instances.ready.eq(1)
                    m.d.sync += w_index.eq(0)
            with m.Else():
                m.d.sync += [fresh.eq(0), pending.eq(rest)]
        if beats == 1:
            m.d.comb += self.outq_data.eq(o_values)
        else:
            outq_hold = Signal((beats - 1) * beat.size)
            with m.If(o.valid & o.ready):
                m.d.sync += outq_hold.eq(Cat(outq_hold[beat.size:], o_values))
            m.d.comb += self.outq_data.eq(Cat(outq_hold, o_values))
        return m
