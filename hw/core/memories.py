"""The core's vector memories: the IVRF, and the copies of the MFU VRFs that the reader
reads (``docs/npu.md``, "Memories").

The MFU pipeline keeps its VRFs inside, where its units read them; the reader needs
their contents too (a chain may read a VRF as its source), so the core keeps a copy of
every VRF the build has, written by the same write bus. The copies share one memory,
VRF slot ``j`` (the ``j``-th built, :func:`hw.core.decode.built_vrfs`) at addresses
``j << ceil_log2(vrf_depth)``: the reader reads one space a cycle and the write bus
writes one, so one read and one write port per bank serve every copy (a memory per copy
only multiplied block RAM: at N = 16 each 64-bit bank took two mostly empty DP16KD;
issue 36 item 3).

With ``lanes`` l < n each memory is ``beats`` banks of one beat: a read sees every bank,
a whole native vector in one cycle (what the MVM's input takes), and a write goes to one
bank, one beat (form (a) of ``docs/notes/2026-11-28-lanes-plan.md``, section 2.2).
"""

from amaranth.hdl import Cat, Const, Module, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from host.spec.isa import Space
from hw.core.decode import built_vrfs, vrf_space
from hw.core.plan import any_of
from hw.core.reader import RD_DATA_LATENCY, memory_spaces, read_request_layout
from hw.core.vectors import beat_layout, checked_config, vector_layout
from hw.core.writer import write_bus_layout

__all__ = ["VectorMemories"]


def _vector_banks(m, name, config, depth):
    """A vector memory of ``depth`` native vectors as ``beats`` banks, bank ``b`` holding
    beat ``b`` of every vector at the vector's address. With ``lanes == n``, one bank:
    the memory of one vector per word, under ``name``. Returns the list of
    ``lib.memory.Memory``, bank 0 first."""
    if config.beats == 1:
        mem = Memory(shape=vector_layout(config), depth=depth, init=[])
        m.submodules[name] = mem
        return [mem]
    banks = []
    for b in range(config.beats):
        mem = Memory(shape=beat_layout(config), depth=depth, init=[])
        m.submodules[f"{name}_beat{b}"] = mem
        banks.append(mem)
    return banks


class VectorMemories(wiring.Component):
    """The IVRF and the VRF copies (module docstring), one read and one write a cycle.

    Parameters
    ----------
    config : host.spec.config.NpuConfig

    Ports
    -----
    rd : ``In(read_request_layout(config))``
        A read of a space (IVRF or a VRF the build has) at a vector address, when
        ``rd.en``; its data comes the next cycle.
    wr : ``In(write_bus_layout(config))``
        A write of one beat into bank ``wr.beat`` of a space, when ``wr.en``.
    ivrf_data, vrf_data : ``Out(vector_layout(config))``
        Each memory's read data (``vrf_data`` only where the build has VRFs): the
        reader's inputs (:func:`hw.core.reader.memory_spaces`).
    rd_data : ``Out(vector_layout(config))``
        The data of the space read :data:`hw.core.reader.RD_DATA_LATENCY` cycles before
        (the host's vector reads), held until the next read's.

    Raises
    ------
    TypeError
        ``config`` is not an :class:`host.spec.config.NpuConfig`.
    """

    def __init__(self, config):
        config = checked_config(self, config)
        self._config = config
        members = {"rd": In(read_request_layout(config)), "wr": In(write_bus_layout(config))}
        for key in memory_spaces(config):
            members[f"{key}_data"] = Out(vector_layout(config))
        members["rd_data"] = Out(vector_layout(config))
        super().__init__(members)

    @property
    def config(self):
        return self._config

    def elaborate(self, platform):
        m = Module()
        c = self._config
        rd, wr = self.rd, self.wr
        vrf_built = built_vrfs(c)
        v_bits = ceil_log2(c.vrf_depth)
        slot_bits = ceil_log2(len(vrf_built))

        def copy_addr(space, addr, name):
            a = Signal(v_bits + slot_bits, name=name)
            m.d.comb += a.eq(addr[:v_bits])
            with m.Switch(Value.cast(space)):
                for j, k in enumerate(vrf_built[1:], 1):
                    with m.Case(vrf_space(k)):
                        m.d.comb += a.eq(Cat(addr[:v_bits], Const(j, slot_bits)))
            return a

        mems = {"ivrf": (_vector_banks(m, "ivrf", c, c.ivrf_depth), rd.addr, wr.addr,
                         wr.space == Space.IVRF.value)}
        if vrf_built:
            on_vrf = any_of([wr.space == vrf_space(k) for k in vrf_built])
            mems["vrf"] = (_vector_banks(m, "vrf_copies", c, len(vrf_built) << v_bits),
                           copy_addr(rd.space, rd.addr, "copy_rd_addr"),
                           copy_addr(wr.space, wr.addr, "copy_wr_addr"), on_vrf)
        rdata = {}
        spaces = memory_spaces(c)
        for key, (banks, raddr, waddr, wsel) in mems.items():
            ports = []
            for b, mem in enumerate(banks):
                rp = mem.read_port(domain="sync", transparent_for=())
                wp = mem.write_port()
                en = wr.en & wsel
                m.d.comb += [rp.addr.eq(raddr), rp.en.eq(rd.en),
                             wp.addr.eq(waddr), wp.data.eq(wr.data),
                             wp.en.eq(en if c.beats == 1 else en & (wr.beat == b))]
                ports.append(rp)
            # The memory's read data, a native vector (the banks side by side).
            out = getattr(self, f"{key}_data")
            m.d.comb += out.eq(ports[0].data if c.beats == 1
                               else Cat(*(rp.data for rp in ports)))
        # The host's reads take their data from registers: each memory's read data as it
        # came, then the choice of the space. Straight from the block RAMs (5.6 to 5.8 ns
        # from the clock to the data; nextpnr times every DP16KD so, whatever its
        # REGMODE) through that choice and host access's response into its register
        # was two to three LUT levels more in one cycle (docs/link-hw.md section 5). The
        # reader registers the same data for itself (hw.core.reader).
        rd_space = Signal(4, name="rd_space_q")     # space of the read issued last cycle
        with m.If(rd.en):
            m.d.sync += rd_space.eq(rd.space)
        data = {key: getattr(self, f"{key}_data") for key in mems}
        for k in range(2, RD_DATA_LATENCY + 1):       # the registers behind them
            later = Signal(4, name=f"rd_space_q{k}")
            m.d.sync += later.eq(rd_space)
            rd_space = later
            for key, d in data.items():
                data[key] = Signal(vector_layout(c), name=f"{key}_data_q{k}")
                m.d.sync += data[key].eq(d)
        for key in mems:
            rdata.update({s: data[key] for s in spaces[key]})
        with m.Switch(rd_space):
            for s, d in rdata.items():
                with m.Case(s):
                    m.d.comb += self.rd_data.eq(d)
        return m
