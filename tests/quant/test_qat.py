"""host.quant.qat: the device as a PyTorch module, QAT from calibration, and its export."""

import json

import numpy as np
import pytest
import torch

from host.compiler.network import compile_graph
from host.compiler.onnx_import import import_onnx
from host.quant.ptq import calibrate_graph
from host.cli import main
from host.compiler.network import Network
from host.quant.qat import DeviceModule, QatError, apply_quant, load_quant, train_qat

torch.set_num_threads(1)
ZOO = "zoo/mlp/seed0"
BUILD = "mantissa_bits_v=4,mantissa_bits_w=4"


@pytest.fixture(scope="module")
def mlp():
    data = np.load(f"{ZOO}/data.npz")
    digits = np.load("zoo/data/digits.npz")
    x = digits["images"].reshape(len(digits["images"]), -1).astype(np.float32) / 16
    return (import_onnx(f"{ZOO}/model.onnx"), data["x_calib"], data["x_test"][:120],
            data["y_test"][:120], x[data["idx_train"]], digits["labels"][data["idx_train"]])


@pytest.mark.parametrize("calibrated", [False, True])
@pytest.mark.parametrize("model, build", [("mlp", BUILD), ("cnn", BUILD),
                                          ("cnn", "n=8,tiles=1,mantissa_bits_v=3")])
def test_module_computes_what_the_device_computes(model, build, calibrated):
    """Bit for bit, with max-based and with calibrated (static input, per-block weight)
    exponents; the CNN has padded and strided convolutions, a max pool and a Dense that
    reads a flattened map (per-pixel blocks on the device)."""
    data = np.load(f"zoo/{model}/seed0/data.npz")
    graph = import_onnx(f"zoo/{model}/seed0/model.onnx")
    if calibrated:
        graph = calibrate_graph(graph, build, data["x_calib"])[0]
        assert any(nd.attrs["quant"]["weight_exponents"] is not None for nd in graph.nodes
                   if nd.op in ("Dense", "Conv"))
    x_test = data["x_test"][:60]
    with torch.no_grad():
        got = DeviceModule(graph, build)(torch.from_numpy(x_test)).numpy()
    want = compile_graph(graph, build).run(x_test)
    np.testing.assert_array_equal(got, want)


def test_static_exponents_and_their_saturation_gradient():
    """A one-layer graph with a static input exponent: the module equals the device and
    the exponent's gradient is seed 002's sum over the clipped values."""
    from onnx import TensorProto, helper, numpy_helper
    w = np.eye(8, dtype=np.float32)
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Gemm", ["x", "w"], ["y"], "fc", transB=1)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 8])],
        [numpy_helper.from_array(w, "w")]), opset_imports=[helper.make_opsetid("", 18)])
    graph = import_onnx(model)
    graph.nodes[0].attrs["quant"] = {"input_exponent": 127, "weight_exponents": None,
                                     "offset": None}      # e = 0: clip at 1.75 (m = 4)
    build = "n=8,tiles=1," + BUILD
    x = np.array([[0.5, 3.0, -2.0, 1.0, 0.25, -0.125, 1.5, 0.0]], np.float32)
    mod = DeviceModule(graph, build)
    xt = torch.from_numpy(x)
    y = mod(xt)
    np.testing.assert_array_equal(y.detach().numpy(), compile_graph(graph, build).run(x))
    assert y.detach().numpy()[0, 1] == 1.75 and y.detach().numpy()[0, 2] == -1.75
    y.sum().backward()
    (t,) = mod.saturation.values()
    # Clipped: 3.0 (+) and -2.0 (-): sum g * sign = 1 - 1 = 0; make it one-sided:
    assert t.grad.item() == pytest.approx(0.0)
    mod.zero_grad()
    y = mod(xt)
    (y[0, 1] * 2 + y[0, 2] * 1).backward()
    # g * sign over the clipped values: 2 * 1 + 1 * (-1) = 1, times beta ln 2 (beta 1.75).
    assert t.grad.item() == pytest.approx(1.75 * np.log(2))


def test_qat_from_calibration_and_its_export_run_on_the_device(mlp, tmp_path):
    graph, x_calib, x_test, y_test, x_train, y_train = mlp
    mod = DeviceModule(calibrate_graph(graph, BUILD, x_calib)[0], BUILD)
    curve = train_qat(mod, x_train[:400], y_train[:400], x_test, y_test, epochs=2)
    assert len(curve) == 3 and all(0 <= c <= 100 for c in curve)
    mod.export(tmp_path / "qat.onnx", tmp_path / "qat.json")
    quant = load_quant(tmp_path / "qat.json")
    again = apply_quant(import_onnx(tmp_path / "qat.onnx"), quant)
    with torch.no_grad():
        want = mod(torch.from_numpy(x_test)).numpy()
    np.testing.assert_array_equal(compile_graph(again, BUILD).run(x_test), want)
    # The same through the command line: npu compile --quant.
    out = tmp_path / "net.npz"
    assert main(["compile", str(tmp_path / "qat.onnx"), "-o", str(out), "--config", BUILD,
                 "--quant", str(tmp_path / "qat.json")]) == 0
    np.testing.assert_array_equal(Network.load(out).run(x_test), want)
    # Another build's widths, or --quant with --calibrate: refused, nothing written.
    out.unlink()
    assert main(["compile", str(tmp_path / "qat.onnx"), "-o", str(out), "--config",
                 "mantissa_bits_v=5,mantissa_bits_w=5", "--quant",
                 str(tmp_path / "qat.json")]) == 2
    np.save(tmp_path / "cal.npy", x_test)
    assert main(["compile", str(tmp_path / "qat.onnx"), "-o", str(out), "--config", BUILD,
                 "--quant", str(tmp_path / "qat.json"), "--calibrate",
                 str(tmp_path / "cal.npy")]) == 2
    assert not out.exists()


def test_the_rate_drops_for_the_last_epochs(mlp):
    """The optimizer's rate per epoch (read by the progress line from Adam's own
    parameter groups): a tenth for the last ``lr_drop_epochs`` epochs, only when training
    is longer; bad values refused naming the parameter."""
    graph, _, x_test, y_test, x_train, y_train = mlp

    def rates(epochs, **kw):
        lines = []
        train_qat(DeviceModule(graph, BUILD), x_train[:64], y_train[:64], x_test[:32],
                  y_test[:32], epochs=epochs, lr=2e-3, progress=lines.append, **kw)
        return [float(line.split("(rate ")[1].split(")")[0]) for line in lines]

    assert rates(4, lr_drop_epochs=1) == [2e-3, 2e-3, 2e-3, 2e-4]
    assert rates(4) == [2e-3, 2e-4, 2e-4, 2e-4]                 # LR_DROP_EPOCHS = 3
    assert rates(3) == rates(2, lr_drop_epochs=5) + [2e-3] == [2e-3] * 3
    assert rates(2, lr_drop_epochs=0) == [2e-3, 2e-3]
    for kw, name in (({"lr_drop_epochs": -1}, "lr_drop_epochs"), ({"epochs": 0}, "epochs"),
                     ({"lr": 0.0}, "lr")):
        with pytest.raises(ValueError, match=name):
            train_qat(DeviceModule(graph, BUILD), x_train[:8], y_train[:8], x_test[:8],
                      y_test[:8], **{"epochs": 1, **kw})


def test_quant_files_are_checked(mlp, tmp_path):
    graph = mlp[0]
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(QatError, match="cannot read"):
        load_quant(bad)
    bad.write_text(json.dumps({"version": 99, "layers": {}}))
    with pytest.raises(QatError, match="version 1"):
        load_quant(bad)
    names = [nd.name for nd in graph.nodes if nd.op in ("Dense", "Conv")]
    with pytest.raises(QatError, match="without settings"):
        apply_quant(graph, {"version": 1, "n": 16, "layers": {}})
    layers = {n: {"input_exponent": None, "weight_exponents": [0], "offset": None}
              for n in names}
    with pytest.raises(QatError, match="weight_exponents of shape"):
        apply_quant(graph, {"version": 1, "n": 16, "layers": layers})


def test_npu_train_writes_a_model_that_compiles_with_its_exponents(tmp_path):
    out = tmp_path / "trained"
    assert main(["train", f"{ZOO}/model.onnx", "--zoo", ZOO, "-o", str(out), "--epochs",
                 "1", "--method", "lazy", "--config", BUILD]) == 0
    assert {"model.onnx", "model.quant.json", "curve.json"} <= {p.name for p in out.iterdir()}
    curve = json.loads((out / "curve.json").read_text())["held_out_accuracy"]
    assert len(curve) == 2 and curve[-1] > 80
    net = tmp_path / "net.npz"
    assert main(["compile", str(out / "model.onnx"), "-o", str(net), "--config", BUILD,
                 "--quant", str(out / "model.quant.json")]) == 0
    data = np.load(f"{ZOO}/data.npz")
    acc = (Network.load(net).run(data["x_test"]).argmax(1) == data["y_test"]).mean() * 100
    assert acc == pytest.approx(curve[-1])     # the device runs what training measured


def test_npu_train_refuses_bad_arguments(tmp_path):
    args = [f"{ZOO}/model.onnx", "-o", str(tmp_path / "o")]
    assert main(["train", *args]) == 2                               # no data
    assert main(["train", *args, "--zoo", str(tmp_path)]) == 2       # not a zoo directory
    np.savez(tmp_path / "d.npz", x_train=np.zeros((3, 8, 8), np.float32))
    assert main(["train", *args, "--data", str(tmp_path / "d.npz")]) == 2   # arrays missing
    assert main(["train", *args, "--zoo", ZOO, "--epochs", "0"]) == 2
    assert main(["train", *args, "--zoo", ZOO, "--lr-drop-epochs", "-1"]) == 2
    assert not (tmp_path / "o").exists()
