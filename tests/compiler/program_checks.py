"""Running a program's words on the reference model for the reordering tests (deps,
schedule): not a test module. Shared so that both compare the same state."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from host.model.core import NpuModel
from host.spec.isa import Space


class Outcome(NamedTuple):
    outputs: np.ndarray
    memories: dict          # Space -> every word of the IVRF and each MFU VRF
    counters: dict
    registers: dict
    chains: int
    cycles: int


def outcome(prog, words) -> Outcome:
    """Outputs, every vector memory, counters, final registers, chains and predicted
    cycles of ``words`` run on the model with ``prog``'s image and inputs."""
    cfg = prog.config
    model = NpuModel(cfg)
    for space, addr, data in prog.vectors:
        model.write(space, addr, data)
    for slot, matrix in prog.matrices:
        model.write_weights(slot, matrix)
    model.load_program(words)
    if prog.inputs is not None and len(prog.inputs):
        model.push_input(prog.inputs)
    result = model.run()
    assert result.ok, result
    spaces = [Space.IVRF] + [s for m in range(cfg.mfus)
                             for s in (Space.asvrf(m), Space.mulvrf(m))]
    mems = {s: model.read(s, 0, cfg.ivrf_depth if s is Space.IVRF else cfg.vrf_depth)
            for s in spaces}
    return Outcome(model.pop_output(model.output_level), mems, model.counters(),
                   model.registers, result.chains, result.cycles_predicted)


def same_bits(a: Outcome, b: Outcome) -> bool:
    """Equal outputs, memories and counters (registers, chains and cycles may differ)."""
    return (np.array_equal(a.outputs, b.outputs) and a.counters == b.counters
            and all(np.array_equal(a.memories[s], b.memories[s]) for s in a.memories))
