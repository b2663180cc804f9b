"""What the ONNX compiler tests share: initializers, onnxruntime's float32 reference, the
per-block magnitudes the error bounds are made from, and the checks against a bound.

onnx and onnxruntime come with the ``dev`` extra: imported, not skipped, so a missing one
fails the tests that need it.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import numpy_helper


def init(name, a, dtype=np.float32):
    """An initializer ``name`` holding ``a`` as ``dtype``."""
    return numpy_helper.from_array(np.asarray(a, dtype), name)


def ort_run(model, x):
    """onnxruntime's output of ``model`` on input ``x`` (the first output)."""
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def block_max(a, n):
    """Per element, the largest magnitude of its native block (n lanes of the last axis)."""
    length = a.shape[-1]
    pad = np.pad(np.abs(a), [(0, 0)] * (a.ndim - 1) + [(0, (-length) % n)])
    m = pad.reshape(*a.shape[:-1], -1, n).max(-1)
    return np.repeat(m, n, axis=-1)[..., :length]


def check_within(y, ref, bound, what):
    """Every element of ``y`` within ``bound`` of ``ref``."""
    bad = np.abs(y.astype(np.float64) - ref) > bound + 1e-6
    assert not bad.any(), (f"{what}: {bad.sum()} elements beyond the bound, worst "
                           f"{np.abs(y - ref)[bad].max():.3g} vs bound "
                           f"{bound[bad].min():.3g}")


def check_classes(y, ref, bound, what):
    """The reference's class on every row with a margin the bound cannot close, and on
    at least 90 % of all rows."""
    top2 = np.sort(ref, axis=1)[:, -2:]
    sure = (top2[:, 1] - top2[:, 0]) > 2 * bound.max(axis=1)
    agree = y.argmax(1) == ref.argmax(1)
    assert agree[sure].all(), f"{what}: class differs on a row with a clear margin"
    assert agree.mean() >= 0.9, f"{what}: only {agree.mean():.0%} of rows agree"
