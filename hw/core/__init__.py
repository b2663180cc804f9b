"""The NPU core: instruction decoder, scheduler, memories and queues (``docs/npu.md``)."""

from hw.core.npu import NpuCore

__all__ = ["NpuCore"]
