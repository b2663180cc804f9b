"""Quantization tools above the compiler: calibration of BFP exponents (``docs/calibration.md``).

``host.quant`` sits between ``host.compiler`` and ``host.cli`` in the layering
(``tests/test_layering.py``): it may import every host layer below it.
"""

from host.quant.calibrate import (
    ActivationCalibration,
    ScaleResult,
    activation_exponent,
    activation_offset,
    calibrated_weights,
    fold_offset,
    scale_until,
    weight_exponents,
)

__all__ = [
    "ActivationCalibration", "ScaleResult", "activation_exponent", "activation_offset",
    "calibrated_weights", "fold_offset", "scale_until", "weight_exponents",
]
