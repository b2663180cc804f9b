"""Host BFP throughput: quantize+pack and unpack+dequantize of a 64 MiB FP32 tensor.

Everything is measured in one process on one array, best of several runs
(``time.perf_counter``), next to a plain ``numpy.copy`` of the same array, so that the
ratio says how far the host packer is from memory speed on this machine (reported both
ways: time / copy time, and its inverse, the fraction of copy speed reached). MB is 10^6
bytes of FP32 data (input of quantize, output of dequantize).

``quantize``, ``pack`` and ``unpack`` run the compiled C kernel when it builds
(``bfp.kernel()``, in each record's config as ``kernel``); quantize+pack is also timed on
the NumPy path (``NPU_HOST_KERNEL=numpy``) in the same run, so that the two can be
compared.
"""

import contextlib
import os
import platform

import numpy as np

from bench import best_time, record
from host.numerics import _ckernel, bfp

SHAPE = (4096, 4096)            # 64 MiB of float32
BLOCK_SIZE = 16
MANTISSA_BITS = (4, 8)
REPEATS = 5


@contextlib.contextmanager
def _kernel(name):
    """Run the block with ``NPU_HOST_KERNEL`` set to ``name``."""
    saved = os.environ.get(_ckernel.ENV_KERNEL)
    os.environ[_ckernel.ENV_KERNEL] = name
    try:
        yield
    finally:
        if saved is None:
            del os.environ[_ckernel.ENV_KERNEL]
        else:
            os.environ[_ckernel.ENV_KERNEL] = saved


def run():
    """Host quantize+pack and unpack+dequantize throughput vs numpy.copy (64 MiB FP32)."""
    x = np.random.default_rng(0).standard_normal(SHAPE, dtype=np.float32)
    mb = x.nbytes / 1e6
    kernel = bfp.kernel()
    common = {"shape": list(SHAPE), "dtype": "float32", "block_size": BLOCK_SIZE,
              "repeats": REPEATS, "numpy": np.__version__,
              "python": platform.python_version(), "machine": platform.machine(),
              "kernel": kernel.name}

    t_copy = best_time(lambda: np.copy(x), REPEATS)
    records = [record("numpy.copy throughput", mb / t_copy, "MB/s",
                      **{k: v for k, v in common.items()
                         if k not in ("block_size", "kernel")})]
    for m in MANTISSA_BITS:
        cfg = dict(common, mantissa_bits=m, rounding="nearest-even")
        t = bfp.quantize(x, BLOCK_SIZE, m)
        packed = bfp.pack(t)
        t_q = best_time(lambda m=m: bfp.quantize(x, BLOCK_SIZE, m), REPEATS)
        t_p = best_time(lambda t=t: bfp.pack(t), REPEATS)
        t_qp = best_time(lambda m=m: bfp.pack(bfp.quantize(x, BLOCK_SIZE, m)), REPEATS)
        t_u = best_time(lambda m=m, p=packed: bfp.unpack(p, SHAPE, BLOCK_SIZE, m), REPEATS)
        t_ud = best_time(lambda m=m, p=packed: bfp.unpack(p, SHAPE, BLOCK_SIZE, m).dequantize(),
                         REPEATS)
        with _kernel("numpy"):
            t_qp_np = best_time(lambda m=m: bfp.pack(bfp.quantize(x, BLOCK_SIZE, m)), REPEATS)
        cfg_np = dict(cfg, kernel="numpy")
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
            record("host quantize+pack throughput on the NumPy path", mb / t_qp_np, "MB/s",
                   **cfg_np),
            record("host quantize+pack speed relative to numpy.copy on the NumPy path",
                   t_copy / t_qp_np, "x",
                   ratio="numpy.copy time / quantize+pack time (1 = memory speed)", **cfg_np),
            record("host quantize+pack speedup of the compiled kernel over the NumPy path",
                   t_qp_np / t_qp, "x",
                   ratio=f"NumPy path time / {kernel.name} kernel time", **cfg),
        ]
    return records
