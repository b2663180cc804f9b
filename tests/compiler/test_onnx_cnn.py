"""Convolutional networks compiled from ONNX: Conv, pools, BatchNormalization, Clip,
LeakyRelu, Flatten + Gemm, checked against onnxruntime and a float64 evaluation.

The bound (``onnx_checks.bound_eval``, ``docs/compiler.md`` section 6) propagates the
BFP quantization of each product's gathered input (blocks of N lanes per pixel) and
weights, FP16 roundings and the ACT unit's error through the graph; every element of the
NPU's output must lie within it of onnxruntime's float32 output. The directed tests use
small integers on a 12-bit build, where the device is exact, and compare with
``onnx_checks.conv_ref`` (a loop-by-loop float64 convolution written for the tests).
"""

from __future__ import annotations

import os
import zlib

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx_checks import bound_eval, check_classes, check_within, conv_ref, init, make_model, ort_run

from host.compiler import compile_onnx
from host.compiler.lower import CompileError
from host.compiler.onnx_import import OnnxImportError, import_onnx
from host.spec.config import parse_config

BUILD = "n=8,tiles=1,mantissa_bits_v=8,mantissa_bits_w=8"
EXACT = "n=8,tiles=1,mantissa_bits_v=12,mantissa_bits_w=12,mrf_depth=2048"
ZOO = os.path.join(os.path.dirname(__file__), "..", "..", "zoo", "cnn", "seed0")


def conv(name, x, y, w, b=None, **attrs):
    ins = [x, w] + ([b] if b else [])
    return helper.make_node("Conv", ins, [y], name=name, **attrs)


def check_model(model, x, what, build=BUILD, n=8, mant=8):
    """Compile, run, and check against onnxruntime within the bound; returns the NPU's
    output, onnxruntime's, and the bound."""
    y = compile_onnx(model, build).run(x)
    ref = ort_run(model, x)
    value, bound = bound_eval(model, x, n, mant, mant)
    assert y.shape == ref.shape, what
    # the float64 evaluation (of the input rounded to FP16, as the device takes it) is
    # what the bound is built on; onnxruntime agrees with it on the same input
    ref16 = ort_run(model, x.astype(np.float16).astype(np.float32))
    assert np.abs(value - ref16).max() <= 1e-4 * max(1.0, np.abs(ref).max()), what
    check_within(y, ref, bound, what)
    return y, ref, bound


# --- exact: small integers on a wide build --------------------------------------------------

@pytest.mark.parametrize("k,stride,pads,hw", [
    (3, 1, (1, 1, 1, 1), (7, 6)),
    (3, 2, (1, 1, 1, 1), (7, 6)),
    (2, 1, (0, 0, 0, 0), (5, 9)),
    (5, 2, (2, 1, 0, 2), (9, 7)),          # asymmetric padding
    (1, 2, (0, 0, 0, 0), (6, 5)),
    (3, 1, (0, 2, 1, 0), (4, 4)),
])
def test_conv_is_exact_on_integers(k, stride, pads, hw):
    """Two convolutions (1 -> 11 -> 3 channels: 11 is not a multiple of N = 8) with
    integer weights and inputs: every output equals the integer convolution."""
    rng = np.random.default_rng(100 + k)
    w1 = rng.integers(-2, 3, (11, 1, 3, 3)).astype(np.float32)
    b1 = rng.integers(-3, 4, 11).astype(np.float32)
    w2 = rng.integers(-1, 2, (3, 11, k, k)).astype(np.float32)
    nodes = [conv("c1", "x", "h", "w1", "b1", pads=[1, 1, 1, 1]),
             conv("c2", "h", "y", "w2", strides=[stride, stride], pads=list(pads))]
    model = make_model(nodes, [init("w1", w1), init("b1", b1), init("w2", w2)],
                       ["B", 1, *hw], "y", ["B", 3, None, None])
    x = rng.integers(-3, 4, (4, 1, *hw)).astype(np.float32)
    want = conv_ref(conv_ref(x, w1, b1, pads=(1, 1, 1, 1)), w2, strides=(stride, stride),
                    pads=(pads[0], pads[1], pads[2], pads[3]))
    # the 3-channel map as the output (transposed back to ONNX's order by the runtime)
    y = compile_onnx(model, EXACT).run(x)
    assert np.array_equal(y, want), (k, stride, pads)
    # and flattened through an identity Gemm (exact on integers), which checks the
    # Gemm's weight permutation
    feats = int(np.prod(want.shape[1:]))
    model = make_model(nodes + [helper.make_node("Flatten", ["y"], ["f"], name="flat"),
                                helper.make_node("Gemm", ["f", "eye"], ["z"], name="eye")],
                       [init("w1", w1), init("b1", b1), init("w2", w2),
                        init("eye", np.eye(feats))], ["B", 1, *hw], "z", ["B", feats])
    y = compile_onnx(model, EXACT).run(x)
    assert np.array_equal(y, want.reshape(len(x), -1)), (k, stride, pads)
    assert np.array_equal(ort_run(model, x), y)


def test_one_channel_map_output_is_exact():
    """A one-channel map is a network output (its pixel-major layout is ONNX's order)."""
    rng = np.random.default_rng(101)
    w = rng.integers(-2, 3, (1, 1, 3, 3)).astype(np.float32)
    model = make_model([conv("c", "x", "y", "w", pads=[1, 0, 1, 0])], [init("w", w)],
                       ["B", 1, 5, 6], "y", ["B", 1, 5, 4])
    x = rng.integers(-4, 5, (3, 1, 5, 6)).astype(np.float32)
    net = compile_onnx(model, EXACT)
    assert net.signature["output_rows"] == 20 and net.signature["input_rows"] == 30
    assert np.array_equal(net.run(x), conv_ref(x, w, pads=(1, 0, 1, 0)))


@pytest.mark.parametrize("op,k,s,pads,incl", [
    ("MaxPool", 2, 2, (0, 0, 0, 0), 0),
    ("MaxPool", 3, 2, (1, 1, 1, 1), 0),       # padding never wins, even over negatives
    ("MaxPool", 3, 1, (0, 2, 2, 0), 0),
    ("AveragePool", 2, 2, (0, 0, 0, 0), 0),
    ("AveragePool", 2, 1, (1, 1, 0, 0), 1),   # divides by 4 everywhere
    ("AveragePool", 2, 1, (1, 1, 0, 0), 0),   # divides by the positions inside the map
])
def test_pools_are_exact(op, k, s, pads, incl):
    """Pools on an integer map with negative values; averages of 2 x 2 windows (divided
    by 1, 2 or 4) are exact in FP16."""
    rng = np.random.default_rng(102)
    w = rng.integers(-2, 3, (5, 1, 3, 3)).astype(np.float32)
    attrs = {"kernel_shape": [k, k], "strides": [s, s], "pads": list(pads)}
    if op == "AveragePool":
        attrs["count_include_pad"] = incl
    nodes = [conv("c", "x", "h", "w", pads=[1, 1, 1, 1]),
             helper.make_node(op, ["h"], ["p"], name="pool", **attrs),
             helper.make_node("Flatten", ["p"], ["f"], name="flat")]
    x = rng.integers(-3, 4, (3, 1, 7, 6)).astype(np.float32)
    h = conv_ref(x, w, pads=(1, 1, 1, 1))
    t, l, b, r = pads
    hp = np.pad(h, ((0, 0), (0, 0), (t, b), (l, r)), constant_values=np.nan)
    oh, ow = (7 + t + b - k) // s + 1, (6 + l + r - k) // s + 1
    want = np.zeros((3, 5, oh, ow))
    for oy in range(oh):
        for ox in range(ow):
            win = hp[:, :, oy * s:oy * s + k, ox * s:ox * s + k]
            if op == "MaxPool":
                want[:, :, oy, ox] = np.nanmax(win, axis=(2, 3))
            elif incl:
                want[:, :, oy, ox] = np.nansum(win, axis=(2, 3)) / (k * k)
            else:
                want[:, :, oy, ox] = np.nanmean(win, axis=(2, 3))
    feats = want[0].size
    model = make_model(nodes + [helper.make_node("Gemm", ["f", "eye"], ["z"], name="eye")],
                       [init("w", w), init("eye", np.eye(feats))], ["B", 1, 7, 6], "z",
                       ["B", feats])
    y = compile_onnx(model, EXACT).run(x)
    assert np.array_equal(y, want.reshape(3, -1)), (op, k, s, pads, incl)
    assert np.array_equal(ort_run(model, x), y)


# --- against onnxruntime, within the bound ---------------------------------------------------

def cnn(rng, *, c_in=1, hw=(8, 7), chans=(5, 11), k=3, stride=2, pool=None, act="Relu",
        bn=False, head=6, auto_pad=None, extra=None):
    """conv (k, pad 1) -> [BN] -> act -> conv (k, stride) -> act -> [pool] -> Flatten ->
    Gemm(head). ``pool``: None or (op, kernel, stride, pads, count_include_pad)."""
    w1 = rng.normal(0, 0.5, (chans[0], c_in, 3, 3)).astype(np.float32)
    b1 = rng.normal(0, 0.1, chans[0]).astype(np.float32)
    w2 = rng.normal(0, 0.3, (chans[1], chans[0], k, k)).astype(np.float32)
    b2 = rng.normal(0, 0.1, chans[1]).astype(np.float32)
    inits = [init("w1", w1), init("b1", b1), init("w2", w2), init("b2", b2)]
    a2 = {"strides": [stride, stride]}
    if auto_pad:
        a2["auto_pad"] = auto_pad
    else:
        a2["pads"] = [1, 1, 1, 1] if k > 1 else [0, 0, 0, 0]
    nodes = [conv("conv1", "x", "c1", "w1", "b1", pads=[1, 1, 1, 1])]
    cur = "c1"
    if bn:
        c = chans[0]
        inits += [init("g", rng.uniform(0.5, 1.5, c)), init("bb", rng.normal(0, 0.1, c)),
                  init("mu", rng.normal(0, 0.1, c)), init("var", rng.uniform(0.5, 2, c))]
        nodes.append(helper.make_node("BatchNormalization", [cur, "g", "bb", "mu", "var"],
                                      ["bn1"], name="bn1"))
        cur = "bn1"

    def activation(x, y, name):
        if act == "Clip6":
            inits.extend([init(f"{name}lo", 0.0), init(f"{name}hi", 6.0)])
            return helper.make_node("Clip", [x, f"{name}lo", f"{name}hi"], [y], name=name)
        if act == "LeakyRelu":
            return helper.make_node("LeakyRelu", [x], [y], name=name, alpha=0.1)
        return helper.make_node(act, [x], [y], name=name)
    nodes.append(activation(cur, "a1", "act1"))
    nodes.append(conv("conv2", "a1", "c2", "w2", "b2", **a2))
    nodes.append(activation("c2", "a2", "act2"))
    cur = "a2"
    if pool is not None:
        op, pk, ps, pp, incl = pool
        attrs = {} if op.startswith("Global") else {"kernel_shape": [pk, pk],
                                                        "strides": [ps, ps], "pads": list(pp)}
        if op == "AveragePool":
            attrs["count_include_pad"] = incl
        nodes.append(helper.make_node(op, [cur], ["p"], name="pool", **attrs))
        cur = "p"
    if extra:
        nodes += extra(cur, inits)
        cur = nodes[-1].output[0]
    nodes.append(helper.make_node("Flatten", [cur], ["f"], name="flatten"))
    model = make_model(nodes, inits, ["B", c_in, *hw], "f", None)  # the shape inferred
    feats = model.graph.output[0].type.tensor_type.shape.dim[1].dim_value
    wd = rng.normal(0, 1 / np.sqrt(feats), (head, feats)).astype(np.float32)
    inits.append(init("wd", wd))
    inits.append(init("bd", rng.normal(0, 0.1, head)))
    nodes.append(helper.make_node("Gemm", ["f", "wd", "bd"], ["y"], name="fc", transB=1))
    return make_model(nodes, inits, ["B", c_in, *hw], "y", ["B", head])


@pytest.mark.parametrize("what,kw", [
    ("relu, stride 2", {}),
    ("kernel 5, stride 1", {"k": 5, "stride": 1}),
    ("kernel 2, SAME_UPPER", {"k": 2, "stride": 1, "auto_pad": "SAME_UPPER", "hw": (5, 6)}),
    ("kernel 2, SAME_LOWER, stride 2", {"k": 2, "stride": 2, "auto_pad": "SAME_LOWER"}),
    ("kernel 3, VALID", {"k": 3, "stride": 1, "auto_pad": "VALID"}),
    ("kernel 1", {"k": 1, "stride": 1, "hw": (6, 5)}),
    ("max pool 2", {"stride": 1, "pool": ("MaxPool", 2, 2, (0, 0, 0, 0), 0)}),
    ("max pool 3 pad 1", {"stride": 1, "pool": ("MaxPool", 3, 2, (1, 1, 1, 1), 0)}),
    ("avg pool 3 pad 1 incl", {"stride": 1, "pool": ("AveragePool", 3, 2, (1, 1, 1, 1), 1)}),
    ("avg pool 3 pad 1 excl", {"stride": 1, "pool": ("AveragePool", 3, 2, (1, 1, 1, 1), 0)}),
    ("global average", {"pool": ("GlobalAveragePool", 0, 0, 0, 0), "chans": (6, 19)}),
    ("global max", {"pool": ("GlobalMaxPool", 0, 0, 0, 0)}),
    ("batch norm folded, ReLU6", {"bn": True, "act": "Clip6"}),
    ("leaky relu", {"act": "LeakyRelu", "hw": (6, 9)}),
    ("sigmoid, N-multiple channels", {"act": "Sigmoid", "chans": (8, 16)}),
])
def test_cnn_matches_onnxruntime(what, kw):
    rng = np.random.default_rng(zlib.crc32(what.encode()))
    model = cnn(rng, **kw)
    x = rng.uniform(-1, 1, (24, 1, *kw.get("hw", (8, 7)))).astype(np.float32)
    y, ref, bound = check_model(model, x, what)
    check_classes(y, ref, bound, what)
    # the bound is a worst case, compounded over the layers (tens of times the observed
    # error here); the observed error on these 8-bit builds stays under 2^-4 of the
    # outputs' largest magnitude (0.3 to 2 % measured; docs/compiler.md section 6)
    assert np.abs(y - ref).max() < 2.0 ** -4 * np.abs(ref).max(), what


def test_the_bound_catches_a_coarser_build():
    """The check fails when the network runs with fewer mantissa bits than the bound
    assumes (so the comparison can fail): one 5 x 5 convolution, where the bound is not
    compounded over layers, on an 8-bit build passes and on a 4-bit build does not."""
    rng = np.random.default_rng(110)
    w = rng.normal(size=(1, 1, 5, 5)).astype(np.float32)
    model = make_model([conv("c", "x", "y", "w", pads=[2, 2, 2, 2])], [init("w", w)],
                       ["B", 1, 6, 7], "y", None)
    x = rng.uniform(-1, 1, (16, 1, 6, 7)).astype(np.float32)
    check_model(model, x, "8-bit build")
    y = compile_onnx(model, "n=8,tiles=1,mantissa_bits_v=4,mantissa_bits_w=4").run(x)
    _, bound = bound_eval(model, x, 8, 8, 8)
    with pytest.raises(AssertionError, match="beyond the bound"):
        check_within(y, ort_run(model, x), bound, "4-bit build")


def test_weights_in_the_wrong_order_are_caught():
    """The Gemm after Flatten reads the map pixel-major on the device: its weight columns
    are permuted at compile time. The same network compared with a model whose Gemm
    weights are in the device's order (the permutation forgotten) is far off."""
    rng = np.random.default_rng(111)
    model = cnn(rng, stride=1, pool=("MaxPool", 2, 2, (0, 0, 0, 0), 0))
    x = rng.uniform(-1, 1, (8, 1, 8, 7)).astype(np.float32)
    y, ref, _ = check_model(model, x, "permuted")
    assert np.abs(y - ref).max() < 2.0 ** -4 * np.abs(ref).max()
    wd = next(i for i in model.graph.initializer if i.name == "wd")
    w = onnx.numpy_helper.to_array(wd)                   # (6, C*H*W), C-major
    wrong = w.reshape(6, 11, 4, 3).transpose(0, 2, 3, 1).reshape(6, -1)
    wd.CopyFrom(init("wd", wrong))
    assert np.abs(y - ort_run(model, x)).max() > 2.0 ** -2 * np.abs(ref).max()


def test_batch_norm_without_a_product_before_it():
    """A BatchNormalization after a Relu has no Conv to fold into: a per-channel multiply
    and add (IR Affine) fused into the chain before it."""
    rng = np.random.default_rng(112)
    c = 11
    inits = [init("g", rng.uniform(0.5, 1.5, c)), init("bb", rng.normal(0, 0.3, c)),
             init("mu", rng.normal(0, 0.3, c)), init("var", rng.uniform(0.5, 2, c))]

    def extra(cur, inits_):
        inits_ += inits
        return [helper.make_node("BatchNormalization", [cur, "g", "bb", "mu", "var"],
                                 ["bn"], name="bn_after_relu")]
    model = cnn(rng, extra=extra)
    ir = import_onnx(model)
    assert [n.op for n in ir.nodes].count("Affine") == 1
    x = rng.uniform(-1, 1, (6, 1, 8, 7)).astype(np.float32)
    check_model(model, x, "affine")
    # and folded into the conv when it directly follows it
    folded = cnn(rng, bn=True)
    assert "Affine" not in [n.op for n in import_onnx(folded).nodes]
    assert import_onnx(folded).nodes[0].origin == ("conv1", "Conv+BatchNormalization")


def test_clip_other_bounds_and_elementwise_constants():
    """Clip with other constant bounds (max(x, lo) then -max(-x, -hi)), Mul / Add / Sub /
    Div by per-channel constants (folded into the conv before, or an Affine)."""
    rng = np.random.default_rng(113)
    scale = rng.uniform(0.5, 2, (1, 11, 1, 1)).astype(np.float32)

    def extra(cur, inits_):
        inits_ += [init("lo", -0.25), init("hi", 0.75), init("sc", scale),
                   init("sh", rng.normal(0, 0.2, (11, 1, 1))), init("two", 2.0)]
        return [helper.make_node("Clip", [cur, "lo", "hi"], ["cl"], name="clip"),
                helper.make_node("Mul", ["cl", "sc"], ["m"], name="mul_c"),
                helper.make_node("Sub", ["m", "sh"], ["s"], name="sub_c"),
                helper.make_node("Div", ["s", "two"], ["d"], name="div_c")]
    model = cnn(rng, act="Tanh", extra=extra)
    x = rng.uniform(-1, 1, (6, 1, 8, 7)).astype(np.float32)
    check_model(model, x, "clip and constants")


@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_mean_over_the_map_is_a_global_pool(keepdims):
    """What torch.onnx.export (dynamo) writes for AdaptiveAvgPool2d(1): ReduceMean over
    axes [-1, -2] (an input at opset 18), then Reshape / Flatten."""
    rng = np.random.default_rng(115)
    w = rng.normal(size=(13, 1, 3, 3)).astype(np.float32)
    nodes = [conv("c", "x", "h", "w", pads=[1, 1, 1, 1]),
             helper.make_node("ReduceMean", ["h", "axes"], ["m"], name="mean",
                              keepdims=keepdims),
             helper.make_node("Flatten", ["m"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "wd"], ["y"], name="fc", transB=1)]
    inits = [init("w", w), init("axes", [-1, -2], np.int64),
             init("wd", rng.normal(size=(4, 13)))]
    model = make_model(nodes, inits, ["B", 1, 5, 6], "y", ["B", 4], opset=18)
    assert [n.op for n in import_onnx(model).nodes][:2] == ["Conv", "AveragePool"]
    x = rng.normal(size=(5, 1, 5, 6)).astype(np.float32)
    check_model(model, x, f"reduce mean keepdims={keepdims}")
    nodes[1] = helper.make_node("ReduceMean", ["h", "one"], ["m"], name="mean_c")
    model = make_model(nodes, inits + [init("one", [1], np.int64)], ["B", 1, 5, 6], "y",
                       None, opset=18)
    with pytest.raises(OnnxImportError, match=r"'mean_c' \(ReduceMean\).*axes \[1\]"):
        compile_onnx(model, BUILD)


def test_ceil_mode_that_changes_nothing_is_taken():
    rng = np.random.default_rng(114)
    w = rng.normal(size=(4, 1, 3, 3)).astype(np.float32)
    nodes = [conv("c", "x", "h", "w", pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["h"], ["p"], name="pool", kernel_shape=[2, 2],
                              strides=[2, 2], ceil_mode=1),
             helper.make_node("Flatten", ["p"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "wd"], ["y"], name="fc", transB=1)]
    model = make_model(nodes, [init("w", w), init("wd", rng.normal(size=(3, 36)))],
                       ["B", 1, 6, 6], "y", ["B", 3])
    x = rng.normal(size=(4, 1, 6, 6)).astype(np.float32)
    check_model(model, x, "ceil mode")


# --- the zoo's CNN (torch.onnx.export, dynamo) -----------------------------------------------

@pytest.mark.skipif(not os.path.exists(os.path.join(ZOO, "model.onnx")),
                    reason="the zoo's CNN is not exported")
def test_zoo_cnn():
    path = os.path.join(ZOO, "model.onnx")
    x = np.load(os.path.join(ZOO, "data.npz"))["x_test"][:40].astype(np.float32)
    model = onnx.load(path)
    y, ref, bound = check_model(model, x, "zoo cnn", build=BUILD.replace("n=8,tiles=1,", ""),
                                n=16)
    check_classes(y, ref, bound, "zoo cnn")
    assert (y.argmax(1) == ref.argmax(1)).all()


# --- the report --------------------------------------------------------------------------------

def test_report_of_a_convolution():
    rng = np.random.default_rng(120)
    model = cnn(rng, stride=1, pool=("MaxPool", 2, 2, (0, 0, 0, 0), 0))
    cfg = parse_config(BUILD)
    rep = compile_onnx(model, cfg).report()
    by = {lay["name"]: lay for lay in rep["layers"]}
    # conv2: 11 x 5 x 3 x 3 weights at each of the 8 x 7 output pixels
    assert by["conv2"]["macs"] == 8 * 7 * 11 * 5 * 9
    assert by["conv1"]["macs"] == 8 * 7 * 5 * 1 * 9
    # its matrix: ceil(11/8) = 2 row tiles by 9 pixels of ceil(5/8) = 1 native vector
    first = by["conv1"]["mrf_slots"][1]
    assert by["conv2"]["mrf_slots"] == [first, cfg.mvm.slots_needed(2, 9)]
    # its bias in ASVRF0 (2 native vectors); its result in the IVRF (8 x 7 pixels of 2)
    assert by["conv2"]["vrf"]["ASVRF0"] >= 2 and by["conv2"]["vrf"]["IVRF"] == 8 * 7 * 2
    # the first conv's result is read with padding: a ring of one pixel around 8 x 7
    assert by["conv1"]["vrf"]["IVRF"] == 10 * 9 * 1
    assert by["fc"]["macs"] == 6 * 11 * 4 * 3
    assert by["act1"]["chains"] == 0 and by["conv2"]["chains"] == 8    # fused; per row
    assert rep["totals"]["macs"] == sum(lay["macs"] for lay in rep["layers"])


# --- refusals ------------------------------------------------------------------------------------

@pytest.mark.parametrize("node,words", [
    (helper.make_node("Conv", ["x", "w2"], ["y"], name="bad", group=2),
     ["'bad' (Conv)", "group=2", "only group = 1"]),
    (helper.make_node("Conv", ["x", "w"], ["y"], name="bad", dilations=[2, 2]),
     ["'bad' (Conv)", "dilations=[2, 2]", "dilation 1"]),
    (helper.make_node("MaxPool", ["x"], ["y"], name="bad", kernel_shape=[2, 2],
                      strides=[2, 2], ceil_mode=1),
     ["'bad' (MaxPool)", "ceil_mode=1", "4 positions instead of 3"]),
    (helper.make_node("MaxPool", ["x"], ["y"], name="bad", kernel_shape=[2, 2],
                      dilations=[1, 2]),
     ["'bad' (MaxPool)", "dilations=[1, 2]"]),
    (helper.make_node("LeakyRelu", ["x"], ["y"], name="bad", alpha=1.5),
     ["'bad' (LeakyRelu)", "alpha=1.5", "0 <= alpha <= 1"]),
    (helper.make_node("Div", ["x", "x"], ["y"], name="bad"),
     ["'bad' (Div)", "two computed tensors"]),
    (helper.make_node("BatchNormalization", ["x", "s", "s", "s", "s"], ["y"], name="bad",
                      training_mode=1),
     ["'bad' (BatchNormalization)", "training_mode=1"]),
])
def test_unsupported_forms_name_node_operator_and_what(node, words):
    w2 = np.ones((4, 1, 3, 3), np.float32)
    model = make_model([node], [init("w", np.ones((2, 2, 3, 3))), init("w2", w2),
                                init("s", np.ones(2))], ["B", 2, 7, 7], "y", None)
    with pytest.raises(OnnxImportError) as info:
        compile_onnx(model, BUILD)
    for w in words + ["supported operators"]:
        assert w in str(info.value), (w, str(info.value))


def test_a_1d_convolution_is_refused():
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], name="c1d")],
                       [init("w", np.ones((2, 3, 3)))], ["B", 3, 9], "y", None)
    with pytest.raises(OnnxImportError, match=r"'c1d' \(Conv\).*only 2-D"):
        compile_onnx(model, BUILD)


def test_a_map_too_large_names_layer_memory_and_sizes():
    rng = np.random.default_rng(130)
    model = cnn(rng, hw=(12, 12))
    # the input (14 x 14 padded pixels) fits, conv1's 12 x 12 result of 5 channels
    # (padded to 13 x 13 for conv2) with the input still live does not
    with pytest.raises(CompileError) as info:
        compile_onnx(model, BUILD + ",ivrf_depth=300")
    msg = str(info.value)
    # 12 x 12 padded for conv2's stride-2 window: a ring on the top and left only
    assert "'conv1' (Conv)" in msg and "IVRF needs 365" in msg and "169 for this " in msg \
        and "196 still live" in msg and "ivrf_depth 300" in msg, msg
    with pytest.raises(CompileError, match=r"'conv2' \(Conv\).*MRF needs .*mrf_depth 12"):
        compile_onnx(model, BUILD + ",mrf_depth=12")
    with pytest.raises(CompileError, match=r"'conv2' \(Conv\).*3 x 3 window.*27 column "
                                           r"tiles.*max_col_tiles is 16"):
        compile_onnx(cnn(rng, chans=(17, 4)), BUILD + ",max_col_tiles=16")


def test_multichannel_images_and_map_outputs_compile():
    """An RGB image input and a map of several channels as the output (refused before
    the runtime transposed rows, tests/compiler/test_onnx_maps.py) compile, and the
    signature records their layout."""
    rng = np.random.default_rng(131)
    net = compile_onnx(cnn(rng, c_in=3), BUILD)
    assert net.signature["input_layout"] == "chw" and net.signature["input_map"] == [3, 8, 7]
    w = rng.normal(size=(4, 1, 3, 3)).astype(np.float32)
    model = make_model([conv("c", "x", "y", "w")], [init("w", w)], ["B", 1, 5, 5], "y",
                       ["B", 4, 3, 3])
    net = compile_onnx(model, BUILD)
    assert net.signature["output_layout"] == "chw" and net.signature["output_map"] == [4, 3, 3]


def test_batch_norm_is_not_folded_into_a_conv_read_elsewhere():
    """A conv whose result (through an Identity) is read by a BatchNormalization and by
    an Add: folding the normalisation into the conv's weights would change the Add's
    input, so it stays a per-channel multiply and add."""
    rng = np.random.default_rng(116)
    c = 3
    w = rng.normal(size=(c, 1, 3, 3)).astype(np.float32)
    inits = [init("w", w), init("g", rng.uniform(0.5, 1.5, c)),
             init("bb", rng.normal(0, 0.3, c)), init("mu", rng.normal(0, 0.3, c)),
             init("var", rng.uniform(0.5, 2, c)), init("wd", rng.normal(size=(2, c * 20)))]
    nodes = [conv("c", "x", "h", "w", pads=[1, 1, 1, 1]),
             helper.make_node("Identity", ["h"], ["hi"], name="id"),
             helper.make_node("BatchNormalization", ["hi", "g", "bb", "mu", "var"], ["n"],
                              name="bn"),
             helper.make_node("Add", ["n", "hi"], ["s"], name="add"),
             helper.make_node("Flatten", ["s"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "wd"], ["y"], name="fc", transB=1)]
    model = make_model(nodes, inits, ["B", 1, 4, 5], "y", ["B", 2])
    assert "Affine" in [n.op for n in import_onnx(model).nodes]
    x = rng.normal(size=(6, 1, 4, 5)).astype(np.float32)
    check_model(model, x, "bn not folded")


# --- a constant Pad before a Conv ----------------------------------------------------------

def _padded_conv(value, pad_pads, conv_pads=(0, 0, 0, 0), reader="Conv"):
    """x (B, 2, 5, 6) -> Pad(constant ``value``, H/W pads ``pad_pads`` as (top, left,
    bottom, right)) -> ``reader`` (a 3x3 Conv with ``conv_pads``, or Relu)."""
    t, left, b, r = pad_pads
    w = np.arange(-9, 9, dtype=np.float32).reshape(1, 2, 3, 3) / 4
    pad = helper.make_node("Pad", ["x", "pads", "value"], ["p"], name="pad", mode="constant")
    inits = [init("w", w), init("pads", np.array([0, 0, t, left, 0, 0, b, r]), np.int64),
             init("value", np.array(value, np.float32))]
    if reader == "Conv":
        nodes = [pad, conv("c", "p", "y", "w", pads=list(conv_pads))]
    else:
        nodes = [pad, helper.make_node(reader, ["p"], ["y"], name="r")]
    return make_model(nodes, inits, ["B", 2, 5, 6], "y", None, opset=18)


@pytest.mark.parametrize("value, pads", [(0.5, (1, 1, 1, 1)), (-2.0, (2, 0, 1, 3)),
                                         (0.0, (1, 2, 0, 1))])
def test_pad_before_a_conv_is_its_padding_value(value, pads):
    """Integer inputs and weights in quarters on a wide build: the device's output equals
    onnxruntime's exactly, and the IR has one Conv with the Pad's pads and value."""
    model = _padded_conv(value, pads)
    g = import_onnx(model)
    assert [nd.op for nd in g.nodes] == ["Conv"]
    assert g.nodes[0].attrs["pads"] == pads
    assert g.nodes[0].attrs.get("pad_value", 0.0) == value
    x = np.random.default_rng(7).integers(-3, 4, (3, 2, 5, 6)).astype(np.float32)
    y = compile_onnx(model, EXACT).run(x)
    assert np.array_equal(y, ort_run(model, x))


@pytest.mark.parametrize("model, words", [
    (lambda: _padded_conv(1.0, (1, 1, 1, 1), conv_pads=(1, 0, 0, 0)),
     ["'c' (Conv)", "after a Pad with value 1.0"]),
    (lambda: _padded_conv(0.5, (1, 1, 1, 1), reader="Relu"),
     ["'r' (Relu)", "result of a Pad", "only as the input of one Conv"]),
])
def test_pads_other_than_before_one_conv_are_refused(model, words):
    with pytest.raises(OnnxImportError) as info:
        import_onnx(model())
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_a_reflecting_pad_is_refused():
    model = _padded_conv(0.0, (1, 1, 1, 1))
    model.graph.node[0].attribute[0].s = b"reflect"
    with pytest.raises(OnnxImportError, match="mode='reflect' is not supported"):
        import_onnx(model)
