"""The quantization file: trained or hand-set exponents that ``npu compile --quant`` applies.

:meth:`host.quant.qat.DeviceModule.export` writes it beside the trained ONNX model
(``docs/training.md`` section 2); this module reads it and compiles with it, without
PyTorch. Format (JSON)::

    {"version": 1, "n": N, "mantissa_bits_v": m_v, "mantissa_bits_w": m_w,
     "layers": {"<Dense or Conv node name>": {"input_exponent": E8M0 code or null,
                                      "weight_exponents": [[int, ...], ...] or null,
                                      "offset": float or null}}}

``input_exponent`` null is the dynamic exponent; ``weight_exponents`` null the max-based
rule; ``offset`` is informational (an offset is already folded into the biases of the
ONNX model the file goes with). Recurrent layers (``LSTM`` / ``GRU`` nodes) may be listed
too: ``{"input_exponent", "state_exponent": E8M0 code or null, "weight_exponents",
"recurrence_exponents": [[int, ...], ...] or null, "offset": null}``, the static
exponents of the products on ``x`` and on ``h`` (GRU's ``r * h`` included) and the block
exponents of ``W`` and ``R`` (rows in the IR's gate order, one per native vector of
columns); left out, they keep the dynamic exponents and the max-based rule.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

__all__ = ["QUANT_VERSION", "QatError", "load_quant", "apply_quant", "compile_quantized"]

#: Version of the quantization file.
QUANT_VERSION = 1


class QatError(ValueError):
    """A graph, setting or quantization file that cannot be used; the message names it."""


def load_quant(path) -> dict:
    """Read a quantization file (:meth:`DeviceModule.export`'s JSON).

    Raises
    ------
    QatError
        the file is missing, not JSON, of another version, or malformed (naming it).
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise QatError(f"cannot read the quantization file {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("version") != QUANT_VERSION or \
            not isinstance(data.get("layers"), dict):
        raise QatError(f"{path} is not a version {QUANT_VERSION} quantization file "
                       f"(a JSON object with 'version' and 'layers')")
    return data


def apply_quant(graph, data: dict, *, source: str = "the quantization file"):
    """Set the matrix layers' (``Dense``, ``Conv``) ``attrs["quant"]`` of ``graph`` (in
    place) from a quantization file's ``layers``; every layer of the file must be one of
    them and each of them must be in the file.

    Recurrent layers (``LSTM``, ``GRU``) may be in the file (``input_exponent`` and
    ``state_exponent`` for their products on x and on h, ``weight_exponents`` and
    ``recurrence_exponents`` for W and R, each null or as the file gives them) or left
    out (dynamic exponents, max-based weights).

    Raises
    ------
    QatError
        naming the layer that is missing on either side or whose settings are malformed.
    """
    layers = dict(data["layers"])
    for nd in graph.nodes:
        if nd.op in ("LSTM", "GRU") and nd.name in layers:
            nd.attrs["quant"] = _recurrent_settings(graph, nd, layers.pop(nd.name), source)
    dense = {nd.name: nd for nd in graph.nodes if nd.op in ("Dense", "Conv")}
    extra = sorted(set(layers) - set(dense))
    missing = sorted(set(dense) - set(layers))
    if extra or missing:
        raise QatError(f"{source} does not match the model: layers not in the model "
                       f"{extra}, matrix layers without settings {missing}")
    for name, s in layers.items():
        node = dense[name]
        if not isinstance(s, dict):
            raise QatError(f"{source}: layer {name!r} has settings {s!r}, not an object")
        node.attrs["quant"] = {
            "input_exponent": _code(s, "input_exponent", name, source),
            # One exponent per MRF word: (rows, column tiles of the matrix the lowering
            # places); compile_graph checks the column count against that matrix.
            "weight_exponents": _exponents(s, "weight_exponents", name, source,
                                           graph.initializers[node.inputs[1]].shape[0]),
            "offset": s.get("offset")}
    return graph


def _code(s: dict, field: str, name: str, source: str):
    code = s.get(field)
    if code is not None and not (isinstance(code, int) and 0 <= code <= 254):
        raise QatError(f"{source}: layer {name!r} has {field} {code!r}, not an E8M0 code "
                       f"0..254 or null")
    return code


def _exponents(s: dict, field: str, name: str, source: str, rows: int, cols=None):
    """The block exponents ``s[field]`` (None, or integers ``(rows, cols)``; ``cols``
    None: any column count) as int16."""
    w = s.get(field)
    if w is None:
        return None
    w = np.asarray(w)
    if w.ndim != 2 or w.shape[0] != rows or w.dtype.kind not in "iu" or \
            (cols is not None and w.shape[1] != cols):
        raise QatError(f"{source}: layer {name!r} has {field} of shape {w.shape} "
                       f"({w.dtype}), the layer needs integers of shape "
                       f"({rows}, {'column tiles' if cols is None else cols})")
    return w.astype(np.int16)


def _recurrent_settings(graph, node, s, source: str) -> dict:
    """A recurrent layer's ``attrs["quant"]`` from its entry in the file: the static
    exponents of its products on x and on h, the block exponents of W and R (one per
    row and native vector of columns; rows in the IR's gate order)."""
    name = node.name
    if not isinstance(s, dict):
        raise QatError(f"{source}: layer {name!r} has settings {s!r}, not an object")
    w, r = (graph.initializers[node.inputs[i]] for i in (1, 2))
    return {"input_exponent": _code(s, "input_exponent", name, source),
            "state_exponent": _code(s, "state_exponent", name, source),
            "weight_exponents": _exponents(s, "weight_exponents", name, source,
                                           w.shape[0], None),
            "recurrence_exponents": _exponents(s, "recurrence_exponents", name, source,
                                               r.shape[0], None),
            "offset": None}


def compile_quantized(source, config=None, *, quant):
    """Compile an ONNX model (as :func:`host.compiler.network.compile_onnx`) with the
    exponents of the quantization file ``quant`` (a path): ``npu compile --quant``.

    Raises
    ------
    QatError
        the file is unreadable or does not match the model, or was made for another N or
        other mantissa widths than ``config`` (naming both).
    host.compiler.onnx_import.OnnxImportError, host.compiler.lower.CompileError
        as ``compile_onnx``.
    """
    from host.compiler.network import as_config, compile_graph
    from host.compiler.onnx_import import import_onnx
    cfg = as_config(config)
    data = load_quant(quant)
    made = {k: data.get(k) for k in ("n", "mantissa_bits_v", "mantissa_bits_w")}
    build = {k: getattr(cfg, k) for k in made}
    if made != build:
        raise QatError(f"{quant} was made for {made}, the build has {build}: compile with "
                       f"a --config of the same N and mantissa widths")
    graph = apply_quant(import_onnx(source), data, source=os.fsdecode(quant))
    label = os.fsdecode(source) if isinstance(source, (str, bytes, os.PathLike)) else ""
    net = compile_graph(graph, cfg, source=label or graph.name)
    net.image.extra.setdefault("report", {})["quantization_file"] = os.fsdecode(quant)
    return net
