"""The event counters of the device (``docs/numerics.md`` section 5, ``docs/npu.md``):
their names, in the order READ_COUNTERS reports them, as the gateware names its ports and
the reference model keeps them."""

from __future__ import annotations

__all__ = ["MVM_COUNTERS", "MFU_COUNTERS", "counter_names"]

#: The MVM's counters, named as ``hw.mvm.mvm.Mvm`` names its ports.
MVM_COUNTERS = ("vector_saturations", "vector_nonfinite", "weight_saturations",
                "weight_nonfinite", "narrow_events", "output_saturations")

#: Each MFU's counters; entry ``mfu<m>_<name>`` for MFU ``m``.
MFU_COUNTERS = ("overflow", "nan_created")


def counter_names(config) -> tuple[str, ...]:
    """The READ_COUNTERS entry names of a build (an ``NpuConfig``): :data:`MVM_COUNTERS`,
    then :data:`MFU_COUNTERS` of MFU 0, 1, ... in order."""
    return MVM_COUNTERS + tuple(f"mfu{m}_{name}" for m in range(config.mfus)
                                for name in MFU_COUNTERS)
