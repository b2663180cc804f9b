"""The multifunction units and the MFU pipeline (``docs/mfu.md``)."""

from hw.mfu.mfu import Mfu, MfuPipeline

__all__ = ["Mfu", "MfuPipeline"]
