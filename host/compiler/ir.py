"""The network compiler's graph IR: what the importers produce and the lowering takes.

A :class:`Graph` is tensors (:class:`Tensor`: name, shape, dtype), nodes (:class:`Node`:
op type, input and output tensor names, attributes) and constant initializers (NumPy
arrays by name). It belongs to the project, not to ONNX: the ONNX importer
(:mod:`host.compiler.onnx_import`) normalises what it reads into these ops, and the
lowering (:mod:`host.compiler.lower`) knows only these ops.

Ops (:data:`OPS`). ``None`` in a shape is the batch axis: the first axis, except in the
sequences of the recurrent layers, which keep ONNX's seq-first layout (``(T, batch, I)``):
a tensor's elements per batch row are the others, row major, wherever the batch axis is.

``Dense``
    ``y = x @ W.T + b``; inputs ``[x, W, b]`` or ``[x, W]``, ``W`` an initializer of shape
    ``(out, in)``, ``b`` one of shape ``(out,)``; ``x`` is ``(batch, in)``.
``Relu``, ``Sigmoid``, ``Tanh``, ``Exp``
    element-wise, one input.
``Conv``
    2-D convolution, ``group = 1``, dilation 1: inputs ``[x, W, b]`` or ``[x, W]``, ``x``
    ``(batch, C_in, H, W)``, ``W`` an initializer ``(C_out, C_in, kh, kw)``, ``b``
    ``(C_out,)``; attributes ``strides`` ``(sh, sw)`` and ``pads`` ``(top, left, bottom,
    right)`` (explicit: ``auto_pad`` is resolved by the importer) and optionally
    ``pad_value``, the value of every padded position (default 0; an ONNX ``Pad`` in
    constant mode before the ``Conv`` sets it, and so does a calibrated input offset,
    ``host.quant.ptq``); output
    ``(batch, C_out, oh, ow)`` with ``oh = (H + top + bottom - kh) // sh + 1``
    (:func:`window_out`).
``MaxPool``, ``AveragePool``
    over each channel's ``kernel`` ``(kh, kw)`` window: attributes ``kernel``,
    ``strides``, ``pads`` as ``Conv``'s; ``AveragePool`` also ``count_include_pad`` (1:
    divide by ``kh * kw``; 0: by the window's positions inside the map). A
    ``GlobalAveragePool`` is an ``AveragePool`` over the whole map. Padded positions of a
    ``MaxPool`` never win.
``Add``, ``Sub``, ``Mul``
    element-wise on two data tensors of the same shape (residual connections).
``Affine``
    ``y = x * scale + shift`` per channel (axis 1: the channels of ``(batch, C, H, W)``,
    the features of ``(batch, F)``): inputs ``[x, scale, shift]``, initializers of shape
    ``(C,)`` (a ``BatchNormalization`` with no convolution or dense layer to fold into,
    or a ``Mul`` / ``Add`` by a constant).
``Clip``
    ``min(max(x, lo), hi)``; attributes ``lo``, ``hi`` (a float, or None: no bound).
``LeakyRelu``
    ``max(x, alpha * x)``; attribute ``alpha`` (0 <= alpha <= 1).
``Softmax``
    over the last axis of a ``(batch, features)`` tensor.
``Flatten``
    ``(batch, d1, d2, ...) -> (batch, d1 * d2 * ...)``, row major (no data movement on the
    NPU: a job's row is already its flattened elements).
``View``
    the same elements per batch row in the same order under another shape (squeezed or
    unsqueezed size-1 axes, a transpose that moves only the batch axis or size-1 axes):
    no data movement.
``LSTM``
    inputs ``[x, W, R, b, h0, c0]``: ``x`` ``(steps, batch, I)`` (or ``(batch, steps, I)``,
    ONNX ``layout = 1``), initializers ``W`` ``(4H, I)``, ``R`` ``(4H, H)``, ``b``
    ``(4H,)`` (the input and recurrent biases summed), ``h0``, ``c0`` ``(H,)`` (the same
    for every batch row), the gates in the order of
    :func:`host.compiler.programs.lstm_sequence`: f, i, o, c. Attributes ``steps``,
    ``hidden``. The output is every step's ``h``, ONNX's ``Y``: ``(steps, 1, batch, H)``
    (``layout = 1``: ``(batch, steps, 1, H)``).
``GRU``
    inputs ``[x, W, R, b, h0]``: ``W`` ``(3H, I)``, ``R`` ``(3H, H)`` in the order z, r, n
    of :func:`host.compiler.programs.emit_gru`, ``b`` ``(4H,)`` = ``b_z, b_r, b_n, b_hn``
    (``b_hn`` unused, zero, without ``linear_before_reset``). Attributes ``steps``,
    ``hidden``, ``linear_before_reset`` (0 or 1). Output as ``LSTM``'s.
``LastStep``
    the last step of a recurrent layer's every-step output (ONNX ``Y_h``, or a ``Gather``
    / ``Slice`` of the last step); attribute ``axis`` (the step axis of the input); the
    output shape drops that axis or keeps it with size 1.

Each node keeps ``origin``: the source node's name and operator (for example
``("fc1", "Gemm")``), so errors raised later still name what the user wrote.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["BINARY", "ELEMENTWISE", "OPS", "POOLS", "RECURRENT", "Graph", "IRError", "Node",
           "Tensor", "window_out"]

#: The op types of the IR.
OPS = ("Dense", "Relu", "Sigmoid", "Tanh", "Exp", "Softmax", "Flatten", "View", "LSTM",
       "GRU", "LastStep", "Conv", "MaxPool", "AveragePool", "Add", "Sub", "Mul", "Affine",
       "Clip", "LeakyRelu")
#: The recurrent ops and the number of gates of each.
RECURRENT = {"LSTM": 4, "GRU": 3}
#: The element-wise unary ops and the NPU unary function of each.
ELEMENTWISE = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp"}
#: The element-wise ops on two data tensors and the MFU's binary op of each.
BINARY = {"Add": "add", "Sub": "a_sub_b", "Mul": "mul"}
#: The pooling ops.
POOLS = ("MaxPool", "AveragePool")


def window_out(size: int, kernel: int, stride: int, before: int, after: int) -> int:
    """Output positions of a window of ``kernel`` sliding by ``stride`` over ``size``
    positions zero padded by ``before`` and ``after`` (ONNX's floor rule); 0 if the window
    does not fit."""
    span = size + before + after - kernel
    return span // stride + 1 if span >= 0 else 0


class IRError(ValueError):
    """A graph that breaks an IR rule; the message names the node or tensor."""


@dataclass
class Tensor:
    """A value of the graph: ``shape`` is a tuple of ints and ``None`` (unknown, the batch
    axis), ``dtype`` a NumPy dtype name (``"float32"``)."""
    name: str
    shape: tuple
    dtype: str = "float32"

    @property
    def batch_axis(self) -> int:
        """The position of the batch axis (the one ``None``; 0 when there is none)."""
        return self.shape.index(None) if None in self.shape else 0

    @property
    def features(self) -> int:
        """Elements per batch row (the product of every axis but the batch axis)."""
        dims = list(self.shape)
        if None in dims:
            dims.remove(None)
        else:
            dims = dims[1:]
        if any(d is None for d in dims):
            raise IRError(f"tensor {self.name!r} has shape {_fmt(self.shape)}: only the batch "
                          f"axis may be unknown")
        return int(np.prod(dims, dtype=np.int64)) if dims else 1


@dataclass
class Node:
    """One operation: ``op`` (a key of :data:`OPS`), input and output tensor names,
    attributes, and ``origin`` = (source node name, source operator)."""
    name: str
    op: str
    inputs: list
    outputs: list
    attrs: dict = field(default_factory=dict)
    origin: tuple = ("", "")

    def where(self) -> str:
        """``node 'fc1' (Gemm)``: how messages name the node."""
        name, op = self.origin if self.origin[0] or self.origin[1] else (self.name, self.op)
        return f"node {name!r} ({op or self.op})"


@dataclass
class Graph:
    """A network: ``inputs`` and ``outputs`` (tensor names), ``nodes`` in topological
    order, ``tensors`` by name, ``initializers`` (constant arrays) by name."""
    name: str = "network"
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    nodes: list = field(default_factory=list)
    tensors: dict = field(default_factory=dict)
    initializers: dict = field(default_factory=dict)

    def add_tensor(self, name: str, shape, dtype="float32") -> Tensor:
        t = Tensor(name, tuple(None if d is None else int(d) for d in shape), str(dtype))
        self.tensors[name] = t
        return t

    def add_node(self, node: Node) -> Node:
        self.nodes.append(node)
        return node

    def producer(self, name: str):
        """The node that writes tensor ``name``, or None (a graph input or initializer)."""
        for node in self.nodes:
            if name in node.outputs:
                return node
        return None

    def consumers(self, name: str) -> list:
        """The nodes that read tensor ``name``."""
        return [node for node in self.nodes if name in node.inputs]

    def validate(self) -> None:
        """Check the IR rules: known ops, every input defined before it is read (graph
        input, initializer or an earlier node's output), each tensor written once, the
        outputs produced, ``Dense``, ``Conv`` and recurrent weights as initializers of
        matching shapes, every window's attributes and output shape, the shapes of binary
        ops and of ``Affine``'s constants.

        Raises
        ------
        IRError
            naming the node or tensor.
        """
        defined = set(self.inputs) | set(self.initializers)
        for name in self.inputs:
            if name not in self.tensors:
                raise IRError(f"graph input {name!r} has no tensor entry")
        for node in self.nodes:
            if node.op not in OPS:
                raise IRError(f"{node.where()}: unknown IR op {node.op!r}; the IR has "
                              f"{', '.join(OPS)}")
            for name in node.inputs:
                if name not in defined:
                    raise IRError(f"{node.where()} reads {name!r} before it is defined")
            for name in node.outputs:
                if name in defined:
                    raise IRError(f"{node.where()} writes {name!r}, already defined")
                if name not in self.tensors:
                    raise IRError(f"{node.where()}: output {name!r} has no tensor entry")
                defined.add(name)
            if node.op == "Dense":
                self._check_dense(node)
            elif node.op in RECURRENT:
                self._check_recurrent(node)
            elif node.op in ("View", "Flatten", "LastStep"):
                self._check_view(node)
            elif node.op == "Conv" or node.op in POOLS:
                self._check_window(node)
            elif node.op in BINARY:
                self._check_binary(node)
            elif node.op == "Affine":
                self._check_affine(node)
            elif node.op == "Clip":
                lo, hi = node.attrs.get("lo"), node.attrs.get("hi")
                if lo is not None and hi is not None and lo > hi:
                    raise IRError(f"{node.where()}: Clip with lo {lo} > hi {hi}")
        for name in self.outputs:
            if name not in defined:
                raise IRError(f"graph output {name!r} is never produced")

    def _check_dense(self, node: Node) -> None:
        if len(node.inputs) not in (2, 3):
            raise IRError(f"{node.where()}: Dense takes [x, W] or [x, W, b]")
        w = self.initializers.get(node.inputs[1])
        if w is None or w.ndim != 2:
            raise IRError(f"{node.where()}: W must be a 2-D initializer")
        if len(node.inputs) == 3:
            b = self.initializers.get(node.inputs[2])
            if b is None or b.shape != (w.shape[0],):
                raise IRError(f"{node.where()}: b must be an initializer of shape "
                              f"({w.shape[0]},), not {None if b is None else b.shape}")
        x = self.tensors[node.inputs[0]]
        if x.features != w.shape[1]:
            raise IRError(f"{node.where()}: input {x.name!r} has {x.features} features, W "
                          f"has shape {w.shape}")

    def _check_recurrent(self, node: Node) -> None:
        gates = RECURRENT[node.op]
        want = 6 if node.op == "LSTM" else 5
        if len(node.inputs) != want:
            raise IRError(f"{node.where()}: {node.op} takes {want} inputs, not "
                          f"{len(node.inputs)}")
        arrays = [self.initializers.get(i) for i in node.inputs[1:]]
        if any(a is None for a in arrays):
            raise IRError(f"{node.where()}: W, R, b and the initial state must be "
                          f"initializers")
        w, r, b = arrays[:3]
        h, steps = int(node.attrs.get("hidden", 0)), int(node.attrs.get("steps", 0))
        b_len = 4 * h
        if w.ndim != 2 or w.shape[0] != gates * h or r.shape != (gates * h, h) \
                or b.shape != (b_len,) or any(a.shape != (h,) for a in arrays[3:]) \
                or steps < 1:
            raise IRError(f"{node.where()}: {node.op} with hidden {h}, steps {steps} has W "
                          f"{w.shape}, R {r.shape}, b {b.shape}, state "
                          f"{[a.shape for a in arrays[3:]]}")
        x = self.tensors[node.inputs[0]]
        if x.features != steps * w.shape[1]:
            raise IRError(f"{node.where()}: input {x.name!r} has {x.features} features per "
                          f"batch row, not steps {steps} x {w.shape[1]}")

    def _check_window(self, node: Node) -> None:
        """Conv and pools: a (batch, C, H, W) input, the attributes, the output shape."""
        x, y = self.tensors[node.inputs[0]], self.tensors[node.outputs[0]]
        if len(x.shape) != 4 or x.shape[0] is not None or None in x.shape[1:]:
            raise IRError(f"{node.where()}: {node.op} needs a (batch, C, H, W) input, not "
                          f"{_fmt(x.shape)}")
        _, c, h, w = x.shape
        if node.op == "Conv":
            if len(node.inputs) not in (2, 3):
                raise IRError(f"{node.where()}: Conv takes [x, W] or [x, W, b]")
            wt = self.initializers.get(node.inputs[1])
            if wt is None or wt.ndim != 4 or wt.shape[1] != c:
                raise IRError(f"{node.where()}: W must be a 4-D initializer (C_out, {c}, kh, "
                              f"kw), not {None if wt is None else wt.shape}")
            if len(node.inputs) == 3:
                b = self.initializers.get(node.inputs[2])
                if b is None or b.shape != (wt.shape[0],):
                    raise IRError(f"{node.where()}: b must be an initializer of shape "
                                  f"({wt.shape[0]},), not {None if b is None else b.shape}")
            c_out, kernel = wt.shape[0], wt.shape[2:]
        else:
            c_out, kernel = c, tuple(node.attrs.get("kernel", ()))
        strides = tuple(node.attrs.get("strides", ()))
        pads = tuple(node.attrs.get("pads", ()))
        if len(kernel) != 2 or len(strides) != 2 or len(pads) != 4 or min(kernel) < 1 \
                or min(strides) < 1 or min(pads) < 0:
            raise IRError(f"{node.where()}: kernel {kernel}, strides {strides}, pads {pads}: "
                          f"need 2 kernel sizes and strides >= 1, 4 pads >= 0")
        want = (None, c_out, window_out(h, kernel[0], strides[0], pads[0], pads[2]),
                window_out(w, kernel[1], strides[1], pads[1], pads[3]))
        if y.shape != want or 0 in want:
            raise IRError(f"{node.where()}: output {_fmt(y.shape)}, the window gives "
                          f"{_fmt(want)}")

    def _check_binary(self, node: Node) -> None:
        shapes = [self.tensors[i].shape if i in self.tensors else None for i in node.inputs]
        y = self.tensors[node.outputs[0]].shape
        if len(node.inputs) != 2 or shapes[0] is None or shapes[0] != shapes[1] \
                or y != shapes[0]:
            raise IRError(f"{node.where()}: {node.op} takes two data tensors of the same "
                          f"shape, not {[None if s is None else _fmt(s) for s in shapes]}")

    def _check_affine(self, node: Node) -> None:
        x = self.tensors[node.inputs[0]]
        c = x.shape[1] if len(x.shape) > 1 else None
        arrays = [self.initializers.get(i) for i in node.inputs[1:]]
        if len(arrays) != 2 or any(a is None or a.shape != (c,) for a in arrays):
            raise IRError(f"{node.where()}: Affine takes [x, scale, shift], scale and shift "
                          f"initializers of shape ({c},) for an input {_fmt(x.shape)}")

    def _check_view(self, node: Node) -> None:
        x, y = self.tensors[node.inputs[0]], self.tensors[node.outputs[0]]
        if node.op == "LastStep":
            ok = y.features * x.shape[node.attrs["axis"]] == x.features
        else:
            ok = x.features == y.features
        if not ok:
            raise IRError(f"{node.where()}: {node.op} of {_fmt(x.shape)} to {_fmt(y.shape)} "
                          f"changes the elements per batch row")

    def __str__(self) -> str:
        lines = [f"graph {self.name}: inputs "
                 + ", ".join(f"{n} {_fmt(self.tensors[n].shape)}" for n in self.inputs)]
        for node in self.nodes:
            shapes = [_fmt(self.initializers[i].shape) if i in self.initializers
                      else _fmt(self.tensors[i].shape) for i in node.inputs]
            out = ", ".join(f"{o} {_fmt(self.tensors[o].shape)}" for o in node.outputs)
            lines.append(f"  {node.op}({', '.join(shapes)}) -> {out}   # {node.where()}")
        lines.append("outputs " + ", ".join(self.outputs))
        return "\n".join(lines)


def _fmt(shape) -> str:
    return "(" + ", ".join("batch" if d is None else str(d) for d in shape) + \
        ("," if len(shape) == 1 else "") + ")"
