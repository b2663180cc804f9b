"""The contract between the gateware, the reference model and the host software.

Everything that hardware and software must agree on is written once here and imported by
``hw``, ``host`` and ``sim``: number formats and limits (:mod:`.formats`), the operation
codes of the MFUs (:mod:`.ops`), build configurations and their presets (:mod:`.config`),
the MFU chain encoding (:mod:`.mfu`), the instruction set (:mod:`.isa`), the event
counters (:mod:`.counters`), the host link's frames, opcodes, statuses and INFO entries
(:mod:`.protocol`) and the network image file (:mod:`.image`).

This package imports no kernel, model, compiler or runtime module
(``docs/architecture.md``).
"""
