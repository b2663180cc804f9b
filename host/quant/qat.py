"""Quantization-aware training initialised by post-training calibration (seed 002).

:class:`DeviceModule` evaluates a compiler IR graph (:mod:`host.compiler.ir`) in PyTorch
the way the device computes it: every matrix product (``Dense``, ``Conv``) quantizes its
input per native vector and its weights per MRF word with :mod:`host.quant.fakequant`,
everything else runs on FP16 values (each op's result rounded to FP16). Its trainable
parameters are the layers' weights and biases (float32, as QAT frameworks keep them) and,
per ``Dense`` with a static input exponent, seed 002's learned saturation and offset:

* saturation: a real ``log2`` parameter ``t``; the device's exponent is ``round(t)`` (the
  device scales by powers of two, DECISIONS "Training"); the clip level is
  ``beta = top * 2**(round(t) - (m - 2))``. Gradients: the input's ``g * 1{|x - m| <
  beta}`` (straight through inside the range), and ``t``'s seed 002 saturation gradient
  ``sum g * sign(x - m) * 1{|x - m| >= beta}`` times ``d beta / d t = beta ln 2``
  (the rounding of ``t`` is passed straight through);
* offset: where calibration chose seed 002's activation offset ``m``, it is already
  folded into two biases (the producing layer's ``b - m``, this layer's ``b + W m``), so
  the quantizer sees ``x - m``; training those biases trains the offset (the gradient
  that reaches the producing bias through the quantizer is ``g * 1{inside}``, seed
  002's ``1 - 1{inside}`` for ``m`` being the part the clipped values pass to ``b + W m``).

The weights' block exponents stay those the module started with (calibrated, or the
max-based rule when there are none) and are re-derived by the max-based rule for blocks
without a setting. :func:`train_qat` trains it; :meth:`DeviceModule.export` writes the
trained network as ONNX (``onnx.helper``: Gemm / Conv / ... nodes named after the IR's
ONNX nodes) and the quantization settings as JSON, which ``npu compile --quant`` applies.

Recurrent layers (``LSTM``, ``GRU``, stacked or not, and the ``LastStep`` / ``View``
nodes around them) are computed as the compiled recurrent program computes them
(:mod:`host.compiler.lower_rnn`, ``programs.lstm_layer`` / ``gru_layer``): per step, the
products ``W x`` and ``U h`` with ``x`` and ``h`` quantized per native vector, each with
its static exponent where the node's ``attrs["quant"]`` has one (``input_exponent``,
``state_exponent``; a learned saturation each, keys ``<node>__x`` and ``<node>__h``) or
the dynamic one, and the weights per MRF word with their block exponents
(``weight_exponents``, ``recurrence_exponents``) or the max-based rule, each product
rounded once to FP16, then every gate operation of the device's chains in its order,
each rounded to FP16, with the MFU's own sigmoid and tanh
(:func:`host.quant.fakequant.unary`). Quantize once (stacked products) changes no bit: a
stacked product quantizes the same vector with the same settings and its rows are the
separate products' rows. Their initial states stay fixed; ``W``, ``R`` and the biases
are trained.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from host.compiler.network import as_config
from host.quant.fakequant import bfp, fp16, unary
from host.quant.quantfile import QUANT_VERSION, QatError, apply_quant, load_quant
from host.spec.formats import E8M0_BIAS, EXP_MAX, EXP_MIN, mantissa_max

__all__ = ["QatError", "DeviceModule", "train_qat", "graph_to_onnx", "load_quant",
           "apply_quant", "QUANT_VERSION", "LR_DROP_EPOCHS", "check_schedule"]

#: The IR ops that quantize (the matrix products) and carry ``attrs["quant"]``.
_MATRIX_OPS = ("Dense", "Conv")

#: Element-wise ops: the device's activation unit (bit for bit, fakequant.unary).
_ELEMENTWISE = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp"}

#: Recurrent ops and the inputs of theirs that are initial states (kept fixed).
_RECURRENT = {"LSTM": (4, 5), "GRU": (4,)}
#: A recurrent node's input quantizers: (saturation key suffix, its ``attrs["quant"]``
#: field); ``x`` the products on the layer's input, ``h`` those on the state (GRU's
#: ``r * h`` included).
_RECURRENT_INPUTS = (("x", "input_exponent"), ("h", "state_exponent"))
#: A recurrent node's matrices: (IR input index, its block exponents' field).
_RECURRENT_WEIGHTS = ((1, "weight_exponents"), (2, "recurrence_exponents"))
#: How far (a fraction of its block's step) ``latent_from`` moves a calibrated recurrent
#: weight towards its float value: less than half a step, so nearest rounding still
#: gives calibration's value.
LATENT_REACH = 0.45


class _LearnedInput(torch.autograd.Function):
    """``Q(x)`` with the static exponent ``round(t)``; seed 002's saturation gradients."""

    @staticmethod
    def forward(ctx, x, t, n, mbits):
        e = int(torch.clamp(torch.round(t), EXP_MIN, EXP_MAX))
        step = 2.0 ** (e - (mbits - 2))
        q = bfp(x.detach(), n, mbits, exponent=e)
        inside = x.abs() < (mantissa_max(mbits) + 0.5) * step
        ctx.save_for_backward(inside, torch.sign(x))
        ctx.beta = mantissa_max(mbits) * step
        return q

    @staticmethod
    def backward(ctx, g):
        inside, sign = ctx.saved_tensors
        grad_x = g * inside.to(g.dtype)
        grad_t = (g * sign * (~inside).to(g.dtype)).sum() * ctx.beta * math.log(2.0)
        return grad_x, grad_t.reshape(()).to(torch.float64), None, None


def _flatten_source(graph, name):
    """The 4-D tensor a ``Flatten`` / ``View`` chain made ``name`` from, or None."""
    node = graph.producer(name)
    while node is not None and node.op in ("Flatten", "View"):
        src = node.inputs[0]
        if len(graph.tensors[src].shape) == 4:
            return src
        node = graph.producer(src)
    return None


def _feeds_recurrent(graph, node) -> bool:
    """Whether ``node``'s result reaches an LSTM / GRU's input through views only."""
    for reader in graph.consumers(node.outputs[0]):
        if reader.op in _RECURRENT or (reader.op in ("View", "Flatten")
                                       and _feeds_recurrent(graph, reader)):
            return True
    return False


def _view(a, src, out_shape, dst):
    """An IR ``View`` / ``Flatten``: the same elements per batch row in the same order,
    the batch axis (None in the IR shapes ``src``, ``dst``) moving to its new place."""
    if None not in src or None not in dst:
        return a.reshape(out_shape)
    pa, pb = list(src).index(None), list(dst).index(None)
    rows = a.movedim(pa, 0)
    rows = rows.reshape(len(rows), *[d for d in dst if d is not None])
    return rows.movedim(0, pb)


class DeviceModule(torch.nn.Module):
    """A compiler IR graph as a PyTorch module computing what the device computes (the
    module docstring). ``graph`` a :class:`host.compiler.ir.Graph` (its ``Dense`` nodes'
    ``attrs["quant"]`` as :func:`host.quant.ptq.calibrate_graph` sets them, or none);
    ``config`` the build (NpuConfig, parse_config text or None); ``start`` the input
    exponents to begin with where a layer has none: ``"dynamic"`` (keep dynamic) or
    ``"default"`` (static, at the device's power-on ``Q_EXPONENT``, e = 0).
    An ``Affine`` whose result a recurrent layer reads (calibration's input offset) is
    not trained: the device runs it as one constant subtraction only.
    ``latent_from``: None, or the graph ``graph`` was calibrated from; its recurrent
    layers' float weights are where the latent weights of the calibrated ``W`` and
    ``R`` start, within their rounding cells (:meth:`_latent_from`).

    Raises
    ------
    QatError
        a bad ``start`` (an op without a PyTorch form is refused when it is evaluated).
    """

    def __init__(self, graph, config=None, *, start: str = "dynamic", latent_from=None):
        super().__init__()
        if start not in ("dynamic", "default"):
            raise QatError(f"start must be 'dynamic' or 'default', not {start!r}")
        self.graph = graph
        self.config = as_config(config)
        self.weights = torch.nn.ParameterDict()
        self.saturation = torch.nn.ParameterDict()
        self.weight_exponents = {}
        self.offsets = {}
        self.states = {}
        for node in graph.nodes:
            key = self._key(node)
            for i, name in enumerate(node.inputs[1:], 1):
                if name in graph.initializers:
                    value = torch.tensor(np.asarray(graph.initializers[name], np.float32))
                    if i in _RECURRENT.get(node.op, ()):
                        self.states[f"{key}__{i}"] = value
                    else:
                        # An input offset before a recurrent layer stays as calibrated:
                        # the device subtracts one constant there (lower._input_shift).
                        self.weights[f"{key}__{i}"] = torch.nn.Parameter(
                            value, requires_grad=not (node.op == "Affine" and
                                                      _feeds_recurrent(graph, node)))
            quant = node.attrs.get("quant") or {}
            if node.op in _RECURRENT:
                # Two quantizers (the products on x and on h), two matrices (W, R).
                for suffix, field in _RECURRENT_INPUTS:
                    self._add_saturation(f"{key}__{suffix}", quant.get(field), start)
                for i, field in _RECURRENT_WEIGHTS:
                    if quant.get(field) is not None:
                        self.weight_exponents[f"{key}__{i}"] = torch.as_tensor(
                            np.asarray(quant[field]), dtype=torch.int32)
                continue
            if node.op not in _MATRIX_OPS:
                continue
            self._add_saturation(key, quant.get("input_exponent"), start)
            self.offsets[node.name] = quant.get("offset")
            if quant.get("weight_exponents") is not None:
                self.weight_exponents[key] = torch.as_tensor(
                    np.asarray(quant["weight_exponents"]), dtype=torch.int32)
        if latent_from is not None:
            self._latent_from(latent_from)

    def _latent_from(self, source) -> None:
        """Move the recurrent layers' latent ``W`` and ``R`` (calibrated: on their
        blocks' grids) towards the float weights of the same node in ``source`` (the
        graph before calibration), each by at most :data:`LATENT_REACH` of its block's
        step: the device's values (nearest rounding) stay calibration's, and training
        starts where the float model's weights pull them (on the grid, the first
        change of a 3-bit weight needs half a step of consistent updates)."""
        by_name = {nd.name: nd for nd in source.nodes}
        mw = self.config.mantissa_bits_w
        for node in self.graph.nodes:
            old = by_name.get(node.name)
            if node.op not in _RECURRENT or old is None or old.op != node.op:
                continue
            key = self._key(node)
            for i, _ in _RECURRENT_WEIGHTS:
                exps = self.weight_exponents.get(f"{key}__{i}")
                target = np.asarray(source.initializers[old.inputs[i]], np.float64)
                param = self.weights[f"{key}__{i}"]
                if exps is None or target.shape != tuple(param.shape):
                    continue
                e = np.repeat(exps.numpy(), self.config.n, axis=1)[:, :target.shape[1]]
                reach = LATENT_REACH * 2.0 ** (e - (mw - 2))
                v = param.detach().to(torch.float64)
                moved = (v + torch.from_numpy(np.clip(target - v.numpy(), -reach, reach))
                         ).to(param.dtype)
                # Where FP16 would round the moved value into the next cell (wide
                # mantissas: FP16's spacing near a step), the weight stays on its grid.
                same = bfp(fp16(moved.to(torch.float64)), self.config.n, mw,
                           exponent=exps) == bfp(fp16(v), self.config.n, mw, exponent=exps)
                with torch.no_grad():
                    param.copy_(torch.where(same, moved, param))

    def _add_saturation(self, key: str, code, start: str) -> None:
        """A learned saturation ``key`` from the E8M0 ``code`` (None: dynamic, or the
        default e = 0 with ``start="default"``)."""
        if code is None and start == "default":
            code = E8M0_BIAS
        if code is not None:
            self.saturation[key] = torch.nn.Parameter(
                torch.tensor(float(code - E8M0_BIAS), dtype=torch.float64))

    @staticmethod
    def _key(node) -> str:
        return "".join(c if c.isalnum() else "_" for c in node.name)

    # --- forward ---------------------------------------------------------------------
    def _quant_input(self, node, x, vals):
        """The device's quantization of a matrix product's input: per native vector,
        i.e. along the channels of each pixel for a map (also one flattened for Dense)."""
        key = self._key(node)
        src = _flatten_source(self.graph, node.inputs[0]) if node.op == "Dense" else None
        if node.op == "Conv" or src is not None:
            x4 = vals[src] if src is not None else x
            x = fp16(x4.permute(0, 2, 3, 1))                 # channels last: per pixel
        else:
            x = fp16(x)
        q = self._quantize(key, x)
        if node.op == "Conv" or src is not None:
            q = q.permute(0, 3, 1, 2)
            return q if node.op == "Conv" else q.reshape(len(q), -1)
        return q

    def _quantize(self, key: str, v):
        """``v`` (FP16 values, a vector per row) quantized per native vector: with the
        learned static exponent ``key`` where there is one, else the dynamic one."""
        cfg = self.config
        if key in self.saturation:
            return _LearnedInput.apply(v, self.saturation[key], cfg.n, cfg.mantissa_bits_v)
        return bfp(v, cfg.n, cfg.mantissa_bits_v)

    def _quant_weight(self, node, w):
        cfg, key = self.config, self._key(node)
        exps = self.weight_exponents.get(key)
        if node.op == "Conv":               # one MRF word per (out, ky, kx, channel block)
            w4 = w.permute(0, 2, 3, 1)
            e4 = None if exps is None else exps.reshape(*w4.shape[:3], -1)
            return bfp(fp16(w4), cfg.n, cfg.mantissa_bits_w, exponent=e4).permute(0, 3, 1, 2)
        src = _flatten_source(self.graph, node.inputs[0])
        if src is not None:
            # A Dense reading a flattened map: its columns are laid out per pixel on the
            # device (lower.window_matrix), one MRF word per (out, pixel, channel block).
            c, h, wd = self.graph.tensors[src].shape[1:]
            w4 = w.reshape(len(w), c, h, wd).permute(0, 2, 3, 1)
            e4 = None if exps is None else exps.reshape(len(w), h, wd, -1)
            q = bfp(fp16(w4), cfg.n, cfg.mantissa_bits_w, exponent=e4)
            return q.permute(0, 3, 1, 2).reshape(w.shape)
        return bfp(fp16(w), cfg.n, cfg.mantissa_bits_w, exponent=exps)

    def _recurrent(self, node, a):
        """Every step's ``h`` of an LSTM / GRU node on ``a`` (its input in the IR's
        layout), in the IR's output layout; the device's arithmetic (module docstring)."""
        cfg, key = self.config, self._key(node)
        n, mw = cfg.n, cfg.mantissa_bits_w
        batch_first = self.graph.tensors[node.inputs[0]].shape[0] is None
        xs = a if batch_first else a.transpose(0, 1)                 # (batch, T, I)
        hidden, steps = int(node.attrs["hidden"]), int(node.attrs["steps"])
        w, r, b = (self.weights[f"{key}__{i}"].to(torch.float64) for i in (1, 2, 3))
        wq, rq = (bfp(fp16(v), n, mw, exponent=self.weight_exponents.get(f"{key}__{i}"))
                  for i, v in ((1, w), (2, r)))
        b = fp16(b)

        def qx(v):                          # the product's input quantizer, on x or h
            return self._quantize(f"{key}__x", fp16(v))

        def qh(v):
            return self._quantize(f"{key}__h", v)
        h = fp16(self.states[f"{key}__4"].to(torch.float64)).expand(len(xs), hidden)
        out = []
        if node.op == "LSTM":
            c = fp16(self.states[f"{key}__5"].to(torch.float64)).expand(len(xs), hidden)
            for t in range(steps):
                # W x + b (W_fio, W_c), then per h group U h + that, the gate chains.
                xw = fp16(fp16(qx(xs[:, t]) @ wq.T) + b)
                pre = fp16(fp16(qh(h) @ rq.T) + xw)
                sig = unary("sigmoid", pre[:, :3 * hidden])
                f, i, o = sig.split(hidden, dim=1)
                fc = fp16(f * c)                            # f's chain: times c
                c = fp16(fp16(unary("tanh", pre[:, 3 * hidden:]) * i) + fc)
                h = fp16(unary("tanh", c) * o)
                out.append(h)
        else:
            lbr = bool(node.attrs.get("linear_before_reset", 0))
            b_zrn, b_hn = b[:3 * hidden], b[3 * hidden:]
            for t in range(steps):
                xw = fp16(fp16(qx(xs[:, t]) @ wq.T) + b_zrn)
                xz, xr, xn = xw.split(hidden, dim=1)
                hq = qh(h)
                if lbr:
                    uz, ur, un = fp16(hq @ rq.T).split(hidden, dim=1)
                    z, rr = unary("sigmoid", fp16(uz + xz)), unary("sigmoid", fp16(ur + xr))
                    nn = unary("tanh", fp16(fp16(fp16(un + b_hn) * rr) + xn))
                else:
                    uz, ur = fp16(hq @ rq[:2 * hidden].T).split(hidden, dim=1)
                    z, rr = unary("sigmoid", fp16(uz + xz)), unary("sigmoid", fp16(ur + xr))
                    rh = qh(fp16(h * rr))
                    nn = unary("tanh", fp16(fp16(rh @ rq[2 * hidden:].T) + xn))
                h = fp16(fp16(fp16(h - nn) * z) + nn)         # (h - n) * z + n
                out.append(h)
        if batch_first:
            return torch.stack(out, 1).unsqueeze(2)                  # (batch, T, 1, H)
        return torch.stack(out, 0).unsqueeze(1)                      # (T, 1, batch, H)

    def forward(self, x):
        g = self.graph
        vals = {g.inputs[0]: x.to(torch.float64)}
        in_shape = list(g.tensors[g.inputs[0]].shape)
        batch = x.shape[in_shape.index(None)] if None in in_shape else len(x)
        for node in g.nodes:
            key = self._key(node)
            a = vals[node.inputs[0]]
            params = [self.weights[f"{key}__{i}"].to(torch.float64)
                      for i in range(1, len(node.inputs)) if f"{key}__{i}" in self.weights]
            out_shape = [batch if d is None else d for d in g.tensors[node.outputs[0]].shape]
            if node.op == "Dense":
                xq = self._quant_input(node, a, vals)
                y = fp16(xq @ self._quant_weight(node, params[0]).T)
                if len(params) > 1:
                    y = fp16(y + fp16(params[1]))
            elif node.op == "Conv":
                (sh, sw), (top, left, bottom, right) = node.attrs["strides"], node.attrs["pads"]
                # The device quantizes the padded positions too (the ring in memory is
                # read with the window): 0 stays 0, a pad_value does not.
                padded = torch.nn.functional.pad(a, (left, right, top, bottom),
                                                 value=float(node.attrs.get("pad_value", 0.0)))
                xq = self._quant_input(node, padded, vals)
                y = fp16(torch.nn.functional.conv2d(xq, self._quant_weight(node, params[0]),
                                                    stride=(sh, sw)))
                if len(params) > 1:
                    y = fp16(y + fp16(params[1]).reshape(1, -1, 1, 1))
            elif node.op in _ELEMENTWISE:
                y = unary(_ELEMENTWISE[node.op], a)
            elif node.op in ("MaxPool", "AveragePool"):
                y = fp16(self._pool(node, a))
            elif node.op in ("Add", "Sub", "Mul"):
                b = vals[node.inputs[1]]
                y = fp16(a + b if node.op == "Add" else a - b if node.op == "Sub" else a * b)
            elif node.op == "Affine":
                shape = (1, -1) + (1,) * (a.dim() - 2)
                y = fp16(fp16(a * fp16(params[0]).reshape(shape)) +
                         fp16(params[1]).reshape(shape))
            elif node.op == "Clip":
                lo, hi = node.attrs.get("lo"), node.attrs.get("hi")
                y = torch.clamp(a, min=lo, max=hi)
            elif node.op == "LeakyRelu":
                y = fp16(torch.maximum(a, fp16(a * node.attrs["alpha"])))
            elif node.op == "Softmax":
                y = fp16(torch.softmax(a, dim=-1))
            elif node.op in ("Flatten", "View"):
                y = _view(a, g.tensors[node.inputs[0]].shape, out_shape,
                          g.tensors[node.outputs[0]].shape)
            elif node.op in _RECURRENT:
                y = self._recurrent(node, a)
            elif node.op == "LastStep":
                axis = node.attrs["axis"]
                y = a.narrow(axis, a.shape[axis] - 1, 1)
                if len(out_shape) < a.dim():
                    y = y.squeeze(axis)
            else:
                raise QatError(f"{node.where()}: no PyTorch form for IR op {node.op}")
            vals[node.outputs[0]] = y
        return vals[g.outputs[0]].to(x.dtype)

    @staticmethod
    def _pool(node, a):
        (sh, sw), (top, left, bottom, right) = node.attrs["strides"], node.attrs["pads"]
        kernel = tuple(node.attrs["kernel"])
        if node.op == "MaxPool":
            padded = torch.nn.functional.pad(a, (left, right, top, bottom),
                                             value=-float("inf"))
            return torch.nn.functional.max_pool2d(padded, kernel, (sh, sw))
        padded = torch.nn.functional.pad(a, (left, right, top, bottom))
        total = torch.nn.functional.avg_pool2d(padded, kernel, (sh, sw)) * \
            (kernel[0] * kernel[1])
        if node.attrs.get("count_include_pad", 0):
            return total / (kernel[0] * kernel[1])
        ones = torch.nn.functional.pad(torch.ones_like(a[:1, :1]), (left, right, top, bottom))
        count = torch.nn.functional.avg_pool2d(ones, kernel, (sh, sw)) * \
            (kernel[0] * kernel[1])
        return total / count

    # --- results ---------------------------------------------------------------------
    def settings(self) -> dict:
        """Per ``Dense`` / ``Conv`` node name: the quantization settings the device runs
        (``input_exponent`` an E8M0 code or None, ``weight_exponents`` a list of lists or
        None, ``offset`` a float or None); per ``LSTM`` / ``GRU``, ``input_exponent`` and
        ``state_exponent`` (codes or None), ``weight_exponents`` and
        ``recurrence_exponents`` (lists of lists or None), ``offset`` None."""
        out = {}
        for node in self.graph.nodes:
            key = self._key(node)
            if node.op in _RECURRENT:
                out[node.name] = {field: self._code(f"{key}__{suffix}")
                                  for suffix, field in _RECURRENT_INPUTS}
                for i, field in _RECURRENT_WEIGHTS:
                    w = self.weight_exponents.get(f"{key}__{i}")
                    out[node.name][field] = None if w is None else w.tolist()
                out[node.name]["offset"] = None
            if node.op not in _MATRIX_OPS:
                continue
            w = self.weight_exponents.get(key)
            out[node.name] = {
                "input_exponent": self._code(key),
                "weight_exponents": None if w is None else w.tolist(),
                "offset": self.offsets.get(node.name),
            }
        return out

    def _code(self, key: str):
        """The E8M0 code the device runs for the learned saturation ``key``, or None
        (dynamic)."""
        if key not in self.saturation:
            return None
        return int(torch.clamp(torch.round(self.saturation[key].detach()),
                               EXP_MIN, EXP_MAX)) + E8M0_BIAS

    def trained_graph(self):
        """A copy of the graph with the trained weights (float32) and the settings in
        each ``Dense``'s ``attrs["quant"]`` (offsets are in the biases already)."""
        import copy
        g = copy.copy(self.graph)
        g.nodes = [copy.copy(nd) for nd in self.graph.nodes]
        g.initializers = dict(self.graph.initializers)
        settings = self.settings()
        for node in g.nodes:
            node.attrs = dict(node.attrs)
            node.inputs = list(node.inputs)
            key = self._key(node)
            for i in range(1, len(node.inputs)):
                if f"{key}__{i}" in self.weights:
                    g.initializers[node.inputs[i]] = \
                        self.weights[f"{key}__{i}"].detach().numpy().astype(np.float32)
            if node.op in _MATRIX_OPS or node.op in _RECURRENT:
                s = dict(settings[node.name])
                for field in ("weight_exponents", "recurrence_exponents"):
                    if s.get(field) is not None:
                        s[field] = np.asarray(s[field], np.int16)
                node.attrs["quant"] = s
        return g

    def export(self, onnx_path, quant_path) -> None:
        """Write the trained network as ONNX (:func:`graph_to_onnx`) and its quantization
        settings as JSON (``{"version", "n", "mantissa_bits_v", "mantissa_bits_w",
        "layers": {node name: settings}}``, :meth:`settings`: every Dense / Conv, LSTM and
        GRU), which ``npu compile --quant`` applies."""
        import onnx
        onnx.save(graph_to_onnx(self.trained_graph()), str(onnx_path))
        cfg = self.config
        Path(quant_path).write_text(json.dumps(
            {"version": QUANT_VERSION, "n": cfg.n, "mantissa_bits_v": cfg.mantissa_bits_v,
             "mantissa_bits_w": cfg.mantissa_bits_w, "layers": self.settings()}, indent=1))


#: Epochs at the end of :func:`train_qat` trained at a tenth of the rate.
LR_DROP_EPOCHS = 3


def check_schedule(epochs, lr, lr_drop_epochs) -> None:
    """Raise ``ValueError`` naming the parameter and the value unless ``epochs`` is an
    integer of at least 1, ``lr`` is positive and ``lr_drop_epochs`` an integer of at
    least 0 (:func:`train_qat`'s schedule; ``npu train`` checks it before writing)."""
    if not (isinstance(epochs, int) and epochs >= 1):
        raise ValueError(f"epochs must be an integer of at least 1, not {epochs!r}")
    if not lr > 0:
        raise ValueError(f"lr must be positive, not {lr!r}")
    if not (isinstance(lr_drop_epochs, int) and lr_drop_epochs >= 0):
        raise ValueError(f"lr_drop_epochs must be an integer of at least 0, not "
                         f"{lr_drop_epochs!r}")


def train_qat(module: DeviceModule, x_train, y_train, x_test, y_test, *, epochs: int = 10,
              lr: float = 1e-3, batch: int = 32, seed: int = 0, progress=None,
              wrap=None, lr_drop_epochs: int = LR_DROP_EPOCHS) -> list:
    """Train ``module`` (a classifier: its output is the logits) with Adam on
    cross-entropy; returns the held-out accuracy in percent after each epoch (the first
    entry is before training). The last ``lr_drop_epochs`` epochs, when ``epochs`` is
    larger, train at a tenth of ``lr`` (0: the rate stays ``lr``); see
    ``docs/training.md`` for why. ``progress``: None or a callable given a line per
    epoch. ``wrap``: None, or a callable that wraps the optimizer (e.g. ``lambda opt:
    LazyUpdate(opt, block_size=N)`` for seed 003's storage of the weights).

    Raises ``ValueError`` for ``epochs`` below 1, ``lr`` not above 0 or
    ``lr_drop_epochs`` below 0 (naming the parameter and the value).
    """
    check_schedule(epochs, lr, lr_drop_epochs)
    drop_from = epochs - lr_drop_epochs if 0 < lr_drop_epochs < epochs else epochs
    x_train = torch.as_tensor(np.asarray(x_train, np.float32))
    y_train = torch.as_tensor(np.asarray(y_train, np.int64))
    x_test = torch.as_tensor(np.asarray(x_test, np.float32))
    y_test = torch.as_tensor(np.asarray(y_test, np.int64))
    torch.manual_seed(seed)
    adam = opt = torch.optim.Adam(module.parameters(), lr=lr)
    if wrap is not None:
        opt = wrap(adam)
    gen = torch.Generator().manual_seed(seed)

    def accuracy():
        with torch.no_grad():
            return float((module(x_test).argmax(-1) == y_test).float().mean()) * 100

    curve = [accuracy()]
    for epoch in range(epochs):
        for group in adam.param_groups:
            group["lr"] = lr / 10 if epoch >= drop_from else lr
        order = torch.randperm(len(x_train), generator=gen)
        for i in range(0, len(order), batch):
            rows = order[i:i + batch]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(module(x_train[rows]), y_train[rows])
            loss.backward()
            opt.step()
        curve.append(accuracy())
        if progress is not None:
            rate = adam.param_groups[0]["lr"]
            progress(f"QAT epoch {epoch + 1}/{epochs} (rate {rate:g}): held-out accuracy "
                     f"{curve[-1]:.1f} %")
    return curve


def graph_to_onnx(graph):
    """The IR ``graph`` as an ONNX model (opset 18) built with ``onnx.helper``: ``Dense``
    as ``Gemm`` (``transB = 1``) named after the IR node, so that a quantization file's
    layer names find their layers again when ``npu compile`` imports it; ``LSTM`` /
    ``GRU`` as ONNX's (gates back in ONNX's order, the summed biases as ``Wb`` with a zero
    ``Rb``, GRU's ``b_hn`` as ``Rb_h``; initial states omitted when zero, else constants
    of one batch row, which the compiler takes and onnxruntime only at batch 1);
    ``LastStep`` as ``Gather`` of index -1; ``View`` as ``Squeeze`` / ``Transpose`` /
    ``Unsqueeze``.

    Raises
    ------
    QatError
        an IR op without an ONNX form here, a ``View`` that merges axes.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    inits, nodes = [], []

    def const(name, value, dtype=np.float32):
        inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    for node in graph.nodes:
        ins, out = list(node.inputs), node.outputs[0]
        a = node.attrs
        if node.op in _RECURRENT:
            nodes.append(_recurrent_onnx(graph, node, const))
            continue
        for name in ins[1:]:
            if name in graph.initializers and not any(i.name == name for i in inits):
                const(name, graph.initializers[name])
        if node.op == "LastStep":
            axis, keep = a["axis"], len(graph.tensors[out].shape) == \
                len(graph.tensors[ins[0]].shape)
            idx = const(f"{node.name}.index", [-1] if keep else -1, np.int64)
            nodes.append(helper.make_node("Gather", [ins[0], idx], [out], node.name,
                                          axis=axis))
        elif node.op == "View":
            nodes.extend(_view_onnx(graph, node, const))
        elif node.op == "Dense":
            nodes.append(helper.make_node("Gemm", ins, [out], node.name, transB=1))
        elif node.op in ("Relu", "Sigmoid", "Tanh", "Exp", "Add", "Sub", "Mul"):
            nodes.append(helper.make_node(node.op, ins, [out], node.name))
        elif node.op == "Softmax":
            nodes.append(helper.make_node("Softmax", ins, [out], node.name, axis=-1))
        elif node.op == "Flatten":
            nodes.append(helper.make_node("Flatten", ins, [out], node.name, axis=1))
        elif node.op == "Conv" and a.get("pad_value", 0.0):
            # ONNX's Conv pads with zeros: another value is a constant Pad before it.
            top, left, bottom, right = a["pads"]
            pads = const(f"{node.name}.pads", [0, 0, top, left, 0, 0, bottom, right],
                         np.int64)
            value = const(f"{node.name}.pad_value", a["pad_value"])
            nodes.append(helper.make_node("Pad", [ins[0], pads, value], [f"{out}.padded"],
                                          f"{node.name}.pad", mode="constant"))
            nodes.append(helper.make_node("Conv", [f"{out}.padded"] + ins[1:], [out],
                                          node.name, strides=list(a["strides"]),
                                          pads=[0, 0, 0, 0]))
        elif node.op == "Conv":
            nodes.append(helper.make_node("Conv", ins, [out], node.name,
                                          strides=list(a["strides"]), pads=_onnx_pads(a)))
        elif node.op in ("MaxPool", "AveragePool"):
            extra = {"count_include_pad": int(a.get("count_include_pad", 0))} \
                if node.op == "AveragePool" else {}
            nodes.append(helper.make_node(node.op, ins, [out], node.name,
                                          kernel_shape=list(a["kernel"]),
                                          strides=list(a["strides"]), pads=_onnx_pads(a),
                                          **extra))
        elif node.op == "Affine":
            rank = len(graph.tensors[ins[0]].shape)
            shape = (-1,) + (1,) * (rank - 2)
            scale = const(f"{node.name}.scale", graph.initializers[ins[1]].reshape(shape))
            shift = const(f"{node.name}.shift", graph.initializers[ins[2]].reshape(shape))
            nodes.append(helper.make_node("Mul", [ins[0], scale], [f"{out}.scaled"],
                                          f"{node.name}.mul"))
            nodes.append(helper.make_node("Add", [f"{out}.scaled", shift], [out], node.name))
        elif node.op == "Clip":
            bounds = [const(f"{node.name}.{k}", a[k]) if a.get(k) is not None else ""
                      for k in ("lo", "hi")]
            nodes.append(helper.make_node("Clip", [ins[0]] + bounds, [out], node.name))
        elif node.op == "LeakyRelu":
            nodes.append(helper.make_node("LeakyRelu", ins, [out], node.name,
                                          alpha=float(a["alpha"])))
        else:
            raise QatError(f"{node.where()}: no ONNX form for IR op {node.op} in the QAT "
                           f"export")

    def value_info(name):
        shape = ["batch" if d is None else int(d) for d in graph.tensors[name].shape]
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

    model = helper.make_model(
        helper.make_graph(nodes, "qat", [value_info(graph.inputs[0])],
                          [value_info(graph.outputs[0])], inits),
        opset_imports=[helper.make_opsetid("", 18)], producer_name="bfp-npu qat")
    onnx.checker.check_model(model)
    return model


def _recurrent_onnx(graph, node, const):
    """An IR ``LSTM`` / ``GRU`` as the ONNX node the importer turns back into it."""
    from onnx import helper

    from host.compiler.onnx_import import GRU_GATES, LSTM_GATES
    hidden = int(node.attrs["hidden"])
    lstm = node.op == "LSTM"
    order = LSTM_GATES if lstm else GRU_GATES          # builder gate -> ONNX block
    gates = "fioc" if lstm else "zrn"
    onnx_gates = sorted(gates, key=lambda g: order[g])
    w, r, b = (np.asarray(graph.initializers[i], np.float32) for i in node.inputs[1:4])

    def blocks(arr):
        return np.concatenate([arr[gates.index(g) * hidden:(gates.index(g) + 1) * hidden]
                               for g in onnx_gates])
    rb = np.zeros(len(gates) * hidden, np.float32)
    if not lstm and node.attrs.get("linear_before_reset", 0):
        rb[order["n"] * hidden:(order["n"] + 1) * hidden] = b[3 * hidden:]
    base = node.name
    ins = [node.inputs[0], const(f"{base}.onnx_W", blocks(w)[None]),
           const(f"{base}.onnx_R", blocks(r)[None]),
           const(f"{base}.onnx_B", np.concatenate([blocks(b[:len(gates) * hidden]), rb])[None]),
           ""]
    for k, what in ((4, "initial_h"), (5, "initial_c")):
        if k < len(node.inputs):
            state = np.asarray(graph.initializers[node.inputs[k]], np.float32)
            ins.append(const(f"{base}.onnx_{what}", state.reshape(1, 1, hidden))
                       if np.any(state != 0) else "")
    while ins[-1] == "":
        ins.pop()
    layout = 1 if graph.tensors[node.inputs[0]].shape[0] is None else 0
    extra = {} if lstm else {"linear_before_reset": int(node.attrs.get("linear_before_reset",
                                                                           0))}
    return helper.make_node(node.op, ins, [node.outputs[0]], base, hidden_size=hidden,
                            layout=layout, **extra)


def _view_onnx(graph, node, const) -> list:
    """An IR ``View`` as ``Squeeze`` (the size-1 axes it drops or moves), ``Transpose``
    (the batch axis) and ``Unsqueeze`` (the size-1 axes of the result), or ``Flatten``
    to ``(batch, features)``."""
    from onnx import helper
    src, dst = list(graph.tensors[node.inputs[0]].shape), \
        list(graph.tensors[node.outputs[0]].shape)
    core_src, core_dst = [d for d in src if d != 1], [d for d in dst if d != 1]
    x, out, made = node.inputs[0], node.outputs[0], []
    if [d for d in core_src if d is not None] != [d for d in core_dst if d is not None] \
            or core_src.count(None) != core_dst.count(None):
        if len(dst) == 2 and dst[0] is None and src[0] is None:
            return [helper.make_node("Flatten", [x], [out], node.name, axis=1)]
        raise QatError(f"{node.where()}: no ONNX form for a View of {src} as {dst} in the "
                       f"QAT export")
    steps = []
    if len(core_src) != len(src):
        steps.append(("Squeeze", [i for i, d in enumerate(src) if d == 1]))
    if core_src != core_dst:
        rest = [i for i, d in enumerate(core_src) if d is not None]
        perm = [core_src.index(None) if d is None else rest.pop(0) for d in core_dst]
        steps.append(("Transpose", perm))
    if len(core_dst) != len(dst):
        steps.append(("Unsqueeze", [i for i, d in enumerate(dst) if d == 1]))
    if not steps:
        steps.append(("Identity", None))
    for k, (op, arg) in enumerate(steps):
        y = out if k == len(steps) - 1 else f"{out}.{op.lower()}"
        name = node.name if k == len(steps) - 1 else f"{node.name}.{op.lower()}"
        if op in ("Squeeze", "Unsqueeze"):
            made.append(helper.make_node(op, [x, const(f"{name}.axes", arg, np.int64)], [y],
                                         name))
        elif op == "Transpose":
            made.append(helper.make_node(op, [x], [y], name, perm=arg))
        else:
            made.append(helper.make_node(op, [x], [y], name))
        x = y
    return made


def _onnx_pads(attrs) -> list:
    top, left, bottom, right = attrs["pads"]
    return [top, left, bottom, right]
