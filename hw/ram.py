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
in its ``attrs``; :mod:`bench.fpga` then lets Yosys leave the read undefined (its
``RD_COLLISION_X_MASK``), which the block RAM gives with no logic. The simulated design
is unchanged: a test that used such a read would still see the old word.
"""

__all__ = ["READ_COLLISION_UNUSED"]

#: ``attrs`` of a :class:`amaranth.lib.memory.Memory` none of whose reads taken in a
#: cycle that writes the same address is used. Yosys copies it to the ``$mem_v2`` cell.
READ_COLLISION_UNUSED = {"npu_read_collision_unused": 1}
