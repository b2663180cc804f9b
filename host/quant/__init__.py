"""Quantization tools above the compiler: calibration of BFP exponents (``docs/calibration.md``).

``host.quant`` sits between ``host.compiler`` and ``host.cli`` in the layering
(``tests/test_layering.py``): it may import every host layer below it. The exponent
searches are :mod:`host.quant.calibrate`; the network calibration (``npu compile
--calibrate``) is :mod:`host.quant.ptq`, whose entry point :func:`compile_calibrated` is
the compiler's ``compile_onnx`` with calibration (the compiler cannot import this layer).
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
from host.quant.ptq import (
    METHODS,
    CalibrationError,
    calibrate_graph,
    compile_calibrated,
    layer_events,
    load_calibration,
    reference_activations,
)

__all__ = [
    "ActivationCalibration", "ScaleResult", "activation_exponent", "activation_offset",
    "calibrated_weights", "fold_offset", "scale_until", "weight_exponents",
    "METHODS", "CalibrationError", "calibrate_graph", "compile_calibrated", "layer_events",
    "load_calibration", "reference_activations",
]
