"""``npu compare`` and :func:`host.compiler.compare.compare`: every layer of a compiled
network against onnxruntime's intermediate tensors.

* An exact model (inputs, weights and biases on a grid every product and sum of which
  FP16 and 8-bit BFP hold exactly) compares with zero error at every layer, through
  ``Reshape``, ``MatMul`` + ``Add`` (the IR's ``Dense`` is compared with the ``Add``'s
  output), a fused ``Relu`` and an ``Identity``.
* A random MLP's per-layer errors lie within the bound of ``docs/compiler.md`` section 6
  propagated to that layer (``error_bound`` of ``test_onnx_mlp``), and the last layer's
  figures are those of ``Network.run`` against onnxruntime computed here.
* A recurrent model (views, the last step, a fixed batch size of 1) and the command's
  exit statuses on bad files.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx_checks import init, ort_run
from test_onnx_mlp import error_bound, mlp_model
from test_onnx_rnn import rnn_model

from host.cli import main
from host.compiler import compile_onnx
from host.compiler.compare import compare, format_comparison, layer_cycles, prefix_graph
from host.compiler.onnx_import import OnnxImportError, import_onnx

BUILD = "n=8,tiles=1,mantissa_bits_v=8,mantissa_bits_w=8"
N = 8


def exact_model():
    """(batch, 2, 6) -> Reshape (batch, 12) -> MatMul + Add (10) -> Relu -> Gemm (5) ->
    Identity. Inputs are multiples of 1/4 up to 2, weights -1, 0, 1, biases multiples of
    1/4: every product and sum is a small multiple of 1/4 (exact in FP16 and in 8-bit
    mantissas)."""
    rng = np.random.default_rng(7)
    w0 = rng.integers(-1, 2, (12, 10)).astype(np.float32)
    b0 = rng.integers(-4, 5, 10).astype(np.float32) / 4
    w1 = rng.integers(-1, 2, (5, 10)).astype(np.float32)
    b1 = rng.integers(-4, 5, 5).astype(np.float32) / 4
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["flat"], name="flatten"),
        helper.make_node("MatMul", ["flat", "W0"], ["mm"], name="fc0"),
        helper.make_node("Add", ["mm", "b0"], ["z0"], name="bias0"),
        helper.make_node("Relu", ["z0"], ["h0"], name="relu0"),
        helper.make_node("Gemm", ["h0", "W1", "b1"], ["z1"], name="fc1", transB=1),
        helper.make_node("Identity", ["z1"], ["y"], name="out"),
    ]
    inits = [init("shape", [-1, 12], np.int64), init("W0", w0), init("b0", b0),
             init("W1", w1), init("b1", b1)]
    graph = helper.make_graph(
        nodes, "exact", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 2, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    x = rng.integers(0, 9, (16, 2, 6)).astype(np.float32) / 4
    return model, x


def test_exact_model_has_zero_error_at_every_layer():
    model, x = exact_model()
    net = compile_onnx(model, BUILD)
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # the prefixes reproduce the image exactly
        recs = compare(model, net, x)
    assert [(r.name, r.op, r.ir_op) for r in recs] == [
        ("flatten", "Reshape", "Flatten"), ("fc0", "MatMul+Add", "Dense"),
        ("relu0", "Relu", "Relu"), ("fc1", "Gemm", "Dense")]
    # the Dense of MatMul + Add is compared with the Add's output; the Gemm with the
    # Identity after it (the importer removed it)
    assert [r.onnx_tensor for r in recs] == ["flat", "z0", "h0", "y"]
    assert [r.fused_into_chain for r in recs] == [False, False, True, False]
    for r in recs:
        assert r.max_abs_error == 0 and r.rel_rms_error == 0, format_comparison(recs)
        assert r.reference_max_abs > 0
    assert recs[-1].argmax_agreement == 1.0
    assert [r.argmax_agreement for r in recs[:-1]] == [None] * 3
    assert recs[0].cycles_predicted is None and recs[0].note.startswith("moves no data")
    assert recs[-1].cycles_predicted == net.report()["per_job"]["cycles_predicted"]
    assert recs[1].cycles_predicted < recs[2].cycles_predicted < recs[3].cycles_predicted


def test_mlp_errors_within_the_bound_of_each_layer():
    rng = np.random.default_rng(3)
    model, layers = mlp_model([20, 13, 7], ["Tanh", None], rng, form="matmul")
    x = rng.normal(0, 1, (24, 20)).astype(np.float32)
    net = compile_onnx(model, BUILD)
    recs = compare(model, net, x)
    assert [r.ir_op for r in recs] == ["Dense", "Tanh", "Dense", "Softmax"]
    for k, r in enumerate(recs):
        _, bound = error_bound(layers[:k + 1], x, N)
        assert r.max_abs_error <= bound.max() + 1e-6, (k, r.max_abs_error, bound.max())
        assert r.max_abs_error > 0                   # 8-bit mantissas are not exact here
    # the last layer's figures are those of the network's own output
    y = net.run(x).astype(np.float64)
    ref = ort_run(model, x).astype(np.float64)
    last = recs[-1]
    assert last.max_abs_error == pytest.approx(np.abs(y - ref).max(), rel=1e-12)
    assert last.rel_rms_error == pytest.approx(
        np.sqrt(np.mean((y - ref) ** 2) / np.mean(ref ** 2)), rel=1e-9)
    assert last.argmax_agreement == np.mean(y.argmax(1) == ref.argmax(1))
    # fewer mantissa bits, larger errors at every layer with a product
    coarse = compare(model, compile_onnx(model, "n=8,tiles=1,mantissa_bits_v=3,"
                                                "mantissa_bits_w=3"), x)
    for fine, rough in zip(recs, coarse):
        assert rough.rel_rms_error > fine.rel_rms_error


def test_recurrent_views_and_fixed_batch():
    rng = np.random.default_rng(5)
    model, _ = rnn_model("LSTM", 4, rng, head=True, last_by="gather", batch_first=True)
    x = rng.normal(0, 1, (6, 4, 12)).astype(np.float32)
    recs = compare(model, compile_onnx(model, BUILD), x)
    ops = [r.ir_op for r in recs]
    assert ops == ["View", "LSTM", "View", "View", "LastStep", "Dense", "Softmax"]
    for r in recs:
        assert r.max_abs_error is not None and r.max_abs_error < 0.05, format_comparison(recs)
    # every step of h (the LSTM's own output) and the last step agree where they overlap
    assert recs[4].max_abs_error <= recs[1].max_abs_error
    # a model exported with batch size 1: onnxruntime runs it row by row
    model1, _ = rnn_model("GRU", 3, rng, head=True, batch=1)
    x1 = rng.normal(0, 1, (3, 5, 12)).astype(np.float32)
    recs1 = compare(model1, compile_onnx(model1, BUILD), x1)
    assert recs1[-1].argmax_agreement is not None and recs1[-1].max_abs_error < 0.02


def test_prefix_graph_and_layer_cycles():
    model, _ = exact_model()
    graph = import_onnx(model)
    net = compile_onnx(model, BUILD)
    part = prefix_graph(graph, "h0")
    assert [nd.name for nd in part.nodes] == ["flatten", "fc0", "relu0"]
    assert part.outputs == ["h0"] and set(part.initializers) == {"fc0.W", "fc0.b"}
    part.validate()
    cycles = layer_cycles(graph, net)
    assert cycles[0] is None and cycles[-1] == net.report()["per_job"]["cycles_predicted"]


def test_another_models_image_is_refused():
    model, x = exact_model()
    rng = np.random.default_rng(1)
    other, _ = mlp_model([12, 5], [None], rng, softmax=False)
    with pytest.raises(ValueError, match="was not compiled from"):
        compare(model, compile_onnx(other, BUILD), x)
    with pytest.raises(ValueError, match=r"shape \(16, 12\)"):
        compare(model, compile_onnx(model, BUILD), x.reshape(16, 12))
    with pytest.raises(TypeError, match="int64"):
        compare(model, compile_onnx(model, BUILD), x.astype(np.int64))


def test_cli(tmp_path, capsys):
    model, x = exact_model()
    onnx.save(model, tmp_path / "m.onnx")
    net = compile_onnx(model, BUILD)
    net.save(tmp_path / "m.npz")
    np.save(tmp_path / "x.npy", x)
    build = "model:n=8,tiles=1,mantissa_bits_v=8,mantissa_bits_w=8"
    args = [str(tmp_path / f) for f in ("m.onnx", "m.npz", "x.npy")]
    assert main(["--device", build, "--json", "compare", *args]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [lay["max_abs_error"] for lay in out["layers"]] == [0, 0, 0, 0]
    assert main(["compare", *args]) == 0                       # model: the image's build
    text = capsys.readouterr().out
    assert "fc0" in text and "MatMul+Add" in text and "Relu (fused)" in text

    rng = np.random.default_rng(2)
    other, _ = mlp_model([12, 5], [None], rng, softmax=False)
    compile_onnx(other, BUILD).save(tmp_path / "other.npz")
    (tmp_path / "bad.onnx").write_bytes(b"\x08\x07garbage")
    np.save(tmp_path / "wide.npy", x.reshape(16, 12))
    np.save(tmp_path / "int.npy", x.astype(np.int32))
    np.savez(tmp_path / "two.npz", a=x, b=x)
    cases = [
        ((tmp_path / "missing.onnx", "m.npz", "x.npy"), "missing.onnx"),
        (("bad.onnx", "m.npz", "x.npy"), "bad.onnx"),
        (("m.onnx", "missing.npz", "x.npy"), "missing.npz"),
        (("m.onnx", "x.npy", "x.npy"), "x.npy: not a network image"),
        (("m.onnx", "other.npz", "x.npy"), "other.npz"),
        (("m.onnx", "m.npz", "missing.npy"), "missing.npy"),
        (("m.onnx", "m.npz", "wide.npy"), "wide.npy has shape (16, 12)"),
        (("m.onnx", "m.npz", "int.npy"), "int.npy must be float16"),
        (("m.onnx", "m.npz", "two.npz"), "two.npz must be one .npy array"),
    ]
    for files, words in cases:
        argv = ["compare", *[str(tmp_path / f) for f in files]]
        assert main(argv) == 2, files
        err = capsys.readouterr().err
        assert words in err, (files, err)
    # a device of another build refuses the image, naming both
    assert main(["--device", "model:n=16", "compare", *args]) == 2
    assert "n=8" in capsys.readouterr().err


def test_import_error_is_an_onnx_import_error(tmp_path):
    (tmp_path / "bad.onnx").write_bytes(b"not onnx")
    model, x = exact_model()
    with pytest.raises(OnnxImportError, match="bad.onnx"):
        compare(tmp_path / "bad.onnx", compile_onnx(model, BUILD), x)
