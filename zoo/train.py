"""Train, export and check the zoo's models: ``python -m zoo.train [--models mlp,cnn]
[--seeds 0,1,2,3,4]``.

For each model and seed: split the data set with the seed, train with PyTorch on the
training set (the calibration and test sets are never seen), export with
``torch.onnx.export`` (the exporter named in :data:`zoo.models.MODELS`), measure the FP32
accuracy with onnxruntime on the test set, and write ``zoo/<model>/seed<k>/``:
``model.onnx`` (+ ``model.onnx.data``), ``data.npz`` and ``meta.json`` (see
``zoo/README.md``). Needs the ``train`` extra (``pip install -e '.[train]'``, ``make zoo``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import platform
import shutil
import sys
import time
import warnings
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from zoo import datasets
from zoo.models import MODELS, ZooModel

ZOO_DIR = Path(__file__).resolve().parent
SEEDS = (0, 1, 2, 3, 4)
INPUT_NAME, OUTPUT_NAME = "input", "logits"
#: Largest difference allowed between PyTorch's and onnxruntime's logits on the test set.
LOGIT_TOLERANCE = 1e-4


@dataclass(frozen=True)
class Data:
    """One seed's split of a data set, as the model's inputs and labels."""

    split: datasets.Split
    x_train: np.ndarray
    y_train: np.ndarray
    x_calib: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    meta: dict


def load(model: ZooModel, seed: int) -> Data:
    """The seeded split of ``model``'s data set (float32 inputs shaped for the model)."""
    if model.dataset == "digits":
        images, labels = datasets.digits()
        x = (images.astype(np.float32) / 16).reshape((-1, *model.input_shape))
        split = datasets.digits_split(len(x), seed)
        meta = {
            "name": "digits",
            "source": "sklearn.datasets.load_digits() (scikit-learn "
                      f"{_version('scikit-learn')}), copied to zoo/data/digits.npz",
            "file": "zoo/data/digits.npz",
            "sha256": datasets.sha256(images, labels),
            "samples": len(x),
            "scaling": "pixel values 0..16 divided by 16",
            "split": "seeded shuffle (numpy default_rng(seed).permutation): "
                     "60 % train, 10 % calibration, 30 % test; indices are image rows",
        }
        return Data(split, x[split.train], labels[split.train], x[split.calib],
                    x[split.test], labels[split.test], meta)
    text = datasets.corpus()
    codes = datasets.encode(text)
    split = datasets.text_split(len(text), seed)
    x_train, y_train = datasets.windows(codes, split.train)
    x_calib, _ = datasets.windows(codes, split.calib)
    x_test, y_test = datasets.windows(codes, split.test)
    meta = {
        "name": "corpus",
        "source": "the Zen of Python (decoded text of the stdlib module `this`) and the "
                  "docstrings (prose lines) of the stdlib modules "
                  f"{', '.join(datasets.CORPUS_MODULES)}; lower-cased and normalised to "
                  "the vocabulary (zoo/datasets.py), saved once as zoo/data/corpus.txt "
                  "(the data set of record; zoo/README.md names the Python that wrote it)",
        "file": "zoo/data/corpus.txt",
        "sha256": datasets.sha256(np.frombuffer(text.encode("ascii"), np.uint8)),
        "characters": len(text),
        "vocabulary": datasets.VOCABULARY,
        "window": datasets.WINDOW,
        "split": "by position: five blocks of 20 % of the text; seed k tests on block 4-k "
                 "(seed 0: the last 20 %), calibrates on the 10 % of text before it "
                 "(cyclically) and trains on the rest; a window (16 inputs and the next "
                 "character) is kept only when all its characters lie in one part; "
                 "indices are window start positions in the text",
    }
    return Data(split, x_train, y_train, x_calib, x_test, y_test, meta)


def _version(package: str) -> str:
    try:
        return version(package)
    except Exception:  # noqa: BLE001  (only for the record)
        return "unknown"


def train(model: ZooModel, module: nn.Module, data: Data, seed: int) -> tuple[float, float]:
    """Adam on cross-entropy over the training set; a progress line per epoch.

    Returns the last epoch's mean loss and the training time in seconds.
    """
    x = torch.from_numpy(data.x_train)
    y = torch.from_numpy(data.y_train)
    optimiser = torch.optim.Adam(module.parameters(), lr=model.lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, model.epochs)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    module.train()
    for epoch in range(1, model.epochs + 1):
        order = torch.randperm(len(x), generator=generator)
        total = 0.0
        for batch in order.split(model.batch_size):
            optimiser.zero_grad()
            loss = loss_fn(module(x[batch]), y[batch])
            loss.backward()
            optimiser.step()
            total += loss.item() * len(batch)
        schedule.step()
        mean = total / len(x)
        _progress(model.name, seed, "train",
                  f"epoch {epoch:3d}/{model.epochs}  loss {mean:.4f}  "
                  f"{time.perf_counter() - start:5.1f} s")
    module.eval()
    return mean, time.perf_counter() - start


def _progress(name: str, seed: int, stage: str, text: str) -> None:
    print(f"{name:>8} seed {seed}  {stage:<6} {text}", flush=True)


def export(model: ZooModel, module: nn.Module, example: np.ndarray, path: Path) -> None:
    """``torch.onnx.export`` of ``module`` to ``path`` with a dynamic batch axis."""
    args = (torch.from_numpy(example),)
    names = {"input_names": [INPUT_NAME], "output_names": [OUTPUT_NAME]}
    chatter = io.StringIO()  # the dynamo exporter prints its stages; keep them for errors
    try:
        with contextlib.redirect_stdout(chatter), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if model.exporter == "dynamo":
                batch = torch.export.Dim("batch")
                torch.onnx.export(module, args, str(path), dynamo=True, external_data=True,
                                  dynamic_shapes=({0: batch},), **names)
            else:
                torch.onnx.export(module, args, str(path), dynamo=False,
                                  dynamic_axes={INPUT_NAME: {0: "batch"},
                                                OUTPUT_NAME: {0: "batch"}}, **names)
    except Exception:
        sys.stdout.write(chatter.getvalue())
        raise


def describe(path: Path) -> dict:
    """What the importer will meet in an exported file: opset, operators, external data,
    batch axis."""
    proto = onnx.load(str(path), load_external_data=False)
    external = sorted({entry.value for init in proto.graph.initializer
                       if init.data_location == onnx.TensorProto.EXTERNAL
                       for entry in init.external_data if entry.key == "location"})
    batch = proto.graph.input[0].type.tensor_type.shape.dim[0]
    return {
        "opset": next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")),
        "operators": sorted({node.op_type for node in proto.graph.node}),
        "external_data": external,
        "batch_axis": "dynamic" if batch.dim_param else batch.dim_value,
    }


def check(module: nn.Module, path: Path, data: Data) -> tuple[int, np.ndarray]:
    """The number of test samples onnxruntime classifies correctly, and its logits.

    Raises
    ------
    AssertionError
        onnxruntime's logits differ from PyTorch's by more than ``LOGIT_TOLERANCE``, or the
        batch axis does not take batches of 1 and 3.
    """
    onnx.checker.check_model(str(path), full_check=True)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    logits = session.run(None, {INPUT_NAME: data.x_test})[0]
    with torch.no_grad():
        reference = module(torch.from_numpy(data.x_test)).numpy()
    error = float(np.max(np.abs(logits - reference)))
    assert error <= LOGIT_TOLERANCE, f"{path}: onnxruntime differs from torch by {error:g}"
    for rows in (1, 3):
        part = session.run(None, {INPUT_NAME: data.x_test[:rows]})[0]
        assert np.allclose(part, logits[:rows], atol=LOGIT_TOLERANCE), f"{path}: batch {rows}"
    return int(np.sum(np.argmax(logits, axis=1) == data.y_test)), logits


def build_one(model: ZooModel, seed: int) -> dict:
    """Train, export, check and save one model and seed; returns its meta.json record."""
    torch.manual_seed(seed)
    data = load(model, seed)
    _progress(model.name, seed, "data", f"{data.split.sizes()}")
    module = model.build()
    loss, seconds = train(model, module, data, seed)

    out = ZOO_DIR / model.name / f"seed{seed}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    path = out / "model.onnx"
    export(model, module, data.x_test[:4], path)
    info = describe(path)
    _progress(model.name, seed, "export", f"{model.exporter}, opset {info['opset']}, "
              f"{' '.join(info['operators'])}")
    correct, _ = check(module, path, data)
    accuracy = correct / len(data.y_test)
    _progress(model.name, seed, "check", f"onnxruntime FP32 accuracy {accuracy:.4f}")

    np.savez_compressed(out / "data.npz", idx_train=data.split.train,
                        idx_calib=data.split.calib, idx_test=data.split.test,
                        x_calib=data.x_calib, x_test=data.x_test, y_test=data.y_test)
    meta = {
        "name": model.name,
        "task": model.task,
        "dataset": data.meta,
        "input_name": INPUT_NAME,
        "output_name": OUTPUT_NAME,
        "input_shape": ["batch", *model.input_shape],
        "batch_axis": info["batch_axis"],
        "exporter": model.exporter,
        "opset": info["opset"],
        "operators": info["operators"],
        "external_data": info["external_data"],
        "seed": seed,
        "split_sizes": data.split.sizes(),
        "epochs": model.epochs,
        "batch_size": model.batch_size,
        "optimiser": f"Adam, lr {model.lr:g}, cosine annealing to 0",
        "final_train_loss": round(loss, 6),
        "train_seconds": round(seconds, 2),
        "fp32_accuracy": accuracy,
        "fp32_correct": correct,
        "fp32_accuracy_by": f"onnxruntime {ort.__version__} (CPUExecutionProvider) on x_test",
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "onnxscript": _version("onnxscript"), "onnx": onnx.__version__,
                     "onnxruntime": ort.__version__},
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    meta["bytes"] = sum(f.stat().st_size for f in out.iterdir())
    return meta


def summary(records: list[dict]) -> str:
    """A table of every model and seed, and per model the mean and standard deviation."""
    lines = [f"{'model':<9}{'seed':>5}{'FP32 acc.':>11}{'bytes':>9}{'train s':>9}"]
    for r in records:
        lines.append(f"{r['name']:<9}{r['seed']:>5}{r['fp32_accuracy']:>11.4f}"
                     f"{r['bytes']:>9}{r['train_seconds']:>9.1f}")
    lines.append("")
    for name in dict.fromkeys(r["name"] for r in records):
        acc = np.array([r["fp32_accuracy"] for r in records if r["name"] == name])
        std = acc.std(ddof=1) if len(acc) > 1 else 0.0
        lines.append(f"{name:<9} mean {acc.mean():.4f}  std {std:.4f}  over {len(acc)} seeds")
    return "\n".join(lines)


def _names(parser: argparse.ArgumentParser, text: str, known: list[str], what: str
           ) -> list[str]:
    """The comma-separated items of ``text``; a usage error (exit status 2) names any
    unknown one."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in known]
    if bad or not items:
        parser.error(f"unknown {what} {', '.join(bad) or repr(text)}; "
                     f"choose from {', '.join(known)}")
    return items


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zoo.train",
                                     description="Train, export and check the zoo's models.")
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated models (default all: {','.join(MODELS)})")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)),
                        help="comma-separated seeds 0..4 (default all)")
    args = parser.parse_args(argv)
    models = _names(parser, args.models, list(MODELS), "model")
    seeds = [int(s) for s in _names(parser, args.seeds, [str(s) for s in SEEDS], "seed")]

    torch.set_num_threads(1)  # polite on a shared machine; these models gain little more
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    records = [build_one(MODELS[name], seed) for name in models for seed in seeds]
    print()
    print(summary(records))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
