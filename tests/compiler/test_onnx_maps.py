"""Maps at the network's edges: an image input of several channels read by a convolution
or pool (an RGB CNN), and a map of several channels as the network's output.

The device keeps a map pixel by pixel (each pixel's channels padded to whole native
vectors, ``docs/compiler.md`` section 4); ONNX orders a batch row channel by channel. The
signature records the layout (``"input_layout": "chw"``, ``"input_map": [C, H, W]`` and
the output's) and :func:`host.compiler.network.signature_jobs` /
:func:`~host.compiler.network.signature_outputs` transpose each row. Checked:

* against onnxruntime within ``onnx_checks.bound_eval``'s bound: C = 3 and C = 11 (N = 8)
  inputs, non-square, padded and strided, through Conv -> Relu -> MaxPool -> Flatten ->
  Gemm; Conv -> Relu with a map output of 5 and 11 channels;
* bit for bit on small integers (12-bit build): an RGB convolution and an 11-channel
  pool, both with map outputs; the same images with the transposition left out of the
  signature (input or output) give other values, so a wrong transpose fails;
* ``npu compare`` on the zoo's CNN now shows every Conv and pool layer, with small errors
  at 8-bit mantissas;
* images without the layout keys (compiled before them) run as before.
"""

from __future__ import annotations

import copy
import os

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx_checks import bound_eval, check_within, conv_ref, init, make_model, ort_run

from host.cli import main
from host.compiler import compile_onnx
from host.compiler.compare import compare, format_comparison
from host.compiler.lower import CompileError
from host.compiler.network import Network, signature_jobs, signature_outputs

BUILD = "n=8,tiles=1,mantissa_bits_v=8,mantissa_bits_w=8"
EXACT = "n=8,tiles=1,mantissa_bits_v=12,mantissa_bits_w=12,mrf_depth=2048"
ZOO = os.path.join(os.path.dirname(__file__), "..", "..", "zoo", "cnn", "seed0")


def conv(name, x, y, w, b=None, **attrs):
    return helper.make_node("Conv", [x, w] + ([b] if b else []), [y], name=name, **attrs)


def check_model(model, x, what):
    """Compile for BUILD, run, and check against onnxruntime within the bound (and the
    observed error under 2^-4 of the outputs' largest magnitude); returns the network
    and its output."""
    net = compile_onnx(model, BUILD)
    y = net.run(x)
    ref = ort_run(model, x)
    assert y.shape == ref.shape, what
    value, bound = bound_eval(model, x, 8, 8, 8)
    ref16 = ort_run(model, x.astype(np.float16).astype(np.float32))
    assert np.abs(value - ref16).max() <= 1e-4 * max(1.0, np.abs(ref).max()), what
    check_within(y, ref, bound, what)
    assert np.abs(y - ref).max() < 2.0 ** -4 * np.abs(ref).max(), what
    return net, y


def rgb_cnn(rng, c_in, hw, c1=6, head=5):
    """Conv (3 x 3, stride 2, pads 1, 0, 2, 1) -> Relu -> MaxPool (2, stride 2, pad 1 at
    the bottom and right) -> Flatten -> Gemm."""
    w = rng.normal(0, 0.4, (c1, c_in, 3, 3)).astype(np.float32)
    b = rng.normal(0, 0.1, c1).astype(np.float32)
    inits = [init("w", w), init("b", b)]
    nodes = [conv("conv", "x", "c", "w", "b", strides=[2, 2], pads=[1, 0, 2, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2],
                              strides=[2, 2], pads=[0, 0, 1, 1]),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten")]
    model = make_model(nodes, inits, ["B", c_in, *hw], "f", None)
    feats = model.graph.output[0].type.tensor_type.shape.dim[1].dim_value
    inits += [init("wd", rng.normal(0, 1 / np.sqrt(feats), (head, feats))),
              init("bd", rng.normal(0, 0.1, head))]
    nodes.append(helper.make_node("Gemm", ["f", "wd", "bd"], ["y"], name="fc", transB=1))
    return make_model(nodes, inits, ["B", c_in, *hw], "y", ["B", head])


# --- against onnxruntime, within the bound ------------------------------------------------

@pytest.mark.parametrize("c_in,hw", [(3, (9, 7)), (11, (7, 10))])
def test_multichannel_image_input(c_in, hw):
    """An RGB-like image (3 channels, and 11: two native vectors a pixel at N = 8) read
    by a padded, strided convolution."""
    rng = np.random.default_rng(300 + c_in)
    model = rgb_cnn(rng, c_in, hw)
    x = rng.uniform(-1, 1, (16, c_in, *hw)).astype(np.float32)
    net, _ = check_model(model, x, f"C = {c_in}")
    sig = net.signature
    assert sig["input_layout"] == "chw" and sig["input_map"] == [c_in, *hw]
    assert sig["input_rows"] == hw[0] * hw[1]
    assert sig["input_vectors"] == hw[0] * hw[1] * -(-c_in // 8)
    assert "output_layout" not in sig                   # a flat (batch, K) output


@pytest.mark.parametrize("c_in,c_out", [(1, 5), (3, 11)])
def test_map_output(c_in, c_out):
    """Conv -> Relu whose output is a map of several channels: (batch, C, H, W), in
    ONNX's order."""
    rng = np.random.default_rng(310 + c_out)
    w = rng.normal(0, 0.5, (c_out, c_in, 3, 2)).astype(np.float32)
    b = rng.normal(0, 0.1, c_out).astype(np.float32)
    model = make_model([conv("conv", "x", "c", "w", "b", strides=[1, 2], pads=[1, 1, 0, 1]),
                        helper.make_node("Relu", ["c"], ["y"], name="relu")],
                       [init("w", w), init("b", b)], ["B", c_in, 6, 9], "y", None)
    x = rng.uniform(-1, 1, (12, c_in, 6, 9)).astype(np.float32)
    net, y = check_model(model, x, f"map of {c_out}")
    assert y.shape == (12, c_out, 5, 5)
    sig = net.signature
    assert sig["output_layout"] == "chw" and sig["output_map"] == [c_out, 5, 5]
    assert sig["output_rows"] == 25 and sig["output_vectors"] == 25 * -(-c_out // 8)
    # an empty batch has the output's shape too
    assert net.run(x[:0]).shape == (0, c_out, 5, 5)


# --- exact: small integers on a wide build ---------------------------------------------------

def exact_conv_model(rng):
    """An RGB convolution (3 -> 11 channels, stride (2, 1), asymmetric padding) -> Relu,
    the map the output; integers throughout."""
    w = rng.integers(-2, 3, (11, 3, 3, 3)).astype(np.float32)
    b = rng.integers(-3, 4, 11).astype(np.float32)
    model = make_model([conv("conv", "x", "c", "w", "b", strides=[2, 1], pads=[1, 0, 2, 1]),
                        helper.make_node("Relu", ["c"], ["y"], name="relu")],
                       [init("w", w), init("b", b)], ["B", 3, 7, 6], "y", None)
    x = rng.integers(-3, 4, (4, 3, 7, 6)).astype(np.float32)
    want = np.maximum(conv_ref(x, w, b, strides=(2, 1), pads=(1, 0, 2, 1)), 0)
    return model, x, want


def test_transposition_is_exact():
    """Integers on a 12-bit build: the device's values equal the integer convolution
    element for element, so every element went to and came from the right place."""
    rng = np.random.default_rng(320)
    model, x, want = exact_conv_model(rng)
    net = compile_onnx(model, EXACT)
    y = net.run(x)
    assert y.shape == want.shape == (4, 11, 4, 5)
    assert np.array_equal(y, want)
    assert np.array_equal(ort_run(model, x), y)


def test_eleven_channel_pool_is_exact():
    """An 11-channel image (two native vectors a pixel) into a padded MaxPool whose
    output is the network's: the input's ring and both transpositions, exactly."""
    rng = np.random.default_rng(321)
    model = make_model([helper.make_node("MaxPool", ["x"], ["y"], name="pool",
                                         kernel_shape=[3, 2], strides=[2, 1],
                                         pads=[1, 0, 1, 1])],
                       [], ["B", 11, 7, 5], "y", None)
    x = rng.integers(-9, 10, (3, 11, 7, 5)).astype(np.float32)
    y = compile_onnx(model, EXACT).run(x)
    ref = ort_run(model, x)
    assert y.shape == ref.shape == (3, 11, 4, 5)
    assert np.array_equal(y, ref)


def _without(net, *keys):
    image = copy.deepcopy(net.image)
    for k in keys:
        image.extra["signature"].pop(k)
    return Network(image)


def test_a_wrong_transposition_fails():
    """The same image with the transposition left out of the signature (rows taken as
    they come, as an image without the keys would be) gives other values: the exact
    check above would catch a transpose that is wrong."""
    rng = np.random.default_rng(320)
    model, x, want = exact_conv_model(rng)
    net = compile_onnx(model, EXACT)
    assert np.array_equal(net.run(x), want)
    no_in = _without(net, "input_layout", "input_map").run(x)
    no_out = _without(net, "output_layout", "output_map").run(x)
    assert no_in.shape == no_out.shape == want.shape
    assert not np.array_equal(no_in, want)
    assert not np.array_equal(no_out, want)
    # the output's pixels, read channel-major, are the right values in the wrong places
    assert np.array_equal(np.sort(no_out.reshape(4, -1), 1), np.sort(want.reshape(4, -1), 1))
    assert np.array_equal(no_out.reshape(4, -1),
                          want.reshape(4, 11, 20).transpose(0, 2, 1).reshape(4, -1))


def test_signature_functions_transpose_rows():
    """``signature_jobs`` puts pixel (y, x)'s channels in one padded row, in row-major
    pixel order; ``signature_outputs`` undoes it."""
    sig = {"input_shape": [None, 3, 2, 2], "input_name": "x", "input_vectors": 4,
           "input_rows": 4, "input_layout": "chw", "input_map": [3, 2, 2]}
    x = np.arange(2 * 12, dtype=np.float32).reshape(2, 3, 2, 2)
    jobs = signature_jobs(x, sig, 4).view(np.float16).astype(np.float32)
    assert jobs.shape == (2, 4, 4)
    assert np.array_equal(jobs[:, :, :3], x.reshape(2, 3, 4).transpose(0, 2, 1))
    assert not jobs[:, :, 3].any()
    out_sig = {"output_shape": [None, 3, 2, 2], "output_features": 12, "output_rows": 4,
               "output_layout": "chw", "output_map": [3, 2, 2]}
    back = signature_outputs(signature_jobs(x, sig, 4), out_sig)
    assert np.array_equal(back, x)
    with pytest.raises(ValueError, match="input_layout is 'hwc'"):
        signature_jobs(x, dict(sig, input_layout="hwc"), 4)


def test_npu_run_transposes_too(tmp_path, capsys):
    """``npu run`` uses the same conversion: its outputs equal Network.run's, bit for
    bit."""
    rng = np.random.default_rng(322)
    model, x, want = exact_conv_model(rng)
    net = compile_onnx(model, EXACT)
    net.save(tmp_path / "net.npz")
    np.save(tmp_path / "x.npy", x)
    argv = ["--device", f"model:{EXACT}", "run", str(tmp_path / "net.npz"),
            str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy")]
    assert main(argv) == 0, capsys.readouterr().err
    y = np.load(tmp_path / "y.npy")
    assert y.shape == want.shape and np.array_equal(y, want)


# --- old images, and what stays refused -------------------------------------------------------

def test_an_image_without_layout_keys_runs_as_before(tmp_path):
    """A one-channel CNN (input rows of one element, a one-channel map output) compiled
    today has the layout keys; without them, as images compiled before them, it runs to
    the same bits (the transposition of one channel is the identity), also from a file.
    An MLP's signature has no layout keys."""
    rng = np.random.default_rng(323)
    w = rng.normal(size=(1, 1, 3, 3)).astype(np.float32)
    model = make_model([conv("c", "x", "y", "w", pads=[1, 0, 1, 0])], [init("w", w)],
                       ["B", 1, 5, 6], "y", None)
    x = rng.uniform(-1, 1, (5, 1, 5, 6)).astype(np.float32)
    net = compile_onnx(model, BUILD)
    assert net.signature["input_map"] == [1, 5, 6] and net.signature["output_map"] == [1, 5, 4]
    y = net.run(x)
    old = _without(net, "input_layout", "input_map", "output_layout", "output_map")
    old.save(tmp_path / "old.npz")
    loaded = Network.load(tmp_path / "old.npz")
    assert not any(k.endswith(("_layout", "_map")) for k in loaded.signature)
    assert np.array_equal(loaded.run(x).view(np.uint32), y.view(np.uint32))
    flat = make_model([helper.make_node("Flatten", ["x"], ["f"], name="flat"),
                       helper.make_node("Gemm", ["f", "wd"], ["y"], name="fc", transB=1)],
                      [init("wd", rng.normal(size=(4, 12)))], ["B", 3, 2, 2], "y", ["B", 4])
    sig = compile_onnx(flat, BUILD).signature
    assert not any(k.endswith(("_layout", "_map")) for k in sig)


def test_softmax_over_a_map_is_still_refused():
    rng = np.random.default_rng(324)
    model = make_model([conv("c", "x", "h", "rng_w"),
                        helper.make_node("Flatten", ["h"], ["f"], name="flat"),
                        helper.make_node("Softmax", ["f"], ["y"], name="sm", axis=1)],
                       [init("rng_w", rng.normal(size=(4, 3, 3, 3)))], ["B", 3, 5, 5], "y",
                       None)
    with pytest.raises(CompileError, match=r"'sm' \(Softmax\).*map of 9 pixels"):
        compile_onnx(model, BUILD)


# --- npu compare on the zoo's CNN -------------------------------------------------------------

@pytest.mark.skipif(not os.path.exists(os.path.join(ZOO, "model.onnx")),
                    reason="the zoo's CNN is not exported")
def test_compare_shows_every_conv_and_pool_layer():
    """Every layer of the zoo's CNN has figures (its prefix program, ending in a map of
    several channels, compiles), with small errors at 8-bit mantissas."""
    path = os.path.join(ZOO, "model.onnx")
    x = np.load(os.path.join(ZOO, "data.npz"))["x_test"][:20].astype(np.float32)
    net = compile_onnx(path, "mantissa_bits_v=8,mantissa_bits_w=8")
    records = compare(path, net, x)
    text = format_comparison(records)
    ops = [r.op for r in records]
    assert ops.count("Conv") == 2 and "MaxPool" in ops, text
    for r in records:
        assert r.max_abs_error is not None, text
        assert "does not compile" not in r.note, text
        assert r.max_abs_error < 2.0 ** -4 * r.reference_max_abs, text
        assert r.rel_rms_error < 2.0 ** -5, text
        if r.op in ("Conv", "MaxPool"):
            assert len(r.shape) == 4 and r.onnx_tensor == r.tensor, text
            assert r.note == "" and r.cycles_predicted, text
    assert records[-1].argmax_agreement == 1.0, text
