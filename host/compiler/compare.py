"""Every layer of a compiled network against onnxruntime: :func:`compare` (``npu compare``).

For each IR node of the network (in network order; the names are the ONNX nodes' the
report lists), the device's output at that layer is set against onnxruntime's
intermediate tensor of the same ONNX node, on the same inputs:

* **onnxruntime**: a copy of the ONNX model with every compared intermediate tensor made
  an extra graph output, run once (float32, the model's own precision). An IR tensor is
  the ONNX tensor of the same name, or the last tensor in the ONNX graph that only renames
  it or folds into it: an ``Identity`` / ``Dropout`` / ``Flatten`` / ``Reshape`` the
  importer removed, the bias ``Add`` after a ``MatMul`` (the IR's ``Dense`` includes it).
* **the device**: the IR graph, re-imported from the ONNX file, truncated so that the
  layer's output is the graph's output (the layer and the nodes it depends on), compiled
  for the network's build and run on the device (the reference model by default). The
  last layer is the network itself. ``Flatten`` / ``View`` move no data (a job's row is
  its flattened elements): their output is the layer before's, reshaped.

An element-wise layer the lowering fuses into the chain of the ``Dense`` before it
(``fused_into_chain``) has no output of its own in the full program; its prefix program
ends with that chain, so its record is the fused chain's output; the ``Dense``'s own
record is the chain cut before the activation. Each prefix is compiled with exactly the
same rules as the whole network, so the values it computes up to its last layer are the
ones the whole network computes (``prefix_matches`` says whether the whole graph,
recompiled, gives ``NET.npz``'s image word for word: it does not for an image made with
settings the ONNX file does not carry, such as calibrated exponents).

Each record (:class:`LayerComparison`) gives the largest absolute error, the relative
RMS error (``rms(device - onnxruntime) / rms(onnxruntime)``), and for the last layer of a
classifier (a ``(batch, K)`` output, ``K > 1``) the fraction of rows whose argmax agrees.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import numpy as np

__all__ = ["LayerComparison", "check_same_network", "compare", "format_comparison",
           "layer_cycles", "prefix_graph"]

#: ONNX operators whose output the importer folds into the IR tensor of their one data
#: input (removed, or folded into the layer before): the IR tensor is then compared with
#: the last such output.
_FOLDED_INTO_INPUT = ("Identity", "Dropout", "Flatten", "Reshape", "BatchNormalization",
                      "Cast")
#: Arithmetic the importer folds the same way only with a constant other operand (of two
#: computed tensors, ``Add`` / ``Sub`` / ``Mul`` are IR nodes of their own).
_FOLDED_WITH_CONSTANT = ("Add", "Sub", "Mul", "Div")
#: IR ops that move no data: their output is their input, reshaped per batch row.
_NO_DATA = ("Flatten", "View")


@dataclass
class LayerComparison:
    """One layer's device output against onnxruntime's.

    Attributes
    ----------
    index : int
        Position of the IR node in the network.
    name, op : str
        The ONNX node's name and operator (as the report lists them).
    ir_op : str
        The IR op (``Dense``, ``Relu``, ...).
    tensor : str
        The IR tensor compared (the layer's output).
    onnx_tensor : str or None
        The ONNX tensor it was compared with (None: no counterpart, see ``note``).
    shape : list
        The layer's output shape, ``None`` the batch axis.
    fused_into_chain : bool
        The lowering computes this layer in the chain of the layer before it.
    max_abs_error, rel_rms_error : float or None
        ``max |device - onnxruntime|`` and ``rms(device - onnxruntime) / rms(onnxruntime)``
        over all rows and elements (``inf`` if the device gave non-finite values where
        onnxruntime did not; ``rel_rms_error`` is ``inf`` for a reference of all zeros
        with a nonzero error). None when not compared.
    reference_max_abs : float or None
        ``max |onnxruntime|``, the scale the errors are to be read against.
    argmax_agreement : float or None
        Last layer of a classifier: the fraction of rows whose largest element is the same.
    cycles_predicted : int or None
        Predicted cycles of one job of the program that ends with this layer (the
        reference model's timing), None for layers that move no data.
    note : str
        Why a value is missing, or what was compared instead.
    """
    index: int
    name: str
    op: str
    ir_op: str
    tensor: str
    onnx_tensor: str | None
    shape: list
    fused_into_chain: bool = False
    max_abs_error: float | None = None
    rel_rms_error: float | None = None
    reference_max_abs: float | None = None
    argmax_agreement: float | None = None
    cycles_predicted: int | None = None
    note: str = ""

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        for k in ("max_abs_error", "rel_rms_error", "reference_max_abs"):
            if d[k] is not None and not np.isfinite(d[k]):
                d[k] = str(d[k])                    # JSON has no inf
        return d


# --- the IR side ---------------------------------------------------------------------------

def prefix_graph(graph, tensor: str):
    """A copy of ``graph`` that ends with ``tensor``: the nodes it depends on (in order),
    ``tensor`` the graph's output, only their initializers."""
    from host.compiler.ir import Graph
    need, nodes = {tensor}, []
    for node in reversed(graph.nodes):
        if any(o in need for o in node.outputs):
            nodes.append(node)
            need.update(node.inputs)
    nodes.reverse()
    names = {t for nd in nodes for t in nd.inputs + nd.outputs} | set(graph.inputs)
    return Graph(name=f"{graph.name}[:{tensor}]", inputs=list(graph.inputs),
                 outputs=[tensor], nodes=[dataclasses.replace(nd) for nd in nodes],
                 tensors={k: v for k, v in graph.tensors.items() if k in names},
                 initializers={k: v for k, v in graph.initializers.items() if k in names})


def _fused(graph, network) -> list[bool]:
    """Per IR node: computed in the chain of the layer before (the report's layer has no
    chain of its own, and it is not a layer that moves no data)."""
    layers = network.report().get("layers") or []
    out = []
    for i, node in enumerate(graph.nodes):
        chains = layers[i].get("chains") if i < len(layers) else None
        out.append(bool(chains == 0 and node.op not in _NO_DATA and node.op != "LastStep"
                        and i > 0))
    return out


def check_same_network(graph, network, label: str) -> None:
    """Raise ValueError naming the first layer where ``network``'s report differs from the
    IR ``graph`` imported from ``label`` (nothing is checked without a report)."""
    layers = network.report().get("layers")
    if not layers:
        return
    ours = [(nd.origin[0] or nd.name, nd.origin[1] or nd.op) for nd in graph.nodes]
    theirs = [(lay["name"], lay["op"]) for lay in layers]
    if ours != theirs:
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                     min(len(ours), len(theirs)))
        a = ours[first] if first < len(ours) else "(none)"
        b = theirs[first] if first < len(theirs) else "(none)"
        raise ValueError(f"the network was not compiled from {label}: its layer {first} is "
                         f"{b}, the model's is {a} ({len(theirs)} and {len(ours)} layers)")


def _same_image(a, b) -> bool:
    """The same program and memory contents (what the device is given)."""
    from host.spec.isa import Space

    def mems(image):
        return [(Space(s), int(addr), [int(w) for w in np.asarray(d).reshape(-1)])
                for s, addr, d in image.memories + image.job_memories]
    return (np.array_equal(np.asarray(a.program, np.uint64), np.asarray(b.program, np.uint64))
            and mems(a) == mems(b))


def layer_cycles(graph, network) -> list:
    """Per IR node, the predicted cycles of one job of the program that ends with it (the
    report of the prefix compiled for ``network``'s build; the last is the network's own),
    or None for a layer that moves no data or whose prefix does not compile."""
    from host.compiler.lower import CompileError
    from host.compiler.network import compile_graph
    out = []
    last = len(graph.nodes) - 1
    for i, node in enumerate(graph.nodes):
        if i == last:
            out.append(network.report().get("per_job", {}).get("cycles_predicted"))
        elif node.op in _NO_DATA:
            out.append(None)
        else:
            try:
                net = compile_graph(prefix_graph(graph, node.outputs[0]), network.config)
                out.append(net.report()["per_job"]["cycles_predicted"])
            except CompileError:
                out.append(None)
    return out


# --- the ONNX side -------------------------------------------------------------------------

def _onnx_tensors(proto, graph) -> dict:
    """IR tensor name -> the ONNX tensor it equals (module docstring)."""
    equiv = {}
    for inp in proto.graph.input:
        if inp.name in graph.tensors:
            equiv[inp.name] = inp.name
    # constants: initializers and what is computed from them alone
    const = {i.name for i in proto.graph.initializer}
    for node in proto.graph.node:
        if all(not i or i in const for i in node.input):
            const.update(o for o in node.output if o)
    for node in proto.graph.node:
        data = [i for i in node.input if i in equiv]
        for k, o in enumerate(node.output):
            if not o:
                continue
            if o in graph.tensors:
                equiv[o] = o
            elif k == 0 and len(data) == 1 and (
                    node.op_type in _FOLDED_INTO_INPUT
                    or node.op_type in _FOLDED_WITH_CONSTANT
                    and all(not i or i in const for i in node.input if i != data[0])):
                equiv[o] = equiv[data[0]]
    found = {}
    for onnx_name, ir_name in equiv.items():       # node order: the last one wins
        found[ir_name] = onnx_name
    return found


def _run_onnxruntime(proto, names, x: np.ndarray, batch_axis: int, out_axes: dict) -> dict:
    """onnxruntime's values of ``names`` (extra outputs of a copy of ``proto``) on ``x``;
    a model with a fixed batch size is run in slices of it."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    infos = {v.name: v for v in list(model.graph.value_info) + list(model.graph.output)}
    have = {o.name for o in model.graph.output}
    for name in names:
        if name in have:
            continue
        info = infos.get(name)
        if info is not None and info.type.tensor_type.elem_type:
            model.graph.output.append(helper.make_tensor_value_info(
                name, info.type.tensor_type.elem_type, None))
        else:
            model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT,
                                                                    None))
    options = ort.SessionOptions()
    options.log_severity_level = 3          # no notes on initializers the copy leaves unused
    sess = ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    dtype = {"tensor(float)": np.float32, "tensor(float16)": np.float16,
             "tensor(double)": np.float64}.get(inp.type, np.float32)
    x = np.asarray(x, dtype)
    fixed = inp.shape[batch_axis] if batch_axis < len(inp.shape) else None
    rows = x.shape[batch_axis]
    if not isinstance(fixed, int) or fixed == rows:
        got = sess.run(list(names), {inp.name: x})
        return dict(zip(names, got))
    parts = {name: [] for name in names}
    for start in range(0, rows, fixed):
        piece = np.take(x, range(start, min(start + fixed, rows)), axis=batch_axis)
        short = fixed - piece.shape[batch_axis]
        if short:
            pad = [(0, 0)] * x.ndim
            pad[batch_axis] = (0, short)
            piece = np.pad(piece, pad)
        for name, value in zip(names, sess.run(list(names), {inp.name: piece})):
            axis = out_axes.get(name, 0)
            parts[name].append(np.take(value, range(fixed - short), axis=axis))
    return {name: np.concatenate(v, axis=out_axes.get(name, 0)) for name, v in parts.items()}


# --- the comparison ------------------------------------------------------------------------

def _rows(a: np.ndarray, axis: int) -> np.ndarray:
    a = np.moveaxis(np.asarray(a), axis, 0)
    return a.reshape(a.shape[0], -1)


def _errors(y: np.ndarray, ref: np.ndarray, classifier: bool) -> dict:
    y = y.astype(np.float64)
    ref = ref.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(y - ref)
    bad = ~np.isfinite(diff)
    max_abs = float("inf") if bad.any() else float(diff.max(initial=0.0))
    err_rms = float("inf") if bad.any() else float(np.sqrt(np.mean(diff ** 2))) if diff.size \
        else 0.0
    ref_rms = float(np.sqrt(np.mean(ref ** 2))) if ref.size else 0.0
    if ref_rms > 0:
        rel = err_rms / ref_rms
    else:
        rel = 0.0 if err_rms == 0 else float("inf")
    out = {"max_abs_error": max_abs, "rel_rms_error": rel,
           "reference_max_abs": float(np.abs(ref).max(initial=0.0))}
    if classifier and len(y):
        out["argmax_agreement"] = float(np.mean(y.argmax(1) == ref.argmax(1)))
    return out


def _open_device(device, network):
    from host.compiler.network import config_text
    from host.runtime.device import Device
    if isinstance(device, Device):
        return device, False
    text = f"model:{config_text(network.config)}" if device == "model" else device
    return Device.open(text), True


def compare(model, network, inputs, device="model", *, progress=None) -> list:
    """Compare every layer of ``network`` on ``device`` with onnxruntime's intermediate
    tensors of ``model`` (see the module docstring).

    Parameters
    ----------
    model : path or onnx.ModelProto
        The ONNX model the network was compiled from (external data beside a path).
    network : host.compiler.network.Network, or a path of its image
    inputs : array
        float16/32/64, shaped like the model's input (batch axis where the model has it).
    device : str or host.runtime.device.Device
        ``"model"`` (the reference model of the network's build, the default), another
        device string for ``Device.open``, or an open ``Device`` (left open).
    progress : bool or None
        True: a line per layer and the jobs' progress on stderr.

    Returns
    -------
    list of LayerComparison
        One per IR node, in network order.

    Raises
    ------
    host.compiler.onnx_import.OnnxImportError
        ``model`` cannot be read or imported.
    ValueError
        the network was not compiled from ``model`` (the first differing layer is named);
        ``inputs`` of another shape than the model's input.
    TypeError
        ``inputs`` not float16/32/64.
    host.runtime.device.DeviceError, host.runtime.transport.TransportError
        the device failed.
    """
    import sys
    import warnings

    from host.compiler.lower import CompileError
    from host.compiler.network import Network, compile_graph, signature_jobs
    from host.compiler.onnx_import import import_onnx, load_onnx
    from host.runtime.progress import Progress

    if not isinstance(network, Network):
        network = Network.load(network)
    label = os.fsdecode(model) if isinstance(model, (str, bytes, os.PathLike)) else \
        "the given model"
    graph = import_onnx(model)
    proto, _ = load_onnx(model)
    check_same_network(graph, network, label)
    x = np.asarray(inputs)
    signature_jobs(x, network.signature, network.config.n, "inputs")   # dtype and shape
    say = (lambda text: print(f"compare: {text}", file=sys.stderr, flush=True)) \
        if progress else (lambda text: None)

    # onnxruntime: every layer's tensor in one run
    x_tensor = graph.tensors[graph.inputs[0]]
    onnx_of = _onnx_tensors(proto, graph)
    wanted = [onnx_of[nd.outputs[0]] for nd in graph.nodes if nd.outputs[0] in onnx_of]
    wanted = list(dict.fromkeys(wanted))
    axes = {onnx_of[nd.outputs[0]]: graph.tensors[nd.outputs[0]].batch_axis
            for nd in graph.nodes if nd.outputs[0] in onnx_of}
    say(f"onnxruntime on {x.shape[x_tensor.batch_axis]} rows, {len(wanted)} tensors")
    refs = _run_onnxruntime(proto, wanted, x, x_tensor.batch_axis, axes)

    fused = _fused(graph, network)
    last = len(graph.nodes) - 1
    # whether the prefixes are compiled as NET.npz was (the whole graph recompiled)
    try:
        whole = compile_graph(graph, network.config)
        reproduced = _same_image(whole.image, network.image)
    except CompileError:
        reproduced = False
    if not reproduced:
        warnings.warn(f"the network recompiled from {label} differs from the given image "
                      f"(compiled with settings the model does not carry, such as calibrated "
                      f"exponents): layers before the last are those of the recompiled "
                      f"network", RuntimeWarning, stacklevel=2)
    dev, own = _open_device(device, network)
    records, device_out = [], {}
    try:
        for i, node in enumerate(graph.nodes):
            t = graph.tensors[node.outputs[0]]
            name, op = node.origin[0] or node.name, node.origin[1] or node.op
            rec = LayerComparison(i, name, op, node.op, t.name, onnx_of.get(t.name),
                                  [None if d is None else int(d) for d in t.shape],
                                  fused_into_chain=fused[i])
            records.append(rec)
            src = node.inputs[0]
            if node.op in _NO_DATA and i != last:
                prev = device_out.get(src)
                if prev is None and src == graph.inputs[0]:
                    prev = x.astype(np.float16).astype(np.float32)
                if prev is not None:
                    rows = np.moveaxis(prev, graph.tensors[src].batch_axis, 0)
                    rows = rows.reshape(len(rows), -1)
                    shape = [len(rows) if d is None else d for d in t.shape]
                    device_out[t.name] = np.moveaxis(
                        rows.reshape([len(rows)] + [d for d in t.shape if d is not None]),
                        0, t.batch_axis).reshape(shape)
                rec.note = "moves no data: the layer before's output"
            else:
                if i == last:
                    net = network
                else:
                    try:
                        net = compile_graph(prefix_graph(graph, t.name), network.config)
                    except CompileError as exc:
                        rec.note = f"the program ending here does not compile: {exc}"
                        say(f"layer {i + 1}/{len(graph.nodes)} {name} ({op}): {rec.note}")
                        continue
                rec.cycles_predicted = net.report().get("per_job", {}).get(
                    "cycles_predicted")
                say(f"layer {i + 1}/{len(graph.nodes)} {name} ({op}) on {dev.transport.name}")
                bar = Progress(None, "jobs") if progress else None
                try:
                    device_out[t.name] = net.run(x, device=dev, progress=bar)
                finally:
                    if bar is not None:
                        bar.close()
            y = device_out.get(t.name)
            ref_name = rec.onnx_tensor
            ref = refs.get(ref_name) if ref_name is not None else None
            if y is None:
                rec.note = rec.note or "no device output"
                continue
            if ref is None:
                rec.note = (rec.note + "; " if rec.note else "") + \
                    "no ONNX tensor of this layer to compare with"
                continue
            yr, rr = _rows(y, t.batch_axis), _rows(ref, t.batch_axis)
            if yr.shape != rr.shape:
                rec.note = (f"the device's output has {yr.shape[1]} elements per row, "
                            f"onnxruntime's {ref_name!r} {rr.shape[1]}")
                continue
            classifier = i == last and len(t.shape) == 2 and yr.shape[1] > 1
            for k, v in _errors(yr, rr, classifier).items():
                setattr(rec, k, v)
            if ref_name != t.name:
                rec.note = (rec.note + "; " if rec.note else "") + \
                    f"ONNX tensor {ref_name!r} (folded into this layer)"
    finally:
        if own:
            dev.close()
    return records


# --- text --------------------------------------------------------------------------------

def _num(v, fmt="{:.3g}") -> str:
    return "-" if v is None else fmt.format(v)


def format_comparison(records: list) -> str:
    """The records as a text table (``npu compare``'s output; notes cut to 120 characters,
    whole in ``to_json``)."""
    def shp(s):
        return "(" + ", ".join("B" if d is None else str(d) for d in s) + ")"

    rows = [("#", "layer", "op", "output", "max abs err", "rel RMS err", "|ref| max",
             "argmax", "cycles", "note")]
    for r in records:
        rows.append((str(r.index), r.name, r.op + (" (fused)" if r.fused_into_chain else ""),
                     shp(r.shape), _num(r.max_abs_error), _num(r.rel_rms_error),
                     _num(r.reference_max_abs),
                     _num(r.argmax_agreement, "{:.1%}"), _num(r.cycles_predicted, "{}"),
                     r.note if len(r.note) <= 120 else r.note[:117] + "..."))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1]
             for row in rows]
    return "\n".join(line.rstrip() for line in lines)
