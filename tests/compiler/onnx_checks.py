"""What the ONNX compiler tests share: initializers, onnxruntime's float32 reference, the
per-block magnitudes the error bounds are made from, and the checks against a bound.

onnx and onnxruntime come with the ``dev`` extra: imported, not skipped, so a missing one
fails the tests that need it.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import numpy_helper


def init(name, a, dtype=np.float32):
    """An initializer ``name`` holding ``a`` as ``dtype``."""
    return numpy_helper.from_array(np.asarray(a, dtype), name)


def ort_run(model, x):
    """onnxruntime's output of ``model`` on input ``x`` (the first output)."""
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def block_max(a, n):
    """Per element, the largest magnitude of its native block (n lanes of the last axis)."""
    length = a.shape[-1]
    pad = np.pad(np.abs(a), [(0, 0)] * (a.ndim - 1) + [(0, (-length) % n)])
    m = pad.reshape(*a.shape[:-1], -1, n).max(-1)
    return np.repeat(m, n, axis=-1)[..., :length]


def check_within(y, ref, bound, what):
    """Every element of ``y`` within ``bound`` of ``ref``."""
    bad = np.abs(y.astype(np.float64) - ref) > bound + 1e-6
    assert not bad.any(), (f"{what}: {bad.sum()} elements beyond the bound, worst "
                           f"{np.abs(y - ref)[bad].max():.3g} vs bound "
                           f"{bound[bad].min():.3g}")


def check_classes(y, ref, bound, what):
    """The reference's class on every row with a margin the bound cannot close, and on
    at least 90 % of all rows."""
    top2 = np.sort(ref, axis=1)[:, -2:]
    sure = (top2[:, 1] - top2[:, 0]) > 2 * bound.max(axis=1)
    agree = y.argmax(1) == ref.argmax(1)
    assert agree[sure].all(), f"{what}: class differs on a row with a clear margin"
    assert agree.mean() >= 0.9, f"{what}: only {agree.mean():.0%} of rows agree"


# --- a float64 evaluation of small ONNX graphs with a per-element error bound --------------
#
# ``bound_eval`` walks an ONNX graph built by the tests (the operators of docs/compiler.md
# section 1) in float64 and carries, for every tensor, its value and a bound on how far
# the NPU's FP16 value can be from it (docs/compiler.md section 6):
#
# * products (Gemm, MatMul, Conv, and a Gemm after Flatten of a feature map, which the
#   device computes as a convolution whose window is the whole map): the bound of
#   ``test_onnx_mlp.error_bound`` on the product's gathered input, blocks of N lanes per
#   pixel (each pixel's channels zero padded to whole native vectors) for a map, of the
#   packed row for a flat vector; weights rounded to FP16; two FP16 roundings and the
#   bias's;
# * element-wise ops: FP16 rounding of each operation (``u = 2^-11`` relative) on top of
#   the propagated bounds (Relu, Clip, max: 1-Lipschitz; sigmoid, tanh, exp: slope
#   times the bound plus the ACT unit's ``2^-8``);
# * MaxPool: exact on FP16 values (the largest bound of the window); AveragePool: a sum
#   of K FP16 additions (each within ``u`` of the running sum of magnitudes) times the
#   FP16 reciprocal of the count;
# * BatchNormalization folded into the Conv / Gemm before it when that is the only
#   reader (as the importer does), else a per-channel multiply and add.

U16 = 2.0 ** -11
ROM = 2.0 ** -8
TINY = 2.0 ** -20


def f16(a):
    """``a`` rounded to FP16 and back (float64)."""
    return np.asarray(a, np.float64).astype(np.float16).astype(np.float64)


def _product_bound(patches, e, wm, b, n, mv, mw):
    """Value and bound of ``patches @ wm.T + b``: rows of ``patches`` / ``e`` are the
    gathered inputs laid out in blocks of ``n`` (zero padding included)."""
    dv, dw = 2.0 ** -(mv - 1), 2.0 ** -(mw - 1)
    a = np.abs(patches) + e
    aw = np.abs(wm)
    bx, bw = block_max(a, n), block_max(aw, n)
    y = patches @ wm.T + (0 if b is None else b)
    ey = e @ aw.T + dv * bx @ aw.T + dw * a @ bw.T + dv * dw * bx @ bw.T + U16 * a @ aw.T
    ey += U16 * (np.abs(y) + ey) * 2 + (0 if b is None else U16 * np.abs(b)) + TINY
    return y, ey


def _im2col(x, kh, kw, strides, pads, n):
    """``(B, C, H, W)`` zero padded and gathered as the device's window reads it:
    ``(B, oh, ow, kh * kw * P * n)`` (each pixel's channels padded to ``P * n``)."""
    bsz, c, h, w = x.shape
    p = -(-c // n)
    t, l, bt, r = pads
    xp = np.zeros((bsz, p * n, h + t + bt, w + l + r))
    xp[:, :c, t:t + h, l:l + w] = x
    oh = (h + t + bt - kh) // strides[0] + 1
    ow = (w + l + r - kw) // strides[1] + 1
    out = np.zeros((bsz, oh, ow, kh, kw, p * n))
    for ky in range(kh):
        for kx in range(kw):
            sl = xp[:, :, ky:ky + (oh - 1) * strides[0] + 1:strides[0],
                    kx:kx + (ow - 1) * strides[1] + 1:strides[1]]
            out[:, :, :, ky, kx, :] = sl.transpose(0, 2, 3, 1)
    return out.reshape(bsz, oh, ow, -1)


def conv_bound(x, e, w, b, strides, pads, n, mv, mw):
    """Value and bound of a 2-D convolution (``w`` ``(C_out, C_in, kh, kw)``, float64)."""
    c_out, c_in, kh, kw = w.shape
    p = -(-c_in // n)
    pat = _im2col(x, kh, kw, strides, pads, n)
    ep = _im2col(e, kh, kw, strides, pads, n)
    wm = np.zeros((c_out, kh, kw, p * n))
    wm[..., :c_in] = w.transpose(0, 2, 3, 1)
    wm = wm.reshape(c_out, -1)
    bsz, oh, ow, k = pat.shape
    y, ey = _product_bound(pat.reshape(-1, k), ep.reshape(-1, k), wm, b, n, mv, mw)
    shape = (bsz, oh, ow, c_out)
    return y.reshape(shape).transpose(0, 3, 1, 2), ey.reshape(shape).transpose(0, 3, 1, 2)


def _pool(x, e, kind, kernel, strides, pads, include_pad):
    bsz, c, h, w = x.shape
    kh, kw = kernel
    t, l, bt, r = pads
    oh = (h + t + bt - kh) // strides[0] + 1
    ow = (w + l + r - kw) // strides[1] + 1
    y, ey = np.zeros((bsz, c, oh, ow)), np.zeros((bsz, c, oh, ow))
    for oy in range(oh):
        for ox in range(ow):
            y0, x0 = oy * strides[0] - t, ox * strides[1] - l
            ys, xs = slice(max(y0, 0), min(y0 + kh, h)), slice(max(x0, 0), min(x0 + kw, w))
            win, ew = x[:, :, ys, xs], e[:, :, ys, xs]
            if kind == "max":
                y[:, :, oy, ox] = win.max(axis=(2, 3))
                ey[:, :, oy, ox] = ew.max(axis=(2, 3))
                continue
            count = kh * kw if include_pad else win.shape[2] * win.shape[3]
            s = win.sum(axis=(2, 3))
            mag = (np.abs(win) + ew).sum(axis=(2, 3))
            rec = f16(1.0 / count)
            v = s / count
            err = (ew.sum(axis=(2, 3)) + (kh * kw - 1) * U16 * mag) * rec \
                + np.abs(s) * abs(rec - 1.0 / count)
            y[:, :, oy, ox] = v
            ey[:, :, oy, ox] = err + U16 * (np.abs(v) + err) + TINY
    return y, ey


def _attrs(node):
    from onnx import helper
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _pads(node, a, size, kernel):
    auto = a.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    strides = list(a.get("strides", [1, 1]))
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for s_, k, st in zip(size, kernel, strides):
            total = max((-(-s_ // st) - 1) * st + k - s_, 0)
            lo, hi = total // 2, total - total // 2
            begin.append(lo if auto == "SAME_UPPER" else hi)
            end.append(hi if auto == "SAME_UPPER" else lo)
        return strides, begin + end
    if auto == "VALID":
        return strides, [0, 0, 0, 0]
    return strides, list(a.get("pads", [0, 0, 0, 0]))


def bound_eval(model, x, n, mv=8, mw=8):
    """float64 value and per-element error bound of ``model``'s output on ``x`` for an NPU
    build of native dimension ``n`` and mantissas ``mv`` / ``mw`` (module comment)."""
    from onnx import numpy_helper
    g = model.graph
    consts = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in g.initializer}
    for node in g.node:
        if node.op_type == "Constant":
            consts[node.output[0]] = numpy_helper.to_array(_attrs(node)["value"])
    readers = {}
    for node in g.node:
        for i in node.input:
            readers[i] = readers.get(i, 0) + 1
    for o in g.output:
        readers[o.name] = readers.get(o.name, 0) + 1
    windowed = any(nd.op_type in ("Conv", "MaxPool", "AveragePool", "GlobalAveragePool",
                                  "GlobalMaxPool") for nd in g.node)
    x = np.asarray(x, np.float64)
    val = {g.input[0].name: f16(x)}
    err = {g.input[0].name: np.zeros_like(x)}
    # the device layout of a flattened feature map: (C, H, W), for the Gemm after it
    mapped = {g.input[0].name: x.shape[1:] if windowed and x.ndim == 4 else None}
    producer = {}

    def put(name, v, e, layout=None):
        val[name], err[name], mapped[name] = v, e, layout

    for node in g.node:
        op, a = node.op_type, _attrs(node)
        ins = [i for i in node.input]
        out = node.output[0]
        if op == "Constant":
            continue
        if op in ("Identity", "Dropout"):
            put(out, val[ins[0]], err[ins[0]], mapped.get(ins[0]))
            continue
        if op in ("Flatten", "Reshape"):
            v = val[ins[0]]
            lay = mapped.get(ins[0])
            if lay is None and v.ndim == 4:
                lay = v.shape[1:]
            put(out, v.reshape(len(v), -1), err[ins[0]].reshape(len(v), -1), lay)
            continue
        if op in ("Gemm", "MatMul", "Conv"):
            if op == "Conv":
                w = consts[ins[1]]
                b = consts[ins[2]] if len(ins) > 2 and ins[2] else None
                extra = _pads(node, a, val[ins[0]].shape[2:], w.shape[2:])
            elif op == "Gemm":
                w = consts[ins[1]]
                w = (w if a.get("transB", 0) else w.T) * a.get("alpha", 1.0)
                b = consts[ins[2]].reshape(-1) * a.get("beta", 1.0) if len(ins) > 2 else None
                if b is not None and b.size == 1:
                    b = np.full(w.shape[0], float(b[0]))
                extra = None
            else:
                w, b, extra = consts[ins[1]].T, None, None
            kind = "conv" if op == "Conv" else "dense"
            producer[out] = (kind, ins[0], w, b, extra)
            put(out, *_apply_product(kind, val[ins[0]], err[ins[0]], w, b, extra,
                                     mapped.get(ins[0]), n, mv, mw))
            continue
        if op == "BatchNormalization" or (op in ("Add", "Sub", "Mul", "Div")
                                          and any(i in consts for i in ins)):
            # y = x * scale + shift per channel: folded into the product before it when
            # that is its only reader, else a multiply and an add in FP16
            if op == "BatchNormalization":
                xin = ins[0]
                gam, beta, mean, var = (consts[i] for i in ins[1:5])
                scale = gam / np.sqrt(var + a.get("epsilon", 1e-5))
                shift = beta - mean * scale
            else:
                ci = 0 if ins[0] in consts else 1
                xin = ins[1 - ci]
                c = consts[ins[ci]]
                chans = val[xin].shape[1]
                c = np.full(chans, float(c.reshape(-1)[0])) if c.size == 1 else \
                    np.broadcast_to(c, val[xin].shape)[0].reshape(chans, -1)[:, 0]
                one, zero = np.ones(chans), np.zeros(chans)
                scale, shift = {"Add": (one, c), "Mul": (c, zero), "Div": (1 / c, zero),
                                "Sub": (one, -c) if ci == 1 else (-one, c)}[op]
            prev = producer.get(xin)
            if prev is not None and readers.get(xin) == 1:
                kind, pin, w, b, extra = prev
                w = w * scale.reshape((-1,) + (1,) * (w.ndim - 1))
                b = (np.zeros(len(scale)) if b is None else b) * scale + shift
                producer[out] = (kind, pin, w, b, extra)
                put(out, *_apply_product(kind, val[pin], err[pin], w, b, extra,
                                         mapped.get(pin), n, mv, mw))
                continue
            v0, e0 = val[xin], err[xin]
            shape = (1, -1) + (1,) * (v0.ndim - 2)
            s_, t_ = scale.reshape(shape), shift.reshape(shape)
            sr, tr = f16(s_), f16(t_)
            m = v0 * s_
            e = e0 * np.abs(sr) + np.abs(s_ - sr) * np.abs(v0)
            if np.any(scale != 1):
                e = e + U16 * (np.abs(m) + e)
            v = m + t_
            if np.any(shift != 0):
                e = e + np.abs(t_ - tr) + U16 * (np.abs(v) + e)
            put(out, v, e + TINY, mapped.get(xin))
            continue
        if op in ("Add", "Sub", "Mul"):
            va, vb, ea, eb = val[ins[0]], val[ins[1]], err[ins[0]], err[ins[1]]
            if op == "Mul":
                v, e = va * vb, np.abs(va) * eb + np.abs(vb) * ea + ea * eb
            else:
                v, e = (va + vb if op == "Add" else va - vb), ea + eb
            put(out, v, e + U16 * (np.abs(v) + e) + TINY, mapped.get(ins[0]))
            continue
        v0, e0 = val[ins[0]], err[ins[0]]
        lay = mapped.get(ins[0])
        if op == "Relu":
            put(out, np.maximum(v0, 0), e0, lay)
        elif op in ("Sigmoid", "Tanh"):
            v = 1 / (1 + np.exp(-v0)) if op == "Sigmoid" else np.tanh(v0)
            put(out, v, e0 * (0.25 if op == "Sigmoid" else 1.0) + ROM * np.abs(v) + TINY, lay)
        elif op == "Exp":
            v = np.exp(v0)
            put(out, v, v * (np.exp(e0) - 1) + ROM * v + TINY, lay)
        elif op == "Clip":
            lo = consts[ins[1]] if len(ins) > 1 and ins[1] else a.get("min", -np.inf)
            hi = consts[ins[2]] if len(ins) > 2 and ins[2] else a.get("max", np.inf)
            lo, hi = float(lo), float(hi)
            v = np.clip(v0, lo, hi)
            slack = max(abs(lo - f16(lo)) if np.isfinite(lo) else 0,
                        abs(hi - f16(hi)) if np.isfinite(hi) else 0)
            put(out, v, e0 + slack, lay)
        elif op == "LeakyRelu":
            al = a.get("alpha", 0.01)
            ar = float(f16(al))
            v = np.maximum(v0, al * v0)
            put(out, v, e0 + (abs(al - ar) + U16 * ar) * (np.abs(v0) + e0) + TINY, lay)
        elif op in ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
                    "ReduceMean", "ReduceMax"):
            if op.startswith(("Global", "Reduce")):        # over axes 2 and 3 (the tests')
                kernel, strides, pads = v0.shape[2:], [1, 1], [0, 0, 0, 0]
            else:
                kernel = a["kernel_shape"]
                strides, pads = _pads(node, a, v0.shape[2:], kernel)
            kind = "max" if "Max" in op else "avg"
            v, e = _pool(v0, e0, kind, kernel, strides, pads, a.get("count_include_pad", 0))
            if op.startswith("Reduce") and not a.get("keepdims", 1):
                v, e = v.reshape(len(v), -1), e.reshape(len(e), -1)
            put(out, v, e)
        elif op == "Softmax":
            z = v0 - v0.max(-1, keepdims=True)
            p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
            ez = e0.max(-1, keepdims=True)
            put(out, p, p * (np.exp(2 * ez) - 1) + 4 * ROM * p + TINY)
        else:
            raise NotImplementedError(op)
    name = g.output[0].name
    return val[name], err[name]


def _apply_product(kind, x, e, w, b, extra, layout, n, mv, mw):
    if kind == "conv":
        return conv_bound(x, e, w, b, *extra, n, mv, mw)
    if layout is not None and int(np.prod(layout[1:])) > 1:
        # a Gemm after Flatten of a map: a convolution whose window is the whole map
        c, h, wd = layout
        y, ey = conv_bound(x.reshape(len(x), c, h, wd), e.reshape(len(x), c, h, wd),
                           w.reshape(len(w), c, h, wd), b, (1, 1), (0, 0, 0, 0), n, mv, mw)
        return y.reshape(len(x), -1), ey.reshape(len(x), -1)
    return _product_bound(x, e, w, b, n, mv, mw)


def make_model(nodes, inits, x_shape, y_name, y_shape, opset=17, x_name="x"):
    """A checked ``ModelProto`` of ``nodes`` with one float input ``x_name`` of
    ``x_shape`` and one output ``y_name`` of ``y_shape`` (symbolic axes as strings; None:
    the shape ONNX's shape inference gives it)."""
    import onnx
    from onnx import TensorProto, helper

    def build(shape):
        graph = helper.make_graph(
            nodes, "test", [helper.make_tensor_value_info(x_name, TensorProto.FLOAT, x_shape)],
            [helper.make_tensor_value_info(y_name, TensorProto.FLOAT, shape)], inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    if y_shape is None:
        inferred = onnx.shape_inference.infer_shapes(build(None)).graph.output[0]
        y_shape = [d.dim_param or d.dim_value or None
                   for d in inferred.type.tensor_type.shape.dim]
    model = build(y_shape)
    onnx.checker.check_model(model)
    return model


def conv_ref(x, w, b=None, strides=(1, 1), pads=(0, 0, 0, 0)):
    """A direct float64 2-D convolution (``x`` ``(B, C, H, W)``, ``w`` ``(O, C, kh, kw)``,
    ``pads`` top, left, bottom, right): the tests' own reference, loop by loop."""
    x = np.asarray(x, np.float64)
    bsz, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    t, l, bt, r = pads
    xp = np.zeros((bsz, c, h + t + bt, wd + l + r))
    xp[:, :, t:t + h, l:l + wd] = x
    oh, ow = (h + t + bt - kh) // strides[0] + 1, (wd + l + r - kw) // strides[1] + 1
    y = np.zeros((bsz, o, oh, ow))
    for oy in range(oh):
        for ox in range(ow):
            patch = xp[:, :, oy * strides[0]:oy * strides[0] + kh,
                       ox * strides[1]:ox * strides[1] + kw]
            y[:, :, oy, ox] = np.einsum("bchw,ochw->bo", patch, w)
    return y if b is None else y + np.asarray(b).reshape(1, -1, 1, 1)
