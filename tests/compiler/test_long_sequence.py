"""Sequences not bounded by program memory (``docs/compiler.md`` section 7, "Runs per
job"): a recurrent stage whose sequence does not fit one program is emitted as a program
of ``S`` steps that a job runs ``T / S`` times, the state kept on the device; the image
records the runs (``NetworkImage.runs``, ``keep``); ``Device.stream``, ``Network.run`` and
``npu run`` run such jobs; the exported NumPy layer refuses them.

A 500-step LSTM on a build of 1,024 instructions and a 512-vector queue must equal, bit
for bit, the per-step composition of ``host.numerics`` operations written here (the
arithmetic of ``host.compiler.programs.emit_lstm``); shorter sequences must give the
same bits chunked as unrolled in one program.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from rnn_onnx import rnn_onnx

from host.cli import main
from host.compiler import compile_onnx
from host.compiler.export import ExportError, export_image
from host.compiler.lower import CompileError
from host.compiler.network import config_text
from host.compiler.onnx_import import import_onnx
from host.numerics.fp16 import binary
from host.numerics.mvm import mvm, quantize_fp16
from host.numerics.unary import unary
from host.runtime.device import Device
from host.runtime.transport import ModelTransport
from host.spec.config import parse_config
from host.spec.image import ImageError, NetworkImage
from host.spec.protocol import REPLY, Frame, FrameDecoder, Opcode

BUILD = "n=8,tiles=1,mantissa_bits_v=8,mantissa_bits_w=8,program_depth=1024"
#: The same build with room for every step of the shorter sequences in one program.
UNROLLED = BUILD.replace("program_depth=1024", "program_depth=65536,netq_depth=4096")
I, H = 12, 10


# --- the model's arithmetic, step by step ---------------------------------------------------

def matvec(cfg, w, x):
    """The MVM on a logical FP16 matrix and vector (rows quantized in blocks of N as the
    MRF holds them, the vector by the MVM's quantizer); float16."""
    n = cfg.n
    rows, cols = w.shape
    big_c = -(-cols // n)
    padded = np.zeros((rows, big_c * n), np.float16)
    padded[:, :cols] = w
    q = quantize_fp16(padded.view(np.uint16).reshape(rows, big_c, n), cfg.mantissa_bits_w)
    xp = np.zeros(big_c * n, np.float16)
    xp[:cols] = x
    res = mvm(xp.view(np.uint16), q.exponent_codes, q.mantissas.reshape(rows, big_c * n),
              n=n, mantissa_bits_v=cfg.mantissa_bits_v, mantissa_bits_w=cfg.mantissa_bits_w)
    return res.out_bits.view(np.float16)[:rows]


def lstm_steps(cfg, node, graph, xs):
    """Every step's ``h`` (float16 ``(T, H)``) of the IR LSTM ``node`` (gates f, i, o, c,
    one bias each, as the importer gives them) on ``xs`` ``(T, I)``: ``emit_lstm``'s
    operations in order."""
    w, r, b, h, c = (graph.initializers[i].astype(np.float16) for i in node.inputs[1:])
    hid = len(h)
    part = lambda a, k: a[k * hid:(k + 1) * hid]
    add, mul = (lambda a, b_: binary("add", a, b_)), (lambda a, b_: binary("mul", a, b_))
    hs = []
    for x in xs.astype(np.float16):
        xw = {g: add(matvec(cfg, part(w, k), x), part(b, k)) for k, g in enumerate("fioc")}
        pre = {g: add(matvec(cfg, part(r, k), h), xw[g]) for k, g in enumerate("fioc")}
        f, i, o = (unary("sigmoid", pre[g]) for g in "fio")
        c = add(mul(unary("tanh", pre["c"]), i), mul(f, c))
        h = mul(unary("tanh", c), o)
        hs.append(h)
    return np.stack(hs)


# --- 500 steps ----------------------------------------------------------------------------

def test_500_step_lstm_runs_in_chunks_bit_exact():
    steps = 500
    rng = np.random.default_rng(50)
    model = rnn_onnx("LSTM", steps, I, H, rng, every=True)
    cfg = parse_config(BUILD)
    net = compile_onnx(model, cfg)
    lay = net.report()["layers"][0]
    assert net.image.runs > 1 and net.image.keep == "all"
    assert lay["runs"] == net.image.runs and lay["steps_per_run"] * lay["runs"] == steps
    assert len(net.image.program) <= cfg.program_depth
    assert net.image.inputs == steps * 2 and net.image.run_inputs * net.image.runs == steps * 2
    x = rng.normal(size=(steps, 1, I)).astype(np.float32)
    y = net.run(x)
    assert y.shape == (steps, 1, H)
    graph = import_onnx(model)
    node = next(nd for nd in graph.nodes if nd.op == "LSTM")
    for b in range(1):
        want = lstm_steps(cfg, node, graph, x[:, b])
        got = y[:, b].astype(np.float16)
        bad = np.flatnonzero((got.view(np.uint16) != want.view(np.uint16)).any(axis=1))
        assert not len(bad), f"sequence {b}: steps {bad[:5]} differ from the reference"
    per_step = net.report()["per_job"]["cycles_predicted"] / steps
    print(f"500-step LSTM (I = {I}, H = {H}) on {BUILD}: {lay['runs']} runs of "
          f"{lay['steps_per_run']} steps, {per_step:.1f} predicted cycles a step")


# --- chunked against unrolled ---------------------------------------------------------------

@pytest.mark.parametrize("kind,every,head", [(("LSTM",), False, 5), (("GRU",), True, 0),
                                             (("LSTM", "GRU"), False, 4)])
def test_chunked_equals_unrolled(kind, every, head):
    """The same model compiled for one program (every step unrolled) and for runs of a
    few steps: bit-identical outputs; every step's output in order (keep "all"), or the
    last run's (keep "last": a head after the last step)."""
    steps = 36
    rng = np.random.default_rng(51)
    model = rnn_onnx(kind[0], steps, I, H, rng, ops=kind, every=every, head=head)
    chunked = compile_onnx(model, BUILD.replace("1024", "400"))
    whole = compile_onnx(model, UNROLLED)
    assert whole.image.runs == 1 and chunked.image.runs > 1
    assert chunked.image.keep == ("all" if every else "last")
    x = rng.normal(size=(steps, 2, I)).astype(np.float32)
    a, b = whole.run(x), chunked.run(x)
    assert a.shape == b.shape and np.array_equal(a, b)
    # the chunked figure: predicted cycles a step (the host's time between runs is not
    # in it), against one program
    per = {k: n.report()["per_job"]["cycles_predicted"] / steps
           for k, n in (("whole", whole), ("chunked", chunked))}
    print(f"{kind}: {chunked.image.runs} runs: {per['chunked']:.1f} cycles a step, "
          f"unrolled {per['whole']:.1f}")
    assert per["chunked"] < 1.25 * per["whole"], per


def test_one_step_must_fit_program_memory():
    rng = np.random.default_rng(52)
    model = rnn_onnx("LSTM", 7, I, H, rng, head=3)
    with pytest.raises(CompileError) as info:
        compile_onnx(model, BUILD.replace("1024", "40"))
    msg = str(info.value)
    assert "'rnn0' (LSTM)" in msg and "program memory" in msg and "one step" in msg \
        and "program_depth 40" in msg, msg


# --- the image, the runtime, the command line, the export ------------------------------------

def small_chunked():
    rng = np.random.default_rng(53)
    model = rnn_onnx("LSTM", 12, I, H, rng, head=3)
    net = compile_onnx(model, BUILD.replace("1024", "200"))
    assert net.image.runs > 1 and net.image.keep == "last"
    return net, rng.normal(size=(12, 2, I)).astype(np.float32)


def test_image_records_runs_per_job(tmp_path):
    net, _ = small_chunked()
    net.save(tmp_path / "c.npz")
    back = NetworkImage.load(tmp_path / "c.npz")
    assert (back.runs, back.keep, back.inputs, back.outputs) == \
        (net.image.runs, "last", net.image.inputs, net.image.outputs)
    with np.load(tmp_path / "c.npz") as f:
        meta = json.loads(str(f["meta"][()]))
    assert meta["version"] == 3 and meta["runs"] == {"count": net.image.runs, "keep": "last"}
    # one run per job stays a version 2 image, as before
    one = NetworkImage(program=np.array([7], np.uint64), inputs=4, outputs=2)
    one.save(tmp_path / "one.npz")
    with np.load(tmp_path / "one.npz") as f:
        meta1 = json.loads(str(f["meta"][()]))
    assert meta1["version"] == 2 and "runs" not in meta1
    assert NetworkImage.load(tmp_path / "one.npz").runs == 1
    # malformed records are refused, naming them
    for runs, says in (({"count": 0, "keep": "all"}, "runs must be a positive integer"),
                       ({"count": 2, "keep": "some"}, "keep must be one of"),
                       ({"count": 3, "keep": "all"}, "must split equally over the 3 runs"),
                       ("2", "must record 'runs'")):
        meta.update(runs=runs, inputs=4, memories=[])
        np.savez(tmp_path / "bad.npz", program=np.array([7], np.uint64),
                 meta=np.array(json.dumps(meta)))
        with pytest.raises(ImageError, match=says):
            NetworkImage.load(tmp_path / "bad.npz")


def test_stream_runs_a_job_in_runs():
    """Device.stream on the chunked image: the prologue once, then per run its share of
    the inputs, RUN, POP; "last" keeps the last run's outputs, "all" every run's."""
    net, x = small_chunked()
    jobs = net.jobs(x)
    img = net.image
    with Device.open(f"model:{config_text(net.config)}") as dev:
        dev.load_image(img)
        kw = {"outputs": img.outputs, "prologue": img.job_memories, "vectors": img.inputs,
              "runs": img.runs}
        last = list(dev.stream(jobs, keep="last", **kw))
        every = list(dev.stream(jobs, keep="all", **kw))
        assert all(e.shape == (img.runs * img.outputs, net.config.n) for e in every)
        assert all(np.array_equal(e[-img.outputs:], la) for e, la in zip(every, last))
        # the head ran after every run; the outputs of the runs differ (the state moved on)
        assert not np.array_equal(every[0][:img.outputs], every[0][-img.outputs:])
        with pytest.raises(ValueError, match=r"vectors \(24 per job\) must split equally "
                                             r"over the 5 runs"):
            next(dev.stream(jobs, outputs=img.outputs, vectors=24, runs=5))
        with pytest.raises(ValueError, match="keep must be 'all' or 'last'"):
            next(dev.stream(jobs, outputs=img.outputs, runs=2, keep="first"))


class RunCounter(ModelTransport):
    """A model transport that tracks RUN requests sent and not yet answered."""

    def __init__(self, config):
        super().__init__(config=config)
        self.sent, self.replies = FrameDecoder(), FrameDecoder()
        self.unanswered = self.most = 0

    def send(self, data):
        self.unanswered += sum(isinstance(f, Frame) and f.opcode == Opcode.RUN.value
                               for f in self.sent.feed(data))
        self.most = max(self.most, self.unanswered)
        super().send(data)

    def recv(self, n, timeout):
        data = super().recv(n, timeout)
        self.unanswered -= sum(isinstance(f, Frame) and f.opcode == Opcode.RUN.value | REPLY
                               for f in self.replies.feed(data))
        return data


@pytest.mark.parametrize("window", [1, 2])
def test_stream_window_counts_runs(window):
    """A job of more runs than the window is sent a run at a time: never more than
    ``window`` RUN requests unanswered (a 500-step job would otherwise send all 50 runs'
    inputs at once, more than the board's receive FIFO holds), same results."""
    net, x = small_chunked()
    img = net.image
    assert img.runs > window
    jobs = net.jobs(x)
    kw = {"outputs": img.outputs, "prologue": img.job_memories, "vectors": img.inputs,
          "runs": img.runs, "keep": img.keep}
    with Device.open(f"model:{config_text(net.config)}") as dev:
        dev.load_image(img)
        wide = list(dev.stream(jobs, window=64, **kw))
    counter = RunCounter(net.config)
    with Device(counter) as dev:
        dev.load_image(img)
        narrow = list(dev.stream(jobs, window=window, **kw))
    assert counter.most == window and counter.unanswered == 0
    assert len(narrow) == len(wide) == x.shape[1]          # x is (steps, batch, input)
    assert all(np.array_equal(a, b) for a, b in zip(wide, narrow))


def test_cli_run_and_export(tmp_path):
    net, x = small_chunked()
    net.save(tmp_path / "net.npz")
    np.save(tmp_path / "x.npy", x)
    device = f"model:{config_text(net.config)}"
    assert main(["--device", device, "run", str(tmp_path / "net.npz"), str(tmp_path / "x.npy"),
                 "-o", str(tmp_path / "y.npy"), "--no-progress"]) == 0
    assert np.array_equal(np.load(tmp_path / "y.npy"), net.run(x))
    with pytest.raises(ExportError, match=r"runs its program \d+ times per job"):
        export_image(net.image, tmp_path / "layer.py")
