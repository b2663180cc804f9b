"""Calibration (seed 002) against the device's max-based exponents, over the model zoo.

For every zoo model and seed (each model trained on its own seeded split), at 3, 4 and 5
bit mantissas (vectors and weights alike, the default build otherwise): the held-out
accuracy of FP32 (onnxruntime), of the NPU with max-based exponents and of the NPU with
exponents calibrated on the seed's ``x_calib`` (its first :data:`CALIB_SAMPLES` rows;
``host.quant.compile_calibrated``, ``method="mmse"``); the test set is never seen by
calibration. Images run on the reference
model through their NumPy export (``bench.zoo.run_batch``, checked bit for bit against
the model on the first rows). Records: mean and standard deviation over the seeds, and
the per-seed values; "never worse" is judged per DECISIONS (not worse beyond one standard
deviation of the difference).
"""

from __future__ import annotations

import time

import numpy as np

from bench import record

BITS = (3, 4, 5)
#: Calibration samples per seed, at most (the digits models have 180; the character model's
#: 1,822 windows would make its device probes take most of an hour).
CALIB_SAMPLES = 256


def run(names=None, seeds=None):
    """Calibrated vs max-based exponents at 3-5 bit mantissas over the zoo (5 seeds)."""
    from bench import zoo
    names = zoo.NAMES if names is None else names
    seeds = zoo.SEEDS if seeds is None else seeds
    records = []
    for name in names:
        entries = [e for s in seeds for e in zoo.zoo_entries(s, (name,))]
        if not entries:
            continue
        fp32 = []
        rows = {(b, m): [] for b in BITS for m in ("max", "mmse")}
        start = time.perf_counter()
        for entry in entries:
            ref = zoo.predictions(zoo.fp32_outputs(entry.onnx, entry.x_test))
            fp32.append(zoo.accuracy(ref, entry.y_test))
            for bits in BITS:
                build = f"mantissa_bits_v={bits},mantissa_bits_w={bits}"
                for method in ("max", "mmse"):
                    got = zoo.evaluate(entry, build, calibrate=method == "mmse",
                                       calib_samples=CALIB_SAMPLES)
                    rows[(bits, method)].append(got["accuracy"])
        print(f"  {name}: FP32 {np.mean(fp32):.2f} %; " + "; ".join(
            f"{b}-bit max {np.mean(rows[(b, 'max')]):.2f} / calibrated "
            f"{np.mean(rows[(b, 'mmse')]):.2f}" for b in BITS) +
            f" ({time.perf_counter() - start:.0f} s)", flush=True)
        cfg = {"model": name, "seeds": len(entries), "test_rows": len(entries[0].y_test)}
        records.append(record(f"calibration {name} accuracy, FP32 (onnxruntime)",
                              round(float(np.mean(fp32)), 2), "%",
                              std=round(float(np.std(fp32)), 2), **cfg))
        for bits in BITS:
            for method, label in (("max", "max-based exponents"), ("mmse", "calibrated")):
                v = np.array(rows[(bits, method)])
                records.append(record(
                    f"calibration {name} {bits}-bit accuracy, {label}",
                    round(float(v.mean()), 2), "%", std=round(float(v.std()), 2),
                    per_seed=[round(float(a), 2) for a in v], mantissa_bits=bits, **cfg))
            diff = np.array(rows[(bits, "mmse")]) - np.array(rows[(bits, "max")])
            records.append(record(
                f"calibration {name} {bits}-bit, calibrated minus max-based",
                round(float(diff.mean()), 2), "points", std=round(float(diff.std()), 2),
                never_worse=bool(diff.mean() >= -diff.std()), mantissa_bits=bits, **cfg))
    return records
