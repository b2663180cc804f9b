"""The ``npu`` command (``host.cli.main``): commands, output formats, exit status.

Most tests call ``main([...])`` in process; one runs ``python -m host.cli`` as a separate
process against a pseudo-terminal board (``host.runtime.server.PtyServer``). Expected outputs
come from ``host.compiler.programs``' ``Program.run`` on a fresh model per job.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from host.spec import protocol as p
from host.cli import main
from host.spec.config import NpuConfig
from host.compiler.image import program_image
from host.spec.image import NetworkImage
from host.model.core import NpuModel
from host.compiler.programs import mlp_layer, native
from host.runtime.server import ProtocolServer, PtyServer

REPO = Path(__file__).resolve().parents[2]
CFG = NpuConfig()                       # what --device model builds
JOBS, BATCH, X, H = 7, 3, 24, 20


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """An MLP image file, an inputs file (float32), and the expected outputs."""
    tmp = tmp_path_factory.mktemp("cli")
    rng = np.random.default_rng(30)
    w = (rng.standard_normal((H, X)) * 0.4).astype(np.float16)
    b = (rng.standard_normal(H) * 0.2).astype(np.float16)
    xs = (rng.standard_normal((JOBS, BATCH, X)) * 2).astype(np.float32)
    expected = []
    for job in xs:
        result, out = mlp_layer(CFG, w, b, job.astype(np.float16)).run(NpuModel(CFG))
        assert result.ok
        expected.append(out)
    image = program_image(mlp_layer(CFG, w, b, xs[0].astype(np.float16)))
    image.save(tmp / "mlp.npz")
    # Each job's inputs as native vectors: BATCH logical vectors of X values.
    inputs = np.stack([native(job.astype(np.float16), CFG.n) for job in xs]).view(np.float16)
    np.save(tmp / "x16.npy", inputs)
    # float32 inputs are rounded to FP16 by npu run: the same bits.
    np.save(tmp / "x32.npy", inputs.astype(np.float32))
    return tmp, np.stack(expected)


def test_help_and_missing_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: npu" in out and "info" in out and "exit status" in out
    assert main([]) == 2
    assert "required" in capsys.readouterr().err
    assert main(["run", "--help"]) == 0
    assert "--window" in capsys.readouterr().out


def test_info(capsys):
    assert main(["info"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = dict(line.split(None, 1) for line in out.splitlines())
    assert lines["n"] == str(CFG.n) and lines["device"] == "model"
    assert lines["unary_ops"] == ", ".join(op.name.lower() for op in CFG.unary_ops)
    assert main(["info", "--json", "--device", "model:n=32,tiles=1"]) == 0
    info = json.loads(capsys.readouterr().out)
    want = NpuModel(NpuConfig(n=32, tiles=1)).info()
    assert info == {"device": "model", "protocol_version": p.PROTOCOL_VERSION,
                    "max_payload": p.MAX_PAYLOAD, **want}


def test_counters(capsys):
    assert main(["--json", "counters", "--clear"]) == 0
    counters = json.loads(capsys.readouterr().out)
    assert counters == NpuModel(CFG).counters()
    assert main(["counters"]) == 0
    assert "vector_saturations  0" in capsys.readouterr().out


@pytest.mark.parametrize("inputs", ["x16.npy", "x32.npy"])
def test_run_writes_the_expected_outputs(mlp, inputs, capsys):
    tmp, expected = mlp
    out = tmp / f"y_{inputs}"
    assert main(["run", str(tmp / "mlp.npz"), str(tmp / inputs), "-o", str(out)]) == 0
    stdout, stderr = capsys.readouterr()
    assert f"{JOBS} jobs in" in stdout
    assert f"jobs: {JOBS}/{JOBS} (100 %)" in stderr      # the progress line, on stderr
    assert "\r" not in stderr                         # not a terminal: no frames
    y = np.load(out)
    assert y.dtype == np.float16 and y.shape == expected.shape
    assert (y.view(np.uint16) == expected).all()


def test_run_json(mlp, capsys):
    tmp, expected = mlp
    out = tmp / "y.npy"
    assert main(["run", "--json", "--window", "1", str(tmp / "mlp.npz"), str(tmp / "x16.npy"),
                 "-o", str(out)]) == 0
    stdout, stderr = capsys.readouterr()
    summary = json.loads(stdout)
    assert summary["jobs"] == JOBS and summary["outputs"] == str(out) and stderr == ""
    assert (np.load(out).view(np.uint16) == expected).all()


@pytest.mark.parametrize("args,message", [
    (["--device", "sim:n", "info"], "bad sim option: unknown build preset 'n'"),
    (["--device", "usb:0", "info"], "unknown device 'usb:0'; choose one of"),
    (["--timeout", "0", "info"], "--timeout must be positive"),
    (["run", "missing.npz", "x16.npy", "-o", "y.npy"], "cannot load image"),
    (["run", "mlp.npz", "missing.npy", "-o", "y.npy"], "cannot read inputs"),
    (["run", "mlp.npz", "bad_shape.npy", "-o", "y.npy"], r"must have shape \(jobs, k, 16\)"),
    (["run", "mlp.npz", "x16.npy", "-o", "y.npy", "--window", "0"], "--window must be"),
    (["run", "--device", "model:n=32", "mlp.npz", "x16.npy", "-o", "y.npy"],
     "the image was built for n=16, the device has n=32"),
    (["run", "x16.npy", "x16.npy", "-o", "y.npy"], "cannot load image"),
    (["frobnicate"], "invalid choice"),
])
def test_usage_errors_exit_2(mlp, args, message, capsys, monkeypatch):
    tmp, _ = mlp
    monkeypatch.chdir(tmp)
    np.save(tmp / "bad_shape.npy", np.zeros((2, 3, 5), np.float16))
    assert main(args) == 2
    stdout, stderr = capsys.readouterr()
    assert stdout == ""
    import re
    assert re.search(message, stderr), stderr


def test_device_errors_exit_1(mlp, capsys, monkeypatch):
    tmp, _ = mlp
    monkeypatch.chdir(tmp)
    # Each job brings 2 vectors fewer than the program reads, and the image does not say
    # how many a job takes (as in a version 1 image): the first run underflows.
    short = np.load(tmp / "x16.npy")[:, :-2]
    np.save(tmp / "short.npy", short)
    image = NetworkImage.load(tmp / "mlp.npz")
    image.inputs = None
    image.save(tmp / "unsized.npz")
    assert main(["run", "unsized.npz", "short.npy", "-o", "y_short.npy", "--no-progress"]) == 1
    stdout, stderr = capsys.readouterr()
    assert stdout == ""
    assert "npu: device error: job 0 failed" in stderr and "QUEUE_UNDERFLOW" in stderr
    assert not (tmp / "y_short.npy").exists()
    assert main(["--device", "serial:/nonexistent/tty", "info"]) == 1
    assert "cannot open serial port" in capsys.readouterr().err


def test_npu_in_a_subprocess_over_a_pty():
    with PtyServer(ProtocolServer(NpuModel(NpuConfig(n=8, tiles=1)))) as board:
        done = subprocess.run([sys.executable, "-m", "host.cli", "--device",
                               f"serial:{board.port}", "info", "--json"],
                              cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["device"] == f"serial:{board.port}@115200"
    assert (info["n"], info["tiles"]) == (8, 1)


def _no_device(monkeypatch):
    """Make any use of a device fail the test: the refusals below come first."""
    def refuse(*args, **kwargs):
        raise AssertionError("the device was opened")
    monkeypatch.setattr("host.runtime.transport.connect", refuse)


@pytest.mark.parametrize("drop, extra", [(2, 0), (0, 3)])
def test_jobs_of_another_size_are_refused_before_anything_runs(mlp, capsys, monkeypatch,
                                                               drop, extra):
    tmp, _ = mlp
    x = np.load(tmp / "x16.npy")
    k = x.shape[1]
    x = np.concatenate([x[:, :k - drop], np.zeros((len(x), extra, x.shape[2]), x.dtype)], 1)
    np.save(tmp / "wrong.npy", x)
    _no_device(monkeypatch)
    out = tmp / f"y_wrong_{drop}_{extra}.npy"
    assert main(["run", str(tmp / "mlp.npz"), str(tmp / "wrong.npy"), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"each job has {k - drop + extra} input vectors; the image takes {k}" in err
    assert not out.exists()


@pytest.mark.parametrize("content, says", [
    (b"", "not a network image"),
    (b"PK\x03\x04 truncated", "damaged, truncated"),
    (None, "damaged, truncated"),
    ("npy", "not a network image"),
])
def test_bad_image_files_exit_2_without_a_traceback(mlp, capsys, monkeypatch, content, says):
    tmp, _ = mlp
    bad = tmp / "bad.npz"
    if content is None:                        # a real image cut short
        raw = (tmp / "mlp.npz").read_bytes()
        bad.write_bytes(raw[:len(raw) * 2 // 3])
    elif content == "npy":                     # another kind of file: an .npy array
        np.save(tmp / "arr.npy", np.zeros(3))
        bad = tmp / "arr.npy"
    else:
        bad.write_bytes(content)
    _no_device(monkeypatch)
    assert main(["run", str(bad), str(tmp / "x16.npy"), "-o", str(tmp / "y.npy")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("npu: error: cannot load image:") and says in err, err
    assert "Traceback" not in err


def test_bad_inputs_file_and_unwritable_output_exit_2(mlp, capsys, monkeypatch):
    tmp, _ = mlp
    _no_device(monkeypatch)
    (tmp / "junk.npy").write_bytes(b"\x93NUMPY garbage")
    assert main(["run", str(tmp / "mlp.npz"), str(tmp / "junk.npy"), "-o",
                 str(tmp / "y.npy")]) == 2
    assert "cannot read inputs" in capsys.readouterr().err
    np.savez(tmp / "two.npz", a=np.zeros(2), b=np.zeros(2))
    assert main(["run", str(tmp / "mlp.npz"), str(tmp / "two.npz"), "-o",
                 str(tmp / "y.npy")]) == 2
    assert "must be one .npy array" in capsys.readouterr().err
    for out in (tmp / "no" / "such" / "dir" / "y.npy", tmp):      # missing folder, a folder
        assert main(["run", str(tmp / "mlp.npz"), str(tmp / "x16.npy"), "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"cannot write {out}" in err and "Traceback" not in err
    assert not (tmp / "no").exists()


def test_float_inputs_that_overflow_fp16_are_counted(mlp, capsys):
    tmp, expected = mlp
    x = np.load(tmp / "x32.npy").astype(np.float64)
    x[0, 0, :3] = 1e6                                   # beyond FP16: infinity
    x[1, 0, 0] = 1e-12                                  # below FP16's smallest subnormal
    np.save(tmp / "big.npy", x)
    assert main(["run", str(tmp / "mlp.npz"), str(tmp / "big.npy"), "-o",
                 str(tmp / "y.npy"), "--no-progress"]) == 0
    assert "3 values overflow to infinity and 1 flush to zero" in capsys.readouterr().err


def test_version(capsys):
    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("npu ") and "protocol version" in out
