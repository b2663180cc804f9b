"""Range scaling on a device's counters (seed 000, ``docs/calibration.md`` section 6):
``compile_calibrated(..., accumulator_bits=K, overflow_threshold=T)``.

The events at the returned exponents and one step tighter are recounted here by a probe
program of the test's own, run on a fresh reference model: ``s_wr`` of the narrow width
and the static exponent, one ``v_rd`` / ``mv_mul`` / ``v_wr`` chain, the image's MRF words.
"""

from __future__ import annotations

import numpy as np
import pytest
from ptq_models import brute_weight_exponent, matrix_words, mlp

from host.cli import main
from host.compiler.network import config_text
from host.model.core import NpuModel
from host.quant import CalibrationError, compile_calibrated
from host.runtime.device import Device
from host.runtime.transport import ModelTransport
from host.spec.config import parse_config
from host.spec.isa import Instruction, Reg, Space, encode_program

#: 4-bit inputs, 8-bit weights: a static input of 1.25s and 2.25s times weights near 1
#: sums past a 16-bit accumulator over six column tiles.
BUILD = "n=16,tiles=1,mantissa_bits_v=4,mantissa_bits_w=8"
K, T = 16, 0


#: The sign of each input column (the same in every row): rows centred on zero, so that
#: calibration places no offset before the first layer, and weights of the same signs
#: (``case``), so that every product is positive and the sums grow as with positive rows.
SIGNS = np.random.default_rng(70).choice([-1.0, 1.0], 96)


def _inputs(rng, samples, blocks=6, n=16):
    """Rows where a static exponent wins (``docs/calibration.md`` section 1's block,
    jittered): per native block fifteen magnitudes near 1.25 and one near 2.25, with the
    column signs :data:`SIGNS`."""
    x = rng.uniform(1.2, 1.3, (samples, blocks * n))
    for s in range(samples):
        for b in range(blocks):
            x[s, b * n + rng.integers(n)] = rng.uniform(2.2, 2.3)
    return (x * SIGNS[:blocks * n]).astype(np.float32)


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(7)
    x = _inputs(rng, 24)
    w1 = rng.uniform(0.6, 1.0, (8, 96)) * SIGNS
    w2 = rng.normal(0, 0.3, (4, 8))
    model = mlp([(w1, np.zeros(8), "Tanh"), (w2, None, None)])
    plain = compile_calibrated(model, BUILD, calibrate=x)
    scaled = compile_calibrated(model, BUILD, calibrate=x, accumulator_bits=K,
                                overflow_threshold=T)
    return model, x, w1, plain, scaled


def _probe_events(image, cfg, x, rows, cols, code, k):
    """Events of the product at tile slot 0 on rows ``x``, recounted on a fresh model with
    a program of the test's own: narrow events plus saturations (static input)."""
    model = NpuModel(cfg)
    for space, addr, data in image.memories:
        model.write(space, addr, data)
    program = [Instruction.s_wr(Reg.NARROW, k), Instruction.s_wr(Reg.Q_STATIC, 1),
               Instruction.s_wr(Reg.Q_EXPONENT, code), Instruction.s_wr(Reg.ROWS, rows),
               Instruction.s_wr(Reg.COLS, cols), Instruction.v_rd(Space.NETQ),
               Instruction.mv_mul(0), Instruction.v_wr(Space.NETQ), Instruction.end_chain(),
               Instruction.end()]
    model.load_program(encode_program(program))
    x16 = x.astype(np.float16)
    for row in x16:
        model.push_input(np.pad(row, (0, (-cols) % cfg.n)).reshape(-1, cfg.n).view(np.uint16))
        assert model.run().ok
        model.pop_output(model.output_level)
    c = model.counters()
    return (c["narrow_events"] + c["vector_saturations"] + c["weight_saturations"]
            + c["output_saturations"])


def test_overflowing_layer_is_raised_until_within_threshold(case):
    x, plain, scaled = case[1], case[3], case[4]
    cfg = parse_config(BUILD)
    before = plain.report()["calibration"]["layers"][0]
    after = scaled.report()["calibration"]["layers"][0]
    assert before["input"]["mode"] == "static"           # the static input policy
    assert not before["offset"]["applied"]                # the probe reads x itself
    e0 = before["input"]["exponent"]
    sc = after["scaling"]
    assert sc["policy"] == "input" and sc["raised"] and 1 <= sc["offset"] <= 3
    log = [it for it in scaled.report()["calibration"]["range_scaling"]["log"]
           if it["layer"] == "fc0"]
    assert len(log) <= 4                                   # a few iterations
    assert [it["offset"] for it in log] == list(range(sc["offset"] + 1))
    assert log[0]["events"] > T and log[0]["narrow_events"] > 0 and log[-1]["events"] <= T
    assert after["input"]["exponent"] == e0 + sc["offset"]
    # Recounted independently: within T at the returned exponent, above T one step tighter.
    code = 127 + after["input"]["exponent"]
    assert _probe_events(scaled.image, cfg, x, 8, 96, code, K) <= T
    assert _probe_events(scaled.image, cfg, x, 8, 96, code - 1, K) > T
    # The image runs with the raised exponent (the program's register write).
    from host.spec.isa import Opcode, decode_program
    codes = [i.operand for i in decode_program(scaled.image.program)
             if i.opcode is Opcode.S_WR and Reg(i.func) is Reg.Q_EXPONENT]
    assert codes[0] == code


def test_a_layer_that_does_not_overflow_keeps_its_exponents(case):
    plain, scaled = case[3], case[4]
    cfg = parse_config(BUILD)
    before = plain.report()["calibration"]["layers"][1]
    after = scaled.report()["calibration"]["layers"][1]
    assert after["scaling"]["offset"] == 0 and not after["scaling"]["raised"]
    assert after["input"] == before["input"] and after["weights"] == before["weights"]
    slot = [lay for lay in plain.report()["layers"] if lay["mrf_slots"]][1]["mrf_slots"][0]
    assert all(np.array_equal(a, b) for a, b in zip(
        matrix_words(plain.image, cfg, slot, 4, 8), matrix_words(scaled.image, cfg, slot, 4, 8)))
    log = scaled.report()["calibration"]["range_scaling"]["log"]
    assert [it["offset"] for it in log if it["layer"] == "fc1"] == [0]


def test_dynamic_inputs_raise_the_weights():
    """A layer whose input stays dynamic: every weight block exponent goes up by the
    offset (the MRF words show it), and the log ends within the threshold with the step
    below above it."""
    rng = np.random.default_rng(0)
    w = rng.normal(0, 1 / 8, (32, 64))
    model = mlp([(w, rng.normal(0, 0.2, 32), None)])
    x = rng.normal(0, 1, (40, 64)).astype(np.float32)
    build = "n=8,tiles=1,mantissa_bits_v=8,mantissa_bits_w=8"
    net = compile_calibrated(model, build, calibrate=x, accumulator_bits=16)
    lay = net.report()["calibration"]["layers"][0]
    assert lay["input"]["mode"] == "dynamic" and lay["scaling"]["policy"] == "weights"
    offset = lay["scaling"]["offset"]
    assert offset >= 1
    log = net.report()["calibration"]["range_scaling"]["log"]
    assert log[-1]["events"] == 0 and log[-2]["events"] > 0
    cfg = parse_config(build)
    exps, _ = matrix_words(net.image, cfg, 0, 32, 64)
    w16 = w.astype(np.float32).astype(np.float16).astype(np.float64)
    want = [[brute_weight_exponent(w16[r, c * 8:(c + 1) * 8], 8) + offset for c in range(8)]
            for r in range(32)]
    assert np.array_equal(exps, want)


def test_range_running_out_is_refused(case):
    model, x = case[0], case[1]
    with pytest.raises(CalibrationError, match="range scaling of layer 'fc0'.*ran out") as e:
        compile_calibrated(model, BUILD, calibrate=x, accumulator_bits=4)
    assert "4-bit accumulator" in str(e.value) and "(offset, events)" in str(e.value)


class _NoNarrowCheck(Device):
    """A device built without the narrow-accumulator check: no ``narrow_events``."""

    def counters(self):
        return {k: v for k, v in super().counters().items() if k != "narrow_events"}


def test_device_without_the_narrow_check_is_refused(case):
    model, x = case[0], case[1]
    dev = _NoNarrowCheck(ModelTransport(config=parse_config(BUILD)))
    with pytest.raises(CalibrationError, match="no narrow-accumulator check.*stopped"):
        compile_calibrated(model, BUILD, calibrate=x, accumulator_bits=K, device=dev)
    # Without range scaling the counts still come from it.
    compile_calibrated(model, BUILD, calibrate=x[:4], device=dev)


def test_device_of_another_build_is_refused(case):
    model, x = case[0], case[1]
    with pytest.raises(CalibrationError, match="does not fit the build.*mantissa_bits_w"):
        compile_calibrated(model, BUILD, calibrate=x, device="model:n=16,tiles=1")


def test_cli_range_scaling(case, tmp_path, capsys):
    import onnx
    model, x = case[0], case[1]
    onnx.save(model, tmp_path / "m.onnx")
    np.save(tmp_path / "c.npy", x)
    out = tmp_path / "net.npz"
    args = ["compile", str(tmp_path / "m.onnx"), "-o", str(out), "--config", BUILD,
            "--calibrate", str(tmp_path / "c.npy")]
    assert main(args + ["--accumulator-bits", "4"]) == 2
    assert "ran out" in capsys.readouterr().err and not out.exists()
    assert main(args + ["--accumulator-bits", str(K), "--overflow-threshold", "0"]) == 0
    text = capsys.readouterr().out
    assert "range scaling: 16-bit accumulator, threshold 0" in text
    assert "fc0 +1:" in text or "fc0 +2:" in text


# --- the simulated board counts as the model does -------------------------------------------

def pytest_generate_tests(metafunc):
    if "board" in metafunc.fixturenames:
        kinds = []
        if metafunc.config.getoption("--sim") in ("all", "verilator"):
            kinds.append(pytest.param("sim", marks=pytest.mark.sim))
        metafunc.parametrize("board", kinds)


def test_simulated_board_counts_as_the_model(board):
    from sim.board import SMALL_CONFIG, SimTransport
    rng = np.random.default_rng(4)
    w = rng.uniform(0.3, 1.0, (8, 16))
    model = mlp([(w, None, None)])
    x = (rng.uniform(0.5, 1.0, (5, 16)) * rng.choice([1, 1, 1, -1], (5, 16))).astype(np.float32)
    build = config_text(SMALL_CONFIG)
    want = compile_calibrated(model, build, calibrate=x, accumulator_bits=9)
    dev = Device(SimTransport(SMALL_CONFIG, simulator="verilator"), timeout=300.0)
    try:
        got = compile_calibrated(model, build, calibrate=x, accumulator_bits=9, device=dev)
    finally:
        dev.close()
    a, b = want.report()["calibration"], got.report()["calibration"]
    assert a["range_scaling"]["log"] == b["range_scaling"]["log"]
    assert len(a["range_scaling"]["log"]) >= 2             # events were counted and raised
    assert a["layers"] == b["layers"]
    assert np.array_equal(want.image.program, got.image.program)
