"""``npu train`` (also ``python -m host.quant.train``): fine-tune an ONNX classifier for the
device and export the result that ``npu compile --quant`` takes (``docs/training.md``).

::

    npu train MODEL.onnx --data DATA.npz -o OUTDIR [--config BUILD]
              [--method qat|lazy] [--start calibrated|default] [--epochs E] [--lr LR]
              [--lr-drop-epochs D]

``DATA.npz`` holds ``x_train``, ``y_train``, ``x_test``, ``y_test`` and optionally
``x_calib`` (float inputs shaped like the model's, batch first; integer labels). With
``--zoo zoo/<model>/seed<k>`` instead, the zoo's split is used (its training rows
rebuilt from ``zoo/data``). Methods:

* ``qat`` (seed 002): :class:`host.quant.qat.DeviceModule` from the calibrated graph
  (``--start calibrated``, default; calibration on ``x_calib``) or from the device's
  default static exponents (``--start default``), float32 master weights, Adam;
* ``lazy`` (seed 003): the same module, its weights kept as 8-bit BFP + 16-bit
  accumulators by :class:`host.quant.bfp_train.LazyUpdate` around Adam (no float copy).

It prints a line per epoch (stage, epoch, held-out accuracy, time), then a summary, and
writes ``OUTDIR/model.onnx``, ``OUTDIR/model.quant.json``, ``OUTDIR/curve.json`` and,
with matplotlib (the ``demo`` extra), ``OUTDIR/curve.png``. Exit status 2 for bad
arguments or files, with a message naming them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

__all__ = ["main", "load_training_data"]

_KEYS = ("x_train", "y_train", "x_test", "y_test")


class _Usage(Exception):
    pass


def load_training_data(data=None, zoo=None) -> dict:
    """The arrays of ``--data FILE.npz`` or ``--zoo DIR`` (module docstring).

    Raises
    ------
    ValueError
        a missing file or array, or arrays whose lengths do not match (naming them).
    """
    if (data is None) == (zoo is None):
        raise ValueError("give one of --data FILE.npz and --zoo DIR")
    if zoo is not None:
        zoo = Path(zoo)
        try:
            split = np.load(zoo / "data.npz")
            meta = json.loads((zoo / "meta.json").read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{zoo} is not a zoo model directory: {exc}") from None
        if (meta.get("dataset") or {}).get("name") != "digits":
            raise ValueError(f"{zoo}: --zoo rebuilds the digits models' training rows "
                             f"only; give the others' data with --data")
        digits = np.load(zoo.parent.parent / "data" / "digits.npz")
        x = digits["images"].astype(np.float32) / 16
        shape = split["x_test"].shape[1:]
        out = {"x_train": x[split["idx_train"]].reshape((-1,) + shape),
               "y_train": digits["labels"][split["idx_train"]],
               "x_test": split["x_test"], "y_test": split["y_test"],
               "x_calib": split["x_calib"]}
    else:
        try:
            with np.load(data) as f:
                out = {k: f[k] for k in f.files}
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read {data}: {exc}") from None
        missing = [k for k in _KEYS if k not in out]
        if missing:
            raise ValueError(f"{data} lacks the arrays {missing} (needs {list(_KEYS)}, "
                             f"optionally x_calib)")
    for part in ("train", "test"):
        x, y = out[f"x_{part}"], out[f"y_{part}"]
        if len(x) != len(y) or len(x) == 0:
            raise ValueError(f"x_{part} has {len(x)} rows and y_{part} {len(y)}: they must "
                             f"match and not be empty")
        if y.dtype.kind not in "iu":
            raise ValueError(f"y_{part} must hold integer labels, not {y.dtype}")
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="npu train", description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="ONNX classifier (.onnx)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", help="x_train, y_train, x_test, y_test[, x_calib] (.npz)")
    src.add_argument("--zoo", help="a zoo model directory (zoo/<model>/seed<k>)")
    p.add_argument("-o", "--output", required=True, help="directory for the results")
    p.add_argument("--config", default="", help="build (parse_config text)")
    p.add_argument("--method", choices=("qat", "lazy"), default="qat")
    p.add_argument("--start", choices=("calibrated", "default"), default="calibrated")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-drop-epochs", type=int, default=None,
                   help="last epochs trained at a tenth of --lr (default 3; 0: constant)")
    p.add_argument("--seed", type=int, default=0)
    return p


def _plot(curve, path, title) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(range(len(curve)), curve, marker="o")
    ax.set_xlabel("epoch")
    ax.set_ylabel("held-out accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def run(args) -> dict:
    import torch

    from host.compiler.onnx_import import OnnxImportError, import_onnx
    from host.quant.bfp_train import LazyUpdate
    from host.quant.ptq import calibrate_graph
    from host.quant.qat import (LR_DROP_EPOCHS, DeviceModule, QatError, check_schedule,
                                train_qat)
    from host.spec.config import parse_config
    drop = LR_DROP_EPOCHS if args.lr_drop_epochs is None else args.lr_drop_epochs
    try:
        check_schedule(args.epochs, args.lr, drop)
    except ValueError as exc:
        name, rest = str(exc).split(" ", 1)            # the message names the parameter
        raise _Usage(f"--{name.replace('_', '-')} {rest}") from None
    try:
        cfg = parse_config(args.config)
        data = load_training_data(args.data, args.zoo)
        graph = import_onnx(args.model)
    except (ValueError, OnnxImportError) as exc:
        raise _Usage(str(exc)) from None
    out = Path(args.output)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _Usage(f"cannot create {out}: {exc}") from None
    torch.set_num_threads(1)
    start = time.monotonic()
    say = lambda line: print(f"[{time.monotonic() - start:6.1f} s] {line}", flush=True)  # noqa: E731
    try:
        if args.start == "calibrated":
            if "x_calib" not in data:
                raise _Usage("--start calibrated needs x_calib in the data")
            say(f"calibrating on {len(data['x_calib'])} samples")
            calibrated = calibrate_graph(graph, cfg, data["x_calib"])[0]
            module = DeviceModule(calibrated, cfg, latent_from=graph)
        else:
            module = DeviceModule(graph, cfg, start="default")
    except QatError as exc:
        raise _Usage(str(exc)) from None
    wrap = None
    if args.method == "lazy":
        wrap = lambda opt: LazyUpdate(opt, block_size=cfg.n)  # noqa: E731
    say(f"training ({args.method}, from {args.start} exponents, {args.epochs} epochs, "
        f"{len(data['x_train'])} samples)")
    curve = train_qat(module, data["x_train"], data["y_train"], data["x_test"],
                      data["y_test"], epochs=args.epochs, lr=args.lr, seed=args.seed,
                      progress=say, wrap=wrap, lr_drop_epochs=drop)
    module.export(out / "model.onnx", out / "model.quant.json")
    (out / "curve.json").write_text(json.dumps({"held_out_accuracy": curve}, indent=1))
    plotted = _plot(curve, out / "curve.png", f"{args.method} from {args.start} exponents")
    summary = {"method": args.method, "start": args.start, "before": curve[0],
               "after": curve[-1], "best": max(curve), "seconds": time.monotonic() - start,
               "files": sorted(p.name for p in out.iterdir())}
    say(f"done: held-out accuracy {curve[0]:.1f} % before, {curve[-1]:.1f} % after "
        f"(best {max(curve):.1f} %); wrote {', '.join(summary['files'])} in {out}"
        + ("" if plotted else " (no curve.png: matplotlib, the demo extra, is missing)"))
    print(f"next: npu compile {out / 'model.onnx'} -o net.npz --config "
          f"'{args.config}' --quant {out / 'model.quant.json'}")
    return summary


def main(argv=None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:                 # --help (0) and usage errors (2)
        return int(exc.code or 0)
    try:
        run(args)
    except _Usage as exc:
        print(f"npu train: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
