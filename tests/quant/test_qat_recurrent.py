"""host.quant.qat on recurrent networks (LSTM, GRU): the module computes what the compiled
recurrent program computes, bit for bit; QAT on the zoo's recurrent classifiers; export."""

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from host.cli import main
from host.compiler.network import Network, compile_graph
from host.compiler.onnx_import import import_onnx
from host.quant.ptq import calibrate_graph
from host.quant.qat import (
    DeviceModule,
    QatError,
    apply_quant,
    graph_to_onnx,
    load_quant,
    train_qat,
)

torch.set_num_threads(1)
BUILD = "mantissa_bits_v=4,mantissa_bits_w=4"


def _zoo(model, seed=0):
    data = np.load(f"zoo/{model}/seed{seed}/data.npz")
    digits = np.load("zoo/data/digits.npz")
    x = digits["images"].astype(np.float32) / 16
    return (import_onnx(f"zoo/{model}/seed{seed}/model.onnx"), data,
            x[data["idx_train"]], digits["labels"][data["idx_train"]])


def _run_module(graph, build, x):
    with torch.no_grad():
        return DeviceModule(graph, build)(torch.from_numpy(x)).numpy()


@pytest.mark.parametrize("model", ["lstm", "gru"])
@pytest.mark.parametrize("build, calibrated", [(BUILD, True), ("n=8,tiles=1,mantissa_bits_v=3",
                                                                False)])
def test_zoo_recurrent_module_computes_what_the_device_computes(model, build, calibrated):
    """The zoo's LSTM / GRU over digit rows with its Gemm head, bit for bit: N = 16 (one
    block per step input, two per h) and N = 8 (four per h), with the head calibrated."""
    graph, data, _, _ = _zoo(model)
    if calibrated:
        graph = calibrate_graph(graph, build, data["x_calib"])[0]
    x = data["x_test"][:40]
    np.testing.assert_array_equal(_run_module(graph, build, x),
                                  compile_graph(graph, build).run(x))


def test_quantize_once_changes_no_bit():
    """The lowering stacks the gates' products (quantize once) or not: the same bits, and
    the module's (dynamic exponents: one quantization of x or h serves every gate)."""
    graph, data, _, _ = _zoo("lstm")
    x = data["x_test"][:20]
    fused = compile_graph(graph, BUILD)
    (entry,) = [la for la in fused.image.extra["report"]["layers"] if "quantize_once" in la]
    assert entry["quantize_once"]["on"]
    plain = import_onnx("zoo/lstm/seed0/model.onnx")
    for nd in plain.nodes:
        if nd.op == "LSTM":
            nd.attrs["quantize_once"] = False
    want = _run_module(graph, BUILD, x)
    np.testing.assert_array_equal(fused.run(x), want)
    np.testing.assert_array_equal(compile_graph(plain, BUILD).run(x), want)


def _rnn_onnx(op, *, layers=1, lbr=1, layout=0, y_h=False, states=False, hidden=10, inp=12,
              steps=4, seed=0):
    """A small ONNX recurrent classifier: ``layers`` stacked LSTM / GRU layers, the last
    step (Y_h or a Gather of Y) into a Gemm head of 5 classes."""
    rng = np.random.default_rng(seed)
    gates = 4 if op == "LSTM" else 3
    inits, nodes = [], []

    def const(name, value, dtype=np.float32):
        inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name
    x_shape = ["batch", steps, inp] if layout else [steps, "batch", inp]
    x, size = "x", inp
    for k in range(layers):
        ins = [x, const(f"W{k}", rng.uniform(-0.6, 0.6, (1, gates * hidden, size))),
               const(f"R{k}", rng.uniform(-0.6, 0.6, (1, gates * hidden, hidden))),
               const(f"B{k}", rng.uniform(-0.3, 0.3, (1, 2 * gates * hidden))), ""]
        if states:
            ins.append(const(f"h{k}", rng.uniform(-0.5, 0.5, (1, 1, hidden))))
            if op == "LSTM":
                ins.append(const(f"c{k}", rng.uniform(-0.5, 0.5, (1, 1, hidden))))
        extra = {"linear_before_reset": lbr} if op == "GRU" else {}
        last = k == layers - 1
        outs = [f"Y{k}", f"Yh{k}"] if last and y_h else [f"Y{k}"]
        nodes.append(helper.make_node(op, ins, outs, f"rnn{k}", hidden_size=hidden,
                                      layout=layout, **extra))
        if not last:
            nodes.append(helper.make_node("Squeeze", [f"Y{k}", const(f"ax{k}", [2 if layout
                                                                           else 1], np.int64)],
                                          [f"S{k}"], f"sq{k}"))
            x, size = f"S{k}", hidden
    k = layers - 1
    if y_h:          # (1, batch, H) / (batch, 1, H)
        nodes.append(helper.make_node("Squeeze", [f"Yh{k}", const("axh", [1 if layout else 0],
                                                                     np.int64)], ["h"], "sqh"))
    else:            # the last step of Y (steps, 1, batch, H) / (batch, steps, 1, H)
        nodes.append(helper.make_node("Gather", [f"Y{k}", const("last", -1, np.int64)],
                                      ["g"], "last", axis=1 if layout else 0))
        nodes.append(helper.make_node("Squeeze", ["g", const("axg", [1 if layout else 0],
                                                             np.int64)], ["h"], "sqg"))
    nodes.append(helper.make_node("Gemm", ["h", const("Wh", rng.uniform(-1, 1, (5, hidden))),
                                           const("bh", rng.uniform(-0.2, 0.2, 5))],
                                  ["logits"], "head", transB=1))
    model = helper.make_model(helper.make_graph(
        nodes, "rnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 5])], inits),
        opset_imports=[helper.make_opsetid("", 18)])
    x = rng.uniform(-1, 1, (6, steps, inp) if layout else (steps, 6, inp)).astype(np.float32)
    return model, x


@pytest.mark.parametrize("op, kw", [
    ("GRU", {"lbr": 0}),                                # n reads r * h: its own product
    ("GRU", {"lbr": 1, "states": True, "layout": 1, "y_h": True}),
    ("LSTM", {"layers": 2}),                            # stacked: layer 2 reads layer 1's h
    ("LSTM", {"states": True, "y_h": True, "layout": 1}),
])
def test_other_recurrent_forms_and_their_export(op, kw):
    """GRU without linear_before_reset, stacked layers, batch-first layout, initial states,
    Y_h: bit for bit with the device, and the export (graph_to_onnx) compiles back to the
    same network."""
    model, x = _rnn_onnx(op, **kw)
    graph = import_onnx(model)
    build = "n=8,tiles=1," + BUILD
    mod = DeviceModule(graph, build)
    with torch.no_grad():
        got = mod(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(got, compile_graph(graph, build).run(x))
    again = import_onnx(graph_to_onnx(mod.trained_graph()))
    assert [nd.op for nd in again.nodes if nd.op in ("LSTM", "GRU", "LastStep", "Dense")] \
        == [nd.op for nd in graph.nodes if nd.op in ("LSTM", "GRU", "LastStep", "Dense")]
    np.testing.assert_array_equal(compile_graph(again, build).run(x), got)


@pytest.mark.parametrize("model", ["lstm", "gru"])
def test_exported_recurrent_onnx_means_what_the_original_means(model):
    """The export is a valid ONNX model with the original's FP32 function (onnxruntime on
    both): the gates back in ONNX's order, the summed biases, the views."""
    import onnxruntime as ort
    graph, data, _, _ = _zoo(model)
    x = data["x_test"][:50]
    exported = graph_to_onnx(DeviceModule(graph, BUILD).trained_graph()).SerializeToString()
    want = ort.InferenceSession(f"zoo/{model}/seed0/model.onnx").run(None, {"input": x})[0]
    got = ort.InferenceSession(exported).run(None, {"input": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_recurrent_gradients_reach_every_weight():
    """Straight-through gradients: W, R and the biases of the recurrent layer and the head
    get finite, non-zero gradients; the initial states are not trained."""
    model, x = _rnn_onnx("LSTM", states=True)
    mod = DeviceModule(import_onnx(model), "n=8,tiles=1," + BUILD)
    mod(torch.from_numpy(x)).square().sum().backward()
    assert len(list(mod.parameters())) == 5                  # W, R, b; head W, b
    for name, p in mod.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and \
            p.grad.abs().sum() > 0, name
    assert len(mod.states) == 2


def test_recurrent_settings_in_the_quant_file_must_be_dynamic():
    graph, _, _, _ = _zoo("gru")
    dynamic = {"input_exponent": None, "weight_exponents": None, "offset": None}
    layers = {"/rnn/GRU": dict(dynamic), "/head/Gemm": dict(dynamic)}
    apply_quant(graph, {"version": 1, "layers": layers})        # listed, null: accepted
    apply_quant(graph, {"version": 1, "layers": {"/head/Gemm": dynamic}})   # or left out
    layers["/rnn/GRU"]["input_exponent"] = 127
    with pytest.raises(QatError, match="recurrent layer '/rnn/GRU'.*dynamic exponents only"):
        apply_quant(graph, {"version": 1, "layers": layers})


@pytest.mark.parametrize("model", ["lstm", "gru"])
def test_qat_of_a_zoo_recurrent_classifier_runs_on_the_device_as_trained(model, tmp_path):
    """The issue's bar: the fake-quantized PyTorch model and the compiled NPU model agree
    on the whole held-out set (at least 99.5 % of the predicted classes; the outputs within
    a bound, which is 0: they are equal bit for bit), after a short QAT from calibration
    (one epoch, 4-bit mantissas) that does not lower held-out accuracy; the trained model
    goes through the export and ``npu compile --quant``."""
    graph, data, x_train, y_train = _zoo(model)
    mod = DeviceModule(calibrate_graph(graph, BUILD, data["x_calib"])[0], BUILD)
    x_test, y_test = data["x_test"], data["y_test"]
    curve = train_qat(mod, x_train, y_train, x_test, y_test, epochs=1)
    assert curve[-1] >= curve[0]
    mod.export(tmp_path / "qat.onnx", tmp_path / "qat.json")
    assert model.upper() in str(load_quant(tmp_path / "qat.json")["layers"]).upper()
    net = tmp_path / "net.npz"
    assert main(["compile", str(tmp_path / "qat.onnx"), "-o", str(net), "--config", BUILD,
                 "--quant", str(tmp_path / "qat.json")]) == 0
    with torch.no_grad():
        want = mod(torch.from_numpy(x_test)).numpy()
    got = Network.load(net).run(x_test)
    assert (got.argmax(1) == want.argmax(1)).mean() >= 0.995
    assert np.abs(got - want).max() <= 0.0
    assert (got.argmax(1) == y_test).mean() * 100 == pytest.approx(curve[-1])


def test_unary_is_the_devices_activation_unit_bit_for_bit():
    """fakequant.unary: every FP16 input (but NaNs) gives the MFU's sigmoid / tanh / exp;
    the gradient is the exact function's derivative."""
    from host.numerics.unary import unary_bits
    from host.quant.fakequant import unary
    bits = np.arange(1 << 16, dtype=np.int64).astype(np.uint16)
    vals = bits.view(np.float16)
    keep = ~np.isnan(vals)
    x = torch.from_numpy(vals[keep].astype(np.float64))
    for op in ("sigmoid", "tanh", "exp"):
        got = unary(op, x).numpy().astype(np.float16).view(np.uint16)
        np.testing.assert_array_equal(got, unary_bits(op, bits[keep]))
    t = torch.tensor([-1.0, 0.0, 2.0], dtype=torch.float64, requires_grad=True)
    unary("sigmoid", t).sum().backward()
    s = torch.sigmoid(t.detach())
    torch.testing.assert_close(t.grad, s * (1 - s))
    with pytest.raises(ValueError, match="unary op"):
        unary("recip", t)
