"""Graphs that are not one chain: residual connections, branches that join, a tensor read
by several layers, element-wise Add / Sub / Mul of two computed tensors; the memory
rules that make them repeatable job after job; and a property test over random small
graphs (MLP and convolution shapes, sizes that are not multiples of N) against a float64
evaluation within the bound of ``onnx_checks.bound_eval`` (``docs/compiler.md`` section
6).

The directed tests use small integers on a 12-bit build, where the device is exact, and
compare with NumPy (``onnx_checks.conv_ref`` and the tests' own arithmetic).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper
from onnx_checks import bound_eval, check_within, conv_ref, init, make_model, ort_run

from host.compiler import compile_onnx
from host.compiler.lower import lower
from host.compiler.onnx_import import OnnxImportError, import_onnx
from host.spec.config import parse_config
from host.spec.isa import Space

BUILD = "n=8,tiles=1,mantissa_bits_v=8,mantissa_bits_w=8"
EXACT = "n=8,tiles=1,mantissa_bits_v=12,mantissa_bits_w=12,mrf_depth=2048"


def node(op, ins, out, name, **attrs):
    return helper.make_node(op, ins, [out], name=name, **attrs)


def flat_head(cur, feats, inits, rows=None):
    """Flatten and an identity Gemm (exact on integers): a map becomes an output the
    device can give in ONNX's order."""
    inits.append(init("eye", np.eye(feats)))
    return [node("Flatten", [cur], "f", "flatten"), node("Gemm", ["f", "eye"], "z", "eye")]


def relu(a):
    return np.maximum(a, 0)


# --- residual connections and branches, exact --------------------------------------------------

def test_residual_block_is_exact():
    """conv -> relu -> conv -> Add(skip) -> relu -> maxpool: the skip tensor is kept (in
    the VRF the Add's chain reads) while the second conv runs, and the Add is fused into
    that conv's chain."""
    rng = np.random.default_rng(200)
    w1 = rng.integers(-2, 3, (6, 1, 3, 3)).astype(np.float32)
    w2 = rng.integers(-1, 2, (6, 6, 3, 3)).astype(np.float32)
    b2 = rng.integers(-3, 4, 6).astype(np.float32)
    inits = [init("w1", w1), init("w2", w2), init("b2", b2)]
    nodes = [node("Conv", ["x", "w1"], "c1", "conv1", pads=[1, 1, 1, 1]),
             node("Identity", ["c1"], "c1i", "ident"),
             node("Relu", ["c1i"], "r1", "relu1"),
             node("Conv", ["r1", "w2", "b2"], "c2", "conv2", pads=[1, 1, 1, 1]),
             node("Add", ["c2", "r1"], "s", "add"),
             node("Relu", ["s"], "r2", "relu2"),
             node("MaxPool", ["r2"], "p", "pool", kernel_shape=[2, 2], strides=[2, 2]),
             node("Dropout", ["p"], "pd", "drop")]
    nodes += flat_head("pd", 6 * 3 * 2, inits)
    model = make_model(nodes, inits, ["B", 1, 6, 5], "z", ["B", 36])
    x = rng.integers(-3, 4, (4, 1, 6, 5)).astype(np.float32)
    r1 = relu(conv_ref(x, w1, pads=(1, 1, 1, 1)))
    r2 = relu(conv_ref(r1, w2, b2, pads=(1, 1, 1, 1)) + r1)
    want = r2[:, :, :6, :4].reshape(4, 6, 3, 2, 2, 2).max(axis=(3, 5)).reshape(4, -1)
    net = compile_onnx(model, EXACT)
    assert np.array_equal(net.run(x), want)
    assert np.array_equal(ort_run(model, x), want)
    by = {lay["name"]: lay for lay in net.report()["layers"]}
    assert by["add"]["chains"] == 0 and by["relu2"]["chains"] == 0      # in conv2's chain
    # relu1's result lives in the IVRF (read by conv2's window, with its ring) and in
    # ASVRF1, where the Add lands (after conv2's bias add in MFU 0)
    assert by["conv1"]["vrf"]["ASVRF1"] == 6 * 5


def test_branches_that_join_with_sub_and_mul():
    """The input read by two convolutions (so it is copied from the queue into the IVRF
    first); Sub of the branch computed first from the one computed second (the chain
    reads the later one: vv_b_sub_a), then Mul by the first branch."""
    rng = np.random.default_rng(201)
    wa = rng.integers(-2, 3, (3, 1, 3, 3)).astype(np.float32)
    wb = rng.integers(-2, 3, (3, 1, 1, 1)).astype(np.float32)
    inits = [init("wa", wa), init("wb", wb)]
    nodes = [node("Conv", ["x", "wa"], "a", "conv_a", pads=[1, 1, 1, 1]),
             node("Conv", ["x", "wb"], "b", "conv_b"),
             node("Sub", ["a", "b"], "d", "sub"),
             node("Mul", ["d", "a"], "m", "mul")]
    nodes += flat_head("m", 3 * 4 * 5, inits)
    model = make_model(nodes, inits, ["B", 1, 4, 5], "z", ["B", 60])
    x = rng.integers(-3, 4, (3, 1, 4, 5)).astype(np.float32)
    a, b = conv_ref(x, wa, pads=(1, 1, 1, 1)), conv_ref(x, wb)
    want = ((a - b) * a).reshape(3, -1)
    y = compile_onnx(model, EXACT).run(x)
    assert np.array_equal(y, want)


def test_a_tensor_read_through_two_rings_and_as_an_operand():
    """One map read by a padded conv (a ring of zeros), a padded MaxPool (a ring of the
    lowest FP16, so padding never wins over negative values) and an Add (as a VRF
    operand): three copies written by one chain."""
    rng = np.random.default_rng(202)
    w1 = rng.integers(0, 3, (2, 1, 3, 3)).astype(np.float32)       # h <= 0: the ring
    w2 = rng.integers(-1, 2, (2, 2, 3, 3)).astype(np.float32)      # value shows
    inits = [init("w1", w1), init("w2", w2)]
    nodes = [node("Conv", ["x", "w1"], "h", "conv1", pads=[1, 1, 1, 1]),
             node("Conv", ["h", "w2"], "c", "conv2", pads=[1, 1, 1, 1]),
             node("MaxPool", ["h"], "p", "pool", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             node("Add", ["c", "p"], "s", "add1"),
             node("Add", ["s", "h"], "t", "add2")]
    nodes += flat_head("t", 2 * 5 * 4, inits)
    model = make_model(nodes, inits, ["B", 1, 5, 4], "z", ["B", 40])
    x = rng.integers(-3, 1, (3, 1, 5, 4)).astype(np.float32)
    h = conv_ref(x, w1, pads=(1, 1, 1, 1))
    hp = np.pad(h, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    p = np.max([hp[:, :, dy:dy + 5, dx:dx + 4] for dy in range(3) for dx in range(3)], 0)
    assert (p < 0).any()                            # the ring value matters
    want = (conv_ref(h, w2, pads=(1, 1, 1, 1)) + p + h).reshape(3, -1)
    assert np.array_equal(compile_onnx(model, EXACT).run(x), want)


def test_mlp_with_a_residual_and_a_shared_input():
    """Flat layers: the input read by two Gemms, a residual Add, Tanh, Softmax."""
    rng = np.random.default_rng(203)
    w = [rng.normal(0, 0.4, s).astype(np.float32) for s in ((13, 11), (13, 11), (13, 13),
                                                            (7, 13))]
    inits = [init(f"w{i}", a) for i, a in enumerate(w)] + [init("b0", rng.normal(0, .1, 13))]
    nodes = [node("Gemm", ["x", "w0", "b0"], "a", "fc_a", transB=1),
             node("Gemm", ["x", "w1"], "b", "fc_b", transB=1),
             node("Relu", ["a"], "ra", "relu"),
             node("Gemm", ["ra", "w2"], "c", "fc_c", transB=1),
             node("Add", ["c", "b"], "s", "res"),
             node("Tanh", ["s"], "t", "tanh"),
             node("Gemm", ["t", "w3"], "l", "fc_out", transB=1),
             node("Softmax", ["l"], "y", "softmax", axis=-1)]
    model = make_model(nodes, inits, ["B", 11], "y", ["B", 7])
    x = rng.normal(size=(16, 11)).astype(np.float32)
    y = compile_onnx(model, BUILD).run(x)
    _, bound = bound_eval(model, x, 8)
    check_within(y, ort_run(model, x), bound, "mlp residual")


# --- memories that must hold from one job to the next -----------------------------------------

def _ivrf_images(model, build):
    low = lower(import_onnx(model), parse_config(build))
    return [v for v in low.program.vectors if v[0] is Space.IVRF]


def test_padding_rings_are_rewritten_when_their_addresses_are_reused():
    """Three padded convs in a row: each map's ring sits where a later map is stored, so
    the rings are rewritten by chains in every job, not written once with the image; the
    rows of a batch (one job each) come out exact."""
    rng = np.random.default_rng(210)
    ws = [rng.integers(-1, 2, (3, 1, 3, 3)), rng.integers(-1, 2, (3, 3, 3, 3)),
          rng.integers(-1, 2, (3, 3, 3, 3))]
    inits = [init(f"w{i}", w) for i, w in enumerate(ws)]
    nodes = [node("Conv", ["x", "w0"], "h0", "conv0", pads=[1, 1, 1, 1]),
             node("Conv", ["h0", "w1"], "h1", "conv1", pads=[1, 1, 1, 1]),
             node("Conv", ["h1", "w2"], "h2", "conv2", pads=[1, 1, 1, 1])]
    nodes += flat_head("h2", 3 * 5 * 6, inits)
    model = make_model(nodes, inits, ["B", 1, 5, 6], "z", ["B", 90])
    # no ring is written once with the image: every one is reused by a later map
    assert _ivrf_images(model, EXACT) == []
    x = rng.integers(-3, 4, (5, 1, 5, 6)).astype(np.float32)
    want = x
    for w in ws:
        want = conv_ref(want, w.astype(np.float64), pads=(1, 1, 1, 1))
    assert np.array_equal(compile_onnx(model, EXACT).run(x), want.reshape(5, -1))


def test_a_ring_nothing_else_uses_is_written_once():
    rng = np.random.default_rng(211)
    w = rng.integers(-1, 2, (2, 1, 3, 3)).astype(np.float32)
    model = make_model([node("Conv", ["x", "w"], "y", "conv", pads=[1, 1, 1, 1])],
                       [init("w", w)], ["B", 1, 4, 4], "y", None)
    model = make_model(list(model.graph.node) + flat_head("y", 32, inits := [init("w", w)]),
                       inits, ["B", 1, 4, 4], "z", ["B", 32])
    images = _ivrf_images(model, EXACT)
    assert len(images) == 1 and len(images[0][2]) == 6 * 6      # the padded input, once
    x = rng.integers(-3, 4, (3, 1, 4, 4)).astype(np.float32)
    assert np.array_equal(compile_onnx(model, EXACT).run(x),
                          conv_ref(x, w, pads=(1, 1, 1, 1)).reshape(3, -1))


def test_constants_do_not_share_addresses_with_scratch():
    """A pool's scratch in ASVRF0 and the next Gemm's bias (a constant written once with
    the image): the bias must survive the pool in every job."""
    rng = np.random.default_rng(212)
    w = rng.integers(-2, 3, (4, 1, 3, 3)).astype(np.float32)
    wd = rng.integers(-1, 2, (5, 4 * 3 * 3)).astype(np.float32)
    bd = rng.integers(-4, 5, 5).astype(np.float32)
    nodes = [node("Conv", ["x", "w"], "h", "conv", pads=[1, 1, 1, 1]),
             node("MaxPool", ["h"], "p", "pool", kernel_shape=[3, 3], strides=[2, 2],
                  pads=[1, 1, 1, 1]),
             node("Flatten", ["p"], "f", "flatten"),
             node("Gemm", ["f", "wd", "bd"], "y", "fc", transB=1)]
    model = make_model(nodes, [init("w", w), init("wd", wd), init("bd", bd)],
                       ["B", 1, 6, 5], "y", ["B", 5])
    x = rng.integers(-3, 4, (4, 1, 6, 5)).astype(np.float32)
    h = conv_ref(x, w, pads=(1, 1, 1, 1))
    hp = np.pad(h, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    p = np.max([hp[:, :, dy:dy + 5:2, dx:dx + 5:2] for dy in range(3) for dx in range(3)], 0)
    want = p.reshape(4, -1) @ wd.T + bd
    assert np.array_equal(compile_onnx(model, EXACT).run(x), want)


# --- refusals ----------------------------------------------------------------------------------

def test_broadcasting_two_computed_tensors_is_refused():
    w = np.ones((2, 1, 1, 1), np.float32)
    nodes = [node("Conv", ["x", "w"], "a", "conv"), node("Add", ["a", "x"], "y", "bcast")]
    model = make_model(nodes, [init("w", w)], ["B", 1, 3, 3], "y", None)
    with pytest.raises(OnnxImportError, match=r"'bcast' \(Add\).*same shape"):
        compile_onnx(model, BUILD)


# --- property: random small graphs within the bound ---------------------------------------------

ACTS = ["Relu", "Sigmoid", "Tanh", "LeakyRelu", "Clip", None]


def _act(kind, cur, name, nodes, inits):
    if kind is None:
        return cur
    if kind == "Clip":
        inits += [init(f"{name}lo", -0.5), init(f"{name}hi", 1.5)]
        nodes.append(node("Clip", [cur, f"{name}lo", f"{name}hi"], name, name))
    elif kind == "LeakyRelu":
        nodes.append(node("LeakyRelu", [cur], name, name, alpha=0.2))
    else:
        nodes.append(node(kind, [cur], name, name))
    return name


@st.composite
def graphs(draw):
    """A random small graph: an MLP (1 to 3 Gemms, optional residual Add) or a CNN (1 or
    2 convs with kernels 1 to 3, stride 1 or 2, padding, an optional residual and pool,
    then Flatten and Gemm), sizes that are not multiples of N = 8."""
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    if draw(st.booleans()):                                        # MLP
        f = draw(st.integers(1, 20))
        shape, cur = ["B", f], "x"
        for i in range(draw(st.integers(1, 3))):
            g = draw(st.integers(1, 20))
            inits += [init(f"w{i}", rng.normal(0, 1 / np.sqrt(f), (g, f))),
                      init(f"b{i}", rng.normal(0, 0.2, g))]
            nodes.append(node("Gemm", [cur, f"w{i}", f"b{i}"], f"g{i}", f"fc{i}", transB=1))
            new = _act(draw(st.sampled_from(ACTS)), f"g{i}", f"act{i}", nodes, inits)
            if g == f and draw(st.booleans()):
                nodes.append(node("Add", [new, cur], f"res{i}", f"res{i}"))
                new = f"res{i}"
            cur, f = new, g
        return make_model(nodes, inits, shape, cur, ["B", f]), f"mlp seed {seed}"
    h, w = draw(st.integers(3, 7)), draw(st.integers(3, 7))
    image = ["B", 1, h, w]
    c, cur = 1, "x"
    for i in range(draw(st.integers(1, 2))):
        co = draw(st.integers(1, 12))
        k = draw(st.integers(1, 3))
        s = draw(st.integers(1, 2))
        pads = [draw(st.integers(0, k - 1)) for _ in range(4)]
        if (h + pads[0] + pads[2] - k) // s + 1 < 1 or (w + pads[1] + pads[3] - k) // s + 1 < 1:
            pads = [k - 1] * 4
        inits += [init(f"k{i}", rng.normal(0, 1 / np.sqrt(c * k * k), (co, c, k, k))),
                  init(f"kb{i}", rng.normal(0, 0.2, co))]
        nodes.append(node("Conv", [cur, f"k{i}", f"kb{i}"], f"c{i}", f"conv{i}",
                          strides=[s, s], pads=pads))
        oh, ow = (h + pads[0] + pads[2] - k) // s + 1, (w + pads[1] + pads[3] - k) // s + 1
        new = _act(draw(st.sampled_from(ACTS)), f"c{i}", f"cact{i}", nodes, inits)
        if (co, oh, ow) == (c, h, w) and cur != "x" and draw(st.booleans()):
            nodes.append(node("Add", [new, cur], f"cres{i}", f"cres{i}"))
            new = f"cres{i}"
        cur, c, h, w = new, co, oh, ow
    pool = draw(st.sampled_from([None, "MaxPool", "AveragePool", "GlobalAveragePool"]))
    if pool == "GlobalAveragePool":
        nodes.append(node(pool, [cur], "pool", "pool"))
        cur, h, w = "pool", 1, 1
    elif pool and min(h, w) >= 2:
        nodes.append(node(pool, [cur], "pool", "pool", kernel_shape=[2, 2], strides=[1, 2],
                          pads=[0, 1, 0, 0]))
        cur, h, w = "pool", h - 1, (w + 1 - 2) // 2 + 1
    feats = c * h * w
    out = draw(st.integers(1, 10))
    inits.append(init("wo", rng.normal(0, 1 / np.sqrt(feats), (out, feats))))
    nodes += [node("Flatten", [cur], "flat", "flatten"),
              node("Gemm", ["flat", "wo"], "y", "head", transB=1)]
    return make_model(nodes, inits, image, "y", ["B", out]), f"cnn seed {seed}"


@settings(max_examples=40, deadline=None, derandomize=True)
@given(data=st.data())
def test_random_graphs_match_a_float64_evaluation(data):
    """Random small MLP and CNN graphs compile and stay within the bound of their float64
    evaluation (on N = 8 with 8-bit mantissas)."""
    model, what = data.draw(graphs())
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim[1:]]
    rng = np.random.default_rng(len(what))
    x = rng.uniform(-1, 1, (3, *shape)).astype(np.float32)
    y = compile_onnx(model, BUILD).run(x)
    value, bound = bound_eval(model, x, 8)
    check_within(y, value, bound, what)


@pytest.mark.parametrize("target", [[0, 1, 6], [-1, 6, 1], [0, 6, -1, 1]])
def test_reshape_that_only_moves_size_1_axes_is_a_view(target):
    """A Reshape that adds or removes size-1 axes (e.g. after a global pool, or an RNN's
    (T, batch, 1, H) to (T, batch, H)) moves no data."""
    rng = np.random.default_rng(220)
    w = rng.normal(size=(6, 1, 3, 3)).astype(np.float32)
    nodes = [node("Conv", ["x", "w"], "h", "conv"),
             node("GlobalAveragePool", ["h"], "g", "gap"),
             node("Reshape", ["g", "shape"], "r", "reshape"),
             node("Flatten", ["r"], "f", "flatten"),
             node("Gemm", ["f", "wd"], "y", "fc", transB=1)]
    inits = [init("w", w), init("shape", target, np.int64),
             init("wd", rng.normal(size=(3, 6)))]
    model = make_model(nodes, inits, ["B", 1, 5, 4], "y", ["B", 3])
    assert "View" in [n.op for n in import_onnx(model).nodes]
    x = rng.normal(size=(4, 1, 5, 4)).astype(np.float32)
    _, bound = bound_eval(model, x, 8)
    check_within(compile_onnx(model, BUILD).run(x), ort_run(model, x), bound, str(target))
