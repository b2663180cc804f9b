"""Small ONNX models and independent reference computations for the calibration tests.

The references here do not use the code under test: a BFP quantizer written out from
``docs/numerics.md`` 2.3-2.4 (round half to even, clamp to ``2^(m-1) - 1``), brute-force
exponent searches over wide ranges, and a decoder of MRF words (``docs/numerics.md`` 2.8:
the E8M0 code in the low byte, then ``m``-bit two's complement mantissas, least
significant first). :func:`exported_run` runs a network through its NumPy export (the
code under test's other form, which the tests compare with the device bit for bit).
"""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def mlp(layers, *, softmax=False, name="mlp"):
    """An ONNX MLP from ``layers``: ``(W (out, in), b or None, act or None)`` per Gemm
    (``transB = 1``); input ``x`` ``(N, in)``."""
    nodes, inits = [], []
    cur = "x"
    for i, (w, b, act) in enumerate(layers):
        ins = [cur, f"W{i}"]
        inits.append(numpy_helper.from_array(np.asarray(w, np.float32), f"W{i}"))
        if b is not None:
            inits.append(numpy_helper.from_array(np.asarray(b, np.float32), f"b{i}"))
            ins.append(f"b{i}")
        nodes.append(helper.make_node("Gemm", ins, [f"h{i}"], name=f"fc{i}", transB=1))
        cur = f"h{i}"
        if act:
            nodes.append(helper.make_node(act, [cur], [f"a{i}"], name=f"act{i}"))
            cur = f"a{i}"
    if softmax:
        nodes.append(helper.make_node("Softmax", [cur], ["y"], name="softmax", axis=-1))
        cur = "y"
    f_in = np.shape(layers[0][0])[1]
    f_out = np.shape(layers[-1][0])[0]
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", f_in])],
        [helper.make_tensor_value_info(cur, TensorProto.FLOAT, ["N", f_out])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def quantize_ref(x, e, m):
    """Dequantized values of ``x`` (float64, one block) at exponent ``e``, ``m``-bit
    mantissas: ``q = clamp(round_half_even(x / 2^(e - m + 2)))``."""
    step = 2.0 ** (e - (m - 2))
    top = 2 ** (m - 1) - 1
    q = np.clip(np.round(np.asarray(x, np.float64) / step), -top, top)   # np.round: half even
    return q * step


def brute_weight_exponent(block, m):
    """The exponent of least squared error of one block (ties to the larger) over the
    documented search window around the max-based exponent: ``floor(log2 max) + 1`` down
    to ``- 3``, at most 15; -127 for an all-zero block."""
    mx = np.abs(block).max()
    if mx == 0:
        return -127
    e0 = int(np.floor(np.log2(mx)))
    best = None
    for e in range(min(e0 + 1, 15), e0 - 4, -1):
        err = ((quantize_ref(block, e, m) - block) ** 2).sum()
        if best is None or err < best[1]:
            best = (e, err)
    return best[0]


def brute_static_exponent(rows, n, m, lo=-30, hi=15):
    """The static exponent of least total squared error of ``rows`` (every native block of
    every row quantized with it) over ``lo..hi`` (ties to the larger), and its error."""
    x = np.asarray(rows, np.float64)
    pad = (-x.shape[1]) % n
    x = np.pad(x, [(0, 0), (0, pad)])
    best = None
    for e in range(hi, lo - 1, -1):
        err = ((quantize_ref(x, e, m) - x) ** 2).sum()
        if best is None or err < best[1]:
            best = (e, err)
    return best


def decode_word(word, n, m):
    """An MRF word as (unbiased exponent, n mantissas)."""
    code = word & 0xFF
    q = []
    for j in range(n):
        u = (word >> (8 + j * m)) & ((1 << m) - 1)
        q.append(u - (1 << m) if u >> (m - 1) else u)
    return code - 127, np.array(q)


def matrix_words(image, cfg, slot, rows, cols):
    """The MRF words of the matrix at tile ``slot`` in ``image``: ``(rows, C)`` exponents
    and ``(rows, C * n)`` mantissas, from the image's MRF memory entries (tile ``(r, c)``
    in slot ``slot + r * G + c // T`` of engine ``c % T``, ``docs/mvm.md``)."""
    n, t = cfg.n, cfg.tiles
    words = {}
    for space, addr, data in image.memories:
        if getattr(space, "name", space) == "MRF":
            for i, w in enumerate(data):
                words[addr + i] = int(w)
    big_c = -(-cols // n)
    groups = -(-big_c // t)
    exps = np.zeros((rows, big_c), int)
    mant = np.zeros((rows, big_c * n), int)
    for row in range(rows):
        r, i = divmod(row, n)
        for c in range(big_c):
            addr = ((slot + r * groups + c // t) * t + c % t) * n + i
            exps[row, c], mant[row, c * n:(c + 1) * n] = decode_word(
                words[addr], n, cfg.mantissa_bits_w)
    return exps, mant


def cnn(conv_w, conv_b, head_w, *, image=(6, 6), strides=(1, 1), pads=(1, 1, 1, 1),
        relu=True, name="cnn"):
    """An ONNX CNN: ``Conv`` (``conv_w`` ``(C_out, 1, kh, kw)``) [+ ``Relu``], then, with
    ``head_w``, ``Flatten`` + ``Gemm``; input ``x`` ``(N, 1, H, W)``."""
    from host.compiler.ir import window_out
    c_out, _, kh, kw = np.shape(conv_w)
    oh = window_out(image[0], kh, strides[0], pads[0], pads[2])
    ow = window_out(image[1], kw, strides[1], pads[1], pads[3])
    inits = [numpy_helper.from_array(np.asarray(conv_w, np.float32), "Wc"),
             numpy_helper.from_array(np.asarray(conv_b, np.float32), "bc")]
    nodes = [helper.make_node("Conv", ["x", "Wc", "bc"], ["c"], name="conv",
                              strides=list(strides), pads=list(pads))]
    cur = "c"
    if relu:
        nodes.append(helper.make_node("Relu", [cur], ["r"], name="relu"))
        cur = "r"
    out_shape = ["N", c_out, oh, ow]
    if head_w is not None:
        inits.append(numpy_helper.from_array(np.asarray(head_w, np.float32), "Wh"))
        nodes += [helper.make_node("Flatten", [cur], ["f"], name="flatten"),
                  helper.make_node("Gemm", ["f", "Wh"], ["y"], name="head", transB=1)]
        cur, out_shape = "y", ["N", np.shape(head_w)[0]]
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, *image])],
        [helper.make_tensor_value_info(cur, TensorProto.FLOAT, out_shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def pixel_major(w, c, h, wd, n):
    """The device's matrix of a weight ``w`` ``(rows, c, h, wd)`` that reads a map pixel
    by pixel (``ky``, ``kx``), each pixel's ``c`` channels zero padded to whole native
    vectors of ``n`` (written out here, not taken from the compiler)."""
    rows = w.shape[0]
    p = -(-c // n) * n
    out = np.zeros((rows, h, wd, p))
    for y in range(h):
        for x in range(wd):
            out[:, y, x, :c] = w[:, :, y, x]
    return out.reshape(rows, -1)


def exported_run(net, x, where, name="exported_layer"):
    """``net`` (a compiled network) on float inputs ``x`` through its NumPy export written
    to ``where / f"{name}.py"``: the outputs in the network's float form (its signature)."""
    from host.compiler.export import export_image
    from host.compiler.network import signature_jobs, signature_outputs
    py, _ = export_image(net.image, where / f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"{name}_{id(net)}", py)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        out, _ = module.run(signature_jobs(x, net.signature, net.config.n))
    finally:
        del sys.modules[spec.name]
    return signature_outputs(out, net.signature)
