"""The host link in gateware: message processors, CRC and UART units (``docs/link-hw.md``)."""

from hw.link.link import NpuLink

__all__ = ["NpuLink"]
