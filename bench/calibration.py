"""Calibration (seed 002) against the device's max-based exponents, over the model zoo.

For every zoo model and seed (each model trained on its own seeded split), at 3, 4 and 5
bit mantissas (vectors and weights alike, the default build otherwise): the held-out
accuracy of FP32 (onnxruntime), of the NPU with max-based exponents, of the NPU calibrated
on the seed's ``x_calib`` (its first :data:`CALIB_SAMPLES` rows; ``method="mmse"``:
exponents of least squared error, then the weight mantissas of least layer-output error
with bias correction, ``rounding="gptq"``, the default) and, for comparison, calibrated
with every weight rounded to nearest (``rounding="nearest"``, seed 002 as first built).
The calibrated images are ``host.quant.calibrate_graph`` then ``compile_graph``: the
image ``compile_calibrated`` (``npu compile --calibrate``) makes without range scaling,
whose device pass only counts saturations (running every layer's prefix on the
reference model, which made the character model's row take most of an hour). The test
set is never seen by calibration. Images run on the reference model through their NumPy export
(``bench.zoo.run_batch``, checked bit for bit against the model on the first rows).
Records: mean and standard deviation over the seeds, and the per-seed values; "never
worse" is judged per DECISIONS (not worse beyond one standard deviation of the
difference); at 4 bits, whether the calibrated mean is within one point of FP32's (the
issue's bar for the digits MLP and CNN).
"""

from __future__ import annotations

import time

import numpy as np

from bench import record

BITS = (3, 4, 5)
#: Calibration samples per seed, at most (the digits models have 180, the character model
#: 1,822 windows).
CALIB_SAMPLES = 256
#: The compiles compared: max-based exponents, calibrated (the default rounding) and
#: calibrated with nearest rounding.
METHODS = (("max", "max-based exponents"), ("mmse", "calibrated"),
           ("nearest", "calibrated, nearest rounding"))


def _accuracy(entry, net) -> float:
    from bench import zoo
    y = zoo.run_batch(net, entry.x_test)
    shape = list(net.signature["output_shape"])
    if None in shape:
        y = np.moveaxis(y, shape.index(None), 0)
    return zoo.accuracy(zoo.predictions(y), entry.y_test)


def _compile(entry, build, method):
    from host.compiler.network import compile_graph, compile_onnx
    from host.compiler.onnx_import import import_onnx
    from host.quant import calibrate_graph
    if method == "max":
        return compile_onnx(entry.onnx, build)
    graph, _ = calibrate_graph(import_onnx(entry.onnx), build,
                               entry.x_calib[:CALIB_SAMPLES], method="mmse",
                               rounding="gptq" if method == "mmse" else "nearest")
    return compile_graph(graph, build, source=str(entry.onnx))


def run(names=None, seeds=None, methods=None):
    """Calibrated vs max-based exponents at 3-5 bit mantissas over the zoo (5 seeds)."""
    from bench import zoo
    names = zoo.NAMES if names is None else names
    seeds = zoo.SEEDS if seeds is None else seeds
    methods = [m for m in METHODS if methods is None or m[0] in methods]
    records = []
    for name in names:
        entries = [e for s in seeds for e in zoo.zoo_entries(s, (name,))]
        if not entries:
            continue
        fp32 = []
        rows = {(b, m): [] for b in BITS for m, _ in methods}
        start = time.perf_counter()
        for entry in entries:
            ref = zoo.predictions(zoo.fp32_outputs(entry.onnx, entry.x_test))
            fp32.append(zoo.accuracy(ref, entry.y_test))
            for bits in BITS:
                build = f"mantissa_bits_v={bits},mantissa_bits_w={bits}"
                for method, _ in methods:
                    rows[(bits, method)].append(
                        _accuracy(entry, _compile(entry, build, method)))
        print(f"  {name}: FP32 {np.mean(fp32):.2f} %; " + "; ".join(
            f"{b}-bit " + " / ".join(f"{m} {np.mean(rows[(b, m)]):.2f}" for m, _ in methods)
            for b in BITS) + f" ({time.perf_counter() - start:.0f} s)", flush=True)
        cfg = {"model": name, "seeds": len(entries), "test_rows": len(entries[0].y_test),
               "calib_samples": min(CALIB_SAMPLES, len(entries[0].x_calib))}
        records.append(record(f"calibration {name} accuracy, FP32 (onnxruntime)",
                              round(float(np.mean(fp32)), 2), "%",
                              std=round(float(np.std(fp32)), 2), **cfg))
        for bits in BITS:
            for method, label in methods:
                v = np.array(rows[(bits, method)])
                extra = {}
                if method == "mmse":
                    extra["within_1_point_of_fp32"] = bool(v.mean() >= np.mean(fp32) - 1.0)
                records.append(record(
                    f"calibration {name} {bits}-bit accuracy, {label}",
                    round(float(v.mean()), 2), "%", std=round(float(v.std()), 2),
                    per_seed=[round(float(a), 2) for a in v], mantissa_bits=bits,
                    **extra, **cfg))
            if (bits, "mmse") in rows and (bits, "max") in rows:
                diff = np.array(rows[(bits, "mmse")]) - np.array(rows[(bits, "max")])
                records.append(record(
                    f"calibration {name} {bits}-bit, calibrated minus max-based",
                    round(float(diff.mean()), 2), "points", std=round(float(diff.std()), 2),
                    never_worse=bool(diff.mean() >= -diff.std()), mantissa_bits=bits,
                    **cfg))
    return records
