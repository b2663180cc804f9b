"""Host BFP throughput: quantize+pack and unpack+dequantize of a 64 MiB FP32 tensor.

Everything is measured in one process on one array, best of several runs
(``time.perf_counter``), next to a plain ``numpy.copy`` of the same array, so that the
ratio says how far the host packer is from memory speed on this machine (reported both
ways: time / copy time, and its inverse, the fraction of copy speed reached). MB is 10^6
bytes of FP32 data (input of quantize, output of dequantize).
"""

import platform

import numpy as np

from bench import best_time, record
from host.numerics import bfp
SHAPE = (4096, 4096)            # 64 MiB of float32
BLOCK_SIZE = 16
MANTISSA_BITS = (4, 8)
REPEATS = 5


def run():
    """Host quantize+pack and unpack+dequantize throughput vs numpy.copy (64 MiB FP32)."""
    x = np.random.default_rng(0).standard_normal(SHAPE, dtype=np.float32)
    mb = x.nbytes / 1e6
    common = dict(shape=list(SHAPE), dtype="float32", block_size=BLOCK_SIZE,
                  repeats=REPEATS, numpy=np.__version__, python=platform.python_version(),
                  machine=platform.machine())

    t_copy = best_time(lambda: np.copy(x), REPEATS)
    records = [record("numpy.copy throughput", mb / t_copy, "MB/s",
                      **{k: v for k, v in common.items() if k != "block_size"})]
    for m in MANTISSA_BITS:
        cfg = dict(common, mantissa_bits=m, rounding="nearest-even")
        t_q = best_time(lambda: bfp.quantize(x, BLOCK_SIZE, m), REPEATS)
        t = bfp.quantize(x, BLOCK_SIZE, m)
        t_p = best_time(lambda: bfp.pack(t), REPEATS)
        t_qp = best_time(lambda: bfp.pack(bfp.quantize(x, BLOCK_SIZE, m)), REPEATS)
        packed = bfp.pack(t)
        t_u = best_time(lambda: bfp.unpack(packed, SHAPE, BLOCK_SIZE, m), REPEATS)
        t_ud = best_time(lambda: bfp.unpack(packed, SHAPE, BLOCK_SIZE, m).dequantize(),
                         REPEATS)
        records += [
            record("host quantize+pack throughput", mb / t_qp, "MB/s", **cfg),
            record("host quantize+pack vs numpy.copy", t_qp / t_copy, "x",
                   ratio="quantize+pack time / numpy.copy time", **cfg),
            record("host quantize+pack speed relative to numpy.copy", t_copy / t_qp, "x",
                   ratio="numpy.copy time / quantize+pack time (1 = memory speed)", **cfg),
            record("host quantize throughput", mb / t_q, "MB/s", **cfg),
            record("host pack throughput", mb / t_p, "MB/s (FP32 equivalent)", **cfg),
            record("host unpack+dequantize throughput", mb / t_ud, "MB/s", **cfg),
            record("host unpack+dequantize vs numpy.copy", t_ud / t_copy, "x",
                   ratio="unpack+dequantize time / numpy.copy time", **cfg),
            record("host unpack throughput", mb / t_u, "MB/s (FP32 equivalent)", **cfg),
        ]
    return records
