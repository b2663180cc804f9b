"""The network compiler's first slice: ONNX MLP classifiers compiled, run and checked.

Models are built with ``onnx.helper``; the reference is onnxruntime's float32 output.
The NPU's result must lie within :func:`error_bound` of it, element by element: the
bound of ``docs/compiler.md`` section 6, propagated through the layers in float64 from
the BFP quantization of vectors (``2^-(m_v - 1)`` of each native block's largest
magnitude) and weights (``2^-(m_w - 1)`` of each tile row block's largest magnitude),
FP16 roundings (``2^-11`` relative per operation) and the ACT unit's functions (within
``2^-8`` relative). The class predicted must be the reference's on every row whose top
two logits are further apart than the bound allows, and on at least 90 % of all rows.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx_checks import block_max, check_classes, check_within, init, ort_run

from host.cli import main
from host.compiler import Network, compile_onnx
from host.compiler.lower import CompileError
from host.compiler.network import config_text, format_report
from host.compiler.onnx_import import OnnxImportError, import_onnx
from host.spec.config import parse_config
from host.spec.image import NetworkImage

BUILD = "n=8,tiles=1,mantissa_bits_v=8,mantissa_bits_w=8"
BUILD16 = "n=16,tiles=2,mantissa_bits_v=8,mantissa_bits_w=8"


# --- model construction -----------------------------------------------------------------

def mlp_model(sizes, acts, rng, *, form="gemm", softmax=True, opset=17, batch="N",
              extra_nodes=None):
    """An MLP ``sizes[0] -> sizes[1] -> ...``; ``acts[i]`` (None, "Relu", "Sigmoid", "Tanh")
    after layer ``i``; ``form``: "gemm" (transB=1), "gemm_t" (transB=0, alpha, beta),
    "matmul" (MatMul + Add). Returns the ModelProto and the float64 layers
    ``[("dense", W (out, in), b), (act, None, None), ...]``."""
    nodes, inits, layers = [], [], []
    cur = "x"
    for i, (f_in, f_out) in enumerate(zip(sizes, sizes[1:])):
        w = rng.normal(0, 1 / np.sqrt(f_in), (f_out, f_in)).astype(np.float32)
        b = rng.normal(0, 0.2, f_out).astype(np.float32)
        out = f"h{i}"
        if form == "gemm":
            inits += [init(f"W{i}", w), init(f"b{i}", b)]
            nodes.append(helper.make_node("Gemm", [cur, f"W{i}", f"b{i}"], [out],
                                          name=f"fc{i}", transB=1))
            layers.append(("dense", w.astype(np.float64), b.astype(np.float64)))
        elif form == "gemm_t":
            alpha, beta = 0.5, 2.0
            inits += [init(f"W{i}", w.T), init(f"b{i}", b[None])]
            nodes.append(helper.make_node("Gemm", [cur, f"W{i}", f"b{i}"], [out],
                                          name=f"fc{i}", alpha=alpha, beta=beta))
            layers.append(("dense", alpha * w.astype(np.float64),
                           beta * b.astype(np.float64)))
        else:
            inits += [init(f"W{i}", w.T), init(f"b{i}", b)]
            nodes.append(helper.make_node("MatMul", [cur, f"W{i}"], [f"{out}m"], name=f"mm{i}"))
            nodes.append(helper.make_node("Add", [f"{out}m", f"b{i}"], [out], name=f"add{i}"))
            layers.append(("dense", w.astype(np.float64), b.astype(np.float64)))
        cur = out
        if acts[i]:
            nodes.append(helper.make_node(acts[i], [cur], [f"{cur}a"], name=f"act{i}"))
            layers.append((acts[i], None, None))
            cur = f"{cur}a"
    if softmax:
        nodes.append(helper.make_node("Softmax", [cur], ["y"], name="softmax", axis=-1))
        layers.append(("Softmax", None, None))
        cur = "y"
    if extra_nodes:
        nodes += extra_nodes(cur)
        cur = nodes[-1].output[0]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, sizes[0]])],
        [helper.make_tensor_value_info(cur, TensorProto.FLOAT, [batch, sizes[-1]])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model, layers


# --- the error bound ----------------------------------------------------------------------

def error_bound(layers, x, n, mv=8, mw=8):
    """float64 reference and per-element bound on ``|npu - reference|`` (module docstring)."""
    dv, dw, u = 2.0 ** -(mv - 1), 2.0 ** -(mw - 1), 2.0 ** -11
    rom, tiny = 2.0 ** -8, 2.0 ** -20
    h = x.astype(np.float64)
    e = np.abs(h - h.astype(np.float16).astype(np.float64))
    for kind, w, b in layers:
        if kind == "dense":
            a = np.abs(h) + e                              # bounds |x| on the NPU
            aw = np.abs(w)
            bx, bw = block_max(a, n), block_max(aw, n)
            y = h @ w.T + b
            ey = e @ aw.T + dv * bx @ aw.T + dw * a @ bw.T + dv * dw * bx @ bw.T \
                + u * a @ aw.T                             # W rounded to FP16
            ey += u * (np.abs(y) + ey) * 2 + u * np.abs(b) + tiny   # product, bias, add
            h, e = y, ey
        elif kind == "Relu":
            h = np.maximum(h, 0)
        elif kind in ("Sigmoid", "Tanh"):
            f = (lambda v: 1 / (1 + np.exp(-v))) if kind == "Sigmoid" else np.tanh
            h = f(h)
            e = e * (0.25 if kind == "Sigmoid" else 1.0) + rom * np.abs(h) + tiny
        elif kind == "Softmax":
            z = h - h.max(-1, keepdims=True)
            p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
            ez = e.max(-1, keepdims=True)
            h, e = p, p * (np.exp(2 * ez) - 1) + 4 * rom * p + tiny
    return h, e


def check_close(y, ref, layers, x, n, what):
    _, bound = error_bound(layers, x, n)
    check_within(y, ref, bound, what)
    return bound


# --- compile and run against onnxruntime --------------------------------------------------

@pytest.mark.parametrize("form", ["gemm", "gemm_t", "matmul"])
def test_mlp_matches_onnxruntime(form):
    rng = np.random.default_rng(1)
    model, layers = mlp_model([20, 13, 7], ["Relu", None], rng, form=form)
    net = compile_onnx(model, BUILD)
    x = rng.normal(size=(64, 20)).astype(np.float32)
    y = net.run(x)
    ref = ort_run(model, x)
    assert y.dtype == np.float32 and y.shape == (64, 7)
    bound = check_close(y, ref, layers, x, 8, form)
    check_classes(y, ref, bound, form)
    # the worst-case bound is loose (errors add up as sqrt(F), not F); the observed error
    # of these 8-bit builds is far smaller: under 2^-6 on probabilities (docs/compiler.md)
    assert np.abs(y - ref).max() < 2.0 ** -6
    # and the run is not trivially exact: it does differ from float32
    assert not np.array_equal(y, ref)


def test_bound_catches_a_coarser_build():
    """The check fails when the network runs with fewer mantissa bits than the bound
    assumes (so the comparison can fail)."""
    rng = np.random.default_rng(2)
    model, layers = mlp_model([20, 13, 7], ["Relu", None], rng, softmax=False)
    net = compile_onnx(model, "n=8,tiles=1,mantissa_bits_v=3,mantissa_bits_w=3")
    x = rng.normal(size=(64, 20)).astype(np.float32)
    with pytest.raises(AssertionError, match="beyond the bound"):
        check_close(net.run(x), ort_run(model, x), layers, x, 8, "3-bit build")


def test_activations_and_batch_of_one():
    rng = np.random.default_rng(3)
    model, layers = mlp_model([11, 9, 17, 5], ["Tanh", "Sigmoid", None], rng, softmax=False,
                              batch=1)
    net = compile_onnx(model, BUILD16)
    x = rng.normal(size=(1, 11)).astype(np.float32)
    check_close(net.run(x), ort_run(model, x), layers, x, 16, "tanh/sigmoid")
    # a fixed batch of 1 in the model still takes any number of rows, one job each
    xs = rng.normal(size=(5, 11)).astype(np.float32)
    check_close(net.run(xs), np.concatenate([ort_run(model, r[None]) for r in xs]), layers,
                xs, 16, "rows")


def test_shape_arithmetic_is_folded(tmp_path):
    """PyTorch-style flatten (Shape, Gather, Unsqueeze, Concat, Reshape), Flatten,
    Identity and Dropout are folded or removed; the input is 4-D."""
    rng = np.random.default_rng(4)
    w = rng.normal(0, 0.3, (6, 20)).astype(np.float32)
    b = rng.normal(0, 0.1, 6).astype(np.float32)
    nodes = [
        helper.make_node("Identity", ["x"], ["xi"], name="id"),
        helper.make_node("Shape", ["xi"], ["s"], name="shape"),
        helper.make_node("Constant", [], ["zero"], name="c0",
                         value=numpy_helper.from_array(np.array(0, np.int64))),
        helper.make_node("Gather", ["s", "zero"], ["bs"], name="gather", axis=0),
        helper.make_node("Constant", [], ["ax"], name="c1",
                         value=numpy_helper.from_array(np.array([0], np.int64))),
        helper.make_node("Unsqueeze", ["bs", "ax"], ["bs1"], name="unsq"),
        helper.make_node("Constant", [], ["m1"], name="c2",
                         value=numpy_helper.from_array(np.array([-1], np.int64))),
        helper.make_node("Concat", ["bs1", "m1"], ["target"], name="concat", axis=0),
        helper.make_node("Reshape", ["xi", "target"], ["flat"], name="reshape"),
        helper.make_node("Dropout", ["flat"], ["d"], name="drop"),
        helper.make_node("Gemm", ["d", "W", "b"], ["z"], name="fc", transB=1),
        helper.make_node("Relu", ["z"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes, "flat", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 1, 4, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 6])],
        [init("W", w), init("b", b)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ir = import_onnx(model)
    assert [n.op for n in ir.nodes] == ["Flatten", "Dense", "Relu"]
    net = compile_onnx(model, BUILD)
    assert net.signature["input_shape"] == [None, 1, 4, 5]
    x = rng.normal(size=(9, 1, 4, 5)).astype(np.float32)
    layers = [("dense", w.astype(np.float64), b.astype(np.float64)), ("Relu", None, None)]
    check_close(net.run(x), ort_run(model, x), layers, x.reshape(9, 20), 8, "flatten")


def test_property_random_mlps():
    """Seeded random MLP shapes, activations and builds: within the bound every time."""
    rng = np.random.default_rng(5)
    acts = [None, "Relu", "Sigmoid", "Tanh"]
    builds = [(BUILD, 8), (BUILD16, 16), ("ulx3s_n4,mantissa_bits_v=8,mantissa_bits_w=8", 4)]
    for case in range(8):
        depth = int(rng.integers(1, 4))
        sizes = [int(s) for s in rng.integers(1, 40, depth + 1)]
        layer_acts = [acts[int(rng.integers(len(acts)))] for _ in range(depth)]
        softmax = bool(rng.integers(2)) and sizes[-1] > 1
        form = ["gemm", "gemm_t", "matmul"][int(rng.integers(3))]
        build, n = builds[case % len(builds)]
        model, layers = mlp_model(sizes, layer_acts, rng, form=form, softmax=softmax)
        x = rng.normal(size=(int(rng.integers(1, 12)), sizes[0])).astype(np.float32)
        what = f"case {case}: {sizes} {layer_acts} softmax={softmax} {form} on {build}"
        y = compile_onnx(model, build).run(x)
        assert y.shape == (len(x), sizes[-1]), what
        check_close(y, ort_run(model, x), layers, x, n, what)


# --- save, report, CLI ---------------------------------------------------------------------

def _model_file(tmp_path, rng=None):
    rng = rng or np.random.default_rng(6)
    model, layers = mlp_model([20, 13, 7], ["Relu", None], rng)
    path = tmp_path / "mlp.onnx"
    onnx.save(model, str(path))
    return model, layers, path


def test_cli_compile_run_report_bit_identical(tmp_path, capsys):
    model, _, path = _model_file(tmp_path)
    net_path = tmp_path / "net.npz"
    assert main(["compile", str(path), "-o", str(net_path), "--config", BUILD]) == 0
    capsys.readouterr()
    x = np.random.default_rng(7).normal(size=(10, 20)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    config = parse_config(BUILD)
    device = f"model:{config_text(config)}"
    out = tmp_path / "y.npy"
    assert main(["--device", device, "run", str(net_path), str(tmp_path / "x.npy"), "-o",
                 str(out), "--no-progress"]) == 0
    y_cli = np.load(out)
    net = compile_onnx(model, BUILD)
    y_api = net.run(x)
    assert y_cli.dtype == np.float32 and y_cli.shape == (10, 7)
    assert np.array_equal(y_cli, y_api)
    # the saved image is the same network
    loaded = Network.load(net_path)
    assert np.array_equal(loaded.run(x), y_api)
    assert loaded.signature == {**net.signature}
    assert net.signature["input_shape"] == [None, 20]
    assert net.signature["output_shape"] == [None, 7]
    assert net.image.inputs == 3 and net.image.outputs == 1
    # the report
    capsys.readouterr()
    assert main(["--json", "report", str(net_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == loaded.report() and report["source"] == str(path)
    assert {**report, "source": ""} == {**net.report(), "source": ""}
    assert [lay["op"] for lay in report["layers"]] == ["Gemm", "Relu", "Gemm", "Softmax"]
    assert [lay["macs"] for lay in report["layers"]] == [260, 0, 91, 0]
    assert report["totals"]["macs"] == 351
    assert report["layers"][0]["mrf_slots"] == [0, 6]        # 2 row tiles x 3 col tiles
    assert report["layers"][2]["mrf_slots"] == [6, 2]
    assert report["per_job"]["cycles_predicted"] > 0
    assert main(["report", str(net_path)]) == 0
    text = capsys.readouterr().out
    assert "fc0" in text and "351 MACs" in text and text.strip() == format_report(report)


def test_native_images_keep_their_form(tmp_path):
    """An image without a signature still takes (jobs, k, n) native vectors."""
    from host.compiler.image import program_image
    from host.compiler.programs import mlp_layer
    cfg = parse_config("n=8,tiles=1")
    rng = np.random.default_rng(8)
    prog = mlp_layer(cfg, rng.normal(size=(5, 6)), rng.normal(size=5), rng.normal(size=6))
    image_path = tmp_path / "layer.npz"
    program_image(prog).save(image_path)
    xs = rng.normal(size=(3, 1, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", xs)
    assert main(["--device", "model:n=8,tiles=1", "run", str(image_path),
                 str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy"), "--no-progress"]) == 0
    y = np.load(tmp_path / "y.npy")
    assert y.dtype == np.float16 and y.shape == (3, 1, 8)


# --- refusals --------------------------------------------------------------------------

def test_unsupported_operator_names_node_and_op():
    rng = np.random.default_rng(9)
    model, _ = mlp_model([6, 4], [None], rng, softmax=False, extra_nodes=lambda cur: [
        helper.make_node("Erf", [cur], ["y"], name="erf")])
    with pytest.raises(OnnxImportError) as info:
        compile_onnx(model, BUILD)
    msg = str(info.value)
    assert "'erf'" in msg and "Erf" in msg and "supported operators: Gemm" in msg


def test_unsupported_forms_are_named():
    rng = np.random.default_rng(10)
    model, _ = mlp_model([6, 4], ["Relu"], rng, softmax=False, extra_nodes=lambda cur: [
        helper.make_node("Softmax", [cur], ["y"], name="sm0", axis=0)])
    with pytest.raises(OnnxImportError, match=r"'sm0' \(Softmax\).*axis 0"):
        compile_onnx(model, BUILD)


def test_truncated_file_names_the_file(tmp_path, capsys):
    _, _, path = _model_file(tmp_path)
    data = path.read_bytes()
    bad = tmp_path / "cut.onnx"
    bad.write_bytes(data[:len(data) // 2])
    with pytest.raises(OnnxImportError, match="cut.onnx"):
        compile_onnx(str(bad), BUILD)
    out = tmp_path / "net.npz"
    assert main(["compile", str(bad), "-o", str(out)]) == 2
    assert "cut.onnx" in capsys.readouterr().err
    assert not out.exists()


def test_too_large_names_layer_memory_and_sizes(tmp_path, capsys):
    rng = np.random.default_rng(11)
    model, _ = mlp_model([20, 13, 7], ["Relu", None], rng)
    with pytest.raises(CompileError) as info:
        compile_onnx(model, "n=4,tiles=1,mrf_depth=16")
    msg = str(info.value)
    # fc0 needs 4 x 5 = 20 tile slots
    assert "'fc0' (Gemm)" in msg and "MRF" in msg and "20 tile slots" in msg \
        and "mrf_depth 16" in msg
    with pytest.raises(CompileError, match=r"'fc0' \(Gemm\).*IVRF needs 4 .*ivrf_depth 2"):
        compile_onnx(model, "n=4,tiles=1,ivrf_depth=2")
    _, _, path = _model_file(tmp_path)
    assert main(["compile", str(path), "-o", str(tmp_path / "n.npz"), "--config",
                 "n=4,tiles=1,mrf_depth=16"]) == 2
    assert "mrf_depth 16" in capsys.readouterr().err


def test_bad_inputs_to_run_and_npu_run(tmp_path, capsys):
    model, _, path = _model_file(tmp_path)
    net = compile_onnx(model, BUILD)
    with pytest.raises(ValueError, match=r"shape \(4, 21\).*\(batch, 20\)"):
        net.run(np.zeros((4, 21), np.float32))
    with pytest.raises(ValueError, match="shape"):
        net.run(np.zeros(20, np.float32))
    with pytest.raises(TypeError, match="int64"):
        net.run(np.zeros((4, 20), np.int64))
    net_path = tmp_path / "net.npz"
    net.save(net_path)
    device = f"model:{config_text(parse_config(BUILD))}"
    for name, arr, word in (("shape", np.zeros((4, 21), np.float32), "shape"),
                            ("native", np.zeros((4, 3, 8), np.float32), "shape"),
                            ("int", np.zeros((4, 20), np.int32), "int32"),
                            ("bits", np.zeros((4, 20), np.uint16), "uint16")):
        np.save(tmp_path / f"{name}.npy", arr)
        out = tmp_path / f"{name}_out.npy"
        assert main(["--device", device, "run", str(net_path), str(tmp_path / f"{name}.npy"),
                     "-o", str(out), "--no-progress"]) == 2, name
        assert word in capsys.readouterr().err, name
        assert not out.exists(), name
    # the right inputs on a device of another build: refused before running (exit 2)
    np.save(tmp_path / "ok.npy", np.zeros((2, 20), np.float32))
    assert main(["--device", "model", "run", str(net_path), str(tmp_path / "ok.npy"), "-o",
                 str(tmp_path / "o.npy"), "--no-progress"]) == 2
    assert "does not fit model" in capsys.readouterr().err


def test_report_of_an_image_without_one(tmp_path, capsys):
    image = NetworkImage(program=np.zeros(1, np.uint64))
    image.save(tmp_path / "plain.npz")
    assert main(["report", str(tmp_path / "plain.npz")]) == 2
    assert "no compile report" in capsys.readouterr().err


def test_external_data_beside_the_file(tmp_path):
    """Weights stored as external data next to the .onnx load through onnx.load."""
    rng = np.random.default_rng(12)
    model, layers = mlp_model([20, 13, 7], ["Relu", None], rng)
    path = tmp_path / "ext.onnx"
    inline = onnx.ModelProto()
    inline.CopyFrom(model)                 # save_model moves the tensors out of `model`
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="ext.weights", size_threshold=0)
    assert (tmp_path / "ext.weights").stat().st_size > 20 * 13 * 4
    x = rng.normal(size=(8, 20)).astype(np.float32)
    assert np.array_equal(compile_onnx(str(path), BUILD).run(x),
                          compile_onnx(inline, BUILD).run(x))
    (tmp_path / "ext.weights").unlink()
    with pytest.raises(OnnxImportError, match="ext.onnx"):
        compile_onnx(str(path), BUILD)


def test_a_unary_function_the_build_lacks():
    rng = np.random.default_rng(13)
    model, _ = mlp_model([6, 4], ["Sigmoid"], rng, softmax=False)
    with pytest.raises(CompileError, match=r"'act0' \(Sigmoid\).*sigmoid.*unary_ops: relu"):
        compile_onnx(model, "n=8,tiles=1,unary_ops=relu+pass")
