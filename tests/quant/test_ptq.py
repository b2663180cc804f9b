"""Network calibration (``host.quant.ptq``, ``docs/calibration.md`` section 6): calibrated
compiles of small ONNX MLPs checked against brute force of the tests' own
(``ptq_models``), the calibrated image run bit-exactly, the offset fold, bad calibration
data, and the command line."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from ptq_models import (
    brute_static_exponent,
    brute_weight_exponent,
    decode_word,
    exported_run,
    matrix_words,
    mlp,
    quantize_ref,
)

from host.cli import main
from host.compiler import compile_onnx
from host.compiler.network import format_report
from host.compiler.onnx_import import import_onnx
from host.quant import (
    CalibrationError,
    calibrate_graph,
    compile_calibrated,
    load_calibration,
    reference_activations,
)
from host.spec.config import parse_config
from host.spec.image import NetworkImage
from host.spec.isa import REG_DEFAULTS, Opcode, Reg, Space, decode_program

BUILD = "n=8,tiles=2"                       # 4-bit mantissas, two tile engines


def _mlp_case(seed=1, sizes=(20, 13, 7)):
    rng = np.random.default_rng(seed)
    layers = []
    for i, (f_in, f_out) in enumerate(itertools.pairwise(sizes)):
        w = rng.normal(0, 1 / np.sqrt(f_in), (f_out, f_in))
        w[0, :3] *= 6                        # a few large weights: clipping can pay
        layers.append((w, rng.normal(0, 0.2, f_out), "Relu" if i < len(sizes) - 2 else None))
    model = mlp(layers, softmax=True)
    x = rng.normal(0, 1, (64, sizes[0])).astype(np.float32)
    return model, layers, x


@pytest.fixture(scope="module")
def mlp_case():
    model, layers, x = _mlp_case()
    net = compile_calibrated(model, BUILD, calibrate=x)
    return model, layers, x, net


def _registers(image):
    """``(reg, value)`` of every ``s_wr`` before each ``mv_mul``, as the registers hold
    them there: a list of dicts, one per product, in program order."""
    regs, out = {r: v for r, v in REG_DEFAULTS.items() if v is not None}, []
    for ins in decode_program(image.program):
        if ins.opcode is Opcode.S_WR:
            regs[Reg(ins.func)] = ins.operand
        elif ins.opcode is Opcode.MV_MUL:
            out.append(dict(regs))
    return out


# --- weights: the MRF words carry the MMSE exponents ----------------------------------------------

def test_mrf_words_carry_the_mmse_exponents(mlp_case):
    """With ``rounding="nearest"`` the words are the FP16 weights rounded to nearest with
    the brute-force exponents (the default rounding's words: ``test_rounding.py``)."""
    model, layers, x = mlp_case[0], mlp_case[1], mlp_case[2]
    net = compile_calibrated(model, BUILD, calibrate=x, rounding="nearest")
    cfg = parse_config(BUILD)
    report = net.report()
    slots = [lay["mrf_slots"][0] for lay in report["layers"] if lay["op"] == "Gemm"]
    lowered = 0
    for (w, _, _), slot in zip(layers, slots):
        w16 = np.asarray(w, np.float32).astype(np.float16).astype(np.float64)
        rows, cols = w16.shape
        exps, mant = matrix_words(net.image, cfg, slot, rows, cols)
        pad = np.pad(w16, [(0, 0), (0, (-cols) % cfg.n)])
        for r in range(rows):
            for c in range(exps.shape[1]):
                block = pad[r, c * cfg.n:(c + 1) * cfg.n]
                e = brute_weight_exponent(block, cfg.mantissa_bits_w)
                assert exps[r, c] == e, (r, c)
                q = quantize_ref(block, e, cfg.mantissa_bits_w) / 2.0 ** (e - 2)
                assert np.array_equal(mant[r, c * cfg.n:(c + 1) * cfg.n], q)
                lowered += e < np.floor(np.log2(np.abs(block).max()))
    assert lowered                           # some blocks really clip their largest values
    assert all(lay["quant"]["weights"] == "raw" for lay in report["layers"]
               if lay["op"] == "Gemm")


def test_max_method_is_todays_compile(mlp_case):
    model, _, x, _ = mlp_case
    plain = compile_onnx(model, BUILD).image
    net = compile_calibrated(model, BUILD, calibrate=x, method="max")
    assert np.array_equal(net.image.program, plain.program)
    assert [(s, a, list(d) if s is Space.MRF else d.tolist()) for s, a, d in
            net.image.memories] == [(s, a, list(d) if s is Space.MRF else d.tolist())
                                    for s, a, d in plain.memories]
    cal = net.report()["calibration"]
    assert cal["method"] == "max"
    assert all(lay["weights"]["mode"] == "max-based" and lay["input"]["mode"] == "dynamic"
               for lay in cal["layers"])


# --- activations: the static exponent is the brute-force argmin --------------------------------

def _static_case(rng, samples=40, n=16):
    """Rows of native blocks where clipping the largest value pays in every block
    (``docs/calibration.md`` section 1's block, jittered): fifteen values near 1.25 and
    one near 2.25 per block of 16, at 4-bit mantissas."""
    x = rng.uniform(1.2, 1.3, (samples, 2 * n))
    for s in range(samples):
        for b in range(2):
            x[s, b * n + rng.integers(n)] = rng.uniform(2.2, 2.3)
    return (x * rng.choice([-1, 1], x.shape)).astype(np.float32)


def test_static_exponent_is_the_brute_force_argmin():
    rng = np.random.default_rng(3)
    x = _static_case(rng)
    w1 = rng.normal(0, 0.2, (8, 32))
    w2 = rng.normal(0, 0.4, (4, 8))
    model = mlp([(w1, rng.normal(0, 0.1, 8), "Tanh"), (w2, None, None)])
    net = compile_calibrated(model, "default", calibrate=x)
    cal = net.report()["calibration"]["layers"]
    first = cal[0]
    e, err = brute_static_exponent(x.astype(np.float16), 16, 4)
    dyn = sum(((quantize_ref(b, int(np.floor(np.log2(np.abs(b).max()))), 4) - b) ** 2).sum()
              for b in x.astype(np.float16).astype(np.float64).reshape(-1, 16))
    assert err < dyn
    assert first["input"]["mode"] == "static" and first["input"]["exponent"] == e
    assert first["input"]["mse_static"] == pytest.approx(err / x.size)
    assert first["input"]["mse_dynamic"] == pytest.approx(dyn / x.size)
    # The second layer (tanh outputs) is decided the same way, against its own brute force
    # on what its quantizer sees: the outputs minus the offset when one was placed.
    ref = reference_activations(import_onnx(model), x)
    offset = cal[1]["offset"]["value"] if cal[1]["offset"]["applied"] else 0.0
    h = (ref["a0"] - offset).astype(np.float16)
    e2, err2 = brute_static_exponent(h, 16, 4)
    assert cal[1]["input"]["best_static"] == e2
    assert cal[1]["input"]["mse_static"] == pytest.approx(err2 / h.size)
    # The program sets the static exponent for the first product only.
    regs = _registers(net.image)
    assert regs[0][Reg.Q_STATIC] == 1 and regs[0][Reg.Q_EXPONENT] == e + 127
    assert regs[1][Reg.Q_STATIC] == (cal[1]["input"]["mode"] == "static")
    assert net.report()["layers"][0]["quant"] == {
        "input": "static", "input_exponent": e, "weights": "raw", "offset": None}


# --- the device runs the calibrated image as the model predicts --------------------------------

def test_calibrated_image_runs_as_exported(mlp_case, tmp_path):
    model, net = mlp_case[0], mlp_case[3]
    xs = np.random.default_rng(9).normal(0, 1, (16, 20)).astype(np.float32)
    y = net.run(xs)
    assert np.array_equal(exported_run(net, xs, tmp_path).view(np.uint32), y.view(np.uint32))
    # And it computes the network: as near the float reference as today's compile.
    ref = reference_activations(import_onnx(model), xs)["y"]
    plain = compile_onnx(model, BUILD).run(xs)
    assert np.abs(y - ref).mean() <= 1.1 * np.abs(plain - ref).mean()


def test_calibration_report_and_errors(mlp_case):
    model, _, x, net = mlp_case
    cal = net.report()["calibration"]
    assert cal["samples"] == 64 and cal["method"] == "mmse" and cal["range_scaling"] is None
    assert cal["rounding"] == "gptq"
    for lay in cal["layers"]:
        assert lay["weights"]["mse_nearest"] <= lay["weights"]["mse_max_based"]
        r = lay["weights"]["rounding"]
        assert r["output_mse"] <= r["output_mse_nearest_corrected"] <= r["output_mse_nearest"]
        assert set(lay["counts"]) >= {"narrow_events", "vector_saturations",
                                      "output_saturations", "narrow_width"}
        assert lay["output_error"]["rel_rms"] is not None
    # The network's output error is the run's (float reference of the model).
    ref = reference_activations(import_onnx(model), x)["y"]
    got = net.run(x)
    d = got.astype(np.float64) - ref
    assert cal["output_error"]["max_abs"] == pytest.approx(np.abs(d).max())
    text = format_report(net.report())
    assert "calibration: method mmse, weight rounding gptq on 64 samples" in text
    assert "network output error" in text
    # The report survives the image file.
    assert json.loads(json.dumps(net.report())) == net.report()


# --- the activation offset, folded into the biases ---------------------------------------------

def _device_weights(w, node, n, m):
    """The values of ``w`` (a flat Dense's) as the MRF holds them: FP16, quantized per
    block of ``n`` with the node's calibrated exponents (``quantize_ref``)."""
    w16 = np.asarray(w, np.float32).astype(np.float16).astype(np.float64)
    e = np.asarray(node.attrs["quant"]["weight_exponents"])
    out = np.zeros_like(w16)
    for r in range(len(w16)):
        for c in range(e.shape[1]):
            out[r, c * n:(c + 1) * n] = quantize_ref(w16[r, c * n:(c + 1) * n], int(e[r, c]), m)
    return out


def test_offset_folds_into_the_biases():
    rng = np.random.default_rng(5)
    w1 = rng.normal(0, 0.3, (16, 16))
    b1 = np.full(16, 6.0)                    # affine layer: outputs about 6 +- 1
    w2 = rng.normal(0, 0.3, (8, 16))
    b2 = rng.normal(0, 0.1, 8)
    model = mlp([(w1, b1, None), (w2, b2, None)])
    x = rng.normal(0, 1, (48, 16)).astype(np.float32)
    g, records = calibrate_graph(import_onnx(model), "n=16,tiles=1", x, rounding="nearest")
    off = records[1]["offset"]
    # The two candidates, seed 002's mean of minima and the centre of the range, each
    # rounded to FP16: the affine outputs lie about 6 +- 1, so the centre wins.
    h = x.astype(np.float64) @ w1.astype(np.float32).T.astype(np.float64) + b1
    minimum = float(np.float16(h.min(axis=1).mean()))
    centre = float(np.float16(((h.min(axis=1) + h.max(axis=1)) / 2).mean()))
    assert off["applied"] and off["rule"] == "centre" and off["value"] == centre
    assert minimum < centre - 1
    m = off["value"]
    dense = [nd for nd in g.nodes if nd.op == "Dense"]
    assert np.allclose(g.initializers[dense[0].inputs[2]], b1 - m)
    # With nearest rounding W m is made of the weights the device multiplies.
    wq = _device_weights(w2, dense[1], 16, parse_config("n=16,tiles=1").mantissa_bits_w)
    assert np.allclose(g.initializers[dense[1].inputs[2]], b2 + wq @ np.full(16, m))
    # The network input (about 0 +- 1) is centred already: no device op for it.
    assert not records[0]["offset"]["applied"]
    assert "too little for a device op" in records[0]["offset"]["why"] or \
        "does not lower" in records[0]["offset"]["why"]
    # The default rounding folds the same offset, then corrects both biases.
    g2, rec2 = calibrate_graph(import_onnx(model), "n=16,tiles=1", x)
    assert rec2[1]["offset"]["applied"] and rec2[1]["offset"]["value"] == m
    assert np.abs(g2.initializers[next(nd for nd in g2.nodes if nd.op == "Dense").inputs[2]]
                  - (b1 - m)).max() < 0.5
    net = compile_calibrated(model, "n=16,tiles=1", calibrate=x)
    ref = reference_activations(import_onnx(model), x)["h1"]
    y = net.run(x).astype(np.float64)
    plain = compile_onnx(model, "n=16,tiles=1").run(x).astype(np.float64)
    assert np.abs(y - ref).mean() < np.abs(plain - ref).mean()


def test_offset_before_a_layer_is_a_device_op(tmp_path):
    """Inputs in [0, 1] (the network input, no producing bias to fold into) and ReLU
    outputs: the centre of the range is subtracted by an ``Affine`` node before the
    layer and ``W m`` added to its bias; the image runs as its NumPy export and closer
    to the float network than the max-based compile."""
    rng = np.random.default_rng(21)
    w1, b1 = rng.normal(0, 0.3, (16, 32)), rng.normal(0, 0.1, 16)
    w2, b2 = rng.normal(0, 0.3, (8, 16)), rng.normal(0, 0.1, 8)
    model = mlp([(w1, b1, "Relu"), (w2, b2, None)])
    x = rng.uniform(0, 1, (64, 32)).astype(np.float32)
    build = "n=16,tiles=1,mantissa_bits_v=3,mantissa_bits_w=3"
    g, records = calibrate_graph(import_onnx(model), build, x, rounding="nearest")
    off = records[0]["offset"]
    centre = float(np.float16(((x.min(axis=1) + x.max(axis=1)) / 2).mean()))
    assert off["applied"] and off["rule"] == "centre" and off["value"] == centre
    assert "device op" in off["why"]
    dense = [nd for nd in g.nodes if nd.op == "Dense"]
    affine = g.producer(dense[0].inputs[0])
    assert affine.op == "Affine" and affine.inputs[0] == g.inputs[0]
    assert np.array_equal(g.initializers[affine.inputs[1]], np.ones(32, np.float32))
    assert np.array_equal(g.initializers[affine.inputs[2]], np.full(32, -centre, np.float32))
    wq = _device_weights(w1, dense[0], 16, 3)
    assert np.allclose(g.initializers[dense[0].inputs[2]],
                       b1.astype(np.float32) + wq.sum(1) * centre, atol=1e-6)
    assert records[1]["offset"]["applied"]             # the ReLU outputs are >= 0 too
    net = compile_calibrated(model, build, calibrate=x)
    xs = rng.uniform(0, 1, (16, 32)).astype(np.float32)
    assert np.array_equal(exported_run(net, xs, tmp_path), net.run(xs))
    ref = reference_activations(import_onnx(model), xs)["h1"]
    plain = compile_onnx(model, build).run(xs).astype(np.float64)
    assert np.abs(net.run(xs) - ref).mean() < 0.8 * np.abs(plain - ref).mean()


def test_offset_of_a_dense_over_a_map_goes_before_the_flatten(tmp_path):
    """A Dense reading a flattened ReLU map: the Affine works on the map (the lowering's
    layout) and a new Flatten feeds the Dense. A Conv that pads its input (pixels in [0,
    1]) takes the offset with its padding value moved by it: ``pad_value = -m``, so that
    ``W (x - m) + b + m sum(W)`` is ``W x + b`` at the borders too."""
    from ptq_models import cnn
    rng = np.random.default_rng(22)
    model = cnn(rng.normal(0, 0.3, (8, 1, 3, 3)), rng.normal(1.0, 0.1, 8),
                rng.normal(0, 0.2, (5, 8 * 6 * 6)))            # ReLU outputs about 1 +- 0.5
    x = rng.uniform(0, 1, (32, 1, 6, 6)).astype(np.float32)
    build = "n=8,tiles=2,mantissa_bits_v=3,mantissa_bits_w=3"
    g, records = calibrate_graph(import_onnx(model), build, x)
    m = records[0]["offset"]["value"]
    assert records[0]["offset"]["applied"] and m == float(np.float16(0.5 * (
        x.reshape(32, -1).min(1) + x.reshape(32, -1).max(1)).mean()))
    conv = next(nd for nd in g.nodes if nd.op == "Conv")
    assert conv.attrs["pad_value"] == -m and g.producer(conv.inputs[0]).op == "Affine"
    assert records[1]["offset"]["applied"]
    head = next(nd for nd in g.nodes if nd.op == "Dense")
    flat = g.producer(head.inputs[0])
    affine = g.producer(flat.inputs[0])
    assert flat.op == "Flatten" and affine.op == "Affine"
    assert len(g.tensors[affine.outputs[0]].shape) == 4
    net = compile_calibrated(model, build, calibrate=x)
    xs = rng.uniform(0, 1, (8, 1, 6, 6)).astype(np.float32)
    assert np.array_equal(exported_run(net, xs, tmp_path), net.run(xs))
    ref = reference_activations(import_onnx(model), xs)["y"]
    plain = compile_onnx(model, build).run(xs).astype(np.float64)
    assert np.abs(net.run(xs) - ref).mean() < np.abs(plain - ref).mean()


# --- bad calibration data --------------------------------------------------------------------

@pytest.mark.parametrize("data, says", [
    (np.zeros((4, 20), np.int64), "must be float16, float32 or float64"),
    (np.zeros((4, 21), np.float32), "has shape (4, 21); the model's input 'x' is (batch, 20)"),
    (np.zeros((4, 2, 10), np.float32), "has shape (4, 2, 10)"),
    (np.zeros((0, 20), np.float32), "holds no samples"),
    (np.full((3, 20), np.nan, np.float32), "holds 60 inf or NaN values"),
    (np.full((3, 20), np.inf, np.float32), "inf or NaN"),
    (np.full((3, 20), 1e6, np.float32), "beyond FP16's range"),
])
def test_bad_calibration_data_is_refused(mlp_case, data, says):
    model = mlp_case[0]
    with pytest.raises(CalibrationError, match="calibration data") as exc:
        load_calibration(data, import_onnx(model))
    assert says in str(exc.value)
    with pytest.raises(CalibrationError):
        compile_calibrated(model, BUILD, calibrate=data)


def test_bad_method_and_files(mlp_case, tmp_path):
    model = mlp_case[0]
    x = mlp_case[2]
    with pytest.raises(CalibrationError, match="method must be one of mmse, max"):
        compile_calibrated(model, BUILD, calibrate=x, method="l2")
    with pytest.raises(CalibrationError, match="cannot read calibration data"):
        compile_calibrated(model, BUILD, calibrate=tmp_path / "missing.npy")
    np.savez(tmp_path / "d.npz", x=x)
    with pytest.raises(CalibrationError, match="not an .npz archive"):
        compile_calibrated(model, BUILD, calibrate=tmp_path / "d.npz")
    with pytest.raises(CalibrationError, match="accumulator_bits"):
        compile_calibrated(model, BUILD, calibrate=x, accumulator_bits=65)


# --- the command line --------------------------------------------------------------------------

@pytest.fixture()
def files(mlp_case, tmp_path):
    import onnx
    model, _, x, _ = mlp_case
    onnx.save(model, tmp_path / "m.onnx")
    np.save(tmp_path / "calib.npy", x)
    return tmp_path


def test_cli_compile_calibrate_and_report(files, capsys):
    out = files / "net.npz"
    assert main(["compile", str(files / "m.onnx"), "-o", str(out), "--config", BUILD,
                 "--calibrate", str(files / "calib.npy")]) == 0
    image = NetworkImage.load(out)
    assert image.extra["report"]["calibration"]["method"] == "mmse"
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    text = capsys.readouterr().out
    assert "calibration: method mmse, weight rounding gptq on 64 samples" in text
    assert "fc0" in text
    assert main(["--json", "report", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["calibration"]["samples"] == 64
    assert report["calibration"]["rounding"] == "gptq"
    # --rounding nearest reaches the calibration: the image records it
    near = files / "near.npz"
    assert main(["compile", str(files / "m.onnx"), "-o", str(near), "--config", BUILD,
                 "--calibrate", str(files / "calib.npy"), "--rounding", "nearest"]) == 0
    assert NetworkImage.load(near).extra["report"]["calibration"]["rounding"] == "nearest"


@pytest.mark.parametrize("make, args, says", [
    (lambda p: np.save(p, np.zeros((4, 20), np.int32)), [], "must be float16"),
    (lambda p: np.save(p, np.zeros((4, 5), np.float32)), [], "has shape (4, 5)"),
    (lambda p: np.save(p, np.zeros((0, 20), np.float32)), [], "holds no samples"),
    (lambda p: np.save(p, np.full((2, 20), np.nan, np.float32)), [], "inf or NaN"),
    (lambda p: p.write_bytes(b"not numpy"), [], "cannot read calibration data"),
    (lambda p: np.save(p, np.ones((4, 20), np.float32)), ["--method", "best"],
     "invalid choice"),
    (lambda p: np.save(p, np.ones((4, 20), np.float32)), ["--accumulator-bits", "0"],
     "accumulator_bits must be"),
])
def test_cli_bad_calibration_exits_2(files, capsys, make, args, says):
    data = files / "bad.npy"
    make(data)
    out = files / "net.npz"
    assert main(["compile", str(files / "m.onnx"), "-o", str(out), "--config", BUILD,
                 "--calibrate", str(data), *args]) == 2
    err = capsys.readouterr().err
    assert says in err
    assert not out.exists()


@pytest.mark.parametrize("args, says", [
    (["--method", "max"], "--method needs --calibrate"),
    (["--accumulator-bits", "16"], "--accumulator-bits needs --calibrate"),
    (["--rounding", "nearest"], "--rounding needs --calibrate"),
    (["--calibrate", "{calib}", "--method", "max", "--rounding", "gptq"],
     "--rounding applies to --method mmse"),
    (["--calibrate", "{calib}", "--overflow-threshold", "3"],
     "--overflow-threshold needs --accumulator-bits"),
])
def test_cli_option_dependencies(files, capsys, args, says):
    out = files / "net.npz"
    args = [a.format(calib=files / "calib.npy") for a in args]
    assert main(["compile", str(files / "m.onnx"), "-o", str(out), *args]) == 2
    assert says in capsys.readouterr().err
    assert not out.exists()


def test_word_decoder_agrees_with_the_device_layout():
    """The tests' own MRF decoder against an uncalibrated image (the device's quantizer):
    exponents are the max-based ones."""
    rng = np.random.default_rng(2)
    w = rng.normal(0, 1, (5, 11))
    net = compile_onnx(mlp([(w, None, None)]), BUILD)
    cfg = parse_config(BUILD)
    exps, _ = matrix_words(net.image, cfg, 0, 5, 11)
    w16 = w.astype(np.float32).astype(np.float16).astype(np.float64)
    pad = np.pad(w16, [(0, 0), (0, 5)]).reshape(5, 2, 8)
    assert np.array_equal(exps, np.floor(np.log2(np.abs(pad).max(-1))).astype(int))
    assert decode_word(0, 8, 4)[0] == -127


# --- convolutions: the window's matrix and its inputs --------------------------------------------

def test_cnn_words_carry_the_mmse_exponents_of_the_placed_matrices(tmp_path):
    """A Conv and a Dense over the whole map: the MRF words hold each matrix as the device
    reads it (pixel by pixel, channels padded), with the brute-force exponents of its
    blocks; the image runs as its NumPy export."""
    from ptq_models import cnn, pixel_major

    rng = np.random.default_rng(11)
    conv_w = rng.normal(0, 0.5, (4, 1, 3, 3))
    head_w = rng.normal(0, 0.2, (5, 4 * 6 * 6))
    model = cnn(conv_w, rng.normal(0, 0.1, 4), head_w)
    x = rng.uniform(0, 1, (24, 1, 6, 6)).astype(np.float32)
    build = "n=8,tiles=2"
    cfg = parse_config(build)
    net = compile_calibrated(model, build, calibrate=x)
    layers = [lay for lay in net.report()["layers"] if lay["mrf_slots"]]
    assert [lay["op"] for lay in layers] == ["Conv", "Gemm"]
    for lay, w in zip(layers, (pixel_major(conv_w, 1, 3, 3, 8),
                               pixel_major(head_w.reshape(5, 4, 6, 6), 4, 6, 6, 8))):
        w16 = w.astype(np.float32).astype(np.float16).astype(np.float64)
        exps, _ = matrix_words(net.image, cfg, lay["mrf_slots"][0], *w16.shape)
        for r in range(w16.shape[0]):
            for c in range(exps.shape[1]):
                block = w16[r, c * 8:(c + 1) * 8]
                assert exps[r, c] == brute_weight_exponent(block, 4), (lay["name"], r, c)
    xs = rng.uniform(0, 1, (6, 1, 6, 6)).astype(np.float32)
    assert np.array_equal(exported_run(net, xs, tmp_path), net.run(xs))
    ref = reference_activations(import_onnx(model), xs)["y"]
    plain = compile_onnx(model, build).run(xs)
    assert np.abs(net.run(xs) - ref).mean() <= 1.2 * np.abs(plain - ref).mean()


def test_conv_probe_counts_as_the_windowed_network():
    """The probe gathers a convolution's windows on the host (stride, padding); its
    counts equal the whole network's counters on the device, which reads the windows
    from memory. Values near 2 round past the top code of a dynamic 4-bit block: every
    nonzero pixel of every window is one vector saturation."""
    from ptq_models import cnn

    from host.compiler.network import config_text
    from host.runtime.device import Device
    rng = np.random.default_rng(12)
    model = cnn(rng.normal(0, 0.5, (1, 1, 3, 3)), [0.1], None, image=(7, 6),
                strides=(2, 1), pads=(1, 0, 0, 1), relu=False)
    x = (rng.uniform(1.94, 1.99, (10, 1, 7, 6)) * rng.choice([-1, 0, 1], (10, 1, 7, 6))
         ).astype(np.float32)
    build = "n=8,tiles=1"
    net = compile_calibrated(model, build, calibrate=x, method="max")
    counts = net.report()["calibration"]["layers"][0]["counts"]
    with Device.open(f"model:{config_text(parse_config(build))}") as dev:
        dev.clear_counters()
        net.run(x, device=dev)
        got = dev.counters()
    assert counts["vector_saturations"] > 100
    for k in ("vector_saturations", "narrow_events", "output_saturations"):
        assert counts[k] == got[k], k


# --- the float reference -------------------------------------------------------------------------

def _ort(model, x):
    import onnxruntime as ort
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


@pytest.mark.parametrize("op, lbr", [("LSTM", 0), ("GRU", 0), ("GRU", 1)])
def test_reference_of_recurrent_layers_is_onnxruntimes(op, lbr):
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(13)
    steps, size, hidden, gates = 4, 5, 6, 4 if op == "LSTM" else 3
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (1, gates * hidden, size))
                                     .astype(np.float32), "W"),
             numpy_helper.from_array(rng.normal(0, 0.5, (1, gates * hidden, hidden))
                                     .astype(np.float32), "R"),
             numpy_helper.from_array(rng.normal(0, 0.2, (1, 2 * gates * hidden))
                                     .astype(np.float32), "B")]
    attrs = {"hidden_size": hidden} | ({"linear_before_reset": lbr} if op == "GRU" else {})
    node = helper.make_node(op, ["x", "W", "R", "B"], ["", "y"], name="rnn", **attrs)
    graph = helper.make_graph(
        [node], "rnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, "N", size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "N", hidden])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.normal(0, 1, (steps, 7, size)).astype(np.float32)
    g = import_onnx(model)
    got = reference_activations(g, x)[g.outputs[0]]
    want = np.moveaxis(_ort(model, x), 1, 0).reshape(7, -1)
    assert np.abs(got - want).max() < 1e-5


def test_reference_of_a_cnn_is_onnxruntimes():
    from ptq_models import cnn
    rng = np.random.default_rng(14)
    model = cnn(rng.normal(0, 0.5, (3, 1, 3, 3)), rng.normal(0, 0.1, 3),
                rng.normal(0, 0.2, (4, 3 * 3 * 2)), image=(6, 5), strides=(2, 2),
                pads=(1, 0, 1, 1))
    x = rng.normal(0, 1, (5, 1, 6, 5)).astype(np.float32)
    g = import_onnx(model)
    assert np.abs(reference_activations(g, x)[g.outputs[0]] - _ort(model, x)).max() < 1e-5


@pytest.mark.parametrize("model", ["lstm", "gru"])
def test_recurrent_layers_are_calibrated(model):
    """``calibrate_graph`` calibrates the zoo LSTM / GRU (``docs/calibration.md`` section
    8): a record per recurrent layer, the input offset placed before it (pixels in
    [0, 1]), W's and R's calibrated values on the grid of their
    block exponents (decoded by the tests' own quantizer) and not all nearest-rounded,
    the device's MRF words those values, the compiled network given its settings
    (``Q_STATIC`` / dynamic as chosen), and at 3 bits, held-out accuracy above the
    max-based compile's on seed 0."""
    from bench import zoo
    from host.compiler.network import compile_graph
    entry = zoo.zoo_entries(0, (model,))[0]
    build = "mantissa_bits_v=3,mantissa_bits_w=3"
    graph = import_onnx(entry.onnx)
    g, records = calibrate_graph(graph, build, entry.x_calib)
    (rec,) = [r for r in records if r.get("recurrent")]
    (node,) = [nd for nd in g.nodes if nd.op in ("LSTM", "GRU")]
    (orig,) = [nd for nd in graph.nodes if nd.op in ("LSTM", "GRU")]
    assert rec["op"] == model.upper() and rec["weights"]["rounding"]["method"] == "gptq"
    q = node.attrs["quant"]
    for i, field in ((1, "weight_exponents"), (2, "recurrence_exponents")):
        w = g.initializers[node.inputs[i]].astype(np.float64)
        e = np.asarray(q[field], np.int64)
        assert e.shape == (w.shape[0], -(-w.shape[1] // 16))
        per_value = np.repeat(e, 16, axis=1)[:, :w.shape[1]]
        np.testing.assert_array_equal(quantize_ref(w, per_value, 3), w)
        w0 = graph.initializers[orig.inputs[i]].astype(np.float16).astype(np.float64)
        assert not np.array_equal(quantize_ref(w0, per_value, 3), w)
    # Pixels in [0, 1]: an input offset is subtracted by an Affine the layer reads
    # (through the transpose); a dynamic exponent beats every static one on h in (-1, 1).
    off = rec["offset"]
    assert off["applied"] and 0.25 < off["value"] < 0.75, off
    (op,) = [nd for nd in g.nodes if nd.name == off["op"]]
    assert op.op == "Affine" and g.initializers[op.inputs[2]].tolist() == \
        [-off["value"]] * len(g.initializers[op.inputs[2]])
    assert g.producer(node.inputs[0]).inputs[0] == op.outputs[0]
    assert q["state_exponent"] is None and rec["state"]["mode"] == "dynamic"
    assert rec["input"]["mode"] == ("dynamic" if q["input_exponent"] is None else "static")
    net = compile_graph(g, build)
    acc = (net.run(entry.x_test).argmax(1) == entry.y_test).mean()
    plain = (compile_onnx(entry.onnx, build).run(entry.x_test).argmax(1) == entry.y_test).mean()
    assert acc > plain
