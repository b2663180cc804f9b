"""Seed 003: BFP training with the lazy update against FP32-master and naive 8-bit updates.

A two-layer digits classifier (64 - 32 - 10, ``host.quant.bfp_train.train_dense``):
8-bit BFP forward, 16-bit BFP activation gradients (and, as a variant, 8-bit ones),
momentum SGD, at a normal and a small learning rate; five seeds, each with its own
train / test split of the zoo's copy of scikit-learn's digits (1,200 / 597 rows). Records
are the mean and standard deviation of the final held-out accuracy, and the bits of
weight state per parameter. The curves (accuracy per epoch, mean over seeds) are written
to ``build/bench/bfp_training_curves.json``.
"""

import json
import time
from pathlib import Path

import numpy as np

from bench import record

SEEDS = range(5)
RATES = (0.01, 0.002)
EPOCHS = 20
DIGITS = Path(__file__).resolve().parent.parent / "zoo" / "data" / "digits.npz"
CURVES = Path(__file__).resolve().parent.parent / "build" / "bench" / "bfp_training_curves.json"


def _split(seed):
    d = np.load(DIGITS)
    x = d["images"].reshape(len(d["images"]), -1).astype(np.float32) / 16
    order = np.random.default_rng(seed).permutation(len(x))
    tr, te = order[:1200], order[1200:]
    return x[tr], d["labels"][tr], x[te], d["labels"][te]


def run():
    """BFP training (seed 003): lazy update vs FP32 master vs naive 8-bit, digits MLP."""
    import torch

    from host.quant.bfp_train import train_dense
    torch.set_num_threads(1)
    variants = [("fp32-master", 16), ("lazy", 16), ("naive", 16), ("lazy", 8)]
    records, curves = [], {}
    for lr in RATES:
        for policy, grad_bits in variants:
            start = time.perf_counter()
            runs = [train_dense(*_split(s), policy=policy, lr=lr, epochs=EPOCHS, seed=s,
                                gradient_bits=grad_bits) for s in SEEDS]
            finals = np.array([r["final"] for r in runs])
            label = f"{policy} update, {grad_bits}-bit gradients, learning rate {lr}"
            print(f"  {label}: {finals.mean():.1f} +- {finals.std():.1f} % "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
            cfg = {"policy": policy, "gradient_bits": grad_bits, "forward_bits": 8,
                       "learning_rate": lr, "epochs": EPOCHS, "seeds": len(SEEDS),
                       "model": "digits 64-32-10", "std": round(float(finals.std()), 2),
                       "per_seed": [round(float(f), 2) for f in finals]}
            records.append(record(f"BFP training digits accuracy, {label}",
                                  round(float(finals.mean()), 2), "%", **cfg))
            curves[label] = np.mean([r["accuracy"] for r in runs], axis=0).round(2).tolist()
            if lr == RATES[0] and grad_bits == 16:
                records.append(record(f"BFP training weight state per parameter, {policy} "
                                      f"update", runs[0]["memory_bits_per_parameter"],
                                      "bits", policy=policy))
    CURVES.parent.mkdir(parents=True, exist_ok=True)
    CURVES.write_text(json.dumps(curves, indent=1))
    return records
