"""``npu``: the command-line tool of the host link (``docs/protocol.md`` section 10).

::

    npu --version
    npu [--device DEV] [--json] [--timeout S] info
    npu [--device DEV] [--json] counters [--clear]
    npu [--device DEV] [--json] run IMAGE.npz INPUTS.npy -o OUTPUTS.npy [--window W]
                                    [--no-progress]
    npu [--json] deps IMAGE.npz [--dot] [--registers] [--build BUILD]
    npu [--json] export IMAGE.npz -o LAYER.py [--build BUILD]
    npu [--json] compile MODEL.onnx -o NET.npz [--config BUILD]
                         [--calibrate DATA.npy [--method mmse|max]
                          [--rounding gptq|nearest]
                          [--accumulator-bits K [--overflow-threshold T]] [--device DEV]]
                         [--quant FILE.json]
    npu [--json] report NET.npz
    npu [--device DEV] [--json] compare MODEL.onnx NET.npz INPUTS.npy
    npu train MODEL.onnx (--data DATA.npz | --zoo DIR) -o OUTDIR [--config BUILD]
              [--method qat|lazy] [--start calibrated|default] [--epochs E] [--lr LR]
              [--lr-drop-epochs D]

``--device`` is ``model`` (the reference model in process, the default),
``model:KEY=VALUE,...`` (other build parameters), ``serial:PORT[@BAUD]`` or a kind from
the transport registry (``sim[:KEY=VALUE,...]``, the simulated board); the environment
variable ``NPU_DEVICE`` sets the default. ``run`` checks its files (the image, the
inputs, the output path) before it opens the device, so a bad file runs nothing. Results go to stdout (JSON with
``--json``), messages and the progress bar to stderr. Exit status: 0 done, 1 the device
or the link failed, 2 usage (bad arguments, unreadable or malformed files).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
import time

import numpy as np

__all__ = ["main", "EXIT_OK", "EXIT_DEVICE", "EXIT_USAGE"]

EXIT_OK, EXIT_DEVICE, EXIT_USAGE = 0, 1, 2


class _UsageError(Exception):
    """Bad arguments or input files: exit status 2."""


def _common(defaults: bool) -> argparse.ArgumentParser:
    """The options every command takes, before or after the command's name. The
    sub-commands' copies default to SUPPRESS, so they only override what was given."""
    from host.runtime.transport import device_choices
    common = argparse.ArgumentParser(add_help=False)
    keep = {} if defaults else {"default": argparse.SUPPRESS}
    common.add_argument("--device", **({"default": os.environ.get("NPU_DEVICE", "model")}
                                       if defaults else keep),
                        help=f"one of: {device_choices()} (default: $NPU_DEVICE "
                             f"or 'model'); 'sim' is the simulated board (a checkout)")
    common.add_argument("--json", action="store_true", **keep,
                        help="machine-readable output (JSON on stdout)")
    common.add_argument("--timeout", type=float, **({"default": 10.0} if defaults else keep),
                        help="seconds to wait for each reply (default 10)")
    return common


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="npu", description="Talk to a BFP NPU: the reference model or a board.",
        epilog="exit status: 0 done, 1 device or link error, 2 usage error",
        parents=[_common(True)])
    parser.add_argument("--version", action="version", version=_version())
    common = _common(False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("info", parents=[common],
                   help="protocol version and build parameters of the device")
    counters = sub.add_parser("counters", parents=[common], help="read the event counters")
    counters.add_argument("--clear", action="store_true", help="clear them after reading")
    run = sub.add_parser("run", parents=[common],
                         help="load a network image and stream inputs through it")
    run.add_argument("image", help="network image (.npz, see docs/protocol.md)")
    run.add_argument("inputs", help=".npy of shape (jobs, k, n): uint16 FP16 bits, or "
                                    "float16/float32/float64 (rounded to FP16, nearest-even)")
    run.add_argument("-o", "--output", required=True,
                     help=".npy written with shape (jobs, outputs, n), float16")
    run.add_argument("--window", type=int, default=4,
                     help="runs in flight (default 4; a job of several runs counts each)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    deps = sub.add_parser("deps", parents=[common],
                          help="the dependency graph of an image's chains (no device)")
    deps.add_argument("image", help="network image (.npz, see docs/protocol.md)")
    deps.add_argument("--dot", action="store_true", help="Graphviz dot instead of text")
    deps.add_argument("--registers", action="store_true",
                      help="also draw scalar-register edges (see docs/deps.md)")
    deps.add_argument("--build", default=None,
                      help="build of the program (host.spec.config.parse_config text); "
                           "default: the image's own, else the default build")
    export = sub.add_parser("export", parents=[common],
                            help="write the image as a NumPy-only Python module (no device)")
    export.add_argument("image", help="network image (.npz, see docs/protocol.md)")
    export.add_argument("-o", "--output", required=True,
                        help="the module to write (.py); its data goes to the .npz of the "
                             "same stem next to it (docs/export.md)")
    export.add_argument("--build", default=None,
                        help="build of the program (host.spec.config.parse_config text); "
                             "default: the image's own, else the default build")
    _compile_parsers(sub, common)
    _compare_parser(sub, common)
    # Listed here for npu --help; main hands everything after "train" to
    # host.quant.train, which has its own options (npu train --help).
    sub.add_parser("train", add_help=False,
                   help="fine-tune an ONNX classifier for the device (QAT or the lazy BFP "
                        "update) and export it for compile --quant; npu train --help")
    return parser


def _compile_parsers(sub, common) -> None:
    """``npu compile`` and ``npu report`` (the network compiler, ``docs/compiler.md``)."""
    comp = sub.add_parser("compile", parents=[common],
                          help="compile an ONNX model into a network image (no device)")
    comp.add_argument("model", help="ONNX model (.onnx; external data beside it)")
    comp.add_argument("-o", "--output", required=True, help="network image to write (.npz)")
    comp.add_argument("--config", default="",
                      help="build to compile for (host.spec.config.parse_config text: a "
                           "preset and KEY=VALUE items; default: the default build)")
    comp.add_argument("--calibrate", metavar="DATA.npy", default=None,
                      help="calibrate the exponents on these samples (float .npy shaped "
                           "like the model's input, batch first; docs/calibration.md); "
                           "counts run on --device ('model': the build's reference model)")
    comp.add_argument("--method", choices=("mmse", "max"), default=None,
                      help="with --calibrate: least squared error (default) or the "
                           "device's max-based exponents")
    comp.add_argument("--rounding", choices=("gptq", "nearest"), default=None,
                      help="with --calibrate --method mmse: weight mantissas chosen by "
                           "layer-output error (default) or rounded to nearest "
                           "(docs/calibration.md section 7)")
    comp.add_argument("--accumulator-bits", type=int, default=None, metavar="K",
                      help="with --calibrate: range scaling (seed 000) until each layer's "
                           "narrow-accumulator events at K bits (1..64) plus saturations "
                           "are at most --overflow-threshold")
    comp.add_argument("--overflow-threshold", type=int, default=None, metavar="T",
                      help="events accepted per layer over the calibration set (default 0)")
    comp.add_argument("--quant", metavar="FILE.json", default=None,
                      help="exponents from quantization-aware training (the file "
                           "host.quant.qat writes beside the trained model; "
                           "docs/training.md); not with --calibrate")
    rep = sub.add_parser("report", parents=[common],
                         help="the compile report stored in a network image (no device)")
    rep.add_argument("image", help="network image made by npu compile (.npz)")


def _version() -> str:
    from host.spec.protocol import PROTOCOL_VERSION
    try:
        version = importlib.metadata.version("bfp-npu")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown (not installed)"
    return f"npu {version}, host protocol version {PROTOCOL_VERSION}"


def _load_image(path: str):
    from host.spec.image import NetworkImage
    try:
        return NetworkImage.load(path)
    except (OSError, ValueError) as exc:
        raise _UsageError(f"cannot load image: {exc}") from None


def _load_npy(path: str) -> np.ndarray:
    """The one array of an inputs file; a usage error naming the file otherwise."""
    try:
        x = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise _UsageError(f"cannot read inputs {path}: {exc}") from None
    if not isinstance(x, np.ndarray):
        x.close()
        raise _UsageError(f"inputs {path} must be one .npy array, not an .npz archive")
    return x


def _load_inputs(path: str) -> np.ndarray:
    """The inputs file as an array of FP16 bit patterns ``(jobs, k, n)``; floats are rounded
    to FP16 (nearest even), and values that overflow to infinity or flush to zero in that
    rounding are counted in a warning on stderr."""
    x = _load_npy(path)
    if x.dtype == np.uint16:
        return x
    if x.dtype in (np.float16, np.float32, np.float64):
        with np.errstate(over="ignore"):                # counted below, not warned twice
            h = x.astype(np.float16)                    # round to nearest, ties to even
        overflow = int(np.count_nonzero(np.isinf(h) & np.isfinite(x)))
        underflow = int(np.count_nonzero((h == 0) & (x != 0)))
        if overflow or underflow:
            print(f"npu: warning: inputs {path}: {overflow} values overflow to infinity and "
                  f"{underflow} flush to zero in the conversion to FP16", file=sys.stderr)
        return h.view(np.uint16)
    raise _UsageError(f"inputs {path} must be uint16 (FP16 bits) or float, not {x.dtype}")


def _check_inputs(x: np.ndarray, path: str, image, n: int) -> None:
    if x.ndim != 3 or x.shape[2] != n or 0 in x.shape:
        raise _UsageError(f"inputs {path} must have shape (jobs, k, {n}), not {x.shape}")
    try:
        image.check_job(x.shape[1], f"inputs {path} (shape {x.shape}): each job")
    except ValueError as exc:
        raise _UsageError(str(exc)) from None


def _check_output(path: str) -> None:
    """Refuse an output path that cannot be written, before anything runs (a file created
    for the test is removed again)."""
    existed = os.path.lexists(path)
    try:
        with open(path, "ab"):
            pass
    except OSError as exc:
        raise _UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
    if not existed:
        os.unlink(path)


def _print(args, data: dict, text: str) -> None:
    print(json.dumps(data) if args.json else text)


def _info_value(value) -> str:
    """An INFO value as ``npu info`` prints it: a list of names joined by commas, the unit
    sets (one list of unit names per MFU) in their ``parse_config`` form
    (``addsub+mul+reduce / addsub+mul+act``)."""
    if isinstance(value, list):
        if value and isinstance(value[0], list):
            return " / ".join("+".join(units) for units in value)
        return ", ".join(value)
    return str(value)


def _info(dev, args, *_) -> None:
    info = dev.info()
    width = max(map(len, info))
    _print(args, {"device": dev.transport.name, **info},
           "\n".join([f"{'device':<{width}}  {dev.transport.name}"]
                     + [f"{k:<{width}}  {_info_value(v)}" for k, v in info.items()]))


def _counters(dev, args, *_) -> None:
    counters = dev.counters()
    if args.clear:
        dev.clear_counters()
    width = max(map(len, counters), default=0)
    _print(args, counters, "\n".join(f"{k:<{width}}  {v}" for k, v in counters.items()))


def _prepare_run(args):
    """The image and inputs of ``npu run``, checked against each other, and the output path
    checked writable; nothing has touched the device yet."""
    if args.window < 1 or args.window > 64:
        raise _UsageError(f"--window must be from 1 to 64, not {args.window}")
    image = _load_image(args.image)
    if isinstance(image.extra.get("signature"), dict):
        x = _model_inputs(args.inputs, image)      # float rows of the model's input shape
    else:
        x = _load_inputs(args.inputs)
    n = (image.config or {}).get("n")
    if n is not None:
        _check_inputs(x, args.inputs, image, n)
    _check_output(args.output)
    return image, x


def _run(dev, args, image, x) -> None:
    try:
        image.check_config(dev.config)
    except ValueError as exc:
        raise _UsageError(f"image {args.image} does not fit {dev.transport.name}: {exc}") \
            from None
    _check_inputs(x, args.inputs, image, dev.config.n)
    start = time.monotonic()
    dev.load_image(image)
    # A job of several runs (a long sequence in chunks) runs them in turn, the state kept
    # on the device; its result is every run's outputs or the last run's (image.keep).
    results = np.empty((len(x), image.job_outputs, dev.config.n), np.uint16)
    progress = None if args.no_progress or args.json else True
    for i, y in enumerate(dev.stream(x, outputs=image.outputs, window=args.window,
                                     progress=progress, prologue=image.job_memories,
                                     vectors=image.inputs, runs=image.runs,
                                     keep=image.keep)):
        results[i] = y
    seconds = time.monotonic() - start
    try:
        with open(args.output, "wb") as f:     # exactly this path (np.save adds .npy)
            np.save(f, _run_outputs(image, results))
    except OSError as exc:
        raise _UsageError(f"cannot write {args.output}: {exc}") from None
    summary = {"jobs": len(x), "outputs": args.output, "seconds": round(seconds, 6),
               "jobs_per_second": len(x) / seconds if seconds else None,
               "runs_per_job": image.runs}
    _print(args, summary, f"{len(x)} jobs in {seconds:.3f} s; outputs written to "
                          f"{args.output}")


def _image_build(args, image):
    """The build of ``--build`` if given, else the one the image was compiled for."""
    from host.spec.config import parse_config
    try:
        return parse_config(args.build) if args.build is not None else image.build()
    except (TypeError, ValueError) as exc:
        raise _UsageError(f"bad build for {args.image}: {exc}") from None


def _deps(args) -> None:
    """``npu deps``: the image's chains and their dependencies (``docs/deps.md``); text,
    ``--json`` or ``--dot`` on stdout. Needs no device."""
    from host.compiler.deps import dependency_graph
    if args.dot and args.json:
        raise _UsageError("choose one of --dot and --json")
    image = _load_image(args.image)
    config = _image_build(args, image)
    try:
        graph = dependency_graph(image.program, config, registers=args.registers)
    except ValueError as exc:
        raise _UsageError(f"{args.image}: {exc}") from None
    text = graph.to_dot() if args.dot else graph.to_json() if args.json else graph.to_text()
    print(text.rstrip("\n"))


def _export(args) -> None:
    """``npu export``: the image as one Python module needing only NumPy, and its ``.npz``
    (``docs/export.md``). Needs no device."""
    from host.compiler.export import ExportError, export_image
    image = _load_image(args.image)
    config = _image_build(args, image)
    start = time.monotonic()
    try:
        py, npz = export_image(image, args.output, config=config, source=args.image)
    except (ExportError, ValueError) as exc:
        raise _UsageError(f"{args.image}: {exc}") from None
    except OSError as exc:
        raise _UsageError(f"cannot write {args.output}: {exc}") from None
    seconds = time.monotonic() - start
    _print(args, {"module": py, "data": npz, "seconds": round(seconds, 6)},
           f"wrote {py} and {npz} in {seconds:.2f} s")


# --- the network compiler: compile, report, and model-shaped inputs of run ----------------

def _model_inputs(path: str, image) -> np.ndarray:
    """``npu run``'s inputs for an image with a signature: float values shaped like the
    model's input (batch first), as jobs of FP16 bits ``(batch, k, n)``."""
    import warnings
    from host.compiler.network import signature_jobs
    x = _load_npy(path)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RuntimeWarning)
            jobs = signature_jobs(x, image.extra["signature"], int(image.config["n"]),
                                  f"inputs {path}")
    except (TypeError, ValueError, KeyError) as exc:
        raise _UsageError(str(exc)) from None
    for w in caught:
        print(f"npu: warning: {w.message}", file=sys.stderr)
    return jobs


def _run_outputs(image, results: np.ndarray) -> np.ndarray:
    """What ``npu run`` writes: float32 model-shaped outputs for an image with a
    signature, else the native output vectors as float16 ``(jobs, K, n)``."""
    signature = image.extra.get("signature")
    if isinstance(signature, dict):
        from host.compiler.network import signature_outputs
        return signature_outputs(results, signature)
    return results.view(np.float16)


def _compile(args) -> None:
    """``npu compile``: an ONNX model to a network image (``docs/compiler.md``); with
    ``--calibrate``, calibrated exponents (``host.quant.compile_calibrated``,
    ``docs/calibration.md``)."""
    from host.compiler.lower import CompileError
    from host.compiler.network import compile_onnx, format_report
    from host.compiler.onnx_import import OnnxImportError
    from host.spec.config import parse_config
    if args.calibrate is None:
        for option, value in (("--method", args.method),
                              ("--rounding", args.rounding),
                              ("--accumulator-bits", args.accumulator_bits),
                              ("--overflow-threshold", args.overflow_threshold)):
            if value is not None:
                raise _UsageError(f"{option} needs --calibrate DATA.npy")
    if args.overflow_threshold is not None and args.accumulator_bits is None:
        raise _UsageError("--overflow-threshold needs --accumulator-bits K")
    if args.rounding is not None and args.method == "max":
        raise _UsageError("--rounding applies to --method mmse, not to max-based exponents")
    if args.quant is not None and args.calibrate is not None:
        raise _UsageError("--quant and --calibrate exclude each other: the quantization "
                          "file already holds the exponents")
    try:
        config = parse_config(args.config)
    except ValueError as exc:
        raise _UsageError(f"bad --config: {exc}") from None
    _check_output(args.output)
    start = time.monotonic()
    try:
        if args.quant is not None:
            from host.quant.quantfile import compile_quantized
            net = compile_quantized(args.model, config, quant=args.quant)
        elif args.calibrate is None:
            net = compile_onnx(args.model, config)
        else:
            from host.quant import compile_calibrated
            net = compile_calibrated(
                args.model, config, calibrate=args.calibrate, method=args.method or "mmse",
                rounding=args.rounding or "gptq", accumulator_bits=args.accumulator_bits,
                overflow_threshold=args.overflow_threshold or 0, device=args.device,
                timeout=args.timeout)
    except (OnnxImportError, CompileError) as exc:
        raise _UsageError(str(exc)) from None
    except ValueError as exc:              # host.quant.CalibrationError: data, device, range
        raise _UsageError(str(exc)) from None
    try:
        with open(args.output, "wb") as f:     # exactly this path (np.savez adds .npz)
            net.save(f)
    except OSError as exc:
        raise _UsageError(f"cannot write {args.output}: {exc}") from None
    seconds = time.monotonic() - start
    _print(args, {"image": args.output, "seconds": round(seconds, 6), **net.report()},
           f"{format_report(net.report())}\nwrote {args.output} in {seconds:.2f} s")


def _report(args) -> None:
    """``npu report``: the compile report stored in an image's ``extra["report"]``."""
    from host.compiler.network import format_report
    image = _load_image(args.image)
    report = image.extra.get("report")
    if not isinstance(report, dict) or "layers" not in report:
        raise _UsageError(f"{args.image} has no compile report (it was not made by "
                          f"npu compile)")
    _print(args, report, format_report(report))


# --- npu compare: every layer against onnxruntime (docs/compiler.md) -----------------------

def _compare_parser(sub, common) -> None:
    cmp = sub.add_parser("compare", parents=[common],
                         help="every layer's output on the device against onnxruntime's "
                              "intermediate tensors")
    cmp.add_argument("model", help="the ONNX model the image was compiled from (.onnx)")
    cmp.add_argument("image", help="network image made by npu compile (.npz)")
    cmp.add_argument("inputs", help=".npy of float inputs shaped like the model's input "
                                    "(batch first)")


def _compare(args) -> None:
    """``npu compare``: per layer, the device's output against onnxruntime's intermediate
    tensor (host.compiler.compare). Files are checked before the device is opened."""
    import warnings
    from host.compiler.compare import check_same_network, compare, format_comparison
    from host.compiler.network import Network, signature_jobs
    from host.compiler.onnx_import import OnnxImportError, import_onnx
    image = _load_image(args.image)
    try:
        net = Network(image)
    except ValueError as exc:
        raise _UsageError(f"{args.image}: {exc}") from None
    try:
        check_same_network(import_onnx(args.model), net, args.model)
    except OnnxImportError as exc:
        raise _UsageError(str(exc)) from None
    except ValueError as exc:
        raise _UsageError(f"{args.image}: {exc}") from None
    x = _load_npy(args.inputs)
    try:
        signature_jobs(x, net.signature, net.config.n, f"inputs {args.inputs}")
    except (TypeError, ValueError) as exc:
        raise _UsageError(str(exc)) from None
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RuntimeWarning)
            records = compare(args.model, net, x, args.device, progress=not args.json)
    except OnnxImportError as exc:
        raise _UsageError(str(exc)) from None
    except ValueError as exc:                # another model's image, a device of another build
        raise _UsageError(f"{args.model} and {args.image}: {exc}") from None
    for w in caught:
        print(f"npu: warning: {w.message}", file=sys.stderr)
    _print(args, {"model": args.model, "image": args.image, "inputs": args.inputs,
                  "device": args.device, "layers": [r.to_json() for r in records]},
           format_comparison(records))


def main(argv=None) -> int:
    """Run the ``npu`` command with ``argv`` (default ``sys.argv[1:]``); returns the exit
    status."""
    from host.runtime.device import Device, DeviceError
    from host.runtime.transport import TransportError, connect
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["train"]:                 # docs/training.md; needs the torch extra
        from host.quant.train import main as train_main
        return train_main(argv[1:])
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:                 # --help (0) and usage errors (2)
        return int(exc.code or 0)
    if not args.timeout > 0:
        print(f"npu: error: --timeout must be positive, not {args.timeout}", file=sys.stderr)
        return EXIT_USAGE
    if args.command in ("compile", "report", "compare"):    # no device, or their own
        try:
            {"compile": _compile, "report": _report, "compare": _compare}[args.command](args)
        except _UsageError as exc:
            print(f"npu: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except (DeviceError, TransportError) as exc:     # --calibrate's or compare's device
            print(f"npu: device error: {exc}", file=sys.stderr)
            return EXIT_DEVICE
        return EXIT_OK
    if args.command in ("deps", "export"):
        try:
            (_deps if args.command == "deps" else _export)(args)
        except _UsageError as exc:
            print(f"npu: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        return EXIT_OK
    prepared = ()
    if args.command == "run":
        try:
            prepared = _prepare_run(args)
        except _UsageError as exc:
            print(f"npu: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
    try:
        transport = connect(args.device)
    except ValueError as exc:
        print(f"npu: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except TransportError as exc:
        print(f"npu: error: {exc}", file=sys.stderr)
        return EXIT_DEVICE
    try:
        with Device(transport, timeout=args.timeout) as dev:
            {"info": _info, "counters": _counters, "run": _run}[args.command](dev, args,
                                                                             *prepared)
    except _UsageError as exc:
        print(f"npu: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (DeviceError, TransportError) as exc:
        print(f"npu: device error: {exc}", file=sys.stderr)
        return EXIT_DEVICE
    except BrokenPipeError:
        # The reader of stdout went away (``npu info | head``): nothing left to say, and
        # Python must not complain again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
