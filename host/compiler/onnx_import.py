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
  with a constant right operand become ``Dense`` (``W`` of shape ``(out, in)``); an
  ``Add`` of a constant vector right after one becomes its bias; ``Relu``, ``Sigmoid``,
  ``Tanh``; ``Softmax`` over the last axis (all of a row's features); ``Flatten`` and
  ``Reshape`` to ``(batch, features)``.

The first axis of the (single) graph input is the batch: each batch row is one job.
Anything else raises :class:`OnnxImportError` naming the ONNX node, its operator and the
supported operators; a file that cannot be parsed raises it naming the file.
"""

from __future__ import annotations

import os

import numpy as np

from host.compiler.ir import Graph, IRError, Node

__all__ = ["FOLDED_OPS", "SUPPORTED_OPS", "OnnxImportError", "import_onnx", "load_onnx"]

#: Operators that become IR nodes (on data, batch first).
SUPPORTED_OPS = ("Gemm", "MatMul", "Add", "Relu", "Sigmoid", "Tanh", "Softmax", "Flatten",
                 "Reshape", "Identity", "Dropout")
#: Operators folded away when every input is a constant (``Shape`` also on data).
FOLDED_OPS = ("Constant", "Shape", "Gather", "Concat", "Unsqueeze", "Squeeze", "Reshape",
              "Flatten", "Cast", "Transpose", "Add", "Sub", "Mul", "Div", "Identity")

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

    def const(self, n: str):
        return self.consts.get(self.name(n))

    def attrs(self, node) -> dict:
        helper = self.onnx.helper
        return {a.name: helper.get_attribute_value(a) for a in node.attribute}

    def data_input(self, node, i: int = 0) -> str:
        n = self.name(node.input[i])
        if n not in self.shapes:
            raise self.err(node, f"input {node.input[i]!r} is not defined")
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
        if any(d is None for d in dims[1:]):
            raise OnnxImportError(f"{self.label}: input {x.name!r} has shape {dims}: only the "
                                  f"batch axis (the first) may be unknown")
        self.batch_value = dims[0]              # a fixed batch size is still the batch axis
        self.shapes[x.name] = (None, *dims[1:])
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
        except OnnxImportError:
            raise
        except Exception as exc:
            raise self.err(node, f"cannot fold this node on its constant inputs: {exc}") \
                from None
        raise self.unsupported(node, f"operator {op!r} on constant inputs is not folded")

    # --- data operators -----------------------------------------------------------------

    def _features(self, node, n: str) -> int:
        shape = self.shapes[n]
        if len(shape) != 2:
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

    def op_Add(self, node) -> None:
        k = [i for i in (0, 1) if self.const(node.input[i]) is not None]
        if len(k) != 1:
            raise self.unsupported(node, "Add of two computed tensors is not supported (only "
                                         "a constant bias after MatMul or Gemm)")
        x = self.data_input(node, 1 - k[0])
        prod = self.ir.producer(x)
        if prod is None or prod.op != "Dense" or self.uses.get(x, 0) != 1:
            raise self.unsupported(node, "Add is supported only as the bias right after a "
                                         "MatMul or Gemm (whose result nothing else reads)")
        rows = self.shapes[x][1]
        c = self._bias(node, self.const(node.input[k[0]]), rows, "the added constant")
        base = prod.inputs[1][:-2]
        if len(prod.inputs) == 3:
            self.ir.initializers[prod.inputs[2]] = \
                (self.ir.initializers[prod.inputs[2]].astype(np.float64) + c).astype(np.float32)
        else:
            self.ir.initializers[f"{base}.b"] = c.astype(np.float32)
            prod.inputs.append(f"{base}.b")
        prod.origin = (prod.origin[0], prod.origin[1] + "+Add")
        self.alias[node.output[0]] = x

    def _unary(self, node) -> None:
        x = self.data_input(node)
        self.add(node, node.op_type, [x], self.shapes[x])

    op_Relu = op_Sigmoid = op_Tanh = _unary

    def op_Softmax(self, node) -> None:
        x = self.data_input(node)
        shape = self.shapes[x]
        rank = len(shape)
        axis = self.attrs(node).get("axis", -1 if self.opset >= 13 else 1)
        axis = axis + rank if axis < 0 else axis
        whole = (self.opset < 13 and axis == 1) or \
            (axis == rank - 1 and all(d == 1 for d in shape[1:-1]))
        if not whole or axis == 0:
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
        if len(shape) == 2:
            self.alias[node.output[0]] = x
            return
        self.add(node, "Flatten", [x], (None, int(np.prod(shape[1:]))))

    def op_Flatten(self, node) -> None:
        x = self.data_input(node)
        shape = self.shapes[x]
        axis = self.attrs(node).get("axis", 1)
        axis = axis + len(shape) if axis < 0 else axis
        if axis != 1:
            raise self.unsupported(node, f"Flatten with axis={axis} is not supported (only "
                                         f"axis=1: (batch, features))")
        self._to_2d(node, x)

    def op_Reshape(self, node) -> None:
        x = self.data_input(node)
        target = self.const(node.input[1])
        if target is None:
            raise self.unsupported(node, "Reshape to a computed shape is not supported")
        shape = self.shapes[x]
        feats = int(np.prod(shape[1:]))
        t = [int(v) for v in target]
        allowzero = self.attrs(node).get("allowzero", 0)
        if not allowzero:
            t = [(BATCH if i == 0 else shape[i]) if v == 0 and i < len(shape) else v
                 for i, v in enumerate(t)]
        ok = len(t) == 2 and (
            (t[0] in (BATCH, self.batch_value) and t[1] in (feats, -1))
            or (t[0] == -1 and t[1] == feats))
        if not ok:
            shown = ["batch" if v == BATCH else v for v in t]
            raise self.unsupported(node, f"Reshape of {_fmt(shape)} to {shown} is not "
                                         f"supported (only to (batch, {feats}))")
        self._to_2d(node, x)


def _fmt(shape) -> str:
    return "(" + ", ".join("batch" if d is None else str(d) for d in shape) + ")"
