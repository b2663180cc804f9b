"""The reference core: executes binary programs bit-exactly (outputs, memories, counters)
and predicts their cycles (:mod:`.core`); the MFU chain model (:mod:`.mfu`); softmax on
the MFUs and its error bound (:mod:`.softmax`)."""

from host.model.core import NpuError, NpuModel, RunResult

__all__ = ["NpuModel", "NpuError", "RunResult"]
