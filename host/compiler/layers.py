"""What the lowering reports and raises, shared by :mod:`host.compiler.lower` and
:mod:`host.compiler.lower_rnn` (which ``lower`` imports, so they cannot live in ``lower``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CompileError", "LayerInfo"]


class CompileError(ValueError):
    """A graph the lowering cannot map onto the build; the message names the layer, the
    memory or limit, and both sizes."""


@dataclass
class LayerInfo:
    """What one IR node became (one row of the report)."""
    name: str
    op: str
    input_shape: list
    output_shape: list
    macs: int = 0
    mrf_slots: list = field(default_factory=list)      # [first, count] or []
    vrf: dict = field(default_factory=dict)            # space name -> native vectors
    chains: int = 0

    def to_json(self) -> dict:
        return {"name": self.name, "op": self.op, "input_shape": self.input_shape,
                "output_shape": self.output_shape, "macs": self.macs,
                "mrf_slots": self.mrf_slots, "vrf": self.vrf, "chains": self.chains}
