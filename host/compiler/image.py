"""A built program as a network image (:class:`host.spec.image.NetworkImage`)."""

from __future__ import annotations


import numpy as np

from host.compiler.programs import Builder
from host.model.core import NpuModel
from host.spec.image import NetworkImage
from host.spec.isa import Space

__all__ = ["program_image"]


def program_image(program, *, per_job_vectors: bool = True) -> NetworkImage:
    """The image of a ``host.compiler.programs.Program``.

    Its matrices become MRF words, quantized by the reference model's weight quantizer
    (the one the on-chip quantizer equals), or with their calibrated block exponents
    (``program.matrix_exponents``), covering just the tile slots they occupy. Its
    vectors (biases, initial state) go to ``job_memories`` with ``per_job_vectors`` (every
    job starts from the same state), else to ``memories``. ``outputs`` is the program's;
    ``inputs`` is the number of input vectors the program was built with, which every
    job must then have. The program's own input vectors are not part of the image: they
    are the first job.
    """
    cfg = program.config
    scratch = NpuModel(cfg)
    memories = []
    for slot, matrix in program.matrices:
        if slot in program.matrix_exponents:          # calibrated: the words as placed
            memories.append((Space.MRF, *Builder(cfg).mrf_words(
                slot, matrix, program.matrix_exponents[slot])))
            continue
        rows, cols = scratch.write_weights(slot, matrix)
        per_slot = cfg.tiles * cfg.n
        start, count = slot * per_slot, cfg.mvm.slots_needed(rows, cols) * per_slot
        memories.append((Space.MRF, start, scratch.read(Space.MRF, start, count)))
    vectors = [(Space(s), int(a), np.asarray(d, np.uint16)) for s, a, d in program.vectors]
    config = cfg.to_dict()
    inputs = 0 if program.inputs is None else len(program.inputs)
    return NetworkImage(program=program.words,
                        memories=memories + ([] if per_job_vectors else vectors),
                        job_memories=vectors if per_job_vectors else [],
                        outputs=program.outputs, inputs=inputs, config=config)
