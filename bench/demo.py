"""``python -m bench.demo`` (``make demo``): the model zoo end to end, in a few minutes
(4.8 measured on the shared 2-core machine; the first run also builds the simulated board
under Verilator, about 6 minutes more, in parallel).

For every zoo model of one seed (``zoo/<name>/seed0``):

1. FP32 accuracy by onnxruntime on the test set;
2. compiled at the default build and at 8-bit mantissas (``mantissa_bits_v = 8``,
   ``mantissa_bits_w = 8``), and calibrated at the default build when the compiler takes
   calibration samples; each run on the test set on the reference model
   (:func:`bench.zoo.run_batch`: its NumPy export, checked bit for bit against the model on
   the first rows);
3. cycles per inference and MVM utilization from the network's report, and per layer
   (:func:`layer_utilization`);
4. accuracy against the mantissa width (3 to 8 bits, vectors and weights alike) on the
   first 600 test rows (``--sweep-samples``), max-based and calibrated on 64 calibration
   rows (the table's calibrated column: 256 rows);
5. the smallest model that fits the simulated board's build (``sim.board.SMALL_CONFIG``,
   the build the hardware tests share) run on a few test rows on the simulated board
   (Verilator; the first build takes minutes and is cached in ``build/sim``), its output
   bits compared with the reference model's.

Then a table, PNG plots under ``build/demo/`` (``accuracy_vs_mantissa.png``,
``utilization_per_layer.png``; they need matplotlib, the ``demo`` extra) and a summary.
The table and the data behind the plots do not need matplotlib (:func:`format_table`,
:func:`sweep_table`); ``build/demo/demo.json`` keeps the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np

from bench.zoo import (
    BUILD_8BIT,
    ZOO,
    accuracy,
    calibration_available,
    evaluate,
    fp32_outputs,
    predictions,
    zoo_entries,
)

__all__ = [
    "OUT",
    "SWEEP_BITS",
    "evaluate_entry",
    "format_table",
    "layer_utilization",
    "main",
    "mantissa_sweep",
    "plot_accuracy",
    "plot_utilization",
    "sim_check",
    "sweep_table",
]

OUT = Path(__file__).resolve().parent.parent / "build" / "demo"
#: Mantissa widths of the sweep (vectors and weights alike).
SWEEP_BITS = tuple(range(3, 9))
#: Test rows of the mantissa sweep: the digits models' whole test sets (539 rows), the
#: first 600 of the character model's 3,660 (for time: twelve compiles and runs a model).
SWEEP_SAMPLES = 600
SIM_SAMPLES = 4
#: Calibration rows of the table's calibrated column and of each point of the calibrated
#: sweep: calibration runs its rows through the reference model layer by layer (about
#: 0.1 s a row for the character model, 0.07 s for the digits LSTM).
TABLE_CALIB_SAMPLES = 256
SWEEP_CALIB_SAMPLES = 64


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# --- measurements --------------------------------------------------------------------------

def layer_utilization(entry, network) -> list:
    """Per layer with MACs: ``(name, op, macs, cycles, utilization %)`` of one job on the
    network's build. A layer's cycles are the report's per-layer figure when it has one;
    otherwise the predicted cycles of the program that ends just before the next layer with
    MACs minus those of the program that ends just before this one
    (:func:`host.compiler.compare.layer_cycles`): the layer with the element-wise layers,
    views and softmax that follow it. Layers after which no program can end (a map of
    several pixels and channels: convolutions) are joined with the next layer with MACs
    into one entry (``"first..last"``, ops joined by ``+``)."""
    from host.compiler.compare import layer_cycles
    from host.compiler.onnx_import import import_onnx
    report = network.report()
    layers = report["layers"]
    peak = report["per_job"]["peak_macs_per_cycle"]
    out = []
    if layers and all(lay.get("cycles_predicted") is not None for lay in layers):
        for lay in layers:
            if lay["macs"]:
                c = lay["cycles_predicted"]
                out.append((lay["name"], lay["op"], lay["macs"], c,
                            100.0 * lay["macs"] / (c * peak) if c else 0.0))
        return out
    cycles = layer_cycles(import_onnx(entry.onnx), network)
    starts = [i for i, lay in enumerate(layers) if lay["macs"]]
    if not starts:
        return out
    ends = [s - 1 for s in starts[1:]] + [len(layers) - 1]
    done, pending = 0, []
    for s, e in zip(starts, ends):
        pending.append(layers[s])
        known = [cycles[i] for i in range(s, e + 1) if cycles[i] is not None]
        if not known:          # no program ends in this layer's stretch: join the next one
            continue
        c = max(known) - done
        done = max(known)
        macs = sum(lay["macs"] for lay in pending)
        name = pending[0]["name"] if len(pending) == 1 else \
            f"{pending[0]['name']}..{pending[-1]['name']}"
        op = "+".join(lay["op"].split("+")[0] for lay in pending)
        out.append((name, op, macs, c, 100.0 * macs / (c * peak) if c > 0 else 0.0))
        pending = []
    return out


def evaluate_entry(entry, *, calibrated: bool) -> dict:
    """One model's row of the table: FP32, default, 8-bit (and calibrated) accuracy on the
    whole test set, agreement with FP32, cycles, utilization and per-layer utilization;
    ``error`` instead when the model does not compile or run."""
    row = {"model": entry.name, "samples": len(entry.y_test),
           "task": entry.meta.get("task", "")}
    ref = predictions(fp32_outputs(entry.onnx, entry.x_test))
    row["fp32"] = accuracy(ref, entry.y_test)
    row["fp32_pred"] = ref
    try:
        default = evaluate(entry, None, fp32_pred=ref)
        bit8 = evaluate(entry, BUILD_8BIT, fp32_pred=ref)
        row.update(default=default["accuracy"], default_agreement=default["agreement"],
                   bit8=bit8["accuracy"], bit8_agreement=bit8["agreement"],
                   cycles=default["cycles"], utilization=default["utilization"],
                   macs=default["network"].report()["totals"]["macs"])
        row["layers"] = layer_utilization(entry, default["network"])
        if calibrated:
            cal = evaluate(entry, None, fp32_pred=ref, calibrate=True,
                           calib_samples=TABLE_CALIB_SAMPLES)
            row.update(calibrated=cal["accuracy"], calibrated_agreement=cal["agreement"])
    except Exception as exc:  # noqa: BLE001  (a model the compiler does not take yet: shown)
        row["error"] = f"{type(exc).__name__}: {exc}"
    return row


def mantissa_sweep(entry, bits=SWEEP_BITS, samples: int | None = SWEEP_SAMPLES, *,
                   calibrated: bool = False,
                   calib_samples: int | None = SWEEP_CALIB_SAMPLES) -> dict:
    """Accuracy (percent) on the first ``samples`` test rows (None: all) at each mantissa width
    (vectors and weights), max-based (``"max"``) and calibrated on the first
    ``calib_samples`` calibration rows (``"calibrated"``, when asked), with the FP32
    accuracy on the same rows (``"fp32"``)."""
    x, y = entry.x_test[:samples], entry.y_test[:samples]
    out = {"model": entry.name, "samples": len(y), "bits": list(bits),
           "calib_samples": len(entry.x_calib[:calib_samples]),
           "fp32": accuracy(predictions(fp32_outputs(entry.onnx, x)), y), "max": []}
    if calibrated:
        out["calibrated"] = []
    for m in bits:
        cfg = f"mantissa_bits_v={m},mantissa_bits_w={m}"
        out["max"].append(evaluate(entry, cfg, x=x, labels=y)["accuracy"])
        if calibrated:
            out["calibrated"].append(evaluate(entry, cfg, x=x, labels=y, calibrate=True,
                                              calib_samples=calib_samples)["accuracy"])
    return out


def sim_check(entries, device: str, config, samples: int = SIM_SAMPLES, *,
              dev=None) -> dict:
    """Run the smallest model (by MACs) that compiles for ``config`` on ``samples`` test
    rows on ``device`` (or the open Device ``dev``) and on the reference model of the same
    build; ``equal`` says whether every output bit agrees."""
    from host.compiler.lower import CompileError
    from host.compiler.network import compile_onnx
    from host.compiler.onnx_import import OnnxImportError
    tried = []
    candidates = []
    for entry in entries:
        try:
            net = compile_onnx(entry.onnx, config)
        except (OnnxImportError, CompileError) as exc:
            tried.append(f"{entry.name}: {exc}")
            continue
        candidates.append((net.report()["totals"]["macs"], entry.name, entry, net))
    if not candidates:
        return {"error": "no zoo model compiles for the simulated board's build: "
                         + "; ".join(tried)}
    _, _, entry, net = min(candidates, key=lambda c: (c[0], c[1]))
    x = entry.x_test[:samples]
    want = net.run(x)
    start = time.monotonic()
    got = net.run(x, device=dev if dev is not None else device, progress=True)
    seconds = time.monotonic() - start
    equal = bool(np.array_equal(want.view(np.uint32), got.view(np.uint32)))
    return {"model": entry.name, "samples": len(x), "equal": equal, "seconds": seconds,
            "device": device, "predicted": predictions(got).tolist(),
            "labels": entry.y_test[:samples].tolist()}


# --- text ----------------------------------------------------------------------------------

def _pct(v) -> str:
    return "-" if v is None else f"{v:.1f} %"


def format_table(rows: list, *, calibrated: bool = False) -> str:
    """The demo's table: model, test samples, FP32 / NPU default / NPU 8-bit (/ calibrated)
    accuracy, agreement of the 8-bit NPU with FP32, cycles per inference and MVM
    utilization at the default build. A row with ``error`` shows it instead."""
    head = ["model", "test", "FP32 (onnxruntime)", "NPU default", "NPU 8-bit"]
    if calibrated:
        head.append("NPU calibrated")
    head += ["8-bit same class as FP32", "cycles/inference", "MVM utilization"]
    lines = [head]
    errors = []
    for r in rows:
        if "error" in r:
            cells = [r["model"], str(r["samples"]), _pct(r.get("fp32"))]
            cells += ["does not compile (below)"] + [""] * (len(head) - len(cells) - 1)
            errors.append(f"  {r['model']}: {r['error']}")
        else:
            cells = [r["model"], str(r["samples"]), _pct(r["fp32"]), _pct(r["default"]),
                     _pct(r["bit8"])]
            if calibrated:
                cells.append(_pct(r.get("calibrated")))
            cells += [_pct(r["bit8_agreement"]), f"{r['cycles']:,}",
                      f"{r['utilization']:.1f} %"]
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                      enumerate(zip(line, widths))).rstrip() for line in lines]
    text.insert(1, "-" * len(text[0]))
    if errors:
        text += ["", "not compiled:"] + [e[:300] for e in errors]
    return "\n".join(text)


def sweep_table(sweeps: list) -> str:
    """Accuracy against mantissa width, one line per model (and method)."""
    if not sweeps:
        return "(no sweep)"
    bits = sweeps[0]["bits"]
    head = ["model", "rows", "FP32"] + [f"{m} bits" for m in bits]
    lines = [head]
    for s in sweeps:
        lines.append([s["model"], str(s["samples"]), f"{s['fp32']:.1f}"]
                     + [f"{v:.1f}" for v in s["max"]])
        if "calibrated" in s:
            lines.append([f"{s['model']} (calibrated)", str(s["samples"]), ""]
                         + [f"{v:.1f}" for v in s["calibrated"]])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w)
                               for i, (c, w) in enumerate(zip(line, widths))).rstrip()
                     for line in lines)


# --- plots (matplotlib, imported only here) --------------------------------------------------

def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_accuracy(sweeps: list, path) -> Path:
    """Accuracy against mantissa width, as the difference from each model's FP32 accuracy
    on the same rows (models of 40 % and 97 % share one axis), one line per model (dashed:
    calibrated). Needs matplotlib."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, s in enumerate(sweeps):
        color = f"C{k}"
        label = f"{s['model']} ({s['samples']} rows, FP32 {s['fp32']:.1f} %)"
        ax.plot(s["bits"], [v - s["fp32"] for v in s["max"]], "o-", color=color,
                label=f"{label}, max-based")
        if "calibrated" in s:
            ax.plot(s["bits"], [v - s["fp32"] for v in s["calibrated"]], "s--",
                    color=color, label=f"{s['model']}, calibrated")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xlabel("mantissa bits (vectors and weights)")
    ax.set_ylabel("test accuracy minus FP32 (points)")
    ax.set_title("Zoo accuracy against mantissa width (0: FP32 by onnxruntime)", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_utilization(rows: list, path) -> Path:
    """MVM utilization per layer with MACs, one group of bars per model. Needs matplotlib."""
    plt = _pyplot()
    rows = [r for r in rows if r.get("layers")]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    x, labels = 0, []
    ticks = []
    for k, r in enumerate(rows):
        for name, op, _macs, _cycles, util in r["layers"]:
            ax.bar(x, util, color=f"C{k}")
            ticks.append(x)
            short = "layers" if ".." in name else name.rsplit("/", 1)[-1][:16]
            labels.append(f"{r['model']}: {short} ({op})")
            x += 1
        x += 1
    ax.set_xticks(ticks)
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("MVM utilization (%)")
    ax.set_title("Predicted MVM utilization per layer, one inference, default build",
                 fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# --- the command ---------------------------------------------------------------------------

class _SimStarter(threading.Thread):
    """Opens the simulated board (building it on first use) while the zoo is evaluated."""

    def __init__(self, device: str, config):
        super().__init__(daemon=True)
        self.device, self.config, self.dev, self.error = device, config, None, None

    def run(self):
        from host.runtime.device import Device
        try:
            self.dev = Device.open(self.device, timeout=120.0)
        except Exception as exc:  # noqa: BLE001  (reported in the summary)
            self.error = f"{type(exc).__name__}: {exc}"


def _measure(entries, args, calibrated: bool):
    """The table's rows (whole test sets) and the mantissa sweeps, with progress lines."""
    from host.runtime.progress import stage
    rows = []
    for entry in entries:
        with stage(f"demo: {entry.name}: FP32 on onnxruntime, NPU default and 8-bit builds "
                   f"on the reference model, {len(entry.y_test)} test rows"
                   + (f", calibrated on {len(entry.x_calib[:TABLE_CALIB_SAMPLES])} of "
                      f"{len(entry.x_calib)} calibration rows" if calibrated else "")):
            rows.append(evaluate_entry(entry, calibrated=calibrated))
    sweeps = []
    for entry, row in zip(entries, rows):
        if "error" in row:
            continue
        used = len(entry.y_test[:args.sweep_samples])
        cal = len(entry.x_calib[:SWEEP_CALIB_SAMPLES])
        with stage(f"demo: {entry.name}: mantissa sweep {SWEEP_BITS[0]}..{SWEEP_BITS[-1]} "
                   f"bits on {used} of {len(entry.y_test)} test rows"
                   + (f", calibrated on {cal} of {len(entry.x_calib)} calibration rows"
                      if calibrated else "")):
            sweeps.append(mantissa_sweep(entry, samples=args.sweep_samples,
                                         calibrated=calibrated))
    return rows, sweeps


def _board(starter, ok, samples: int):
    """The simulated board's check (:func:`sim_check`) once it is up; None without one."""
    from host.runtime.progress import stage
    if starter is None:
        return None
    with stage("demo: waiting for the simulated board"):
        starter.join()
    if starter.error:
        return {"error": starter.error}
    try:
        with stage(f"demo: the smallest model on the simulated board, {samples} test rows"):
            return sim_check(ok, starter.device, starter.config, samples, dev=starter.dev)
    except Exception as exc:  # noqa: BLE001  (reported in the summary)
        return {"error": f"{type(exc).__name__}: {exc}"}


def main(argv=None) -> int:
    from host.compiler.network import config_text
    parser = argparse.ArgumentParser(prog="python -m bench.demo", description=__doc__.split(
        "\n\n")[0].strip("`"), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--zoo", type=Path, default=ZOO, help=f"zoo folder (default {ZOO})")
    parser.add_argument("--seed", type=int, default=0, help="which seed's models (default 0)")
    parser.add_argument("--out", type=Path, default=OUT, help=f"plots (default {OUT})")
    parser.add_argument("--sweep-samples", type=int, default=SWEEP_SAMPLES,
                        help=f"test rows of the mantissa sweep (default {SWEEP_SAMPLES})")
    parser.add_argument("--sim-samples", type=int, default=SIM_SAMPLES,
                        help=f"test rows run on the simulated board (default {SIM_SAMPLES})")
    parser.add_argument("--no-sim", action="store_true", help="skip the simulated board")
    args = parser.parse_args(argv)
    start = time.monotonic()

    entries = zoo_entries(args.seed, root=args.zoo)
    if not entries:
        print(f"demo: no zoo models under {args.zoo} (seed {args.seed}); train them with "
              f"python -m zoo.train", file=sys.stderr)
        return 1
    calibrated = calibration_available()
    _say(f"demo: {len(entries)} zoo models (seed {args.seed}): "
         f"{', '.join(e.name for e in entries)}; calibration "
         f"{'available' if calibrated else 'not available in the compiler yet'}")

    starter = None
    if not args.no_sim:
        from sim.board import SMALL_CONFIG
        sim_device = f"sim:{config_text(SMALL_CONFIG)}"
        _say("demo: starting the simulated board in the background (the first Verilator "
             "build takes several minutes; later runs reuse build/sim)")
        starter = _SimStarter(sim_device, SMALL_CONFIG)
        starter.start()

    try:
        rows, sweeps = _measure(entries, args, calibrated)
        ok = [e for e, r in zip(entries, rows) if "error" not in r]
        sim = _board(starter, ok or entries, samples=args.sim_samples)
    finally:
        if starter is not None:
            starter.join()
            if starter.dev is not None:
                starter.dev.close()

    print()
    print(f"Model zoo (seed {args.seed}), accuracy on each model's held-out test set; NPU on "
          f"the reference model; cycles and utilization of one inference at the default "
          f"build:")
    print(format_table(rows, calibrated=calibrated))
    print()
    whole = all(s["samples"] == len(e.y_test) for s, e in zip(sweeps, ok))
    cal_rows = ", ".join(f"{s['model']} {s['calib_samples']}" for s in sweeps)
    print("Accuracy (%) against mantissa width (vectors and weights), max-based exponents"
          + (f" and calibrated (method mmse; calibration rows: {cal_rows})"
             if calibrated else "") + ", "
          + ("on the whole test sets:" if whole else
             "on a reduced test set for speed (rows: "
             + ", ".join(f"{s['model']} {s['samples']}" for s in sweeps) + "):"))
    print(sweep_table(sweeps))
    plots = []
    try:
        plots.append(plot_accuracy(sweeps, args.out / "accuracy_vs_mantissa.png"))
        plots.append(plot_utilization(rows, args.out / "utilization_per_layer.png"))
    except ImportError as exc:
        print(f"\nno plots: {exc} (make demo installs the demo extra: pip install -e "
              f"'.[demo]')")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "demo.json").write_text(json.dumps(
        {"rows": [{k: v for k, v in r.items() if k != "fp32_pred"} for r in rows],
         "sweeps": sweeps, "sim": sim}, indent=2, default=str) + "\n")

    print("\nSummary:")
    done = [r for r in rows if "error" not in r]
    print(f"  {len(done)} of {len(rows)} models compiled and ran on the reference model"
          + (f"; not yet: {', '.join(r['model'] for r in rows if 'error' in r)}"
             if len(done) < len(rows) else ""))
    for r in done:
        print(f"  {r['model']}: 8-bit {r['bit8'] - r['fp32']:+.1f} points from FP32 "
              f"({r['bit8_agreement']:.1f} % same class), default build "
              f"{r['default'] - r['fp32']:+.1f} points")
    if sim is None:
        print("  simulated board: skipped (--no-sim)")
    elif "error" in sim:
        print(f"  simulated board: FAILED: {sim['error'][:500]}")
    else:
        print(f"  simulated board: {sim['model']} on {sim['samples']} test rows: output bits "
              f"{'equal to' if sim['equal'] else 'DIFFERENT from'} the reference model's "
              f"({sim['seconds']:.1f} s)")
    for p in plots:
        print(f"  plot: {p}")
    print(f"  figures: {args.out / 'demo.json'}; {time.monotonic() - start:.0f} s in all")
    failed = sim is not None and ("error" in sim or not sim["equal"])
    return 1 if failed or not done else 0


if __name__ == "__main__":
    sys.exit(main())
