"""ONNX to the compiler's IR (:mod:`host.compiler.ir`).

:func:`import_onnx` loads a model (a path, with external data files beside the ``.onnx``
read by ``onnx.load``'s default behaviour, or an ``onnx.ModelProto``), runs ONNX shape
inference, folds the constant parts of the graph, and turns the rest into IR nodes:

* removed: ``Identity``, ``Dropout`` (inference: its output is its input);
* folded when every input is constant (shape arithmetic and weight preprocessing):
  ``Constant``, ``Shape`` (the batch axis becomes a symbolic value), ``Gather``,
  ``Concat``, ``Unsqueeze``, ``Squeeze``, ``Reshape``, ``Flatten``, ``Cast``,
  ``Transpose``, ``Add``, ``Sub``, ``Mul``, ``Div``;
* imported: ``Gemm`` (``alpha``, ``beta``, ``transB``; ``transA = 0``) and ``MatMul``
  with a constant right operand become ``Dense`` (``W`` of shape ``(out, in)``);
  ``Conv`` 2-D (``group = 1``, dilation 1, explicit ``pads`` or ``auto_pad``) becomes
  ``Conv`` with explicit pads; ``MaxPool``, ``AveragePool`` (``ceil_mode`` only where it
  changes nothing), ``GlobalAveragePool``, ``GlobalMaxPool`` and ``ReduceMean`` /
  ``ReduceMax`` over the two spatial axes become the IR's pools;
  ``Relu``, ``Sigmoid``, ``Tanh``, ``Exp``, ``Clip`` (constant bounds), ``LeakyRelu``
  (``0 <= alpha <= 1``); ``Softmax`` over the last axis (all of a row's features);
  ``Flatten`` and ``Reshape`` to ``(batch, features)``;
* element-wise arithmetic: ``Add``, ``Sub``, ``Mul`` of two data tensors of one shape
  become the IR's ``Add`` / ``Sub`` / ``Mul``; ``Add``, ``Sub``, ``Mul``, ``Div`` by a
  constant (a scalar or one value per channel) and ``BatchNormalization`` (inference)
  are a per-channel ``y = x * scale + shift``, folded into the ``Dense`` / ``Conv`` that
  produces ``x`` when nothing else reads ``x`` (the bias of a ``MatMul`` + ``Add``, a
  convolution's batch normalisation), else an IR ``Affine``;
* recurrent: ``LSTM`` and ``GRU`` (forward, default activations, no clip, no peepholes,
  ``input_forget = 0``; ``layout`` 0 or 1; ``sequence_lens`` only if every entry is the
  sequence length; constant ``initial_h`` / ``initial_c``, the same for every batch
  row) become the IR's ``LSTM`` / ``GRU`` (the gates reordered to the builder's: LSTM
  f, i, o, c from ONNX's i, o, f, c; the two biases summed); ``Y_h`` and a ``Gather`` or
  ``Slice`` of the last step of ``Y`` become ``LastStep``; ``Squeeze``, ``Unsqueeze``,
  ``Transpose`` (moving only the batch axis or size-1 axes), ``Gather`` / ``Slice`` of a
  size-1 axis become ``View``.

The batch axis of the (single) graph input is its only symbolic axis; with none, the
first axis, or the axis that becomes the batch axis of the LSTM / GRU the input feeds
(axis 1 of ``X`` with ``layout = 0``). Each batch row is one job (a whole sequence).
Anything else raises :class:`OnnxImportError` naming the ONNX node, its operator and the
supported operators; a file that cannot be parsed raises it naming the file.
"""

from __future__ import annotations

import os

import numpy as np

from host.compiler.ir import Graph, IRError, Node, window_out

__all__ = ["FOLDED_OPS", "SUPPORTED_OPS", "OnnxImportError", "import_onnx", "load_onnx"]

#: Operators that become IR nodes (on data, batch first).
SUPPORTED_OPS = ("Gemm", "MatMul", "Add", "Sub", "Mul", "Div", "Relu", "Sigmoid", "Tanh",
                 "Exp", "Softmax", "Flatten", "Reshape", "Identity", "Dropout", "Conv",
                 "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
                 "ReduceMean", "ReduceMax", "BatchNormalization", "Clip", "LeakyRelu",
                 "LSTM", "GRU", "Squeeze", "Pad",
                 "Unsqueeze", "Transpose", "Gather", "Slice")
#: Operators folded away when every input is a constant (``Shape`` also on data).
FOLDED_OPS = ("Constant", "Shape", "Gather", "Concat", "Unsqueeze", "Squeeze", "Reshape",
              "Flatten", "Cast", "Transpose", "Add", "Sub", "Mul", "Div", "Identity",
              "Slice", "ConstantOfShape", "Expand")

#: Where each gate of the builders' order sits in ONNX's weights: LSTM (ONNX i, o, f, c;
#: :func:`host.compiler.programs.lstm_sequence` f, i, o, c) and GRU (ONNX z, r, h; the
#: builder's z, r, n).
LSTM_GATES = {"f": 2, "i": 0, "o": 1, "c": 3}
GRU_GATES = {"z": 0, "r": 1, "n": 2}
_DEFAULT_ACTS = {"LSTM": ["sigmoid", "tanh", "tanh"], "GRU": ["sigmoid", "tanh"]}

#: The value a folded ``Shape`` gives the batch axis (any other negative value but -1 in
#: folded shape arithmetic is an error).
BATCH = -(1 << 62)

_FLOATS = {1: "float32", 10: "float16", 11: "float64"}


class OnnxImportError(ValueError):
    """An ONNX model the importer cannot take; the message names the file or the node."""


def _supported() -> str:
    return (f"supported operators: {', '.join(SUPPORTED_OPS)}; folded on constants: "
            f"{', '.join(FOLDED_OPS)}")


def _onnx():
    try:
        import onnx
    except ImportError:
        raise OnnxImportError("the ONNX importer needs the 'onnx' package: pip install "
                              "'bfp-npu[onnx]' (or pip install onnx)") from None
    return onnx


def load_onnx(source):
    """``source`` (a path or an ``onnx.ModelProto``) as a ``ModelProto``, shape-inferred.

    Raises
    ------
    OnnxImportError
        naming the file when it cannot be read or parsed (missing, truncated, not ONNX),
        or when ONNX's checker or shape inference refuses the model.
    """
    onnx = _onnx()
    if isinstance(source, onnx.ModelProto):
        model, label = source, f"model {source.graph.name or '(unnamed)'}"
    elif isinstance(source, (str, bytes, os.PathLike)):
        label = os.fsdecode(source)
        if not os.path.isfile(label):
            raise OnnxImportError(f"{label}: no such ONNX file")
        try:
            model = onnx.load(label)       # external data beside the file, by default
        except Exception as exc:            # protobuf DecodeError, OSError, ValueError ...
            raise OnnxImportError(f"{label}: not a readable ONNX model (damaged, truncated "
                                  f"or another format): {type(exc).__name__}: {exc}") \
                from None
        if not model.graph.node and not model.graph.input:
            raise OnnxImportError(f"{label}: not a readable ONNX model (no graph: empty, "
                                  f"truncated or another format)")
    else:
        raise TypeError(f"expected a path or an onnx.ModelProto, not {type(source).__name__}")
    try:
        onnx.checker.check_model(model)
        model = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception as exc:
        raise OnnxImportError(f"{label}: ONNX refuses the model: {type(exc).__name__}: "
                              f"{exc}") from None
    return model, label


def import_onnx(source) -> Graph:
    """Import an ONNX model into a :class:`host.compiler.ir.Graph` (see the module's
    docstring for what is taken).

    Raises
    ------
    OnnxImportError
        the file cannot be read; an operator or a form of one that is not supported (the
        message names the node, the operator and the supported operators); more than one
        input or output; a non-float input.
    """
    model, label = load_onnx(source)
    return _Importer(model, label).run()


class _Importer:
    def __init__(self, model, label: str):
        self.onnx = _onnx()
        self.model = model
        self.label = label
        self.g = model.graph
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                          13)
        self.consts: dict[str, np.ndarray] = {}
        self.alias: dict[str, str] = {}
        self.shapes: dict[str, tuple] = {}     # data tensors: shape, None = batch
        self.ir = Graph(name=self.g.name or "network")
        self.uses: dict[str, int] = {}
        self.steps: dict[str, int] = {}        # sequences (RNN outputs): the step axis
        # A constant Pad's result, merged into the Conv that reads it: (x, pads, value).
        self.padded: dict[str, tuple] = {}
        for node in self.g.node:
            for i in node.input:
                self.uses[i] = self.uses.get(i, 0) + 1
        for o in self.g.output:
            self.uses[o.name] = self.uses.get(o.name, 0) + 1

    # --- helpers ------------------------------------------------------------------------

    def err(self, node, why: str) -> OnnxImportError:
        return OnnxImportError(f"{self.label}: node {node.name or '(unnamed)'!r} "
                               f"({node.op_type}): {why}")

    def unsupported(self, node, why: str = "") -> OnnxImportError:
        what = why or f"operator {node.op_type!r} is not supported"
        return self.err(node, f"{what}; {_supported()}")

    def name(self, n: str) -> str:
        while n in self.alias:
            n = self.alias[n]
        return n

    def readers(self, x: str) -> int:
        """How many nodes (and graph outputs) read the data tensor ``x``, through the names
        removed as aliases of it (``Identity``, ``Dropout``, folded nodes) too."""
        names = {n for n in set(self.uses) | set(self.alias) if self.name(n) == x} | {x}
        # each alias was made from one reading of the name it points to
        return sum(self.uses.get(n, 0) for n in names) - \
            sum(1 for a in self.alias if self.name(a) == x)

    def const(self, n: str):
        return self.consts.get(self.name(n))

    def attrs(self, node) -> dict:
        helper = self.onnx.helper
        return {a.name: helper.get_attribute_value(a) for a in node.attribute}

    def data_input(self, node, i: int = 0) -> str:
        n = self.name(node.input[i])
        if n not in self.shapes:
            raise self.err(node, f"input {node.input[i]!r} is not defined")
        if n in self.padded and not (node.op_type == "Conv" and i == 0):
            raise self.unsupported(node, f"input {node.input[i]!r} is the result of a Pad: "
                                         f"a Pad is supported only as the input of one Conv")
        return n

    def new_tensor(self, node, out: str, shape) -> str:
        self.shapes[out] = tuple(shape)
        self.ir.add_tensor(out, shape)
        return out

    def add(self, node, op, inputs, shape, **attrs) -> Node:
        out = self.new_tensor(node, node.output[0], shape)
        return self.ir.add_node(Node(node.name or out, op, list(inputs), [out], attrs,
                                     (node.name, node.op_type)))

    # --- the walk -----------------------------------------------------------------------

    def run(self) -> Graph:
        numpy_helper = self.onnx.numpy_helper
        for init in self.g.initializer:
            self.consts[init.name] = numpy_helper.to_array(init)
        inputs = [i for i in self.g.input if i.name not in self.consts]
        if len(inputs) != 1:
            raise OnnxImportError(f"{self.label}: the model must have exactly one input, not "
                                  f"{len(inputs)} ({', '.join(i.name for i in inputs)})")
        if len(self.g.output) != 1:
            raise OnnxImportError(f"{self.label}: the model must have exactly one output, not "
                                  f"{len(self.g.output)}")
        x = inputs[0]
        tt = x.type.tensor_type
        if tt.elem_type not in _FLOATS:
            raise OnnxImportError(f"{self.label}: input {x.name!r} must be float16, float32 or "
                                  f"float64, not ONNX element type {tt.elem_type}")
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if len(dims) < 2:
            raise OnnxImportError(f"{self.label}: input {x.name!r} must be (batch, "
                                  f"features...), not of rank {len(dims)}")
        unknown = [i for i, d in enumerate(dims) if d is None]
        if len(unknown) > 1:
            raise OnnxImportError(f"{self.label}: input {x.name!r} has shape {dims}: only the "
                                  f"batch axis may be unknown (a sequence length must be "
                                  f"fixed: the program unrolls the steps)")
        axis = unknown[0] if unknown else self.rnn_batch_axis(x.name, len(dims))
        self.batch_value = dims[axis]           # a fixed batch size is still the batch axis
        dims[axis] = None
        self.shapes[x.name] = tuple(dims)
        self.ir.add_tensor(x.name, self.shapes[x.name], _FLOATS[tt.elem_type])
        self.ir.inputs = [x.name]
        self.input_dtype = _FLOATS[tt.elem_type]
        for node in self.g.node:
            self.visit(node)
        out = self.name(self.g.output[0].name)
        if out not in self.shapes:
            raise OnnxImportError(f"{self.label}: output {self.g.output[0].name!r} does not "
                                  f"depend on the input (a constant)")
        if out == x.name:
            raise OnnxImportError(f"{self.label}: the model computes nothing (its output is its "
                                  f"input)")
        self.ir.outputs = [out]
        used = {i for n in self.ir.nodes for i in n.inputs}
        self.ir.initializers = {k: v for k, v in self.ir.initializers.items() if k in used}
        try:
            self.ir.validate()
        except IRError as exc:
            raise OnnxImportError(f"{self.label}: {exc}") from None
        return self.ir

    def rnn_batch_axis(self, name: str, rank: int) -> int:
        """The input axis that becomes an LSTM / GRU's batch axis (through Transposes), or
        0: the batch axis of an input whose axes are all fixed."""
        perm = list(range(rank))                # axis k of `name` is input axis perm[k]
        while True:
            users = [n for n in self.g.node if name in n.input]
            if len(users) != 1:
                return 0
            node = users[0]
            if node.op_type == "Transpose":
                p = self.attrs(node).get("perm", list(range(rank))[::-1])
                perm = [perm[i] for i in p]
                name = node.output[0]
            elif node.op_type in ("Identity", "Cast"):
                name = node.output[0]
            elif node.op_type in ("LSTM", "GRU") and node.input[0] == name and rank == 3:
                return perm[0 if self.attrs(node).get("layout", 0) else 1]
            else:
                return 0

    def visit(self, node) -> None:
        op = node.op_type
        if node.domain not in ("", "ai.onnx"):
            raise self.unsupported(node, f"operator {node.domain}.{op} (a custom domain) is "
                                         f"not supported")
        present = [i for i in node.input if i]
        if op == "Constant":
            self.consts[node.output[0]] = self.constant(node)
            return
        if op == "Identity" or (op == "Dropout" and present):
            self.remove(node)
            return
        if present and all(self.const(i) is not None for i in present):
            self.consts[node.output[0]] = self.fold(node)
            return
        if op == "Shape":
            self.consts[node.output[0]] = self.shape_of(node)
            return
        if op == "ConstantOfShape" and self.const(node.input[0]) is not None:
            self.consts[node.output[0]] = self.fold(node)
            return
        handler = getattr(self, f"op_{op}", None)
        if handler is None:
            raise self.unsupported(node)
        handler(node)

    def remove(self, node) -> None:
        if node.op_type == "Dropout":
            a = self.attrs(node)
            if len(node.input) > 2 and node.input[2]:
                mode = self.const(node.input[2])
                if mode is None or bool(mode):
                    raise self.unsupported(node, "Dropout in training mode is not supported")
            if len(node.output) > 1 and node.output[1] and self.uses.get(node.output[1]):
                raise self.unsupported(node, "Dropout's mask output is not supported")
            del a
        self.alias[node.output[0]] = self.name(node.input[0])

    # --- constants ----------------------------------------------------------------------

    def constant(self, node) -> np.ndarray:
        a = self.attrs(node)
        nh = self.onnx.numpy_helper
        if "value" in a:
            return nh.to_array(a["value"])
        for key, dtype in (("value_float", np.float32), ("value_int", np.int64),
                           ("value_floats", np.float32), ("value_ints", np.int64)):
            if key in a:
                return np.array(a[key], dtype)
        raise self.unsupported(node, f"Constant with attributes {sorted(a)} is not supported")

    def shape_of(self, node) -> np.ndarray:
        n = self.data_input(node)
        shape = np.array([BATCH if d is None else d for d in self.shapes[n]], np.int64)
        a = self.attrs(node)
        start, end = a.get("start", 0), a.get("end", None)
        return shape[start:end]

    def fold(self, node) -> np.ndarray:
        op = node.op_type
        a = self.attrs(node)
        v = [self.const(i) if i else None for i in node.input]
        try:
            if op in ("Add", "Sub", "Mul", "Div"):
                if any(np.issubdtype(x.dtype, np.integer) and np.any(x == BATCH) for x in v):
                    raise self.unsupported(node, "arithmetic on the batch size is not "
                                                 "supported")
                f = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}.get(op)
                if f is not None:
                    return f(v[0], v[1]).astype(v[0].dtype)
                if np.issubdtype(v[0].dtype, np.integer):
                    return (v[0] // v[1]).astype(v[0].dtype)
                return (v[0] / v[1]).astype(v[0].dtype)
            if op == "Gather":
                return np.take(v[0], v[1], axis=a.get("axis", 0))
            if op == "Concat":
                return np.concatenate([x for x in v if x is not None], axis=a["axis"])
            if op == "Unsqueeze":
                axes = a.get("axes") if len(v) < 2 or v[1] is None else v[1]
                out = v[0]
                rank = out.ndim + len(axes)
                for ax in sorted(int(x) % rank for x in axes):
                    out = np.expand_dims(out, ax)
                return out
            if op == "Squeeze":
                axes = a.get("axes") if len(v) < 2 or v[1] is None else v[1]
                if axes is None:
                    return np.squeeze(v[0])
                return np.squeeze(v[0], axis=tuple(int(x) % v[0].ndim for x in axes))
            if op == "Reshape":
                target = [int(t) for t in v[1]]
                if any(t == BATCH for t in target):
                    raise self.unsupported(node, "a constant reshaped by the batch size")
                if not a.get("allowzero", 0):
                    target = [v[0].shape[i] if t == 0 else t for i, t in enumerate(target)]
                return v[0].reshape(target)
            if op == "Flatten":
                axis = a.get("axis", 1) % max(v[0].ndim, 1)
                return v[0].reshape(int(np.prod(v[0].shape[:axis])), -1)
            if op == "Cast":
                return v[0].astype(self.onnx.helper.tensor_dtype_to_np_dtype(a["to"]))
            if op == "Transpose":
                return np.transpose(v[0], a.get("perm"))
            if op == "ConstantOfShape":
                # a state of zeros shaped by the batch size: one row, broadcast over it
                shape = [1 if int(d) == BATCH else int(d) for d in v[0]]
                fill = a.get("value")
                fill = self.onnx.numpy_helper.to_array(fill).reshape(-1)[0] \
                    if fill is not None else np.float32(0)
                return np.full(shape, fill, np.asarray(fill).dtype)
            if op == "Expand":
                # a constant broadcast to a shape that may hold the batch size (torch's
                # zero initial states): one row, broadcast over the batch
                shape = [1 if int(d) == BATCH else int(d) for d in v[1]]
                return v[0] * np.ones(shape, v[0].dtype)
            if op == "Slice":
                starts, ends = v[1], v[2]
                axes = v[3] if len(v) > 3 and v[3] is not None else range(len(starts))
                steps = v[4] if len(v) > 4 and v[4] is not None else [1] * len(starts)
                index = [slice(None)] * v[0].ndim
                for st, en, ax, sp in zip(starts, ends, axes, steps):
                    index[int(ax)] = slice(int(st), int(en), int(sp))
                return v[0][tuple(index)]
        except OnnxImportError:
            raise
        except Exception as exc:
            raise self.err(node, f"cannot fold this node on its constant inputs: {exc}") \
                from None
        raise self.unsupported(node, f"operator {op!r} on constant inputs is not folded")

    # --- data operators -----------------------------------------------------------------

    def _features(self, node, n: str) -> int:
        shape = self.shapes[n]
        if len(shape) != 2 or shape[0] is not None:
            raise self.unsupported(node, f"input {n!r} has shape {_fmt(shape)}; this "
                                         f"operator needs (batch, features) (Flatten first)")
        return shape[1]

    def dense(self, node, x: str, w: np.ndarray, b) -> None:
        feats = self._features(node, x)
        if w.ndim != 2 or w.shape[1] != feats:
            raise self.err(node, f"weights of shape {w.shape} do not match the input's "
                                 f"{feats} features")
        base = node.name or node.output[0]
        wn = f"{base}.W"
        self.ir.initializers[wn] = np.ascontiguousarray(w, np.float32)
        inputs = [x, wn]
        if b is not None:
            self.ir.initializers[f"{base}.b"] = np.asarray(b, np.float32)
            inputs.append(f"{base}.b")
        self.add(node, "Dense", inputs, (None, w.shape[0]))

    def _bias(self, node, c, rows: int, what: str) -> np.ndarray:
        c = np.asarray(c, np.float64)
        if c.size == 1:
            return np.full(rows, c.reshape(()), np.float64)
        if c.ndim == 2 and c.shape[0] == 1:
            c = c[0]
        if c.shape != (rows,):
            raise self.unsupported(node, f"{what} of shape {c.shape} is not supported "
                                         f"(needs ({rows},), (1, {rows}) or a scalar)")
        return c

    def op_Gemm(self, node) -> None:
        a = self.attrs(node)
        if a.get("transA", 0):
            raise self.unsupported(node, "Gemm with transA=1 is not supported")
        x = self.data_input(node)
        b = self.const(node.input[1])
        if b is None:
            raise self.unsupported(node, "Gemm with a non-constant B is not supported")
        alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
        w = (b if a.get("transB", 0) else b.T).astype(np.float64) * alpha
        bias = None
        if len(node.input) > 2 and node.input[2]:
            c = self.const(node.input[2])
            if c is None:
                raise self.unsupported(node, "Gemm with a non-constant C is not supported")
            bias = beta * self._bias(node, c, w.shape[0], "C")
        self.dense(node, x, w, bias)

    def op_MatMul(self, node) -> None:
        if self.const(node.input[0]) is not None:
            raise self.unsupported(node, "MatMul with a constant left operand is not "
                                         "supported (only x @ W)")
        x = self.data_input(node)
        w = self.const(node.input[1])
        if w is None or w.ndim != 2:
            raise self.unsupported(node, "MatMul needs a constant 2-D right operand")
        self.dense(node, x, w.T.astype(np.float64), None)

    # --- element-wise arithmetic: with a constant (folded or Affine) or two data tensors --

    def _channel_const(self, node, c, shape) -> np.ndarray:
        """A constant operand of an element-wise op on data of ``shape`` as one value per
        channel (axis 1; the features of a ``(batch, F)`` tensor), float64 ``(C,)``."""
        c = np.asarray(c, np.float64)
        chans = shape[1] if len(shape) > 1 else 1
        if c.size == 1:
            return np.full(chans, c.reshape(()), np.float64)
        # drop leading size-1 axes; what is left must be (C,) followed by size-1 axes,
        # lined up with axis 1 of the data (numpy's right-aligned broadcasting)
        dims = list(c.shape)
        trailing = len(shape) - 2                    # the axes after the channel axis
        while dims and dims[0] == 1 and len(dims) > trailing + 1:
            dims.pop(0)
        if len(dims) == trailing + 1 and dims[0] == chans and all(d == 1 for d in dims[1:]):
            return c.reshape(chans)
        raise self.unsupported(node, f"{node.op_type} with a constant of shape {c.shape} on "
                                     f"a tensor of shape {_fmt(shape)} is not supported (only "
                                     f"a scalar or one value per channel, axis 1)")

    def _affine(self, node, x: str, scale, shift) -> None:
        """``y = x * scale + shift`` per channel: folded into the ``Dense`` / ``Conv`` that
        produces ``x`` when nothing else reads ``x``, else an IR ``Affine``."""
        prod = self.ir.producer(x)
        if prod is not None and prod.op in ("Dense", "Conv") and self.readers(x) == 1:
            w = self.ir.initializers[prod.inputs[1]].astype(np.float64)
            scale_w = scale.reshape((-1,) + (1,) * (w.ndim - 1))
            self.ir.initializers[prod.inputs[1]] = (w * scale_w).astype(np.float32)
            base = prod.inputs[1][:-2]
            if len(prod.inputs) == 3:
                b = self.ir.initializers[prod.inputs[2]].astype(np.float64)
                self.ir.initializers[prod.inputs[2]] = (b * scale + shift).astype(np.float32)
            elif np.any(shift != 0):
                self.ir.initializers[f"{base}.b"] = shift.astype(np.float32)
                prod.inputs.append(f"{base}.b")
            prod.origin = (prod.origin[0], prod.origin[1] + "+" + node.op_type)
            self.alias[node.output[0]] = x
            return
        base = node.name or node.output[0]
        names = [f"{base}.scale", f"{base}.shift"]
        self.ir.initializers[names[0]] = np.asarray(scale, np.float32)
        self.ir.initializers[names[1]] = np.asarray(shift, np.float32)
        self.add(node, "Affine", [x, *names], self.shapes[x])

    def _arith(self, node) -> None:
        """Add, Sub, Mul, Div: one constant operand (an affine map per channel) or two data
        tensors of one shape (Add, Sub, Mul)."""
        op = node.op_type
        k = [i for i in (0, 1) if self.const(node.input[i]) is not None]
        if not k:
            a, b = self.data_input(node, 0), self.data_input(node, 1)
            if op == "Div":
                raise self.unsupported(node, "Div of two computed tensors is not supported "
                                             "(only by a constant)")
            if self.shapes[a] != self.shapes[b]:
                raise self.unsupported(node, f"{op} of computed tensors of shapes "
                                             f"{_fmt(self.shapes[a])} and "
                                             f"{_fmt(self.shapes[b])} is not supported (only "
                                             f"of the same shape, no broadcasting)")
            self.add(node, op, [a, b], self.shapes[a])
            return
        x = self.data_input(node, 1 - k[0])
        c = self._channel_const(node, self.const(node.input[k[0]]), self.shapes[x])
        ones, zeros = np.ones_like(c), np.zeros_like(c)
        if op == "Add":
            scale, shift = ones, c
        elif op == "Mul":
            scale, shift = c, zeros
        elif op == "Sub":
            scale, shift = (ones, -c) if k[0] == 1 else (-ones, c)
        else:
            if k[0] == 0:
                raise self.unsupported(node, "Div of a constant by a computed tensor is not "
                                             "supported (only x / constant)")
            scale, shift = 1.0 / c, zeros
        self._affine(node, x, scale, shift)

    op_Add = op_Sub = op_Mul = op_Div = _arith

    def op_BatchNormalization(self, node) -> None:
        a = self.attrs(node)
        if a.get("training_mode", 0):
            raise self.unsupported(node, "BatchNormalization with training_mode=1 is not "
                                         "supported (only inference)")
        if any(o and self.uses.get(o, 0) for o in node.output[1:]):
            raise self.unsupported(node, "BatchNormalization's running mean / variance "
                                         "outputs are not supported (only inference)")
        x = self.data_input(node)
        shape = self.shapes[x]
        if len(shape) < 2 or shape[0] is not None:
            raise self.unsupported(node, f"BatchNormalization of {_fmt(shape)} is not "
                                         f"supported (only (batch, C, ...))")
        params = []
        for i, what in zip(range(1, 5), ("scale", "B", "input_mean", "input_var")):
            v = self.const(node.input[i]) if len(node.input) > i and node.input[i] else None
            if v is None:
                raise self.unsupported(node, f"BatchNormalization with a computed {what} is "
                                             f"not supported (only constants)")
            v = np.asarray(v, np.float64).reshape(-1)
            if v.shape != (shape[1],):
                raise self.err(node, f"{what} has {v.size} values, the input has "
                                     f"{shape[1]} channels")
            params.append(v)
        gamma, beta, mean, var = params
        k = gamma / np.sqrt(var + float(a.get("epsilon", 1e-5)))
        self._affine(node, x, k, beta - mean * k)

    def _unary(self, node) -> None:
        x = self.data_input(node)
        self.add(node, node.op_type, [x], self.shapes[x])

    op_Relu = op_Sigmoid = op_Tanh = op_Exp = _unary

    def op_Clip(self, node) -> None:
        x = self.data_input(node)
        if self.opset < 11:
            a = self.attrs(node)
            bounds = [a.get("min"), a.get("max")]
        else:
            bounds = []
            for i, what in ((1, "min"), (2, "max")):
                if len(node.input) > i and node.input[i]:
                    v = self.const(node.input[i])
                    if v is None or np.asarray(v).size != 1:
                        raise self.unsupported(node, f"Clip with a computed or non-scalar "
                                                     f"{what} is not supported (only "
                                                     f"constants)")
                    bounds.append(float(np.asarray(v).reshape(())))
                else:
                    bounds.append(None)
        lo, hi = [None if v is None or not np.isfinite(v) else float(v) for v in bounds]
        if lo is not None and hi is not None and lo > hi:
            raise self.unsupported(node, f"Clip with min {lo} > max {hi} is not supported")
        if lo is None and hi is None:
            self.alias[node.output[0]] = x
            return
        self.add(node, "Clip", [x], self.shapes[x], lo=lo, hi=hi)

    def op_LeakyRelu(self, node) -> None:
        x = self.data_input(node)
        alpha = float(self.attrs(node).get("alpha", 0.01))
        if not 0.0 <= alpha <= 1.0:
            raise self.unsupported(node, f"LeakyRelu with alpha={alpha} is not supported "
                                         f"(computed as max(x, alpha * x), which needs "
                                         f"0 <= alpha <= 1)")
        if alpha == 1.0:
            self.alias[node.output[0]] = x
        elif alpha == 0.0:
            self.add(node, "Relu", [x], self.shapes[x])
        else:
            self.add(node, "LeakyRelu", [x], self.shapes[x], alpha=alpha)

    # --- convolution and pooling ----------------------------------------------------------

    def _image(self, node) -> str:
        x = self.data_input(node)
        shape = self.shapes[x]
        if len(shape) != 4 or shape[0] is not None:
            raise self.unsupported(node, f"{node.op_type} of a tensor of shape {_fmt(shape)} "
                                         f"is not supported (only 2-D: (batch, C, H, W))")
        return x

    def _window(self, node, a: dict, size, kernel):
        """``strides`` and explicit ``pads`` (top, left, bottom, right) of a Conv or pool,
        ``auto_pad`` resolved; dilations other than 1 refused."""
        kernel = [int(k) for k in kernel]
        dil = [int(d) for d in a.get("dilations", [1, 1])]
        if dil != [1, 1]:
            raise self.unsupported(node, f"attribute dilations={dil} is not supported (only "
                                         f"dilation 1)")
        strides = [int(s) for s in a.get("strides", [1, 1])]
        if len(strides) != 2 or min(strides) < 1:
            raise self.err(node, f"strides {strides} must be two integers >= 1")
        auto = a.get("auto_pad", b"NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else auto
        if auto == "NOTSET":
            pads = [int(p) for p in a.get("pads", [0, 0, 0, 0])]
            if len(pads) != 4 or min(pads) < 0:
                raise self.err(node, f"pads {pads} must be four integers >= 0")
        elif auto == "VALID":
            pads = [0, 0, 0, 0]
        elif auto in ("SAME_UPPER", "SAME_LOWER"):
            begin, end = [], []
            for n, k, s in zip(size, kernel, strides):
                total = max((-(-n // s) - 1) * s + k - n, 0)
                small, big = total // 2, total - total // 2
                begin.append(small if auto == "SAME_UPPER" else big)
                end.append(big if auto == "SAME_UPPER" else small)
            pads = begin + end
        else:
            raise self.unsupported(node, f"attribute auto_pad={auto!r} is not supported")
        return strides, pads

    def _ceil_mode(self, node, a: dict, size, kernel, strides, pads) -> None:
        """Refuse ``ceil_mode = 1`` where it changes the output size."""
        if not a.get("ceil_mode", 0):
            return
        for n, k, s, pb, pe in zip(size, kernel, strides, pads[:2], pads[2:]):
            floor = window_out(n, k, s, pb, pe)
            ceil = -(-(n + pb + pe - k) // s) + 1
            if (ceil - 1) * s >= n + pb:        # a last window starting in the end padding
                ceil -= 1
            if ceil != floor:
                raise self.unsupported(node, f"attribute ceil_mode=1 is not supported where "
                                             f"it changes the output (here {ceil} positions "
                                             f"instead of {floor} along an axis of {n})")

    def op_Pad(self, node) -> None:
        """A constant ``Pad`` of the two spatial axes of a map whose one reader is a
        ``Conv``: no IR node, it becomes the ``Conv``'s ``pads`` and ``pad_value``."""
        x = self._image(node)
        a = self.attrs(node)
        mode = a.get("mode", b"constant")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        if mode != "constant":
            raise self.unsupported(node, f"attribute mode={mode!r} is not supported (only "
                                         f"'constant', before a Conv)")
        if self.opset < 11:
            pads = np.asarray(a.get("pads", []), np.int64)
            value = float(a.get("value", 0.0))
        else:
            pads = self.const(node.input[1]) if len(node.input) > 1 else None
            if pads is None:
                raise self.unsupported(node, "Pad with computed pads is not supported")
            value = 0.0
            if len(node.input) > 2 and node.input[2]:
                v = self.const(node.input[2])
                if v is None or np.size(v) != 1:
                    raise self.unsupported(node, "Pad's constant_value must be one constant")
                value = float(np.asarray(v).reshape(()))
            if len(node.input) > 3 and node.input[3]:
                raise self.unsupported(node, "Pad's axes input is not supported")
        pads = [int(p) for p in np.asarray(pads).reshape(-1)]
        if len(pads) != 8 or min(pads) < 0 or any(pads[i] for i in (0, 1, 4, 5)):
            raise self.unsupported(node, f"pads {pads} are not supported (only >= 0 on the "
                                         f"two spatial axes of (batch, C, H, W))")
        if not np.isfinite(value):
            raise self.unsupported(node, f"Pad's constant_value {value} is not finite")
        if self.readers(node.output[0]) != 1:
            raise self.unsupported(node, "a Pad is supported only as the input of one Conv")
        _, c, h, wd = self.shapes[x]
        top, left, bottom, right = pads[2], pads[3], pads[6], pads[7]
        self.shapes[node.output[0]] = (None, c, h + top + bottom, wd + left + right)
        self.padded[node.output[0]] = (x, (top, left, bottom, right), value)

    def op_Conv(self, node) -> None:
        a = self.attrs(node)
        x = self._image(node)
        _, c, h, wd = self.shapes[x]            # after a Pad: the padded map's size
        pre = self.padded.pop(x, None)
        w = self.const(node.input[1])
        if w is None:
            raise self.unsupported(node, "Conv with computed weights is not supported (only "
                                         "constants)")
        if w.ndim != 4:
            raise self.unsupported(node, f"Conv with weights of shape {w.shape} is not "
                                         f"supported (only 2-D: (C_out, C_in, kh, kw))")
        group = int(a.get("group", 1))
        if group != 1:
            raise self.unsupported(node, f"attribute group={group} is not supported (grouped "
                                         f"or depthwise convolution; only group = 1)")
        if w.shape[1] != c:
            raise self.err(node, f"weights of shape {w.shape} do not match the input's {c} "
                                 f"channels")
        kernel = list(w.shape[2:])
        if "kernel_shape" in a and [int(k) for k in a["kernel_shape"]] != kernel:
            raise self.err(node, f"kernel_shape {list(a['kernel_shape'])} differs from the "
                                 f"weights' {kernel}")
        strides, pads = self._window(node, a, (h, wd), kernel)
        extra = {}
        if pre is not None:                     # the Pad's source, both paddings as one
            if pre[2] and any(pads):
                raise self.unsupported(node, f"a Conv padding its input with zeros after a "
                                             f"Pad with value {pre[2]} is not supported")
            if pre[2]:
                extra["pad_value"] = pre[2]
            x = pre[0]
            pads = [p + q for p, q in zip(pads, pre[1])]
            h, wd = self.shapes[x][2:]
        inputs = [x]
        base = node.name or node.output[0]
        self.ir.initializers[f"{base}.W"] = np.ascontiguousarray(w, np.float32)
        inputs.append(f"{base}.W")
        if len(node.input) > 2 and node.input[2]:
            b = self.const(node.input[2])
            if b is None:
                raise self.unsupported(node, "Conv with a computed bias is not supported")
            self.ir.initializers[f"{base}.b"] = np.asarray(b, np.float32).reshape(-1)
            inputs.append(f"{base}.b")
        oh = window_out(h, kernel[0], strides[0], pads[0], pads[2])
        ow = window_out(wd, kernel[1], strides[1], pads[1], pads[3])
        if oh < 1 or ow < 1:
            raise self.err(node, f"a {kernel[0]} x {kernel[1]} kernel does not fit the "
                                 f"padded {h} x {wd} input")
        self.add(node, "Conv", inputs, (None, w.shape[0], oh, ow), strides=tuple(strides),
                 pads=tuple(pads), **extra)

    def _pool(self, node, op: str, kernel, a: dict) -> None:
        x = self._image(node)
        _, c, h, wd = self.shapes[x]
        if len(node.output) > 1 and node.output[1] and self.uses.get(node.output[1]):
            raise self.unsupported(node, f"{node.op_type}'s Indices output is not supported")
        kernel = [int(k) for k in kernel]
        if len(kernel) != 2 or min(kernel) < 1:
            raise self.unsupported(node, f"kernel_shape {kernel} is not supported (only 2-D)")
        strides, pads = self._window(node, a, (h, wd), kernel)
        if any(p >= k for p, k in zip(pads, kernel * 2)):
            raise self.err(node, f"pads {pads} must be smaller than the kernel {kernel}")
        self._ceil_mode(node, a, (h, wd), kernel, strides, pads)
        oh = window_out(h, kernel[0], strides[0], pads[0], pads[2])
        ow = window_out(wd, kernel[1], strides[1], pads[1], pads[3])
        if oh < 1 or ow < 1:
            raise self.err(node, f"a {kernel[0]} x {kernel[1]} window does not fit the "
                                 f"padded {h} x {wd} input")
        extra = {}
        if op == "AveragePool":
            extra["count_include_pad"] = int(a.get("count_include_pad", 0))
        self.add(node, op, [x], (None, c, oh, ow), kernel=tuple(kernel),
                 strides=tuple(strides), pads=tuple(pads), **extra)

    def op_MaxPool(self, node) -> None:
        a = self.attrs(node)
        if "kernel_shape" not in a:
            raise self.err(node, "MaxPool needs kernel_shape")
        self._pool(node, "MaxPool", a["kernel_shape"], a)

    def op_AveragePool(self, node) -> None:
        a = self.attrs(node)
        if "kernel_shape" not in a:
            raise self.err(node, "AveragePool needs kernel_shape")
        self._pool(node, "AveragePool", a["kernel_shape"], a)

    def op_GlobalAveragePool(self, node) -> None:
        x = self._image(node)
        self._pool(node, "AveragePool", self.shapes[x][2:], {})

    def op_GlobalMaxPool(self, node) -> None:
        x = self._image(node)
        self._pool(node, "MaxPool", self.shapes[x][2:], {})

    def _reduce(self, node) -> None:
        """``ReduceMean`` / ``ReduceMax`` over both spatial axes of a ``(batch, C, H, W)``
        map (what ``torch.onnx.export`` writes for ``AdaptiveAvgPool2d(1)``): a global
        pool, then a ``View`` without the two axes unless ``keepdims``."""
        x = self._image(node)
        a = self.attrs(node)
        axes = self._axes(node)
        if axes is None and a.get("noop_with_empty_axes", 0):
            self.alias[node.output[0]] = x
            return
        axes = sorted({int(v) % 4 for v in axes}) if axes is not None else [0, 1, 2, 3]
        if axes != [2, 3]:
            raise self.unsupported(node, f"{node.op_type} over axes {axes} is not supported "
                                         f"(only over the two spatial axes [2, 3]: a global "
                                         f"pool)")
        op = "AveragePool" if node.op_type == "ReduceMean" else "MaxPool"
        _, c, h, w = self.shapes[x]
        keep = a.get("keepdims", 1)
        out = node.output[0]
        pooled = out if keep else f"{out}.pooled"
        self.new_tensor(node, pooled, (None, c, 1, 1))
        extra = {"count_include_pad": 0} if op == "AveragePool" else {}
        self.ir.add_node(Node(node.name or out, op, [x], [pooled],
                              dict(kernel=(h, w), strides=(1, 1), pads=(0, 0, 0, 0), **extra),
                              (node.name, node.op_type)))
        if not keep:
            self.new_tensor(node, out, (None, c))
            self.ir.add_node(Node(f"{node.name or out}.squeeze", "View", [pooled], [out], {},
                                  (node.name, node.op_type)))

    op_ReduceMean = op_ReduceMax = _reduce

    def op_Softmax(self, node) -> None:
        x = self.data_input(node)
        shape = self.shapes[x]
        rank = len(shape)
        axis = self.attrs(node).get("axis", -1 if self.opset >= 13 else 1)
        axis = axis + rank if axis < 0 else axis
        whole = (self.opset < 13 and axis == 1) or \
            (axis == rank - 1 and all(d == 1 for d in shape[1:-1]))
        if not whole or axis == 0 or shape[0] is not None:
            raise self.unsupported(node, f"Softmax over axis {axis} of a tensor of shape "
                                         f"{_fmt(shape)} is not supported (only over the "
                                         f"last axis, all of a row's features)")
        feats = int(np.prod(shape[1:]))
        if rank != 2:
            flat = self.new_tensor(node, f"{node.output[0]}.flat", (None, feats))
            self.ir.add_node(Node(f"{node.name}.flatten", "Flatten", [x], [flat], {},
                                  (node.name, node.op_type)))
            x = flat
        self.add(node, "Softmax", [x], (None, feats))
        if rank != 2:
            self.shapes[node.output[0]] = (None, feats)

    def _to_2d(self, node, x: str) -> None:
        shape = self.shapes[x]
        if len(shape) == 2 and shape[0] is None:
            self.alias[node.output[0]] = x
            return
        self.add(node, "Flatten", [x], (None, _feats(shape)))

    def op_Flatten(self, node) -> None:
        x = self.data_input(node)
        shape = self.shapes[x]
        axis = self.attrs(node).get("axis", 1)
        axis = axis + len(shape) if axis < 0 else axis
        if axis != 1 or shape[0] is not None:
            raise self.unsupported(node, f"Flatten with axis={axis} is not supported (only "
                                         f"axis=1: (batch, features))")
        self._to_2d(node, x)

    def op_Reshape(self, node) -> None:
        x = self.data_input(node)
        target = self.const(node.input[1])
        if target is None:
            raise self.unsupported(node, "Reshape to a computed shape is not supported")
        shape = self.shapes[x]
        feats = _feats(shape)
        t = [int(v) for v in target]
        allowzero = self.attrs(node).get("allowzero", 0)
        if not allowzero:
            t = [(BATCH if shape[i] is None else shape[i]) if v == 0 and i < len(shape) else v
                 for i, v in enumerate(t)]
        view = self._reshape_view(shape, t)
        if view is not None and (len(view) != 2 or view[0] is not None):
            # only size-1 axes come or go (a sequence's (T, batch, 1, H) to (T, batch, H)):
            # the elements of a batch row keep their order
            kept = [i for i, d in enumerate(shape) if d != 1]
            step = self.steps.get(x)
            self.view(node, x, view, None if step not in kept else
                      [i for i, d in enumerate(view) if d != 1][kept.index(step)])
            return
        # the batch axis may sit behind size-1 axes (an RNN's Y_h (1, batch, H))
        before = shape[:shape.index(None)] if None in shape else shape
        if any(d != 1 for d in before):
            raise self.unsupported(node, f"Reshape of {_fmt(shape)} is not supported (the "
                                         f"batch axis must come first, after size-1 axes)")
        ok = len(t) == 2 and (
            (t[0] in (BATCH, self.batch_value) and t[1] in (feats, -1))
            or (t[0] == -1 and t[1] == feats))
        if not ok:
            shown = ["batch" if v == BATCH else v for v in t]
            raise self.unsupported(node, f"Reshape of {_fmt(shape)} to {shown} is not "
                                         f"supported (only to (batch, {feats}))")
        self._to_2d(node, x)


    def _reshape_view(self, shape, target):
        """The shape a Reshape of ``shape`` to ``target`` (zeros resolved; ``BATCH`` the
        batch size) gives when it only adds or removes size-1 axes, else None."""
        t = [None if v in (BATCH,) else v for v in target]
        if t.count(-1) > 1:
            return None
        if -1 in t:
            known = int(np.prod([d for d in t if d not in (None, -1)], dtype=np.int64))
            if known == 0 or _feats(shape) % known:
                return None
            # with no batch entry in the target, -1 is the batch axis
            t[t.index(-1)] = _feats(shape) // known if None in t else \
                (None if known == _feats(shape) else -1)
            if -1 in t:
                return None
        if [d for d in t if d != 1] != [d for d in shape if d != 1]:
            return None
        return t

    # --- views and recurrent layers -------------------------------------------------------

    def _axes(self, node, i: int = 1):
        """A Squeeze / Unsqueeze's axes (attribute, or constant input ``i``), or None."""
        if len(node.input) > i and node.input[i]:
            axes = self.const(node.input[i])
            if axes is None:
                raise self.unsupported(node, "computed axes are not supported")
            return [int(a) for a in np.asarray(axes).reshape(-1)]
        axes = self.attrs(node).get("axes")
        return None if axes is None else [int(a) for a in axes]

    def view(self, node, x: str, shape, step_axis=None) -> None:
        """An IR ``View`` of ``x`` as ``shape``; ``step_axis`` where a sequence's step axis
        is now (None: not a sequence, or that axis was removed)."""
        out = node.output[0]
        self.add(node, "View", [x], shape)
        if step_axis is not None:
            self.steps[out] = step_axis

    def op_Squeeze(self, node) -> None:
        x = self.data_input(node)
        shape = self.shapes[x]
        axes = self._axes(node)
        axes = [i for i, d in enumerate(shape) if d == 1] if axes is None else \
            sorted(a % len(shape) for a in axes)
        for a in axes:
            if shape[a] != 1:
                raise self.unsupported(node, f"Squeeze of axis {a} of {_fmt(shape)} (not of "
                                             f"size 1) is not supported")
        keep = [i for i in range(len(shape)) if i not in axes]
        step = self.steps.get(x)
        self.view(node, x, [shape[i] for i in keep],
                  keep.index(step) if step in keep else None)

    def op_Unsqueeze(self, node) -> None:
        x = self.data_input(node)
        shape = list(self.shapes[x])
        axes = self._axes(node)
        rank = len(shape) + len(axes)
        axes = sorted(a % rank for a in axes)
        pos = list(range(len(shape)))            # where each old axis goes
        for a in axes:
            shape.insert(a, 1)
            pos = [p + 1 if p >= a else p for p in pos]
        step = self.steps.get(x)
        self.view(node, x, shape, None if step is None else pos[step])

    def op_Transpose(self, node) -> None:
        x = self.data_input(node)
        shape = self.shapes[x]
        perm = self.attrs(node).get("perm", list(range(len(shape)))[::-1])
        moved = [a for a in perm if shape[a] not in (None, 1)]
        if moved != sorted(moved):
            raise self.unsupported(node, f"Transpose with perm {list(perm)} of {_fmt(shape)} "
                                         f"is not supported (it reorders the elements of a "
                                         f"batch row; only the batch axis and size-1 axes "
                                         f"may move)")
        step = self.steps.get(x)
        self.view(node, x, [shape[a] for a in perm],
                  None if step is None else list(perm).index(step))

    def _pick(self, node, x: str, axis: int, index: int, keep: bool) -> None:
        """Element ``index`` of ``axis`` of ``x`` (dropping the axis unless ``keep``): a
        ``View`` of a size-1 axis, the ``LastStep`` of a sequence, else refused."""
        shape = list(self.shapes[x])
        axis %= len(shape)
        size = shape[axis]
        out_shape = shape[:axis] + ([1] if keep else []) + shape[axis + 1:]
        step = self.steps.get(x)
        if size is None:
            raise self.unsupported(node, "selecting batch rows is not supported")
        if size == 1 and index in (0, -1):
            if step is not None and not keep:
                step = None if step == axis else step - (step > axis)
            self.view(node, x, out_shape, step)
            return
        if step == axis and index in (-1, size - 1):
            self.add(node, "LastStep", [x], out_shape, axis=axis)
            return
        what = "step" if step == axis else "element"
        raise self.unsupported(node, f"selecting {what} {index} of axis {axis} of "
                                     f"{_fmt(shape)} is not supported (only the last step of "
                                     f"an LSTM / GRU output, or a size-1 axis)")

    def op_Gather(self, node) -> None:
        x = self.data_input(node)
        idx = self.const(node.input[1])
        if idx is None or idx.size != 1:
            raise self.unsupported(node, "Gather on data needs one constant index")
        self._pick(node, x, int(self.attrs(node).get("axis", 0)), int(idx.reshape(-1)[0]),
                   keep=idx.ndim > 0)

    def op_Slice(self, node) -> None:
        x = self.data_input(node)
        shape = self.shapes[x]
        if self.opset < 10:
            a = self.attrs(node)
            v = [np.array(a.get("starts")), np.array(a.get("ends")), a.get("axes"), None]
        else:
            v = [self.const(i) if i else None for i in list(node.input[1:]) + [""] * 4][:4]
            if any(v[k] is None and len(node.input) > k + 1 and node.input[k + 1]
                   for k in range(4)):
                raise self.unsupported(node, "Slice with computed starts, ends, axes or "
                                             "steps is not supported")
        starts, ends = [int(s) for s in v[0]], [int(e) for e in v[1]]
        axes = [int(a) % len(shape) for a in v[2]] if v[2] is not None else \
            list(range(len(starts)))
        steps = [int(s) for s in v[3]] if v[3] is not None else [1] * len(starts)
        picks = []
        for st, en, ax, sp in zip(starts, ends, axes, steps):
            size = shape[ax]
            if size is None:
                if (st, sp) == (0, 1) and en >= (1 << 31) - 1:
                    continue
                raise self.unsupported(node, "slicing batch rows is not supported")
            r = range(size)[slice(st, en, sp)]
            if list(r) == list(range(size)):
                continue                                    # the whole axis
            if len(r) == 1:
                picks.append((ax, r[0]))
                continue
            raise self.unsupported(node, f"Slice [{st}:{en}:{sp}] of axis {ax} of "
                                         f"{_fmt(shape)} is not supported (only the whole "
                                         f"axis, or its last step of an LSTM / GRU output)")
        if len(picks) > 1:
            raise self.unsupported(node, "Slice of more than one axis is not supported")
        if not picks:
            self.view(node, x, shape, self.steps.get(x))
            return
        self._pick(node, x, picks[0][0], picks[0][1], keep=True)

    def _rnn_const(self, node, i: int, what: str, shape, default=None):
        if len(node.input) <= i or not node.input[i]:
            if default is None:
                raise self.unsupported(node, f"{node.op_type} needs its input {what}")
            return default
        v = self.const(node.input[i])
        if v is None:
            raise self.unsupported(node, f"{node.op_type} with a computed {what} is not "
                                         f"supported (only a constant)")
        v = np.asarray(v, np.float64)
        if shape is not None and v.shape != tuple(shape):
            raise self.err(node, f"{what} has shape {v.shape}, not {tuple(shape)}")
        return v

    def _rnn_state(self, node, i: int, what: str, hidden: int, layout: int) -> np.ndarray:
        """``initial_h`` / ``initial_c``: one row, the same for every batch row."""
        if len(node.input) <= i or not node.input[i]:
            return np.zeros(hidden)
        v = self._rnn_const(node, i, what, None)
        rows = v.reshape(-1, hidden) if v.ndim == 3 and v.shape[2] == hidden and \
            v.shape[1 if layout else 0] == 1 else None
        if rows is None:
            raise self.err(node, f"{what} has shape {v.shape}, not "
                                 f"{'(batch, 1, ' if layout else '(1, batch, '}{hidden})")
        if np.any(rows != rows[0]):
            raise self.unsupported(node, f"{what} that differs between batch rows is not "
                                         f"supported (one state for every sequence)")
        return rows[0]

    def _rnn_common(self, node, extra_refused: dict):
        """Checks shared by LSTM and GRU; returns x, steps, inputs, hidden, layout, attrs."""
        op = node.op_type
        a = self.attrs(node)
        def refuse(attr, why):
            raise self.unsupported(node, f"attribute {attr}: {why}")
        direction = a.get("direction", b"forward")
        direction = direction.decode() if isinstance(direction, bytes) else direction
        if direction != "forward":
            refuse("direction", f"{direction!r} is not supported (only 'forward')")
        acts = a.get("activations")
        if acts is not None:
            acts = [x.decode() if isinstance(x, bytes) else x for x in acts]
            if [x.lower() for x in acts] != _DEFAULT_ACTS[op]:
                refuse("activations", f"{acts} are not supported (only the defaults "
                                      f"{[x.capitalize() for x in _DEFAULT_ACTS[op]]})")
        if "clip" in a:
            refuse("clip", f"clip={a['clip']} is not supported (no cell clipping)")
        for attr, why in extra_refused.items():
            if a.get(attr, 0):
                refuse(attr, why)
        layout = int(a.get("layout", 0))
        if layout not in (0, 1):
            refuse("layout", f"{layout} is not supported")
        x = self.data_input(node)
        shape = self.shapes[x]
        seq_axis, batch_axis = (1, 0) if layout else (0, 1)
        if len(shape) != 3 or shape[batch_axis] is not None or shape[seq_axis] is None:
            want = "(batch, seq_length, input_size)" if layout else \
                "(seq_length, batch, input_size)"
            raise self.unsupported(node, f"input X of shape {_fmt(shape)} is not supported "
                                         f"(needs {want} with layout={layout})")
        steps, size = shape[seq_axis], shape[2]
        hidden = a.get("hidden_size")
        w = self._rnn_const(node, 1, "W", None)
        gates = 4 if op == "LSTM" else 3
        if hidden is None:
            hidden = w.shape[1] // gates
        hidden = int(hidden)
        if w.shape != (1, gates * hidden, size):
            raise self.err(node, f"W has shape {w.shape}, not (1, {gates * hidden}, {size})")
        r = self._rnn_const(node, 2, "R", (1, gates * hidden, hidden))
        b = self._rnn_const(node, 3, "B", (1, 2 * gates * hidden),
                            np.zeros((1, 2 * gates * hidden)))
        if len(node.input) > 4 and node.input[4]:
            lens = self.const(node.input[4])
            if lens is None or np.any(np.asarray(lens) != steps):
                raise self.unsupported(node, f"input sequence_lens is supported only as a "
                                             f"constant equal to the sequence length "
                                             f"{steps} for every batch row")
        return x, steps, size, hidden, layout, w[0], r[0], b[0]

    def _rnn_outputs(self, node, ir_inputs, steps, hidden, layout, **attrs) -> None:
        op = node.op_type
        used = [bool(n) and self.uses.get(n, 0) > 0 for n in node.output]
        if op == "LSTM" and len(used) > 2 and used[2]:
            raise self.unsupported(node, "output Y_c (the last cell state) is not supported "
                                         "(only Y and Y_h)")
        base = node.name or node.output[0] or node.output[1]
        y = node.output[0] if node.output and node.output[0] else f"{base}.Y"
        y_shape = (None, steps, 1, hidden) if layout else (steps, 1, None, hidden)
        self.new_tensor(node, y, y_shape)
        self.ir.add_node(Node(node.name or y, op, [ir_inputs[0], *ir_inputs[1:]], [y],
                              dict(steps=steps, hidden=hidden, **attrs),
                              (node.name, op)))
        self.steps[y] = 1 if layout else 0
        if len(used) > 1 and used[1]:
            yh = node.output[1]
            self.new_tensor(node, yh, (None, 1, hidden) if layout else (1, None, hidden))
            self.ir.add_node(Node(f"{node.name or y}.Y_h", "LastStep", [y], [yh],
                                  {"axis": self.steps[y]}, (node.name, op)))

    def _rnn_inits(self, node, **arrays) -> list:
        base = node.name or node.output[0] or node.output[1]
        names = []
        for key, value in arrays.items():
            self.ir.initializers[f"{base}.{key}"] = np.ascontiguousarray(value, np.float32)
            names.append(f"{base}.{key}")
        return names

    def op_LSTM(self, node) -> None:
        if len(node.input) > 7 and node.input[7]:
            raise self.unsupported(node, "input P (peepholes) is not supported")
        x, steps, size, hidden, layout, w, r, b = self._rnn_common(
            node, {"input_forget": "input_forget=1 (coupled input and forget gates) is not "
                                   "supported"})
        blk = lambda a, k: a[k * hidden:(k + 1) * hidden]
        order = [LSTM_GATES[g] for g in "fioc"]
        wb, rb = b[:4 * hidden], b[4 * hidden:]
        names = self._rnn_inits(
            node, W=np.concatenate([blk(w, k) for k in order]),
            R=np.concatenate([blk(r, k) for k in order]),
            b=np.concatenate([blk(wb, k) + blk(rb, k) for k in order]),
            h0=self._rnn_state(node, 5, "initial_h", hidden, layout),
            c0=self._rnn_state(node, 6, "initial_c", hidden, layout))
        self._rnn_outputs(node, [x, *names], steps, hidden, layout)

    def op_GRU(self, node) -> None:
        x, steps, size, hidden, layout, w, r, b = self._rnn_common(node, {})
        lbr = int(self.attrs(node).get("linear_before_reset", 0))
        blk = lambda a, k: a[k * hidden:(k + 1) * hidden]
        order = [GRU_GATES[g] for g in "zrn"]
        wb, rb = b[:3 * hidden], b[3 * hidden:]
        z, rr, n = order
        bias = [blk(wb, z) + blk(rb, z), blk(wb, rr) + blk(rb, rr)]
        bias += [blk(wb, n), blk(rb, n)] if lbr else [blk(wb, n) + blk(rb, n),
                                                      np.zeros(hidden)]
        names = self._rnn_inits(
            node, W=np.concatenate([blk(w, k) for k in order]),
            R=np.concatenate([blk(r, k) for k in order]), b=np.concatenate(bias),
            h0=self._rnn_state(node, 5, "initial_h", hidden, layout))
        self._rnn_outputs(node, [x, *names], steps, hidden, layout,
                          linear_before_reset=1 if lbr else 0)

def _feats(shape) -> int:
    """Elements per batch row of an importer shape (``None`` the batch axis)."""
    return int(np.prod([d for d in shape if d is not None], dtype=np.int64))


def _fmt(shape) -> str:
    return "(" + ", ".join("batch" if d is None else str(d) for d in shape) + ")"
