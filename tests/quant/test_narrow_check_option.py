"""Range scaling on a build without the narrow-accumulator check (``narrow_check=off``,
issue 36): the device's INFO says the check is absent (its ``narrow_events`` counter
exists and stays 0), and ``compile_calibrated`` with ``accumulator_bits`` says so and
stops; calibration without range scaling still runs on it."""

from __future__ import annotations

import numpy as np
import pytest
from ptq_models import mlp

from host.quant import CalibrationError, compile_calibrated
from host.runtime.device import Device
from host.runtime.transport import ModelTransport
from host.spec.config import parse_config

BUILD = "n=8,tiles=1,mantissa_bits_v=8,mantissa_bits_w=8,narrow_check=off"


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(5)
    model = mlp([(rng.normal(0, 1 / 8, (8, 16)), np.zeros(8), None)])
    return model, rng.normal(0, 1, (6, 16)).astype(np.float32)


@pytest.mark.parametrize("device", [None, "model"])
def test_range_scaling_is_refused(case, device):
    model, x = case
    if device == "model":
        device = Device(ModelTransport(config=parse_config(BUILD)))
        assert device.info()["narrow_check"] == 0 and "narrow_events" in device.counters()
    with pytest.raises(CalibrationError, match="has no narrow-accumulator check.*stopped"):
        compile_calibrated(model, BUILD, calibrate=x, accumulator_bits=16, device=device)


def test_calibration_without_range_scaling_runs(case):
    model, x = case
    net = compile_calibrated(model, BUILD, calibrate=x)
    assert net.image.config["narrow_check"] is False
