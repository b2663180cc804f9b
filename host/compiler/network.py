"""A compiled network: :func:`compile_onnx` and :class:`Network` (``docs/compiler.md``).

``compile_onnx(path_or_model, config)`` imports an ONNX model
(:mod:`host.compiler.onnx_import`), lowers it (:mod:`host.compiler.lower`) and returns a
:class:`Network`: the :class:`~host.spec.image.NetworkImage` with its signature and
report in ``extra``, and ``run`` / ``save`` / ``report``.

The image's ``extra["signature"]`` says how float inputs become jobs::

    {"input_shape": [None, F], "output_shape": [None, K], "input_name": ...,
     "output_name": ..., "input_features": F, "output_features": K,
     "input_vectors": ceil(F / N), "output_vectors": ceil(K / N)}

Each batch row is one job: its elements, flattened row major, rounded to FP16 (nearest
even) and zero padded to whole native vectors. The batch axis is where the model puts it
(the ``None`` of ``input_shape`` / ``output_shape``: the first axis, or axis 1 of a
seq-first recurrent model's ``(seq, batch, features)``). A sequence model's job is one
whole sequence: ``"input_rows"`` (its steps) logical vectors, each padded on its own
(``"output_rows"`` likewise for every step's output); missing, they are 1. A job's
output vectors are cut back to ``K`` elements and returned as float32.

An image input ``(batch, C, H, W)`` read through a window, or a map output of several
pixels, is kept pixel by pixel on the device: the signature then has ``"input_layout":
"chw"`` and ``"input_map": [C, H, W]`` (``"output_layout"`` / ``"output_map"``), and
each batch row is transposed from ONNX's channel-major order to ``H * W`` rows of ``C``
elements, each padded on its own to whole native vectors (and back for the output).
Without these keys (images compiled before them) rows are taken as they are.
:func:`signature_jobs` and :func:`signature_outputs` are the one implementation, which
``npu run`` uses too.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from host.spec.config import NpuConfig, parse_config
from host.spec.image import NetworkImage
from host.spec.mfu import format_unit_sets

__all__ = [
    "Network",
    "compile_graph",
    "compile_onnx",
    "config_text",
    "format_report",
    "signature_jobs",
    "signature_outputs",
]


def config_text(config: NpuConfig) -> str:
    """``config`` as :func:`host.spec.config.parse_config` text (every field), e.g. for a
    ``model:`` device string of exactly this build."""
    items = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name == "unary_ops":
            value = "+".join(op.name.lower() for op in value)
        elif f.name == "unit_sets":
            if value is None:
                continue                # every unit in every MFU, the default
            value = format_unit_sets(value, config.mfus)
        elif f.name == "lanes" and value == config.n:
            continue                    # as wide as n, the default
        items.append(f"{f.name}={value}")
    return ",".join(items)


def as_config(config) -> NpuConfig:
    """The build ``config`` names: an :class:`NpuConfig` as is, ``parse_config`` text, or
    None for the default build.

    Raises
    ------
    TypeError
        another type (naming it); ``ValueError`` from ``parse_config`` for bad text.
    """
    if config is None:
        return NpuConfig()
    if isinstance(config, NpuConfig):
        return config
    if isinstance(config, str):
        return parse_config(config)
    raise TypeError(f"config must be an NpuConfig, parse_config text or None, not "
                    f"{type(config).__name__}")


def signature_jobs(x, signature: dict, n: int, name: str = "inputs") -> np.ndarray:
    """Float inputs shaped like the model's input (the batch axis where ``input_shape``
    has ``None``) as jobs: uint16 FP16 bits ``(batch, input_vectors, n)``, each of the
    ``input_rows`` logical vectors of a job padded on its own; an image with
    ``"input_layout": "chw"`` is first transposed from ``(C, H, W)`` to ``H * W`` rows of
    ``C`` elements (the device's pixels).

    Raises
    ------
    TypeError
        ``x`` is not a float16/32/64 array (the message names ``name`` and the dtype).
    ValueError
        ``x`` does not have the model's input shape (batch first; both shapes named).

    Warns
    -----
    RuntimeWarning
        finite values that overflow to inf in the rounding to FP16.
    """
    from host.compiler.programs import native
    x = np.asarray(x)
    if x.dtype not in (np.float16, np.float32, np.float64):
        raise TypeError(f"{name} must be float16, float32 or float64 values shaped like the "
                        f"model's input, not {x.dtype}")
    want = list(signature["input_shape"])
    axis = want.index(None) if None in want else 0
    if x.ndim != len(want) or any(w is not None and w != d for w, d in zip(want, x.shape)):
        shown = "(" + ", ".join("batch" if d is None else str(d) for d in want) + ")"
        where = "batch first" if axis == 0 else f"batch axis {axis}"
        raise ValueError(f"{name} has shape {x.shape}; the model's input "
                         f"{signature.get('input_name')!r} is {shown} ({where})")
    batch = x.shape[axis]
    k = signature["input_vectors"]
    if batch == 0:
        return np.zeros((0, k, n), np.uint16)
    rows = np.moveaxis(x, axis, 0)
    c_h_w = _map_layout(signature, "input")
    if c_h_w is not None:                    # (C, H, W) -> H * W pixels of C elements
        c, h, w = c_h_w
        rows = rows.reshape(batch, c, h * w).transpose(0, 2, 1)
    else:
        rows = rows.reshape(batch, signature.get("input_rows", 1), -1)
    return native(rows, n, name).reshape(batch, k, n)


def _map_layout(signature: dict, side: str):
    """``(C, H, W)`` of a map ``side`` (``"input"`` / ``"output"``) the device keeps
    pixel by pixel (``signature[side + "_layout"] == "chw"``), else None (rows as they
    are)."""
    layout = signature.get(f"{side}_layout")
    if layout is None:
        return None
    if layout != "chw":
        raise ValueError(f"the signature's {side}_layout is {layout!r}; this runtime knows "
                         f"'chw' (ONNX's (C, H, W) rows, pixels on the device)")
    c, h, w = (int(d) for d in signature[f"{side}_map"])
    return c, h, w


def signature_outputs(results, signature: dict) -> np.ndarray:
    """Jobs' output vectors (uint16 ``(batch, output_vectors, n)``) as float32 values
    shaped like the model's output (its batch axis where the model has it); a map kept
    pixel by pixel (``"output_layout": "chw"``) transposed back to ONNX's order."""
    results = np.asarray(results, np.uint16)
    batch = results.shape[0]
    k = signature["output_features"]
    rows = signature.get("output_rows", 1)
    per_row = int(np.prod(results.shape[1:])) // rows           # (also for a batch of 0)
    flat = results.reshape(batch, rows, per_row)[:, :, :k // rows]
    c_h_w = _map_layout(signature, "output")
    if c_h_w is not None:                    # H * W pixels of C elements -> (C, H, W)
        flat = flat.transpose(0, 2, 1)
    shape = list(signature["output_shape"])
    axis = shape.index(None) if None in shape else 0
    out = flat.view(np.float16).astype(np.float32).reshape(
        (batch, *(d for i, d in enumerate(shape) if i != axis)))
    return np.moveaxis(out, 0, axis)


class Network:
    """A compiled network: an image plus what it takes and gives.

    Attributes
    ----------
    image : NetworkImage
    config : NpuConfig
        The build the image was compiled for.
    signature : dict
        ``image.extra["signature"]``.
    """

    def __init__(self, image: NetworkImage):
        if not isinstance(image.extra.get("signature"), dict):
            raise ValueError("the image has no signature (extra['signature']): it was not "
                             "compiled from a model; use npu run with native vectors")
        self.image = image
        self.config = image.build()
        self.signature = image.extra["signature"]

    @classmethod
    def load(cls, path) -> Network:
        """A network from its image file (:meth:`save`)."""
        return cls(NetworkImage.load(path))

    def save(self, path) -> None:
        """Write the network image (``.npz``, ``docs/protocol.md`` section 10)."""
        self.image.save(path)

    def report(self) -> dict:
        """Per layer: operator, shapes, MACs, MRF slots, VRF use, chains; totals; the
        predicted cycles of one job (``image.extra["report"]``, JSON-ready)."""
        return self.image.extra.get("report", {})

    def __str__(self) -> str:
        return format_report(self.report())

    def jobs(self, inputs) -> np.ndarray:
        """:func:`signature_jobs` for this network."""
        return signature_jobs(inputs, self.signature, self.config.n)

    def run(self, inputs, device="model", *, window: int = 4, progress=None) -> np.ndarray:
        """Run the network on ``inputs`` (float16/32/64, shaped like the model's input,
        batch first or where the model declares it: axis 1 of a seq-first LSTM / GRU
        input ``(T, batch, I)``, one job per sequence); returns float32 outputs shaped
        like the model's output (its batch axis where the model has it).

        ``device`` is a ``host.runtime.device.Device`` (left open) or a device string for
        :meth:`Device.open`; plain ``"model"`` is the reference model of exactly this
        network's build. Each row is one job of :meth:`Device.stream`: ``image.runs``
        runs of the program (a long sequence in chunks of steps, the state kept on the
        device between them), keeping every run's outputs or the last run's
        (``image.keep``).

        Raises
        ------
        TypeError, ValueError
            inputs of another dtype or shape (before the device is opened); a device of
            another build (``ValueError`` from ``load_image``).
        host.runtime.device.DeviceError
            the device refused a request or a job failed.
        """
        from host.runtime.device import Device
        jobs = self.jobs(inputs)
        if not len(jobs):
            return signature_outputs(np.zeros((0, self.image.job_outputs, self.config.n),
                                              np.uint16), self.signature)
        own = not isinstance(device, Device)
        if own:
            text = f"model:{config_text(self.config)}" if device == "model" else device
            dev = Device.open(text)
        else:
            dev = device
        try:
            dev.load_image(self.image)
            results = np.stack(list(dev.stream(jobs, outputs=self.image.outputs,
                                               window=window, progress=progress,
                                               prologue=self.image.job_memories,
                                               vectors=self.image.inputs,
                                               runs=self.image.runs, keep=self.image.keep)))
        finally:
            if own:
                dev.close()
        return signature_outputs(results, self.signature)


def compile_graph(graph, config=None, *, source: str = "") -> Network:
    """Lower an IR graph (:mod:`host.compiler.ir`) for ``config`` (an NpuConfig, parse_config
    text, or None for the default build) into a :class:`Network`.

    A ``Dense`` or ``Conv`` node may carry quantization settings (``host.quant`` writes
    them, ``docs/calibration.md``) in ``node.attrs["quant"]``: ``"input_exponent"``, the
    E8M0 code of a static input exponent (the lowering sets ``Q_STATIC`` /
    ``Q_EXPONENT`` for its products), and ``"weight_exponents"``, one exponent per tile
    row block of the matrix the lowering places (``(rows, column tiles)``; for a ``Conv``
    or a ``Dense`` over a map, ``host.compiler.lower.window_matrix``'s columns): the image
    then carries that matrix's MRF words quantized with them
    (:meth:`~host.compiler.programs.Builder.mrf_words`) instead of the words of the
    device's dynamic quantizer. ``None`` (or no entry) keeps the dynamic exponent.

    Raises
    ------
    host.compiler.lower.CompileError
        the graph does not fit the build (names the layer, the memory and both sizes), or
        its quantization settings are malformed (names the layer).
    """
    from host.compiler.image import program_image
    from host.compiler.lower import CompileError, lower
    from host.compiler.programs import Builder
    cfg = as_config(config)
    low = lower(graph, cfg)
    from host.spec.isa import Space
    image = program_image(low.program, per_job_vectors=False)
    # Calibrated weights: the MRF words of the matrix quantized with the node's block
    # exponents replace those of the device's quantizer (same slots, same layout).
    placed = dict(low.program.matrices)                  # tile slot -> the FP16 matrix
    for node, info in zip(graph.nodes, low.layers):
        exps = (node.attrs.get("quant") or {}).get("weight_exponents")
        if node.op not in ("Dense", "Conv") or exps is None or not info.mrf_slots:
            continue
        try:
            addr, words = Builder(cfg).mrf_words(info.mrf_slots[0],
                                                 placed[info.mrf_slots[0]],
                                                 np.asarray(exps), f"{node.where()} W")
        except (TypeError, ValueError) as exc:
            raise CompileError(f"{node.where()}: its calibrated weights: {exc}") from None
        at = [i for i, (sp, a, _) in enumerate(image.memories)
              if Space(sp) is Space.MRF and a == addr]
        image.memories[at[0]] = (Space.MRF, addr, words)
    image.job_memories = [(Space(s), int(a), np.asarray(d, np.uint16))
                          for s, a, d in low.job_vectors]
    image.inputs = low.in_vectors
    # A sequence longer than one program holds runs in chunks (docs/compiler.md section 7).
    from host.compiler.lower_rnn import runs_per_job
    image.runs = runs_per_job(low)
    image.keep = "all" if low.out_rows > 1 else "last"
    x = graph.tensors[graph.inputs[0]]
    y = graph.tensors[graph.outputs[0]]

    def declared(t):
        shape = list(t.shape)
        return shape if None in shape else [None] + shape[1:]
    image.extra["signature"] = {
        "input_shape": declared(x), "output_shape": declared(y),
        "input_name": x.name, "output_name": y.name,
        "input_features": low.in_features, "output_features": low.out_features,
        "input_vectors": image.inputs, "output_vectors": image.job_outputs}
    if low.in_rows != 1 or low.out_rows != 1:
        image.extra["signature"].update(input_rows=low.in_rows, output_rows=low.out_rows)
    # maps kept pixel by pixel: the runtime transposes each row (signature_jobs)
    if low.in_map is not None:
        image.extra["signature"].update(input_layout="chw", input_map=list(low.in_map))
    if low.out_map is not None:
        image.extra["signature"].update(output_layout="chw", output_map=list(low.out_map))
    image.extra["report"] = _report(low, cfg, image, source or graph.name, graph)
    return Network(image)


def compile_onnx(source, config=None) -> Network:
    """Compile an ONNX model (a path, with external data beside it, or an
    ``onnx.ModelProto``) for ``config`` (an :class:`NpuConfig`, parse_config text such as
    ``"n=8,tiles=1,mantissa_bits_v=8,mantissa_bits_w=8"``, or None for the default build).

    Raises
    ------
    host.compiler.onnx_import.OnnxImportError
        an unreadable file (names it), an unsupported operator (names the node, the
        operator and the supported ones).
    host.compiler.lower.CompileError
        a model the build cannot hold (names the layer, the memory and both sizes).
    ValueError
        bad ``config`` text.
    """
    from host.compiler.onnx_import import import_onnx
    cfg = as_config(config)
    graph = import_onnx(source)
    label = os.fsdecode(source) if isinstance(source, (str, bytes, os.PathLike)) else ""
    return compile_graph(graph, cfg, source=label or graph.name)


def _one_job_cycles(image: NetworkImage, cfg: NpuConfig):
    """Predicted cycles, chains and instructions of one job of zeros, summed over its
    runs (the host's time between runs not counted): every run is the same program on
    an idle core, and the prediction does not depend on the values, so one run's figures
    times the runs."""
    from host.model.core import NpuModel
    model = NpuModel(cfg)
    for space, addr, data in image.memories + image.job_memories:
        model.write(space, addr, data)
    model.load_program(image.program)
    model.push_input(np.zeros((image.run_inputs, cfg.n), np.uint16))
    result = model.run()
    runs = image.runs
    return (runs * int(result.cycles_predicted), runs * int(result.chains),
            runs * int(result.instructions))


def _report(low, cfg: NpuConfig, image: NetworkImage, source: str, graph=None) -> dict:
    layers = [info.to_json() for info in low.layers]
    # A layer's quantization settings (node.attrs["quant"]), when it has any: the static
    # input exponent (unbiased) or None, and whether the weights are the image's raw words.
    from host.spec.formats import E8M0_BIAS
    for lay, node in zip(layers, graph.nodes if graph is not None else []):
        quant = node.attrs.get("quant")
        if node.op in ("Dense", "Conv") and quant:
            code = quant.get("input_exponent")
            lay["quant"] = {
                "input": "dynamic" if code is None else "static",
                "input_exponent": None if code is None else int(code) - E8M0_BIAS,
                "weights": "dynamic" if quant.get("weight_exponents") is None else "raw",
                "offset": quant.get("offset")}
        elif node.op in ("LSTM", "GRU") and quant:
            # Both input quantizers (products on x and on h) and both matrices.
            def unbiased(code):
                return None if code is None else int(code) - E8M0_BIAS
            lay["quant"] = {
                "input_exponent": unbiased(quant.get("input_exponent")),
                "state_exponent": unbiased(quant.get("state_exponent")),
                "weights": "dynamic" if quant.get("weight_exponents") is None else "raw",
                "recurrence_weights": "dynamic" if quant.get("recurrence_exponents") is None
                else "raw"}
    vrf = {}
    for info in low.layers:
        for space, count in info.vrf.items():
            if space != "IVRF":
                vrf[space] = vrf.get(space, 0) + count
    cycles, chains, instructions = _one_job_cycles(image, cfg)
    macs = sum(info.macs for info in low.layers)
    return {
        "source": source, "build": config_text(cfg), "layers": layers,
        "totals": {"macs": macs,
                   "mrf_slots": sum(i.mrf_slots[1] for i in low.layers if i.mrf_slots),
                   "mrf_depth": cfg.mrf_depth, "ivrf_peak": low.ivrf_peak,
                   "ivrf_depth": cfg.ivrf_depth, "vrf": vrf, "vrf_depth": cfg.vrf_depth,
                   "instructions": len(image.program), "program_depth": cfg.program_depth,
                   "input_vectors": image.inputs, "output_vectors": image.job_outputs},
        # a job of several runs (docs/compiler.md section 7): the figures of all its runs,
        # the host's time between them not counted
        "per_job": {"cycles_predicted": cycles, "chains": chains, "runs": image.runs,
                    "instructions": instructions,
                    "macs_per_cycle": round(macs / cycles, 3) if cycles else None,
                    "peak_macs_per_cycle": cfg.macs_per_cycle},
    }


def format_report(report: dict) -> str:
    """The report as a text table."""
    if not report:
        return "(no report)"

    def shp(s):
        return "(" + ", ".join("B" if d is None else str(d) for d in s) + ")"

    rows = [("layer", "op", "input", "output", "MACs", "MRF slots", "VRF vectors")]
    for lay in report["layers"]:
        slots = f"{lay['mrf_slots'][0]}+{lay['mrf_slots'][1]}" if lay["mrf_slots"] else "-"
        vrf = " ".join(f"{k}:{v}" for k, v in lay["vrf"].items()) or "-"
        rows.append((lay["name"], lay["op"], shp(lay["input_shape"]), shp(lay["output_shape"]),
                     str(lay["macs"]), slots, vrf))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    t = report["totals"]
    p = report["per_job"]
    vrf = ", ".join(f"{k} {v}/{t['vrf_depth']}" for k, v in t["vrf"].items()) or "none"
    lines += [
        f"total: {t['macs']} MACs per job; MRF {t['mrf_slots']}/{t['mrf_depth']} tile slots; "
        f"IVRF peak {t['ivrf_peak']}/{t['ivrf_depth']}; VRF {vrf}; "
        f"{t['instructions']}/{t['program_depth']} instructions",
        f"per job: {t['input_vectors']} input and {t['output_vectors']} output vectors; "
        f"{p['chains']} chains; {p['cycles_predicted']} cycles predicted "
        f"({p['macs_per_cycle']} of {p['peak_macs_per_cycle']} MACs per cycle)",
        f"build: {report['build']}"]
    if isinstance(report.get("calibration"), dict):
        lines += _format_calibration(report["calibration"])
    return "\n".join(lines)


def _format_calibration(cal: dict) -> list:
    """The calibration section of :func:`format_report` (``docs/calibration.md`` 6)."""
    def num(v, fmt="{:.3g}"):
        return "-" if v is None else fmt.format(v)

    rows = [("layer", "method", "input", "mse static/dynamic", "weights", "w mse (max)",
             "offset", "sat v/w/o", "narrow", "scaled", "out err")]
    for lay in cal.get("layers", []):
        inp, wts, off = lay.get("input", {}), lay.get("weights", {}), lay.get("offset")
        counts, sc = lay.get("counts", {}), lay.get("scaling")
        e = wts.get("exponents") or []
        mode = f"static e={inp['exponent']}" if inp.get("mode") == "static" else "dynamic"
        err = (lay.get("output_error") or {}).get("rel_rms")
        rows.append((
            lay["name"], lay.get("method", cal.get("method", "")), mode,
            f"{num(inp.get('mse_static'))}/{num(inp.get('mse_dynamic'))}",
            f"{wts.get('mode', '-')} {e[0]}..{e[1]}" if e else wts.get("mode", "-"),
            f"{num(wts.get('mse'))} ({num(wts.get('mse_max_based'))})",
            (num(off.get("value")) + (" op" if off.get("op") else ""))
            if off and off.get("applied") else "-",
            (f"{counts.get('vector_saturations', '-')}/{wts.get('clipped', '-')}/"
             f"{counts.get('output_saturations', '-')}"),
            f"{counts.get('narrow_events', '-')} (k={counts.get('narrow_width', '-')})",
            f"+{sc['offset']} {sc['policy']}" if sc else "-",
            "-" if err is None else f"{100 * err:.2f} %"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    rounding = f", weight rounding {cal['rounding']}" if cal.get("rounding") else ""
    out = [(f"calibration: method {cal.get('method')}{rounding} on {cal.get('samples')} samples "
            f"({cal.get('data')}); counts on {cal.get('device')}; output error against the "
            f"{cal.get('reference', 'float reference')}")]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    total = cal.get("output_error") or {}
    out.append(f"network output error: {num(total.get('rel_rms'), '{:.4g}')} relative RMS, "
               f"{num(total.get('max_abs'), '{:.4g}')} largest")
    rs = cal.get("range_scaling")
    if rs:
        out.append(f"range scaling: {rs['accumulator_bits']}-bit accumulator, threshold "
                   f"{rs['threshold']} events ({rs['events']}); raised: {rs['policy']}")
        for it in rs.get("log", []):
            parts = []
            if it.get("input_exponent") is not None:
                parts.append(f"input e={it['input_exponent']}")
            w = it.get("weight_exponents")
            if w:
                parts.append(f"weights {w[0]}..{w[1]}")
            out.append(f"  {it['layer']} +{it['offset']}: {', '.join(parts) or 'dynamic'}: "
                       f"{it['events']} events (narrow {it['narrow_events']}, saturations "
                       f"v/w/o {it['vector_saturations']}/{it['weight_saturations']}/"
                       f"{it['output_saturations']})")
    return out
