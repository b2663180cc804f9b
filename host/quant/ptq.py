"""Post-training calibration of a network (seeds 002 and 000): from an ONNX model and a
calibration set to a network image with calibrated exponents (``docs/calibration.md``).

:func:`compile_calibrated` is the entry point (``npu compile --calibrate``); it lives in
``host.quant`` and not in ``host.compiler.compile_onnx`` because the layering puts
``quant`` above ``compiler`` (``tests/test_layering.py``): the compiler honours
per-layer quantization settings (``node.attrs["quant"]`` of a ``Dense`` or ``Conv``,
``host.compiler.network.compile_graph``) and this module chooses them. The steps:

1. **Reference.** The IR graph is evaluated in float64 on the calibration set
   (:func:`reference_activations`): every tensor, one row per sample.
2. **Settings** (:func:`calibrate_graph`, no device). Per matrix layer (``Dense``,
   ``Conv``; recurrent layers keep the dynamic exponent), on the matrix the lowering
   places and the vectors its input quantizer sees (:class:`_View`): with
   ``method="mmse"`` the weight block exponents of least squared error
   (:func:`~host.quant.calibrate.weight_exponents` on the FP16 weights, written into the
   image as raw MRF words) and the input's static exponent of least total squared error
   over the set, chosen only where it beats the dynamic exponent
   (:func:`~host.quant.calibrate.activation_exponent`); seed 002's activation offset
   where it folds into biases at no device cost and lowers the error; then, layer by
   layer in network order on the layer's inputs as the device computes them with the
   settings of the layers before (:func:`quantized_activations`), the weight mantissas
   of least output error and the bias corrected (``rounding="gptq"``, the default,
   :mod:`host.quant.rounding`), written into the graph as FP16-exact weights so that the
   compiler's MRF words are those mantissas. ``method="max"``: the device's max-based
   exponents (today's compile), recorded as such.
3. **Counts on a device** (the runtime's :class:`~host.runtime.device.Device`; default
   the reference model of the build): the network's prefix up to each layer runs the set
   to give that layer's inputs as the device computes them; a probe program then runs
   them through the layer's products alone (counters are global) and reads its
   saturation and narrow-accumulator counters.
4. **Range scaling** (seed 000, with ``accumulator_bits``): per layer, in order, the
   exponents are raised by powers of two while the events (:func:`layer_events`) exceed
   ``overflow_threshold`` (:func:`~host.quant.calibrate.scale_until`). Policy: a layer
   with a static input exponent raises that exponent (one register write; it also
   removes the input's clipping); a layer with dynamic inputs raises every weight block
   exponent (its MRF words are rewritten). Every evaluation is logged.
5. The network is compiled with the final settings; ``extra["report"]["calibration"]``
   records per layer the settings, the errors, the counts and the output error against
   the float reference, and the range-scaling log.
"""

from __future__ import annotations

import copy
import os

import numpy as np

from host.compiler.ir import Graph
from host.compiler.network import as_config
from host.numerics import bfp
from host.quant.calibrate import (
    activation_centre,
    activation_exponent,
    activation_offset,
    fold_offset,
    scale_until,
    weight_exponents,
)
from host.quant.rounding import round_layer
from host.spec.config import NpuConfig
from host.spec.formats import (
    E8M0_BIAS,
    MVM_EXP_MAX,
    NARROW_WIDTH_MAX,
    ZERO_BLOCK_EXP,
    Rounding,
    check_int,
)

__all__ = [
    "METHODS",
    "ROUNDINGS",
    "CalibrationError",
    "calibrate_graph",
    "compile_calibrated",
    "layer_events",
    "load_calibration",
    "quantized_activations",
    "reference_activations",
]

#: The calibration methods: least squared error (seed 002) and the device's max-based rule.
METHODS = ("mmse", "max")
#: How ``mmse`` chooses weight mantissas: by the layer's output error with bias correction
#: (default, ``host.quant.rounding``), or each weight rounded to nearest.
ROUNDINGS = ("gptq", "nearest")
#: The MVM counters a probe reads. A layer's events in range scaling are narrow
#: accumulator events plus saturations (DECISIONS): every one of these, except that
#: ``vector_saturations`` count only for a static input exponent; with a dynamic one they
#: are the max-based exponent's round-past-the-top clamps, which no exponent of the layer
#: sets (they are reported, not counted as events).
EVENT_COUNTERS = ("narrow_events", "vector_saturations", "weight_saturations",
                  "output_saturations")


def layer_events(counts: dict, static_input: bool) -> int:
    """A layer's range-scaling events from its probe's counters (see
    :data:`EVENT_COUNTERS`)."""
    return sum(int(counts[k]) for k in EVENT_COUNTERS
               if static_input or k != "vector_saturations")
_ROUNDING = Rounding.NEAREST_EVEN      # what the compiled programs use (ROUNDING = 0)


class CalibrationError(ValueError):
    """Calibration data or settings that cannot be used, or range scaling that cannot
    reach its threshold; the message names the data or the layer."""


# --- calibration data ------------------------------------------------------------------------

def _declared(graph: Graph) -> list:
    """The graph input's shape with ``None`` at the batch axis (as the image signature)."""
    shape = list(graph.tensors[graph.inputs[0]].shape)
    return shape if None in shape else [None] + shape[1:]


def load_calibration(data, graph: Graph, *, label: str | None = None) -> np.ndarray:
    """The calibration set, checked against the graph's input.

    Parameters
    ----------
    data : float array or path of a ``.npy`` file
        Shaped like the model's input as ``Network.run`` and ``npu run`` take it: the
        batch axis where the model declares it (first for an MLP; axis 1 of a seq-first
        recurrent model's ``(T, batch, I)``), one calibration sample per batch entry.
    graph : the IR graph (its one input)
    label : how messages name the data (default: the path, or "calibration data")

    Returns
    -------
    numpy.ndarray
        ``data`` as float64 rows ``(samples, features)``: each sample's elements, row
        major, as a job carries them.

    Raises
    ------
    CalibrationError
        an unreadable file or an ``.npz``; a dtype other than float16/32/64; another
        shape; no samples; inf or NaN values; values that overflow FP16 (the device's
        input format). The message names the data.
    """
    if isinstance(data, (str, bytes, os.PathLike)):
        path = os.fsdecode(data)
        label = label or f"calibration data {path}"
        try:
            arr = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise CalibrationError(f"cannot read {label}: {exc}") from None
        if not isinstance(arr, np.ndarray):
            arr.close()
            raise CalibrationError(f"{label} must be one .npy array, not an .npz archive")
    else:
        label = label or "calibration data"
        arr = np.asarray(data)
    if arr.dtype not in (np.float16, np.float32, np.float64):
        raise CalibrationError(f"{label} must be float16, float32 or float64 values shaped "
                               f"like the model's input, not {arr.dtype}")
    want = _declared(graph)
    axis = want.index(None)
    if arr.ndim != len(want) or any(w is not None and w != d for w, d in zip(want, arr.shape)):
        shown = "(" + ", ".join("batch" if d is None else str(d) for d in want) + ")"
        where = "batch first" if axis == 0 else f"batch axis {axis}"
        raise CalibrationError(f"{label} has shape {arr.shape}; the model's input "
                               f"{graph.inputs[0]!r} is {shown} ({where})")
    samples = arr.shape[axis]
    if samples == 0:
        raise CalibrationError(f"{label} holds no samples (shape {arr.shape})")
    bad = int(np.count_nonzero(~np.isfinite(arr)))
    if bad:
        raise CalibrationError(f"{label} holds {bad} inf or NaN values; calibrate on finite "
                               f"data")
    with np.errstate(over="ignore"):
        over = int(np.count_nonzero(np.isinf(arr.astype(np.float16))))
    if over:
        raise CalibrationError(f"{label} holds {over} values beyond FP16's range (65504), "
                               f"the device's input format")
    return np.moveaxis(arr, axis, 0).reshape(samples, -1).astype(np.float64)


# --- the float reference -----------------------------------------------------------------------

def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _recurrent(node, graph, x):
    """An LSTM / GRU over rows ``x`` ``(S, steps * I)``; every step's ``h``, ``(S, steps * H)``."""
    w, r, b, h0 = (graph.initializers[i].astype(np.float64) for i in node.inputs[1:5])
    hidden, steps = int(node.attrs["hidden"]), int(node.attrs["steps"])
    xs = x.reshape(len(x), steps, -1)
    h = np.broadcast_to(h0, (len(x), hidden)).copy()
    out = []
    if node.op == "LSTM":
        c = np.broadcast_to(graph.initializers[node.inputs[5]].astype(np.float64),
                            h.shape).copy()
        for t in range(steps):
            g = xs[:, t] @ w.T + h @ r.T + b
            f, i, o, cc = (g[:, k * hidden:(k + 1) * hidden] for k in range(4))
            c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(cc)
            h = _sigmoid(o) * np.tanh(c)
            out.append(h)
    else:
        lbr = bool(node.attrs.get("linear_before_reset", 0))
        bz, br, bn, bhn = (b[k * hidden:(k + 1) * hidden] for k in range(4))
        wz, wr, wn = (w[k * hidden:(k + 1) * hidden] for k in range(3))
        uz, ur, un = (r[k * hidden:(k + 1) * hidden] for k in range(3))
        for t in range(steps):
            xt = xs[:, t]
            z = _sigmoid(xt @ wz.T + h @ uz.T + bz)
            rr = _sigmoid(xt @ wr.T + h @ ur.T + br)
            if lbr:
                n = np.tanh((h @ un.T + bhn) * rr + xt @ wn.T + bn)
            else:
                n = np.tanh((rr * h) @ un.T + xt @ wn.T + bn + bhn)
            h = (h - n) * z + n
            out.append(h)
    return np.concatenate(out, axis=1)


def _last_step(node, graph, x):
    t = graph.tensors[node.inputs[0]]
    dims = list(t.shape)
    batch = t.batch_axis
    del dims[batch]
    axis = node.attrs["axis"] - (1 if batch < node.attrs["axis"] else 0)
    return np.take(x.reshape(len(x), *dims), -1, axis=axis + 1).reshape(len(x), -1)


def _shaped(graph: Graph, name: str, rows: np.ndarray) -> np.ndarray:
    """Rows ``(S, features)`` of tensor ``name`` as ``(S, *its non-batch axes)``."""
    t = graph.tensors[name]
    dims = list(t.shape)
    del dims[t.batch_axis]
    return rows.reshape(len(rows), *dims)


def _window(node, graph, x):
    """Conv, MaxPool and AveragePool on rows ``x`` of a ``(batch, C, H, W)`` tensor."""
    x = _shaped(graph, node.inputs[0], x)
    (sh, sw), (top, left, bottom, right) = node.attrs["strides"], node.attrs["pads"]
    pads = [(0, 0), (0, 0), (top, bottom), (left, right)]
    if node.op == "Conv":
        w = graph.initializers[node.inputs[1]].astype(np.float64)
        kernel = w.shape[2:]
    else:
        kernel = tuple(node.attrs["kernel"])
    fill = -np.inf if node.op == "MaxPool" else float(node.attrs.get("pad_value", 0.0))
    xp = np.pad(x, pads, constant_values=fill)
    win = np.lib.stride_tricks.sliding_window_view(xp, kernel, axis=(2, 3))[:, :, ::sh, ::sw]
    if node.op == "Conv":
        y = np.einsum("schwij,ocij->sohw", win, w)
        if len(node.inputs) > 2:
            y = y + graph.initializers[node.inputs[2]].astype(np.float64)[:, None, None]
    elif node.op == "MaxPool":
        y = win.max(axis=(-2, -1))
    else:
        y = win.sum(axis=(-2, -1))
        if node.attrs.get("count_include_pad", 0):
            y = y / (kernel[0] * kernel[1])
        else:
            ones = np.pad(np.ones(x.shape[2:]), pads[2:])
            count = np.lib.stride_tricks.sliding_window_view(ones, kernel)[::sh, ::sw]
            y = y / count.sum(axis=(-2, -1))
    return y.reshape(len(y), -1)


def _affine(node, graph, x):
    t = _shaped(graph, node.inputs[0], x)
    scale, shift = (graph.initializers[i].astype(np.float64) for i in node.inputs[1:3])
    shape = (1, -1) + (1,) * (t.ndim - 2)
    return (t * scale.reshape(shape) + shift.reshape(shape)).reshape(len(x), -1)


def reference_activations(graph: Graph, data) -> dict:
    """Every tensor of ``graph`` on the calibration set, evaluated in float64.

    ``data`` is what :func:`load_calibration` takes (or its float64 rows). Returns
    ``{tensor name: float64 (samples, features)}``: each sample's elements of the
    tensor, row major, its batch axis left out (as a job holds them).
    """
    rows = data if isinstance(data, np.ndarray) and data.ndim == 2 \
        and data.dtype == np.float64 and data.shape[1] == \
        graph.tensors[graph.inputs[0]].features else load_calibration(data, graph)
    vals = {graph.inputs[0]: rows}
    for node in graph.nodes:
        vals[node.outputs[0]] = _node_value(node, graph, vals)
    return vals


def _node_value(node, graph: Graph, vals: dict) -> np.ndarray:
    """One IR node evaluated in float64 on the rows of its inputs in ``vals`` (``{tensor:
    (samples, features)}``), as :func:`reference_activations` evaluates it."""
    x = vals[node.inputs[0]]
    if node.op == "Dense":
        y = x @ graph.initializers[node.inputs[1]].astype(np.float64).T
        if len(node.inputs) > 2:
            y = y + graph.initializers[node.inputs[2]].astype(np.float64)
    elif node.op == "Relu":
        y = np.maximum(x, 0.0)
    elif node.op == "Sigmoid":
        y = _sigmoid(x)
    elif node.op == "Tanh":
        y = np.tanh(x)
    elif node.op == "Exp":
        y = np.exp(x)
    elif node.op == "Clip":
        lo, hi = node.attrs.get("lo"), node.attrs.get("hi")
        y = np.clip(x, -np.inf if lo is None else lo, np.inf if hi is None else hi)
    elif node.op == "LeakyRelu":
        y = np.where(x > 0, x, node.attrs["alpha"] * x)
    elif node.op in ("Add", "Sub", "Mul"):
        other = vals[node.inputs[1]]
        y = x + other if node.op == "Add" else x - other if node.op == "Sub" else x * other
    elif node.op == "Affine":
        y = _affine(node, graph, x)
    elif node.op in ("Conv", "MaxPool", "AveragePool"):
        y = _window(node, graph, x)
    elif node.op == "Softmax":
        e = np.exp(x - x.max(axis=1, keepdims=True))
        y = e / e.sum(axis=1, keepdims=True)
    elif node.op in ("Flatten", "View"):
        y = x
    elif node.op == "LastStep":
        y = _last_step(node, graph, x)
    elif node.op in ("LSTM", "GRU"):
        y = _recurrent(node, graph, x)
    else:
        raise CalibrationError(f"{node.where()}: no float reference for IR op {node.op}")
    return y


# --- per-layer settings (seed 002) -------------------------------------------------------------

def _check_method(method) -> str:
    if method not in METHODS:
        raise CalibrationError(f"method must be one of {', '.join(METHODS)}, not {method!r}")
    return method


def _sq_error(values: np.ndarray, t: bfp.BfpTensor) -> float:
    """Total squared error of ``t`` against ``values`` (float64 of the quantized input)."""
    d = values.astype(np.float64) - t.dequantize().astype(np.float64)
    return float((d * d).sum())


def _fp16(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.asarray(x, np.float64).astype(np.float16)


def _name(node) -> str:
    return node.origin[0] or node.name


#: The IR ops whose input goes through the MVM's quantizer and whose weights are an MRF
#: matrix: the layers calibrated, counted and range-scaled here.
MATRIX_OPS = ("Dense", "Conv")
#: Recurrent layers: calibrated here (``method="mmse"``: static exponents of the products
#: on x and on h where they beat the dynamic one, block exponents of W and R, their
#: mantissas by output error), not counted or range-scaled.
RECURRENT_OPS = ("LSTM", "GRU")


def _layout(graph: Graph, name: str):
    """``(C, H, W)`` when the lowering keeps tensor ``name`` as a map of several pixels
    (pixel by pixel, each pixel's channels padded to whole native vectors), else None
    (a flat vector): maps come from ``Conv`` and pools (and a 4-D network input of a
    graph with them), through ``Flatten`` / ``View`` and element-wise ops
    (``host.compiler.lower``, "Layout")."""
    windowed = any(nd.op in ("Conv", "MaxPool", "AveragePool") for nd in graph.nodes)
    while True:
        prod = graph.producer(name)
        if prod is None:
            t = graph.tensors[name]
            shape = tuple(t.shape[1:]) if windowed and len(t.shape) == 4 \
                and t.shape[0] is None else None
            break
        if prod.op in ("Conv", "MaxPool", "AveragePool"):
            shape = tuple(graph.tensors[name].shape[1:])
            break
        if prod.op in ("Dense", "LSTM", "GRU", "LastStep"):
            return None
        name = prod.inputs[0]                 # Flatten, View, element-wise: the same layout
    return shape if shape is not None and shape[1] * shape[2] > 1 else None


class _View:
    """A matrix layer as the MVM sees it: the matrix the lowering places (``matrix``,
    float32 ``(rows, cols)``: a ``Conv``'s or a map-reading ``Dense``'s columns in the
    window's pixel-major order, ``host.compiler.lower.window_matrix``), the input vectors
    of each product (:meth:`vectors`) and the logical vectors the input quantizer blocks
    (:meth:`samples`)."""

    def __init__(self, graph: Graph, node, n: int):
        from host.compiler.lower import window_matrix
        self.node, self.n = node, n
        w = np.asarray(graph.initializers[node.inputs[1]], np.float32)
        self.map = _layout(graph, node.inputs[0])
        if node.op == "Conv":
            self.map = tuple(graph.tensors[node.inputs[0]].shape[1:])
            self.kernel = w.shape[2:]
            self.strides = tuple(node.attrs["strides"])
            self.pads = tuple(node.attrs["pads"])
            self.pad_value = float(node.attrs.get("pad_value", 0.0))
            self.matrix = window_matrix(w, n)
        elif self.map is not None:                    # a Dense over a whole map
            self.kernel, self.strides, self.pads = self.map[1:], (1, 1), (0, 0, 0, 0)
            self.pad_value = 0.0
            self.matrix = window_matrix(w.reshape(w.shape[0], *self.map), n)
        else:
            self.matrix = w

    def samples(self, x: np.ndarray) -> np.ndarray:
        """Rows ``x`` of the layer's input as ``(S, pixels, C)`` (a map) or ``(S, F)``:
        every row along the last axis one logical vector of the quantizer."""
        if self.map is None:
            return x
        c, h, w = self.map
        return x.reshape(len(x), c, h * w).transpose(0, 2, 1)

    def vectors(self, x: np.ndarray) -> np.ndarray:
        """Rows ``x`` as the product inputs: ``(S, products, cols)``, one product per
        output pixel (its window gathered, each pixel's channels zero padded, the padded
        pixels ``pad_value`` in every channel of the map)."""
        if self.map is None:
            return x[:, None, :]
        c, h, w = self.map
        p = -(-c // self.n) * self.n
        t, left, b, r = self.pads
        img = np.zeros((len(x), h + t + b, w + left + r, p))
        img[..., :c] = self.pad_value
        img[:, t:t + h, left:left + w, :c] = x.reshape(len(x), c, h, w).transpose(0, 2, 3, 1)
        win = np.lib.stride_tricks.sliding_window_view(img, self.kernel, axis=(1, 2))
        win = win[:, ::self.strides[0], ::self.strides[1]]        # (S, oh, ow, p, kh, kw)
        win = win.transpose(0, 1, 2, 4, 5, 3)                     # pixel by pixel
        return win.reshape(len(x), win.shape[1] * win.shape[2], -1)


def _affine_producer(graph: Graph, node):
    """The ``Dense`` whose result ``node`` reads with nothing in between and nobody else
    reading it, or None: only then can an input offset fold into biases for free."""
    x = node.inputs[0]
    prev = graph.producer(x)
    if prev is None or prev.op != "Dense" or graph.consumers(x) != [node] \
            or x in graph.outputs:
        return None
    return prev


def _input_choice(x16: np.ndarray, n: int, m: int):
    """(ActivationCalibration or None, why): None when every sample is zero."""
    try:
        return activation_exponent(x16, n, m, _ROUNDING), ""
    except ValueError as exc:
        return None, str(exc)


def _best(cal) -> float:
    return min(cal.mse_static, cal.mse_dynamic) if cal is not None else 0.0


def calibrate_graph(graph: Graph, config, data, *, method: str = "mmse",
                    rounding: str = "gptq"):
    """Choose every matrix layer's (``Dense``, ``Conv``) quantization settings from a
    calibration set (no device: the float reference only).

    Parameters
    ----------
    graph : host.compiler.ir.Graph
    config : NpuConfig, parse_config text or None (the default build)
    data : the calibration set, as :func:`load_calibration` takes it, or the dict of
        :func:`reference_activations`
    method : ``"mmse"`` (default) or ``"max"``
    rounding : ``"gptq"`` (default) or ``"nearest"``, with ``method="mmse"``: how the
        weight mantissas are chosen once the exponents are (``docs/calibration.md``
        section 7). ``"gptq"``: layer by layer in network order, on the layer's inputs as
        the device computes them with the settings of the layers before
        (:func:`quantized_activations`), the mantissas of least output error
        (:func:`host.quant.rounding.round_layer`: error-compensated rounding, never worse
        than nearest per output row) and the bias corrected for the mean output error;
        the weights and biases of the returned graph are those values, so the compiler's
        MRF words (the placed FP16 matrix quantized with the calibrated exponents) are
        exactly the chosen mantissas. ``"nearest"``: each weight rounded to nearest, the
        biases unchanged (seed 002 as first built).

    Returns
    -------
    (Graph, list of dict)
        A copy of ``graph`` whose ``Dense`` and ``Conv`` nodes carry ``attrs["quant"] =
        {"input_exponent": E8M0 code or None, "weight_exponents": int16 or None,
        "offset": float or None}``: the exponents one per tile row block of the matrix
        the lowering places (``(rows, column tiles)``; a ``Conv``'s or a map-reading
        ``Dense``'s in the window's pixel order); with an offset (flat ``Dense`` after a
        ``Dense``) the biases are refolded, this layer's ``b + W m``, the producing
        layer's ``b - m``. One record per layer for the report (``docs/calibration.md``
        section 6).

    Raises
    ------
    CalibrationError
        bad data or method (see :func:`load_calibration`).
    """
    method = _check_method(method)
    if rounding not in ROUNDINGS:
        raise CalibrationError(f"rounding must be one of {', '.join(ROUNDINGS)}, not "
                               f"{rounding!r}")
    cfg = as_config(config)
    # A copy: an offset placed before a layer adds its tensors (_insert_offset).
    ref = dict(data) if isinstance(data, dict) else reference_activations(graph, data)
    n, mv, mw = cfg.n, cfg.mantissa_bits_v, cfg.mantissa_bits_w
    g = copy.copy(graph)
    g.nodes = [copy.copy(nd) for nd in graph.nodes]
    for nd in g.nodes:
        nd.attrs = dict(nd.attrs)
        nd.inputs = list(nd.inputs)
    g.initializers = dict(graph.initializers)
    records = []
    # The device's values of every tensor so far (rounding "gptq"): the layers before
    # the one being calibrated run with their final settings.
    emulate = method == "mmse" and rounding == "gptq"
    qvals = {g.inputs[0]: _f16(ref[g.inputs[0]])} if emulate else None
    for node in list(g.nodes):          # _insert_offset adds nodes
        if node.op in RECURRENT_OPS and method == "mmse":
            records.append(_calibrate_recurrent(g, node, cfg, ref, qvals))
            continue
        if node.op not in MATRIX_OPS:
            if emulate:
                qvals[node.outputs[0]] = _f16(_node_value(node, g, qvals))
            continue
        view = _View(graph, node, n)
        w16 = _fp16(view.matrix)
        dynamic = bfp.quantize(w16, n, mw, _ROUNDING)
        mse_max = _sq_error(w16, dynamic) / w16.size
        x = ref[node.inputs[0]]
        cal, why_none = _input_choice(_fp16(view.samples(x)), n, mv)
        rec = {"name": _name(node), "node": node.name, "op": node.origin[1] or node.op,
               "method": method}
        quant = {"input_exponent": None, "weight_exponents": None, "offset": None}
        if method == "max":
            rec["weights"] = {"mode": "max-based", "mse": mse_max, "mse_max_based": mse_max,
                              **_exponent_summary(dynamic.exponents, dynamic.exponents),
                              "clipped": dynamic.saturation_count}
            rec["input"] = {"mode": "dynamic", "exponent": None,
                            "mse_dynamic": None if cal is None else cal.mse_dynamic,
                            "mse_static": None if cal is None else cal.mse_static,
                            "best_static": None if cal is None else cal.exponent}
            rec["offset"] = None
        else:
            e = weight_exponents(w16, n, mw, _ROUNDING)
            calibrated = bfp.quantize(w16, n, mw, _ROUNDING, exponent=e)
            quant["weight_exponents"] = e
            rec["weights"] = {"mode": "calibrated", "mse": _sq_error(w16, calibrated) / w16.size,
                              "mse_max_based": mse_max,
                              **_exponent_summary(e, dynamic.exponents),
                              "clipped": calibrated.saturation_count}
            # Seed 002's offset (section 5 of docs/calibration.md): folded into both
            # biases where the input is an affine layer's result (no device cost), else
            # subtracted by an Affine node placed before the layer (one MFU op).
            prev = _affine_producer(g, node) if view.map is None else None
            # The bias b + W m: with the float weights when error-compensated rounding
            # follows (its bias correction aims at the float layer, W x + b), else with
            # the weights the device multiplies (nearest rounding: Wq (x - m) + b + Wq m
            # is then Wq x + b exactly).
            device_w = None if emulate else calibrated.dequantize().astype(np.float64)
            offset = {"value": None, "applied": False}
            if cal is not None:
                m, shifted, rule = _offset_choice(view.samples(x), n, mv)
                offset.update(value=m, rule=rule)
                offset["mse"] = None if shifted is None else _best(shifted)
                movable = prev is not None or node.op == "Dense" or not any(view.pads) \
                    or _fp16(view.pad_value - m) == view.pad_value - m
                if not m:
                    offset["why"] = "the offset is 0"
                elif shifted is None or _best(shifted) >= _best(cal):
                    offset["why"] = "it does not lower the input's error"
                elif prev is None and _best(shifted) > OFFSET_OP_GAIN * _best(cal):
                    offset["why"] = (f"it lowers the input's error by less than "
                                     f"{1 - OFFSET_OP_GAIN:.0%}, too little for a device op")
                elif not movable:
                    offset["why"] = ("the layer's padding value minus the offset is not "
                                     "an FP16 number")
                elif prev is not None:
                    offset.update(applied=True, why="folded into the biases")
                    quant["offset"] = m
                    _fold(g, prev, node, m, device_w)
                    cal = shifted
                else:
                    op = _insert_offset(g, node, m, ref, qvals, device_w)
                    offset.update(applied=True, op=op, why=f"subtracted by the device op {op}")
                    cal = shifted
            else:
                offset["why"] = why_none
            rec["offset"] = offset
            if cal is not None and cal.choice == "static":
                quant["input_exponent"] = cal.exponent_code
            rec["input"] = {"mode": "static" if quant["input_exponent"] is not None
                            else "dynamic",
                            "exponent": None if quant["input_exponent"] is None
                            else cal.exponent,
                            "mse_dynamic": None if cal is None else cal.mse_dynamic,
                            "mse_static": None if cal is None else cal.mse_static,
                            "best_static": None if cal is None else cal.exponent}
        if cal is None:
            rec["input"]["why"] = why_none
        node.attrs["quant"] = quant
        if method == "mmse":
            rec["weights"]["rounding"] = {"method": "nearest"}
        if emulate:
            if quant["offset"] is not None:          # the producer's result is now x - m
                qvals[prev.outputs[0]] = _emulate_matrix(g, prev, cfg, qvals)
            _, rounded = _round_weights(g, node, cfg, qvals, w16)
            rec["weights"]["rounding"] = rounded
            rec["weights"]["mse_nearest"] = rec["weights"]["mse"]
            rec["weights"]["mse"] = rounded.pop("weight_mse")
            qvals[node.outputs[0]] = _emulate_matrix(g, node, cfg, qvals)
        records.append(rec)
    return g, records


def _f16(x) -> np.ndarray:
    """``x`` rounded to FP16, as float64 (a tensor as the device holds it)."""
    return _fp16(x).astype(np.float64)


def _device_inputs(view: _View, x_rows: np.ndarray, cfg: NpuConfig, quant: dict):
    """The product inputs ``(S, products, cols)`` of a matrix layer as its input quantizer
    makes them from the rows ``x_rows`` (FP16, then BFP per native vector with the
    layer's static exponent or the dynamic one; an FP16 inf saturates to the largest
    finite value and NaN becomes 0, the device's rule), dequantized to float64."""
    code = quant.get("input_exponent")
    e = None if code is None else int(code) - E8M0_BIAS
    return bfp.quantize(_fp16(view.vectors(x_rows)), cfg.n, cfg.mantissa_bits_v,
                        _ROUNDING, exponent=e, nonfinite="saturate"
                        ).dequantize().astype(np.float64)


def _emulate_matrix(g: Graph, node, cfg: NpuConfig, vals: dict) -> np.ndarray:
    """A ``Dense`` / ``Conv`` as the device computes it (to FP16 roundings of the
    accumulation order): quantized inputs times the MRF's values (the placed FP16 matrix
    quantized with the node's weight exponents, or the dynamic ones), rounded to FP16,
    plus the FP16 bias, rounded to FP16; rows of its output as the float reference
    orders them."""
    view = _View(g, node, cfg.n)
    quant = node.attrs.get("quant") or {}
    x = vals[node.inputs[0]]
    v = _device_inputs(view, x, cfg, quant)
    wq = bfp.quantize(_fp16(view.matrix), cfg.n, cfg.mantissa_bits_w, _ROUNDING,
                      exponent=quant.get("weight_exponents")).dequantize()
    y = _f16(v @ wq.astype(np.float64).T)
    if len(node.inputs) > 2:
        y = _f16(y + _f16(g.initializers[node.inputs[2]]))
    return y.transpose(0, 2, 1).reshape(len(x), -1)


def quantized_activations(graph: Graph, config, data) -> dict:
    """Every tensor of ``graph`` as the device computes it, emulated in NumPy on the
    calibration set: matrix layers by their settings (``attrs["quant"]``: input exponent,
    weight exponents; without them the device's dynamic exponents), every other op on
    the float reference's formula with its result rounded to FP16 (recurrent layers
    included: their internal quantization is not emulated). Not bit-exact (the device's
    accumulation and unary functions round differently); it is what error-compensated
    rounding takes as a layer's inputs. Returns ``{tensor: float64 (samples,
    features)}`` like :func:`reference_activations`."""
    cfg = as_config(config)
    rows = data[graph.inputs[0]] if isinstance(data, dict) else load_calibration(data, graph)
    vals = {graph.inputs[0]: _f16(rows)}
    for node in graph.nodes:
        vals[node.outputs[0]] = _emulate_matrix(graph, node, cfg, vals) \
            if node.op in MATRIX_OPS else _f16(_node_value(node, graph, vals))
    return vals


#: Smallest step ``2^(e - (m - 2))`` whose multiples FP16 holds exactly (its subnormal
#: step): blocks with finer steps keep nearest rounding (see :func:`_round_weights`).
_FP16_STEP_EXP = -24
#: Largest weight mantissa width whose codes FP16 holds exactly (11 significant bits).
_FP16_MANTISSA_BITS = 12


def _unplace(view: _View, values: np.ndarray, shape) -> np.ndarray:
    """The placed matrix ``values`` (``_View.matrix``'s layout) back in the initializer's
    layout ``shape`` (float32): the inverse of ``window_matrix`` for a ``Conv`` or a
    map-reading ``Dense``; its padding columns must be zero."""
    if view.map is None and view.node.op != "Conv":
        return values.astype(np.float32).reshape(shape)
    rows = values.shape[0]
    c, kh, kw = (shape[1], *shape[2:]) if view.node.op == "Conv" else \
        (view.map[0], *view.map[1:])
    p = -(-c // view.n) * view.n
    m = values.reshape(rows, kh, kw, p)
    if np.any(m[..., c:]):
        raise AssertionError("calibrated weights in the padding columns")   # a bug
    return m[..., :c].transpose(0, 3, 1, 2).astype(np.float32).reshape(shape)


def _frozen(e: np.ndarray, mw: int) -> np.ndarray:
    """Blocks whose chosen values FP16 could not hold, which keep nearest rounding (the
    compiler takes FP16 weights): steps below FP16's subnormal step, or mantissas wider
    than FP16's significand."""
    return (e - (mw - 2) < _FP16_STEP_EXP) | (mw > _FP16_MANTISSA_BITS)


def _placeable(w: np.ndarray, chosen: np.ndarray, e: np.ndarray, frozen: np.ndarray,
               n: int) -> np.ndarray:
    """The values a layer's weights ``w`` take: ``chosen``, but ``w`` itself in frozen
    and all-zero blocks; checked to be FP16 numbers."""
    fixed = np.repeat(frozen | (e == ZERO_BLOCK_EXP), n, axis=-1)[:, :w.shape[1]]
    values = np.where(fixed, w, chosen)
    if not np.array_equal(_fp16(values).astype(np.float64), values):
        raise AssertionError("chosen weights not exact in FP16")             # a bug
    return values


def _round_weights(g: Graph, node, cfg: NpuConfig, qvals: dict, w16: np.ndarray):
    """Error-compensated mantissas and bias correction of one layer
    (:func:`host.quant.rounding.round_layer`) on its device inputs (``qvals``, the
    layers before with their final settings); writes the chosen values into ``g``'s
    weights (exactly representable in FP16, so the compiler's MRF words are those
    mantissas) and bias. Returns ``(the placed values, the report's rounding record)``."""
    n, mw = cfg.n, cfg.mantissa_bits_w
    view = _View(g, node, n)
    quant = node.attrs["quant"]
    x = _device_inputs(view, qvals[node.inputs[0]], cfg, quant)
    x = x.reshape(-1, x.shape[-1])
    w = w16.astype(np.float64)
    e = np.asarray(quant["weight_exponents"], np.int32)
    b = g.initializers[node.inputs[2]].astype(np.float64) if len(node.inputs) > 2 else None
    frozen = _frozen(e, mw)
    res = round_layer(w, x, e, n, mw, b, frozen=frozen)
    values = _placeable(w, res.values, e, frozen, n)
    shape = g.initializers[node.inputs[1]].shape
    wname, bname = f"{node.name}.W~", f"{node.name}.b~"
    g.initializers[wname] = _unplace(view, values, shape)
    g.initializers[bname] = res.bias.astype(np.float32)
    node.inputs[1:] = [wname, bname]
    size = max(len(x), 1) * w.shape[0]
    d = values - w
    return values, {
        "method": "gptq", "weight_mse": float((d * d).mean()), "rows": int(w.shape[0]),
        "rows_gptq": res.rows_gptq, "inputs": len(x), "output_mse": res.error / size,
        "output_mse_nearest": res.error_nearest / size,
        "output_mse_nearest_corrected": res.error_nearest_corrected / size,
        "bias_corrected": True}


def _calibrate_recurrent(g: Graph, node, cfg: NpuConfig, ref: dict, qvals: dict | None):
    """Calibrate one ``LSTM`` / ``GRU`` node of ``g`` in place (``method="mmse"``; module
    docstring, ``docs/calibration.md`` section 8) and return its report record.

    * The static exponents of its two input quantizers, on ``x`` (every step's input)
      and on ``h`` (the initial state and every step's state but the last, what the
      products on ``h`` read), by :func:`activation_exponent` on the float reference's
      values, each kept only where it beats the dynamic exponent. GRU's ``r * h`` (the
      product of n without ``linear_before_reset``) shares ``h``'s.
    * The block exponents of ``W`` and ``R`` by :func:`weight_exponents`.
    * With ``qvals`` (error-compensated rounding): the mantissas of ``W`` by output error
      on the layer's device inputs (``x`` quantized with its setting), those of ``R`` on
      ``h`` as the float recurrence computes it from those inputs (FP16, quantized with
      its setting), each with its bias correction: ``W``'s and ``R``'s into the summed
      bias, GRU's n rows of ``R`` with ``linear_before_reset`` into ``b_hn``; without it
      they read ``r * h``, so they keep nearest rounding. The chosen values (FP16-exact)
      become the node's weights.
    """
    n, mv, mw = cfg.n, cfg.mantissa_bits_v, cfg.mantissa_bits_w
    hidden, steps = int(node.attrs["hidden"]), int(node.attrs["steps"])
    gates = 4 if node.op == "LSTM" else 3
    lbr = bool(node.attrs.get("linear_before_reset", 0))
    x = ref[node.inputs[0]]
    h0 = np.broadcast_to(g.initializers[node.inputs[4]].astype(np.float64),
                         (len(x), 1, hidden))
    hs = ref[node.outputs[0]].reshape(len(x), steps, hidden)
    quant = {"input_exponent": None, "state_exponent": None, "offset": None}
    rec = {"name": _name(node), "node": node.name, "op": node.origin[1] or node.op,
           "method": "mmse", "recurrent": True}
    w16 = {i: _fp16(g.initializers[node.inputs[i]]) for i in (1, 2)}
    exps = {i: weight_exponents(w16[i], n, mw, _ROUNDING) for i in (1, 2)}
    rec["offset"] = _recurrent_offset(g, node, cfg, ref, qvals, w16[1], exps[1])
    x = ref[node.inputs[0]]                     # x - m where an offset was placed
    xs = x.reshape(len(x), steps, -1)
    for field, key, samples in (("input_exponent", "input", xs),
                                ("state_exponent", "state",
                                 np.concatenate([h0, hs[:, :-1]], axis=1))):
        cal, why = _input_choice(_fp16(samples), n, mv)
        if cal is not None and cal.choice == "static":
            quant[field] = cal.exponent_code
        rec[key] = {"mode": "static" if quant[field] is not None else "dynamic",
                    "exponent": None if quant[field] is None else cal.exponent,
                    "mse_dynamic": None if cal is None else cal.mse_dynamic,
                    "mse_static": None if cal is None else cal.mse_static,
                    "best_static": None if cal is None else cal.exponent,
                    **({"why": why} if cal is None else {})}
    total = {"mse": 0.0, "mse_max_based": 0.0, "clipped": 0, "size": 0}
    for i, field in ((1, "weight_exponents"), (2, "recurrence_exponents")):
        e = exps[i]
        quant[field] = e
        dynamic = bfp.quantize(w16[i], n, mw, _ROUNDING)
        calibrated = bfp.quantize(w16[i], n, mw, _ROUNDING, exponent=e)
        total["mse"] += _sq_error(w16[i], calibrated)
        total["mse_max_based"] += _sq_error(w16[i], dynamic)
        total["clipped"] += calibrated.saturation_count
        total["size"] += w16[i].size
        rec[field] = _exponent_summary(e, dynamic.exponents)
    size = total.pop("size")
    rec["weights"] = {"mode": "calibrated", "mse": total["mse"] / size,
                      "mse_max_based": total["mse_max_based"] / size,
                      "clipped": total["clipped"], "rounding": {"method": "nearest"}}
    node.attrs["quant"] = quant
    if qvals is None:
        return rec

    def device(rows, code):                       # quantized as the product's input
        e = None if code is None else int(code) - E8M0_BIAS
        return bfp.quantize(_fp16(rows), n, mv, _ROUNDING, exponent=e,
                            nonfinite="saturate").dequantize().astype(np.float64)
    xq = qvals[node.inputs[0]]
    x_dev = device(xq.reshape(len(xq) * steps, -1), quant["input_exponent"])
    h_run = _f16(_node_value(node, g, qvals)).reshape(len(xq), steps, hidden)
    h_prev = np.concatenate([h0[:len(xq)], h_run[:, :-1]], axis=1).reshape(-1, hidden)
    h_dev = device(h_prev, quant["state_exponent"])
    b = g.initializers[node.inputs[3]].astype(np.float64).copy()
    rows = gates * hidden
    # R's rows rounded by output error on h: all of them, but GRU's n rows without
    # linear_before_reset (they read r * h).
    r_rows = rows if node.op == "LSTM" or lbr else 2 * hidden
    parts = {}
    for i, inp, nrows in ((1, x_dev, rows), (2, h_dev, r_rows)):
        w = w16[i].astype(np.float64)
        e = np.asarray(quant["weight_exponents" if i == 1 else "recurrence_exponents"],
                       np.int32)
        frozen = _frozen(e, mw)
        res = round_layer(w[:nrows], inp, e[:nrows], n, mw, b[:rows] if i == 1 else None,
                          frozen=frozen[:nrows])
        chosen = w.copy()
        chosen[:nrows] = res.values
        if nrows < len(w):                    # nearest rounding for the rest
            chosen[nrows:] = bfp.quantize(w16[i][nrows:], n, mw, _ROUNDING,
                                          exponent=e[nrows:]).dequantize()
        values = _placeable(w, chosen, e, frozen, n)
        if i == 1:
            b[:rows] = res.bias
        elif node.op == "GRU" and lbr:        # U_n h + b_hn: n's correction into b_hn
            b[:2 * hidden] += res.bias[:2 * hidden]
            b[rows:rows + hidden] += res.bias[2 * hidden:]
        else:
            b[:nrows] += res.bias
        d = values - w
        parts["W" if i == 1 else "R"] = {
            "rows_gptq": res.rows_gptq, "inputs": len(inp),
            "output_mse": res.error / max(len(inp) * nrows, 1),
            "output_mse_nearest": res.error_nearest / max(len(inp) * nrows, 1),
            "weight_mse": float((d * d).mean())}
        name = _fresh(g, f"{node.name}.{'W' if i == 1 else 'R'}~")
        g.initializers[name] = values.astype(np.float32)
        node.inputs[i] = name
    name = _fresh(g, f"{node.name}.b~")
    g.initializers[name] = b.astype(np.float32)
    node.inputs[3] = name
    rec["weights"]["rounding"] = {"method": "gptq", "bias_corrected": True, **parts}
    qvals[node.outputs[0]] = _f16(_node_value(node, g, qvals))
    return rec


def _recurrent_offset(g: Graph, node, cfg: NpuConfig, ref: dict, qvals: dict | None,
                      w16: np.ndarray, e: np.ndarray) -> dict:
    """Seed 002's offset on the input ``x`` of recurrent ``node`` (every step's input
    vector; ``docs/calibration.md`` section 8): chosen as for a matrix layer
    (:func:`_offset_choice`), and placed where it lowers the input's error by the device
    op's margin (:data:`OFFSET_OP_GAIN`) and an ``Affine`` fits before the layer
    (:func:`_sequence_source`): the ``Affine`` subtracts ``m`` and the summed bias of
    the gates' ``W x`` rows becomes ``b + W m`` (``W`` the float weights ``w16`` when
    error-compensated rounding follows, else nearest rounding with block exponents
    ``e``). Returns the report's offset record."""
    n, mv, mw = cfg.n, cfg.mantissa_bits_v, cfg.mantissa_bits_w
    x = ref[node.inputs[0]]
    samples = x.reshape(-1, w16.shape[1])
    offset = {"value": None, "applied": False}
    cal, why = _input_choice(_fp16(samples), n, mv)
    if cal is None:
        return dict(offset, why=why)
    m, shifted, rule = _offset_choice(samples, n, mv)
    offset.update(value=m, rule=rule, mse=None if shifted is None else _best(shifted))
    place = _sequence_source(g, node.inputs[0])
    if not m:
        offset["why"] = "the offset is 0"
    elif shifted is None or _best(shifted) >= _best(cal):
        offset["why"] = "it does not lower the input's error"
    elif _best(shifted) > OFFSET_OP_GAIN * _best(cal):
        offset["why"] = (f"it lowers the input's error by less than "
                         f"{1 - OFFSET_OP_GAIN:.0%}, too little for a device op")
    elif place is None:
        offset["why"] = "no tensor before the layer has a channel axis for the device op"
    else:
        rows = len(w16)
        wm = (w16.astype(np.float64) if qvals is not None else
              bfp.quantize(w16, n, mw, _ROUNDING, exponent=e).dequantize().astype(np.float64))
        b = g.initializers[node.inputs[3]].astype(np.float64).copy()
        b[:rows] = fold_offset(wm, b[:rows], m)
        name = _fresh(g, f"{node.name}.b+Wm")
        g.initializers[name] = b.astype(np.float32)
        node.inputs[3] = name
        op = _place_offset(g, node, m, *place, ref, qvals)
        offset.update(applied=True, op=op, why=f"subtracted by the device op {op}")
    return offset


def _exponent_summary(e, dynamic) -> dict:
    e = np.asarray(e, np.int32)
    d = np.asarray(dynamic, np.int32)
    live = d != ZERO_BLOCK_EXP
    return {"exponents": [int(e[live].min()), int(e[live].max())] if live.any() else [],
            "blocks": int(live.sum()),
            "blocks_lowered": int((e < d)[live].sum()),
            "blocks_raised": int((e > d)[live].sum())}


#: An offset that needs a device op (not folded into a producing layer's bias) is placed
#: only where it brings the input's squared error to at most this share of what it is
#: without (``docs/calibration.md`` section 5).
OFFSET_OP_GAIN = 0.9


def _offset_choice(samples: np.ndarray, n: int, m: int):
    """``(offset, its ActivationCalibration, rule)`` of least input error among seed
    002's offset (:func:`~host.quant.calibrate.activation_offset`, rule ``"minimum"``)
    and the centre of the range (:func:`~host.quant.calibrate.activation_centre`, rule
    ``"centre"``), each rounded to FP16 (the device holds it so); ``(0.0, None, None)``
    when both are 0."""
    best = (0.0, None, None)
    for rule, value in (("minimum", activation_offset(samples)),
                        ("centre", activation_centre(samples))):
        v = float(_fp16(value))
        if not v:
            continue
        cal, _ = _input_choice(_fp16(samples - v), n, m)
        if cal is not None and (best[1] is None or _best(cal) < _best(best[1])):
            best = (v, cal, rule)
    return best


def _fresh(g: Graph, base: str) -> str:
    """A tensor / initializer name ``g`` does not use yet, from ``base``."""
    name, k = base, 1
    while name in g.tensors or name in g.initializers:
        name, k = f"{base}~{k}", k + 1
    return name


def _insert_offset(g: Graph, node, m: float, ref: dict, qvals: dict | None,
                   device_w: np.ndarray | None = None) -> str:
    """Make ``node`` (a ``Dense`` / ``Conv``) read its input minus ``m`` through a new
    ``Affine`` node (:func:`_place_offset`) and give it the bias ``b + W m``, so that in
    real arithmetic the layer computes what it did. A ``Dense`` reading a flattened map
    gets the ``Affine`` on the map, before new copies of the ``Flatten`` / ``View`` nodes
    (the map keeps the lowering's layout, and its other readers keep the old values); a
    padding ``Conv``'s ``pad_value`` goes down by ``m`` too. ``device_w``: the placed
    matrix whose row sums make ``W m`` (default the float weights). ``ref`` and
    ``qvals`` (float and device values of the tensors) gain the new tensors. Returns the
    new node's name."""
    chain, src = [], node.inputs[0]
    if node.op == "Dense" and _layout(g, src) is not None:     # a Dense over a whole map
        p = g.producer(src)
        while p is not None and p.op in ("Flatten", "View"):
            chain.insert(0, p)
            src = p.inputs[0]
            if len(g.tensors[src].shape) == 4:
                break
            p = g.producer(src)
        if len(g.tensors[src].shape) != 4:
            chain, src = [], node.inputs[0]
    if node.op == "Conv" and any(node.attrs["pads"]):
        # The padded positions move with the values: W (x - m) over the window, the ring
        # included, is W x - m sum(W) everywhere, which the bias b + m sum(W) undoes.
        node.attrs["pad_value"] = float(node.attrs.get("pad_value", 0.0)) - m
    w = g.initializers[node.inputs[1]].astype(np.float64)
    b = g.initializers[node.inputs[2]] if len(node.inputs) > 2 else None
    bname = _fresh(g, f"{node.name}.b+Wm")
    wm = w.reshape(len(w), -1) if device_w is None else device_w
    g.initializers[bname] = fold_offset(wm, b, m).astype(np.float32)
    node.inputs[2:] = [bname]
    return _place_offset(g, node, m, chain, src, ref, qvals)


def _place_offset(g: Graph, node, m: float, chain: list, src: str, ref: dict,
                  qvals: dict | None) -> str:
    """Put an ``Affine`` node (scale 1, shift ``-m``; the device's MFU subtracts, rounding
    to FP16 once) on tensor ``src``, followed by new copies of the ``chain`` nodes
    (``Flatten`` / ``View`` from ``src`` to ``node``'s input), and make ``node`` read the
    result; the graph's other readers keep the old tensors. ``ref`` and ``qvals`` gain
    the new tensors. Returns the ``Affine`` node's name."""
    from host.compiler.ir import Node
    t = g.tensors[src]
    c = t.shape[1]
    scale, shift = _fresh(g, f"{node.name}.offset_scale"), _fresh(g, f"{node.name}.offset")
    g.initializers[scale] = np.ones(c, np.float32)
    g.initializers[shift] = np.full(c, -m, np.float32)
    out = _fresh(g, f"{src}-m")
    g.add_tensor(out, t.shape, t.dtype)
    new = [Node(_fresh(g, f"{node.name}.offset_op"), "Affine", [src, scale, shift], [out],
                origin=(f"{node.name} offset", "Affine"))]
    for nd in chain:
        o = _fresh(g, f"{nd.outputs[0]}-m")
        g.add_tensor(o, g.tensors[nd.outputs[0]].shape, g.tensors[nd.outputs[0]].dtype)
        new.append(Node(_fresh(g, f"{nd.name}-m"), nd.op, [out] + nd.inputs[1:], [o],
                        dict(nd.attrs), nd.origin))
        out = o
    at = g.nodes.index(node)
    g.nodes[at:at] = new
    node.inputs[0] = out
    for nd in new:
        ref[nd.outputs[0]] = _node_value(nd, g, ref)
        if qvals is not None:
            qvals[nd.outputs[0]] = _f16(_node_value(nd, g, qvals))
    return new[0].name


def _sequence_source(g: Graph, x: str):
    """``(chain, src)`` for an offset op before a recurrent layer reading ``x``: ``src``
    the nearest tensor back through ``View`` / ``Flatten`` nodes with a channel axis
    (axis 1 not the batch axis: an ``Affine`` needs one; a time-major sequence has the
    batch there), ``chain`` the nodes from it to ``x``; None when there is none."""
    def channels(name):
        shape = g.tensors[name].shape
        return len(shape) > 1 and shape[1] is not None
    chain, src = [], x
    while not channels(src):
        p = g.producer(src)
        if p is None or p.op not in ("Flatten", "View"):
            return None
        chain.insert(0, p)
        src = p.inputs[0]
    return chain, src


def _fold(g: Graph, prev, node, m: float, device_w: np.ndarray | None = None) -> None:
    """``W (x - m) + (b + W m)``: this layer's bias becomes ``b + W m`` and the producing
    layer's ``b - m`` (its result is then ``x - m``)."""
    w = g.initializers[node.inputs[1]]
    b = g.initializers[node.inputs[2]] if len(node.inputs) > 2 else None
    name = f"{node.name}.b+Wm"
    g.initializers[name] = fold_offset(w if device_w is None else device_w, b, m)
    node.inputs[2:] = [name]
    pw = g.initializers[prev.inputs[1]]
    pb = g.initializers[prev.inputs[2]].astype(np.float64) if len(prev.inputs) > 2 \
        else np.zeros(pw.shape[0])
    pname = f"{prev.name}.b-m"
    g.initializers[pname] = pb - m
    prev.inputs[2:] = [pname]


# --- runs on a device -------------------------------------------------------------------------

class _Runner:
    """The device side: prefix networks (a layer's inputs as the device computes them)
    and one-product probes (a layer's counters alone)."""

    def __init__(self, dev, cfg: NpuConfig, data_rows: np.ndarray, window: int = 4):
        self.dev, self.cfg, self.window = dev, cfg, window
        self.data_rows = data_rows

    def run_image(self, image, jobs) -> list:
        self.dev.load_image(image)
        return list(self.dev.stream(jobs, outputs=image.outputs, window=self.window,
                                    prologue=image.job_memories, vectors=image.inputs))

    def tensor_rows(self, graph: Graph, name: str):
        """``(rows, note)``: the rows of tensor ``name`` on the device (the data for the
        graph's input, through Flatten / View only; else the output of the nodes it
        depends on, compiled with their current settings; a map comes back in ONNX's
        order), or ``(None, why)`` when the device cannot give it (the prefix does not
        compile)."""
        from host.compiler.compare import prefix_graph
        from host.compiler.lower import CompileError
        from host.compiler.network import compile_graph
        sub = prefix_graph(graph, name)
        if all(nd.op in ("Flatten", "View") for nd in sub.nodes):
            return _fp16(self.data_rows).astype(np.float64), ""
        try:
            net = compile_graph(sub, self.cfg)
        except CompileError as exc:
            return None, f"the program ending at {name!r} does not compile ({exc})"
        return self.network_rows(net), ""

    def network_rows(self, net) -> np.ndarray:
        from host.compiler.network import signature_jobs, signature_outputs
        sig = net.signature
        x = self.data_rows.reshape(len(self.data_rows),
                                   *[d for d in sig["input_shape"] if d is not None])
        x = np.moveaxis(x, 0, sig["input_shape"].index(None))
        jobs = signature_jobs(x, sig, self.cfg.n)
        out = signature_outputs(np.stack(self.run_image(net.image, jobs)), sig)
        axis = sig["output_shape"].index(None)
        return np.moveaxis(out, axis, 0).reshape(len(jobs), -1).astype(np.float64)

    def probe(self, view: _View, quant: dict, x_rows: np.ndarray, narrow: int) -> dict:
        """The MVM counters of one layer's products alone on its input rows ``x_rows``:
        every product input (:meth:`_View.vectors`) through a one-chain program (``s_wr
        narrow``, the layer's input exponent, ``mv_mul`` of its matrix with the layer's
        words), as many products a job as the queues take (ITERATIONS; zero vectors pad
        the last job, and count nothing)."""
        from host.compiler.image import program_image
        from host.compiler.programs import Builder, native
        from host.spec.isa import Reg, Space
        cfg = self.cfg
        w16 = _fp16(view.matrix)
        rows, cols = w16.shape
        vecs = _fp16(view.vectors(x_rows)).reshape(-1, cols)
        v_in, v_out = -(-cols // cfg.n), -(-rows // cfg.n)
        per = max(1, min(len(vecs), cfg.netq_depth // v_in, cfg.netq_depth // v_out,
                         1 << 16))
        vecs = np.concatenate([vecs, np.zeros((-len(vecs) % per, cols), np.float16)])
        bld = Builder(cfg)
        bld.set(Reg.NARROW, narrow)
        slot = bld.matrix(w16, "w")
        bld.chain("netq", rows=rows, mv_mul=slot, cols=cols, writes=["netq"],
                  iterations=per, static_exponent=quant.get("input_exponent"))
        image = program_image(bld.finish())
        image.inputs = per * v_in
        if quant.get("weight_exponents") is not None:
            addr, words = bld.mrf_words(slot, w16, quant["weight_exponents"])
            image.memories = [(Space.MRF, addr, words) if Space(s) is Space.MRF else (s, a, d)
                              for s, a, d in image.memories]
        jobs = native(vecs, cfg.n, "inputs").reshape(-1, per * v_in, cfg.n)
        self.dev.clear_counters()
        self.run_image(image, jobs)
        counters = self.dev.counters()
        return {k: int(counters.get(k, 0)) for k in EVENT_COUNTERS}


def _open_device(device, cfg: NpuConfig, timeout: float = 10.0):
    """(Device, whether to close it): ``None`` / ``"model"`` is the reference model of
    exactly this build."""
    from host.compiler.network import config_text
    from host.runtime.device import Device
    if device is None or device == "model":
        return Device.open(f"model:{config_text(cfg)}"), True
    if isinstance(device, str):
        try:
            return Device.open(device, timeout=timeout), True
        except ValueError as exc:
            raise CalibrationError(str(exc)) from None
    return device, False


def _raised(quant: dict, policy: str, offset: int, base_w) -> dict:
    """``quant`` with the policy's exponents raised by ``offset``."""
    q = dict(quant)
    if not offset:
        return q
    if policy == "input":
        q["input_exponent"] = quant["input_exponent"] + offset
    else:
        live = base_w != ZERO_BLOCK_EXP
        q["weight_exponents"] = np.where(live, base_w + offset, base_w).astype(np.int16)
    return q


def _top_offset(policy: str, quant: dict, base_w, w16, x16, cfg) -> int:
    """The largest offset the layer's exponents allow: the exponent limit 15, and below
    the first offset at which every mantissa of what is raised is zero (no events there
    would be no overflow, only no data: DECISIONS)."""
    n = cfg.n
    if policy == "input":
        e = quant["input_exponent"] - E8M0_BIAS
        top = MVM_EXP_MAX - e

        def zero_at(o):
            return not bfp.quantize(x16, n, cfg.mantissa_bits_v, _ROUNDING,
                                    exponent=e + o).mantissas.any()
    else:
        live = base_w != ZERO_BLOCK_EXP
        if not live.any():
            return 0
        top = MVM_EXP_MAX - int(base_w[live].max())

        def zero_at(o):
            e = np.where(live, base_w + o, ZERO_BLOCK_EXP)
            return not bfp.quantize(w16, n, cfg.mantissa_bits_w, _ROUNDING,
                                    exponent=e).mantissas.any()
    for o in range(1, top + 1):
        if zero_at(o):
            return o - 1
    return top


def _summary(exps) -> list | None:
    if exps is None:
        return None
    e = np.asarray(exps, np.int32)
    live = e != ZERO_BLOCK_EXP
    return [int(e[live].min()), int(e[live].max())] if live.any() else []


def _error(device_rows: np.ndarray, ref_rows: np.ndarray) -> dict:
    d = device_rows - ref_rows
    norm = float(np.sqrt((ref_rows * ref_rows).sum()))
    return {"rel_rms": float(np.sqrt((d * d).sum()) / norm) if norm else None,
            "max_abs": float(np.abs(d).max()) if d.size else 0.0}


def _device_pass(g: Graph, cfg, records, ref, rows, dev, *, accumulator_bits,
                 overflow_threshold, window=4):
    """Steps 3 and 4 of the module docstring; updates ``g``'s settings and ``records``,
    returns the range-scaling section of the report (or None)."""
    runner = _Runner(dev, cfg, rows, window)
    narrow = NARROW_WIDTH_MAX if accumulator_bits is None else accumulator_bits
    layers = [nd for nd in g.nodes if nd.op in MATRIX_OPS]
    log = []
    for i, (node, rec) in enumerate(zip(layers, records)):
        view = _View(g, node, cfg.n)
        x_dev, note = runner.tensor_rows(g, node.inputs[0])
        quant = node.attrs["quant"]
        if i:           # the layer before's output error (x - m on the device: an offset)
            records[i - 1]["output_error"] = {"tensor": node.inputs[0], "note": note} \
                if x_dev is None else {"tensor": node.inputs[0], **_error(
                    x_dev + (quant.get("offset") or 0.0), ref[node.inputs[0]])}
        if x_dev is None:
            # The device cannot give this input: the probe takes the float reference's
            # (with the offset it would see), rounded to FP16.
            x_dev = ref[node.inputs[0]] - (quant.get("offset") or 0.0)
            rec["counts_inputs"] = f"float reference: {note}"
        w16 = _fp16(view.matrix)
        x16 = _fp16(view.samples(x_dev))
        if accumulator_bits is None:
            counts = runner.probe(view, quant, x_dev, narrow)
            rec["counts"] = {**counts, "narrow_width": narrow}
            continue
        policy = "input" if quant.get("input_exponent") is not None else "weights"
        base_w = None
        if policy == "weights":
            base_w = quant.get("weight_exponents")
            if base_w is None:
                base_w = bfp.quantize(w16, cfg.n, cfg.mantissa_bits_w, _ROUNDING).exponents
            base_w = np.asarray(base_w, np.int32)
        seen = {}

        def events_at(o, quant=quant, policy=policy, base_w=base_w, view=view, x_dev=x_dev,
                      seen=seen, rec=rec):
            q = _raised(quant, policy, o, base_w)
            counts = runner.probe(view, q, x_dev, narrow)
            events = layer_events(counts, policy == "input")
            seen[o] = (q, counts)
            log.append({"layer": rec["name"], "offset": o,
                        "input_exponent": None if q["input_exponent"] is None
                        else q["input_exponent"] - E8M0_BIAS,
                        "weight_exponents": _summary(q["weight_exponents"]),
                        "events": events, **counts})
            return events

        top = _top_offset(policy, quant, base_w, w16, x16, cfg)
        try:
            res = scale_until(events_at, 0, overflow_threshold, top)
        except ValueError as exc:
            raise CalibrationError(
                f"range scaling of layer {rec['name']!r} ({node.where()}): with a "
                f"{accumulator_bits}-bit accumulator and threshold {overflow_threshold} the "
                f"{'input exponent' if policy == 'input' else 'weight exponents'} ran out "
                f"of range (largest exponent {MVM_EXP_MAX}, or every mantissa zero above "
                f"offset {top}): {exc}") from None
        q, counts = seen[res.offset]
        node.attrs["quant"] = q
        rec["counts"] = {**counts, "narrow_width": narrow}
        rec["scaling"] = {"policy": policy, "offset": res.offset, "raised": res.raised,
                          "iterations": len(res.log)}
        if res.offset:
            if policy == "input":
                rec["input"]["exponent"] = q["input_exponent"] - E8M0_BIAS
            else:
                raised = bfp.quantize(w16, cfg.n, cfg.mantissa_bits_w, _ROUNDING,
                                      exponent=q["weight_exponents"])
                rec["weights"].update(exponents=_summary(q["weight_exponents"]),
                                      mode=rec["weights"]["mode"] + " (raised)",
                                      mse=_sq_error(w16, raised) / w16.size,
                                      clipped=raised.saturation_count)
    if accumulator_bits is None:
        return None
    return {"accumulator_bits": accumulator_bits, "threshold": overflow_threshold,
            "events": "narrow_events + weight_saturations + output_saturations + "
                      "vector_saturations (static inputs only)",
            "policy": "static inputs: the input exponent; dynamic inputs: every weight "
                      "block exponent", "log": log}


# --- the entry point --------------------------------------------------------------------------

def compile_calibrated(source, config=None, *, calibrate, method: str = "mmse",
                       accumulator_bits: int | None = None, overflow_threshold: int = 0,
                       device=None, window: int = 4, timeout: float = 10.0,
                       rounding: str = "gptq"):
    """Compile an ONNX model with exponents calibrated on ``calibrate``
    (``npu compile MODEL.onnx -o NET.npz --calibrate DATA.npy``).

    Parameters
    ----------
    source : path of an ``.onnx`` file or an ``onnx.ModelProto`` (as ``compile_onnx``)
    config : NpuConfig, parse_config text or None (the default build)
    calibrate : float array or path of a ``.npy`` file
        The calibration set, shaped like the model's input with the batch axis where
        ``Network.run`` takes it (:func:`load_calibration`).
    method : ``"mmse"`` (seed 002, default) or ``"max"`` (the device's max-based
        exponents, as an uncalibrated compile; the report still records the errors and
        counts)
    accumulator_bits : None or int 1..64
        ``K``: run range scaling (seed 000) with the narrow-accumulator check at ``K``
        bits.
    overflow_threshold : int >= 0
        ``T``: events accepted per layer over the whole calibration set.
    device : None, device string or ``host.runtime.device.Device``
        Where the counts and range scaling run; None or ``"model"``: the reference model
        of exactly this build. A ``Device`` is left open.
    window : runs in flight on the device (``Device.stream``)
    timeout : seconds to wait for each reply of a device opened from a string
    rounding : ``"gptq"`` (default) or ``"nearest"``: the weight mantissas of ``mmse``
        (:func:`calibrate_graph`)

    Returns
    -------
    host.compiler.network.Network
        ``image.extra["report"]["calibration"]`` holds the per-layer records and the
        range-scaling log (``docs/calibration.md`` section 6).

    Raises
    ------
    CalibrationError
        bad data, method, accumulator width or threshold; a device without the
        narrow-accumulator check (with ``accumulator_bits``); a device of another build;
        range scaling that runs out of exponent range (names the layer, with the log).
    host.compiler.onnx_import.OnnxImportError, host.compiler.lower.CompileError
        as ``compile_onnx``.
    host.runtime.device.DeviceError
        the device failed.
    """
    from host.compiler.network import compile_graph
    from host.compiler.onnx_import import import_onnx
    method = _check_method(method)
    if accumulator_bits is not None:
        try:
            accumulator_bits = check_int("accumulator_bits", accumulator_bits, 1,
                                         NARROW_WIDTH_MAX)
        except (TypeError, ValueError) as exc:
            raise CalibrationError(str(exc)) from None
    try:
        overflow_threshold = check_int("overflow_threshold", overflow_threshold, 0)
    except (TypeError, ValueError) as exc:
        raise CalibrationError(str(exc)) from None
    cfg = as_config(config)
    graph = import_onnx(source)
    label = os.fsdecode(source) if isinstance(source, (str, bytes, os.PathLike)) else ""
    rows = load_calibration(calibrate, graph)
    ref = reference_activations(graph, rows)
    g, records = calibrate_graph(graph, cfg, ref, method=method, rounding=rounding)
    for node in g.nodes:                 # the float values of offset nodes' tensors
        if node.outputs[0] not in ref:
            ref[node.outputs[0]] = _node_value(node, g, ref)
    dev, own = _open_device(device, cfg, timeout)
    try:
        try:
            dev_cfg = dev.config
        except AttributeError:                         # pragma: no cover
            dev_cfg = cfg
        from host.spec.image import NetworkImage
        try:
            NetworkImage(program=np.zeros(1, np.uint64), config=cfg.to_dict()) \
                .check_config(dev_cfg)
        except ValueError as exc:
            raise CalibrationError(f"device {dev.transport.name} does not fit the build: "
                                   f"{exc}") from None
        if accumulator_bits is not None:
            info = dev.info()
            if "narrow_events" not in dev.counters() or not info.get("narrow_check", 1):
                raise CalibrationError(
                    f"device {dev.transport.name} has no narrow-accumulator check (a build "
                    f"option; its counters have no narrow_events): range scaling with "
                    f"--accumulator-bits cannot count overflow events, stopped")
        # Counts and range scaling are the matrix layers' (recurrent records left out).
        scaling = _device_pass(g, cfg, [r for r in records if not r.get("recurrent")],
                               ref, rows, dev,
                               accumulator_bits=accumulator_bits,
                               overflow_threshold=overflow_threshold, window=window)
        net = compile_graph(g, cfg, source=label or graph.name)
        runner = _Runner(dev, cfg, rows, window)
        out = runner.network_rows(net)
        device_name = dev.transport.name
    finally:
        if own:
            dev.close()
    y = graph.outputs[0]
    err = _error(out, ref[y])
    if records:
        records[-1]["output_error"] = {"tensor": y, **err}
    net.image.extra["report"]["calibration"] = {
        "method": method, "rounding": rounding if method == "mmse" else None,
        "samples": len(rows),
        "data": os.fsdecode(calibrate) if isinstance(calibrate, (str, bytes, os.PathLike))
        else f"array {tuple(np.shape(calibrate))}",
        "device": device_name, "reference": "float64 evaluation of the model",
        "output_error": {"tensor": y, **err},
        "range_scaling": scaling, "layers": _jsonable(records)}
    return net


def _jsonable(x):
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    return x
