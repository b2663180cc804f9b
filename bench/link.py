"""Host link throughput: framing plus packing a batch of inputs, and jobs per second.

* Framing + packing: a batch of FP32 inputs (16 MiB) is rounded to FP16 (nearest-even),
  laid out as native vectors and cut into PUSH_INPUT frames (header, CRC-16 header check,
  CRC-32 of each payload), exactly as ``host.runtime.device`` does before sending; MB is 10^6
  bytes of FP32 input. The baseline is a plain ``bytes`` copy of the same array in the
  same process (memory speed on this machine); the ratio says how far the host side of
  the link is from it. The receive side (``FrameDecoder.feed`` over the framed batch) is
  measured too, in MB of frame bytes.
* Jobs per second: an LSTM from ``host.compiler.programs`` (X = 12, H = 10, 3 steps) on the small
  board ``sim.board.SMALL_CONFIG`` (N = 8, T = 1) streamed through the reference model,
  in process and through a pseudo-terminal serial link (the model's execution dominates
  both), and through the simulated board ("simulated board inferences per second":
  ``sim.board.SimTransport``, link and core Verilated at ``-O1``, the cocotb bridge and
  the socket; the build shared with ``tests/hw/test_link_hw.py``, built first if it is not
  cached, which is not timed). Timed from the first job to the last result, after the
  image is loaded.

Best of several runs, ``time.perf_counter``.
"""

import platform
import time

import numpy as np

from bench import best_time, record
from host.spec import protocol as p
BATCH = (16384, 16, 16)          # jobs x vectors x n: 16 MiB of FP32
N = BATCH[2]
REPEATS = 5
LSTM_JOBS = 40
#: Jobs through the simulated board (its simulation runs a few thousand cycles a second).
SIM_JOBS = 20


def frame_inputs(x: np.ndarray) -> list[bytes]:
    """FP32 ``(jobs, k, n)`` to PUSH_INPUT frames, as ``Device.push_input`` sends them."""
    raw = x.astype(np.float16).astype("<f2").tobytes()     # RNE to FP16, little-endian
    width = 2 * x.shape[-1]
    step = p.MAX_PAYLOAD // width * width
    return [p.encode_frame(p.Opcode.PUSH_INPUT, i & 0xFF, raw[s:s + step])
            for i, s in enumerate(range(0, len(raw), step))]


def _lstm_jobs_per_second(kind: str, jobs: int = LSTM_JOBS) -> float:
    from host.compiler.image import program_image
    from host.runtime.device import Device
    from host.model.core import NpuModel
    from host.compiler.programs import lstm_sequence, native
    from host.runtime.server import ProtocolServer, PtyServer
    from host.runtime.transport import ModelTransport, SerialTransport
    from sim.board import SMALL_CONFIG as cfg

    rng = np.random.default_rng(0)
    w = {}
    for g in "fioc":
        w[f"W_{g}"] = (rng.standard_normal((10, 12)) * 0.4).astype(np.float16)
        w[f"U_{g}"] = (rng.standard_normal((10, 10)) * 0.4).astype(np.float16)
        w[f"b_{g}"] = (rng.standard_normal(10) * 0.2).astype(np.float16)
    h0 = c0 = np.zeros(10, np.float16)
    seqs = [native(rng.standard_normal((3, 12)).astype(np.float16), cfg.n)
            for _ in range(jobs)]
    image = program_image(lstm_sequence(cfg, w, seqs[0], h0, c0))
    board = None
    if kind == "model":
        dev = Device(ModelTransport(NpuModel(cfg)))
    elif kind == "pty":
        board = PtyServer(ProtocolServer(NpuModel(cfg))).start()
        dev = Device(SerialTransport(board.port))
    else:
        from sim.board import SimTransport
        dev = Device(SimTransport(cfg, simulator="verilator"), timeout=120.0)
    try:
        dev.load_image(image)
        start = time.perf_counter()
        done = sum(1 for _ in dev.stream(seqs, outputs=image.outputs,
                                         prologue=image.job_memories))
        assert done == jobs
        return jobs / (time.perf_counter() - start)
    finally:
        dev.close()
        if board is not None:
            board.stop()


def run():
    """Host link: framing+packing of a 16 MiB FP32 input batch vs a bytes copy; LSTM jobs/s
    through the model, a pseudo-terminal and the simulated board."""
    x = np.random.default_rng(0).standard_normal(BATCH, dtype=np.float32)
    mb = x.nbytes / 1e6
    common = dict(batch=list(BATCH), max_payload=p.MAX_PAYLOAD, repeats=REPEATS,
                  numpy=np.__version__, python=platform.python_version(),
                  machine=platform.machine())
    t_copy = best_time(lambda: bytes(x.data), REPEATS)
    t_frame = best_time(lambda: frame_inputs(x), REPEATS)
    stream = b"".join(frame_inputs(x))
    t_decode = best_time(lambda: p.FrameDecoder().feed(stream), REPEATS)
    frames = len(p.FrameDecoder().feed(stream))
    lstm = dict(x=12, h=10, steps=3, n=8, tiles=1)
    return [
        record("bytes copy throughput", mb / t_copy, "MB/s", **common),
        record("host link framing+packing throughput", mb / t_frame, "MB/s", frames=frames,
               **common),
        record("host link framing+packing vs bytes copy", t_frame / t_copy, "x",
               ratio="framing+packing time / bytes copy time", **common),
        record("host link frame decoding throughput", len(stream) / 1e6 / t_decode, "MB/s",
               unit_of_mb="frame bytes", frames=frames, **common),
        record("model transport LSTM inferences per second", _lstm_jobs_per_second("model"),
               "jobs/s", jobs=LSTM_JOBS, **lstm),
        record("pty serial transport LSTM inferences per second",
               _lstm_jobs_per_second("pty"), "jobs/s", jobs=LSTM_JOBS, **lstm),
        record("simulated board inferences per second",
               _lstm_jobs_per_second("sim", SIM_JOBS), "jobs/s", jobs=SIM_JOBS,
               simulator="verilator", opt="-O1", network="LSTM", **lstm),
    ]
