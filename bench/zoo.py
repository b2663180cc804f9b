"""Accuracy of the model zoo on the NPU: FP32 (onnxruntime) against the compiled network.

For every zoo model (``zoo/<name>/seed<k>/``: ``model.onnx``, ``data.npz`` with the seeded
split's ``x_test`` / ``y_test`` / ``x_calib``, ``meta.json``) and each of its five seeds,
on the held-out test set of that seed's split:

* FP32 accuracy: onnxruntime on ``model.onnx`` (float32, as trained);
* NPU accuracy at 8-bit mantissas (the default build with ``mantissa_bits_v = 8``,
  ``mantissa_bits_w = 8``) and at the default build (4-bit mantissas), each image run on
  the reference model (``host.model``, bit-exact with the RTL) through its NumPy export
  (:func:`run_batch`, checked bit for bit against the model on the first rows);
* the agreement of the NPU's predicted class with the FP32 model's (the project's
  decision on accuracy figures: one test sample is worth 0.2 to 2 points, so a threshold
  tighter than the spread over seeds is judged by agreement, which bounds the accuracy
  difference: ``|acc_npu - acc_fp32| <= 100 - agreement`` points on every seed);
* calibrated: when the compiler takes calibration samples
  (``host.quant.ptq.compile_calibrated``), the default build with exponents calibrated by
  least squared error (``method="mmse"``) on the seed's ``x_calib`` (its first
  :data:`CALIB_ROWS` rows: calibration runs them through the reference model layer by
  layer, about 0.1 s a row for the character model);
* cycles per inference and MVM utilization (useful MACs over the build's peak MACs per
  cycle times the predicted cycles of one job) from the network's report.

Records are means and standard deviations over the seeds (``config["std"]``, the
per-seed values in ``config["per_seed"]``). ``run()`` is the benchmark; the helpers are
shared with ``bench.demo``.
"""

from __future__ import annotations

import inspect
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench import record

__all__ = [
    "BUILD_8BIT",
    "NAMES",
    "SEEDS",
    "ZOO",
    "ZooEntry",
    "accuracy",
    "calibration_available",
    "compile_entry",
    "evaluate",
    "fp32_outputs",
    "predictions",
    "run",
    "zoo_entries",
]

ZOO = Path(__file__).resolve().parent.parent / "zoo"
#: The zoo's models, smallest first, and its seeds.
NAMES = ("mlp", "cnn", "lstm", "gru", "charlstm")
SEEDS = tuple(range(5))
#: The 8-bit build: the default build with 8-bit vector and weight mantissas.
BUILD_8BIT = "mantissa_bits_v=8,mantissa_bits_w=8"
#: Calibration rows the bench calibrates on (the digits models have 180).
CALIB_ROWS = 512


@dataclass
class ZooEntry:
    """One trained model of the zoo (one seed): its files and its test data."""
    name: str
    seed: int
    path: Path
    meta: dict
    data: dict = field(repr=False)

    @property
    def onnx(self) -> Path:
        return self.path / "model.onnx"

    @property
    def x_test(self) -> np.ndarray:
        return self.data["x_test"]

    @property
    def y_test(self) -> np.ndarray:
        return self.data["y_test"]

    @property
    def x_calib(self) -> np.ndarray:
        return self.data["x_calib"]


def zoo_entries(seed: int = 0, names=None, root=None) -> list:
    """The zoo models of ``seed`` whose files exist, in the order of ``names`` (default
    :data:`NAMES`), under ``root`` (default :data:`ZOO`)."""
    out = []
    for name in NAMES if names is None else names:
        d = Path(ZOO if root is None else root) / name / f"seed{seed}"
        if not all((d / f).is_file() for f in ("model.onnx", "data.npz", "meta.json")):
            continue
        with np.load(d / "data.npz") as f:
            data = {k: f[k] for k in f.files}
        out.append(ZooEntry(name, seed, d, json.loads((d / "meta.json").read_text()), data))
    return out


def fp32_outputs(path, x: np.ndarray) -> np.ndarray:
    """onnxruntime's output of the ONNX model ``path`` on ``x`` (batch first; a model with a
    fixed batch size is run a slice at a time)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.log_severity_level = 3
    sess = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    fixed = inp.shape[0] if inp.shape and isinstance(inp.shape[0], int) else None
    x = np.asarray(x, np.float32)
    if fixed is None or fixed == len(x):
        return sess.run(None, {inp.name: x})[0]
    parts = []
    for start in range(0, len(x), fixed):
        piece = x[start:start + fixed]
        short = fixed - len(piece)
        if short:
            piece = np.concatenate([piece, np.zeros((short, *x.shape[1:]), x.dtype)])
        parts.append(sess.run(None, {inp.name: piece})[0][:fixed - short])
    return np.concatenate(parts)


def predictions(outputs: np.ndarray) -> np.ndarray:
    """The predicted class of each row: the argmax of the last axis (batch first)."""
    return np.asarray(outputs).argmax(-1)


def accuracy(pred: np.ndarray, labels: np.ndarray) -> float:
    """Percent of ``pred`` equal to ``labels``."""
    pred, labels = np.asarray(pred).reshape(-1), np.asarray(labels).reshape(-1)
    return float(100.0 * np.mean(pred == labels)) if len(labels) else float("nan")


def _calibrated_compiler():
    """The compiler's entry point for calibrated exponents, or None when there is none yet:
    ``host.quant.ptq.compile_calibrated`` (``npu compile --calibrate``), else a
    ``calibrate`` parameter of ``compile_onnx``."""
    try:
        from host.quant.ptq import compile_calibrated
        return compile_calibrated
    except ImportError:
        pass
    from host.compiler.network import compile_onnx
    if "calibrate" in inspect.signature(compile_onnx).parameters:
        return compile_onnx
    return None


def calibration_available() -> bool:
    """Whether the compiler takes calibration samples (:func:`_calibrated_compiler`)."""
    return _calibrated_compiler() is not None


def compile_entry(entry: ZooEntry, config=None, *, calibrate: bool = False,
                  calib_samples: int | None = None):
    """``compile_onnx`` of the entry's model for ``config`` (parse_config text or None);
    with ``calibrate``, the exponents calibrated (method ``"mmse"``, seed 002) on the
    entry's ``x_calib`` (its first ``calib_samples`` rows; None: all)."""
    from host.compiler.network import compile_onnx
    if calibrate:
        return _calibrated_compiler()(entry.onnx, config,
                                      calibrate=entry.x_calib[:calib_samples], method="mmse")
    return compile_onnx(entry.onnx, config)


def _batch_first(net, y: np.ndarray) -> np.ndarray:
    shape = list(net.signature["output_shape"])
    return np.moveaxis(y, shape.index(None), 0) if None in shape else y


def utilization(report: dict) -> float:
    """MVM utilization of one job in percent: useful MACs over the build's peak MACs per
    cycle times the predicted cycles (``report["per_job"]``)."""
    p = report["per_job"]
    cycles, peak = p["cycles_predicted"], p["peak_macs_per_cycle"]
    return 100.0 * report["totals"]["macs"] / (cycles * peak) if cycles and peak else 0.0


#: Rows of every batch run through the export that are also run on the reference model and
#: must give the same bits (:func:`run_batch`).
CHECK_ROWS = 8


def run_batch(net, x: np.ndarray, *, check_rows: int = CHECK_ROWS) -> np.ndarray:
    """``net.run(x)`` on the reference model, computed by the image's NumPy export
    (``host.compiler.export``: the model's kernels, all rows as one batch, bit for bit the
    model's outputs), which is tens of times faster for thousands of rows. The first
    ``check_rows`` rows also run on the reference model itself (``Device.stream``); their
    outputs must be bit-identical.

    Raises
    ------
    AssertionError
        the export and the reference model differ on the checked rows.
    """
    import importlib.util
    import sys
    import tempfile

    from host.compiler.export import export_image
    from host.compiler.network import signature_outputs
    with tempfile.TemporaryDirectory(prefix="npu-zoo-") as tmp:
        py, _ = export_image(net.image, Path(tmp) / "layer.py")
        name = f"_npu_zoo_layer_{id(net)}"
        spec = importlib.util.spec_from_file_location(name, py)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module          # dataclasses in the module look themselves up
        try:
            spec.loader.exec_module(module)
            results, _ = module.run(net.jobs(x))
        finally:
            del sys.modules[name]
    y = signature_outputs(results, net.signature)
    if check_rows and len(x):
        rows = min(check_rows, len(x))
        axis = list(net.signature["input_shape"]).index(None) \
            if None in net.signature["input_shape"] else 0
        out_axis = list(net.signature["output_shape"]).index(None) \
            if None in net.signature["output_shape"] else 0
        want = net.run(np.take(x, range(rows), axis=axis))
        got = np.take(y, range(rows), axis=out_axis)
        assert np.array_equal(want.view(np.uint32), got.view(np.uint32)), \
            f"the export of {net.report().get('source')} differs from the reference model"
    return y


def evaluate(entry: ZooEntry, config=None, *, x=None, labels=None, fp32_pred=None,
             calibrate: bool = False, calib_samples: int | None = None, device="model",
             progress=None) -> dict:
    """Compile ``entry`` for ``config`` and run it on ``x`` (default the test set) on
    ``device`` (``"model"``: the reference model, by :func:`run_batch`): accuracy against
    ``labels``, agreement with ``fp32_pred`` (percent), cycles per inference and
    utilization from the report, the network, its outputs."""
    x = entry.x_test if x is None else x
    labels = entry.y_test[:len(x)] if labels is None else labels
    start = time.monotonic()
    net = compile_entry(entry, config, calibrate=calibrate, calib_samples=calib_samples)
    compiled = time.monotonic() - start
    y = run_batch(net, x) if device == "model" else \
        net.run(x, device=device, progress=progress)
    y = _batch_first(net, y)
    pred = predictions(y)
    report = net.report()
    out = {"network": net, "outputs": y, "accuracy": accuracy(pred, labels),
           "agreement": accuracy(pred, fp32_pred) if fp32_pred is not None else None,
           "cycles": report["per_job"]["cycles_predicted"],
           "utilization": utilization(report), "samples": len(x),
           "compile_seconds": compiled, "run_seconds": time.monotonic() - start - compiled}
    return out


def _stats(values) -> tuple[float, float]:
    v = np.asarray(values, np.float64)
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def _say(text: str) -> None:
    import sys
    print(f"bench zoo: {text}", file=sys.stderr, flush=True)


def run(root=None, names=None, seeds=SEEDS) -> list:
    """Zoo accuracy over 5 seeds (FP32, NPU 8-bit, default build), agreement, cycles, util.

    ``root``, ``names``, ``seeds``: another zoo folder, models and seeds (for tests)."""
    records = []
    calib = calibration_available()
    root = Path(ZOO if root is None else root)
    for name in NAMES if names is None else names:
        seeds_found = [e for s in seeds for e in zoo_entries(s, (name,), root)]
        if not seeds_found:
            _say(f"{name}: no trained model under {root / name} (python -m zoo.train)")
            continue
        rows, errors = [], []
        for entry in seeds_found:
            start = time.monotonic()
            ref = predictions(fp32_outputs(entry.onnx, entry.x_test))
            row = {"seed": entry.seed, "fp32": accuracy(ref, entry.y_test),
                   "samples": len(entry.y_test),
                   "calib_rows": len(entry.x_calib[:CALIB_ROWS])}
            try:
                for key, cfg, cal in (("bit8", BUILD_8BIT, False), ("default", None, False),
                                      ("calibrated", None, True)):
                    if cal and not calib:
                        continue
                    got = evaluate(entry, cfg, fp32_pred=ref, calibrate=cal,
                                   calib_samples=CALIB_ROWS)
                    row[key] = got["accuracy"]
                    row[f"{key}_agreement"] = got["agreement"]
                    if key == "default":
                        row["cycles"], row["utilization"] = got["cycles"], got["utilization"]
            except Exception as exc:  # noqa: BLE001  (a model not compiled yet: recorded)
                errors.append(f"seed {entry.seed}: {type(exc).__name__}: {exc}")
                _say(f"{name} seed {entry.seed}: {type(exc).__name__}: {exc}")
                continue
            rows.append(row)
            _say(f"{name} seed {entry.seed}: FP32 {row['fp32']:.2f} %, 8-bit {row['bit8']:.2f} "
                 f"% (agreement {row['bit8_agreement']:.2f} %), default {row['default']:.2f} "
                 f"% ({time.monotonic() - start:.1f} s)")
        sizes = sorted({r["samples"] for r in rows})
        common = {"model": name, "seeds": [r["seed"] for r in rows],
                  "test_samples": sizes[0] if len(sizes) == 1 else sizes,
                  "split": "test", "device": "reference model"}
        if errors:
            records.append(record(f"zoo {name} seeds that failed to compile or run",
                                  len(errors), "seeds", first_error=errors[0][:300],
                                  errors=errors, **common))
        if not rows:
            continue
        for key, what in (("fp32", "accuracy, FP32 (onnxruntime)"),
                          ("bit8", "accuracy, NPU 8-bit mantissas"),
                          ("default", "accuracy, NPU default build"),
                          ("calibrated", "accuracy, NPU default build calibrated"),
                          ("bit8_agreement", "agreement with FP32 class, NPU 8-bit mantissas"),
                          ("default_agreement", "agreement with FP32 class, NPU default build"),
                          ("calibrated_agreement",
                           "agreement with FP32 class, NPU default build calibrated")):
            if key not in rows[0]:
                continue
            vals = [r[key] for r in rows]
            mean, std = _stats(vals)
            extra = {"calibration_rows": [r["calib_rows"] for r in rows],
                     "method": "mmse"} if key.startswith("calibrated") else {}
            records.append(record(f"zoo {name} {what}", round(mean, 3), "%",
                                  std=round(std, 3), per_seed=[round(v, 3) for v in vals],
                                  **extra, **common))
        diff = [r["bit8"] - r["fp32"] for r in rows]
        mean, std = _stats(diff)
        worst = min(r["bit8_agreement"] for r in rows)
        # agreement pooled over every seed's test rows: |acc_8bit - acc_fp32| on the pooled
        # rows is at most 100 - pooled agreement points
        pooled = sum(r["bit8_agreement"] * r["samples"] for r in rows) / \
            sum(r["samples"] for r in rows)
        records.append(record(
            f"zoo {name} accuracy change, NPU 8-bit mantissas minus FP32", round(mean, 3),
            "points", std=round(std, 3), per_seed=[round(v, 3) for v in diff],
            pooled_agreement=round(pooled, 3), lowest_agreement=round(worst, 3),
            within_half_point_by_agreement=bool(pooled >= 99.5),
            within_half_point_by_accuracy=bool(all(abs(d) <= 0.5 for d in diff)),
            **common))
        mean, _ = _stats([r["cycles"] for r in rows])
        records.append(record(f"zoo {name} cycles per inference, default build",
                              round(mean), "cycles", **common))
        mean, _ = _stats([r["utilization"] for r in rows])
        records.append(record(f"zoo {name} MVM utilization, default build", round(mean, 3),
                              "%", **common))
    return records


# --- the table of docs/zoo-accuracy.md ---------------------------------------------------------

def markdown_table(records: list) -> str:
    """The zoo's records (``bench/results.json``) as the Markdown table of
    ``docs/zoo-accuracy.md``: per model, mean +- standard deviation over the seeds."""
    by = {r["name"]: r for r in records if (r.get("config") or {}).get("bench") in
          (None, "zoo")}

    def cell(name, fmt="{:.1f}"):
        r = by.get(name)
        if r is None:
            return "-"
        std = r["config"].get("std")
        return fmt.format(r["value"]) + ("" if std is None else
                                         " ± " + fmt.replace("+", "").format(std))

    head = ["model", "seeds x test rows", "FP32 (onnxruntime)", "NPU 8-bit", "8-bit - FP32",
            "8-bit same class as FP32 (lowest seed)", "NPU default", "default same class",
            "NPU default calibrated", "cycles / inference", "MVM utilization"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name in NAMES:
        p = f"zoo {name} "
        fp32 = by.get(p + "accuracy, FP32 (onnxruntime)")
        failed = by.get(p + "seeds that failed to compile or run")
        if fp32 is None:
            if failed is not None:
                why = failed["config"].get("first_error", "")[:160].replace("|", "/")
                lines.append(f"| {name} | - | not compiled: {why} |" + " |" * (len(head) - 3))
            continue
        cfg = fp32["config"]
        change = by.get(p + "accuracy change, NPU 8-bit mantissas minus FP32")
        agree = by.get(p + "agreement with FP32 class, NPU 8-bit mantissas")
        lowest = "-" if change is None else f"{change['config']['lowest_agreement']:.1f}"
        cycles = by.get(p + "cycles per inference, default build")
        util = by.get(p + "MVM utilization, default build")
        lines.append("| " + " | ".join([
            name, f"{len(cfg['seeds'])} x " + (f"{cfg['test_samples']}" if isinstance(
                cfg["test_samples"], int) else "{}-{}".format(min(cfg["test_samples"]),
                                                            max(cfg["test_samples"]))),
            cell(p + "accuracy, FP32 (onnxruntime)"), cell(p + "accuracy, NPU 8-bit mantissas"),
            cell(p + "accuracy change, NPU 8-bit mantissas minus FP32", "{:+.2f}"),
            ("-" if agree is None else f"{agree['value']:.1f} ({lowest})"),
            cell(p + "accuracy, NPU default build"),
            cell(p + "agreement with FP32 class, NPU default build"),
            cell(p + "accuracy, NPU default build calibrated"),
            "-" if cycles is None else f"{cycles['value']:,}",
            "-" if util is None else f"{util['value']:.1f} %"]) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    """``python -m bench.zoo [RESULTS]``: the Markdown table of the zoo's records."""
    import argparse

    from bench import RESULTS
    parser = argparse.ArgumentParser(prog="python -m bench.zoo", description=main.__doc__)
    parser.add_argument("results", nargs="?", type=Path, default=RESULTS,
                        help=f"records written by python -m bench zoo (default {RESULTS})")
    args = parser.parse_args(argv)
    print(markdown_table(json.loads(args.results.read_text())))
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
