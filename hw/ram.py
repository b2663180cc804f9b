"""What the gateware tells a synthesis flow about its memories.

Amaranth gives every synchronous read port a defined result when it reads a word in the
cycle a write port writes it (the old word, for ``transparent_for=()``). An ECP5 block
RAM (DP16KD, PDPW16KD) leaves a read and a write of one address on different ports in
one cycle undefined, so Yosys keeps Amaranth's result with logic of its own: it delays
the write by a cycle and forwards it to the read, with an address comparison and a
multiplexer per data bit in front of the read's register. In the MVM's MRF that logic
put the sequencer's read address, compared with the write address, on the routed
critical path (``docs/mvm.md`` section 11).

A memory whose design never uses such a read says so with :data:`READ_COLLISION_UNUSED`
in its ``attrs``; the flows (:mod:`bench.fpga`, ``make bitstream`` in :mod:`hw.board.board`)
then run :func:`yosys_collision_commands` inside ``synth_ecp5``, which lets Yosys leave
the read undefined (its ``RD_COLLISION_X_MASK``), as the block RAM gives it with no logic.
The simulated design is unchanged: a test that used such a read would still see the old
word.
"""

__all__ = ["READ_COLLISION_UNUSED", "MAX_MARKED_PORTS", "yosys_collision_commands"]

#: ``attrs`` of a :class:`amaranth.lib.memory.Memory` none of whose reads taken in a
#: cycle that writes the same address is used. Yosys copies it to the ``$mem_v2`` cell.
READ_COLLISION_UNUSED = {"npu_read_collision_unused": 1}

#: Read ports, and write ports, of a marked memory that :func:`yosys_collision_commands`
#: handles, each (Yosys's mask is as wide as their product).
MAX_MARKED_PORTS = 4


def yosys_collision_commands():
    """Yosys commands that make the collision reads of every memory marked
    :data:`READ_COLLISION_UNUSED` undefined.

    They must run between ``memory_collect`` (in ``synth_ecp5``'s ``coarse`` step) and
    ``memory_libmap`` (its ``map_ram`` step): ``synth_ecp5 ... -run begin:map_ram``, these,
    then ``synth_ecp5 ... -run map_ram:``. The mask has a bit per (read port, write port)
    pair and must be exactly that wide, so there is one ``setparam`` per port count; a
    marked memory with more than :data:`MAX_MARKED_PORTS` read or write ports stops the
    script (``select -assert-none``) rather than keep Yosys's logic unnoticed.

    Returns a list of command lines (``str``).
    """
    (attr,) = READ_COLLISION_UNUSED
    n = MAX_MARKED_PORTS
    return [
        *[f"setparam -set RD_COLLISION_X_MASK {rd * wr}'b{'1' * (rd * wr)} "
          f"t:$mem_v2 a:{attr} %i r:RD_PORTS={rd} %i r:WR_PORTS={wr} %i"
          for rd in range(1, n + 1) for wr in range(1, n + 1)],
        *[f"select -assert-none t:$mem_v2 a:{attr} %i r:{ports}>{n} %i"
          for ports in ("RD_PORTS", "WR_PORTS")],
    ]
