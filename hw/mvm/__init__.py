"""The matrix-vector multiplier: vector quantizer, tile engines with their MRF slices,
BFP-long accumulator and FP16 output converter (``docs/mvm.md``)."""

from hw.mvm.mvm import Mvm

__all__ = ["Mvm"]
