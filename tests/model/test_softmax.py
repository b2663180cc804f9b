"""Softmax on the MFU model (:mod:`host.model.softmax`): the three chains, and the proven error
bound against a float64 softmax asserted over many random vectors."""

import numpy as np
import pytest

from host.spec.mfu import MfuConfig, allocate
from host.model.mfu import MfuVrfs, run_chain
from host.model.softmax import (
    run_softmax, softmax_bits, softmax_bound, softmax_constants, softmax_ops,
    softmax_reference,
)
from host.spec.ops import UnaryOp
from host.numerics.unary import unary_bits

CFG = MfuConfig(n=16, mfus=2, vrf_depth=32, max_length=8)


def test_chains_use_mfu0_only():
    store, a, b = softmax_ops(3, 7)
    assert store == ()
    for ops in (a, b):
        placed = allocate(ops, 2)
        assert placed[0] == ops and placed[1] == ()
    assert [str(o) for o in a] == ["reduce.max", "addsub.b_sub_a(3)", "act.exp"]
    assert [str(o) for o in b] == ["reduce.sum", "act.recip", "mul.mul(7)"]


def test_run_softmax_is_the_three_chains():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((3, 16)) * 4).astype(np.float16).view(np.uint16)
    vrfs = MfuVrfs(CFG)
    run = run_softmax(CFG, x, 5, vrfs, x_addr=4, e_addr=20)
    assert (vrfs.addsub[0][4:7] == x).all()
    assert (vrfs.mul[0][20:23] == run.a.out).all()
    # Chain A by hand: exp(x - max) over the 2 * 16 + 5 logical elements.
    logical = x.reshape(-1)[:37]
    m = logical.view(np.float16).max()
    d = (x.view(np.float16) - m).view(np.uint16)
    assert (run.a.out == unary_bits("exp", d)).all()
    again = run_chain(CFG, softmax_ops(4, 20)[2], run.a.out, 5, vrfs)
    assert (again.out == run.out).all()


def test_softmax_bits_small_cases():
    one = np.array([0x4500], np.uint16)                                  # 5.0
    assert (softmax_bits(CFG, one) == 0x3C00).all()
    equal = np.full(64, 0xC000, np.uint16)                               # 64 x (-2)
    assert (softmax_bits(CFG, equal).view(np.float16) == np.float16(1 / 64)).all()
    with pytest.raises(ValueError, match="len\\(x_bits\\) must be from 1 to 128, not 129"):
        softmax_bits(CFG, np.zeros(129, np.uint16))
    with pytest.raises(ValueError, match="must include RECIP"):
        run_softmax(MfuConfig(unary_ops=("exp",)), np.zeros((1, 16), np.uint16), 16,
                    MfuVrfs(MfuConfig(unary_ops=("exp",))))


def test_bound_premises():
    """The unit errors the bound uses, measured exhaustively, are at most 1 spacing; exp
    of 0 is exactly 1, so the sum is at least 1."""
    c = softmax_constants()
    assert 0.5 <= c.exp_err <= 1.0 and 0.5 <= c.recip_err <= 1.0
    assert unary_bits(UnaryOp.EXP, np.array([0x0000, 0x8000], np.uint16)).tolist() == \
        [0x3C00, 0x3C00]


def _vectors(rng, count):
    """Random logical vectors of 1..128 elements in several scales, with ties, a single
    dominant element and values near the FP16 limits."""
    for k in range(count):
        size = int(rng.integers(1, CFG.n * CFG.max_length + 1))
        kind = k % 6
        if kind < 4:
            x = rng.standard_normal(size) * [0.25, 2.0, 10.0, 300.0][kind]
        elif kind == 4:
            x = rng.choice([-3.0, 0.0, 1.5], size)                       # many ties
            x[rng.integers(0, size)] = 12.0
        else:
            x = rng.uniform(-65504, 65504, size)
        yield np.clip(x, -65504, 65504).astype(np.float16).view(np.uint16)


def test_bound_holds_on_random_vectors():
    """Over many random vectors the model stays within the bound; the bound is close
    (some element uses most of it), and the measured figures are the ones the
    documentation reports (docs/mfu.md section 8)."""
    rng = np.random.default_rng(2024)
    worst_fraction = worst_abs = worst_rel = 0.0
    for x in _vectors(rng, 3000):
        p_hat = softmax_bits(CFG, x).view(np.float16).astype(np.float64)
        p = softmax_reference(x)
        err = np.abs(p_hat - p)
        bound = softmax_bound(x)
        assert (err <= bound).all(), (x, np.argmax(err / bound))
        worst_fraction = max(worst_fraction, float((err / bound).max()))
        worst_abs = max(worst_abs, float(err.max()))
        normal = p >= 2.0 ** -14
        if normal.any():
            worst_rel = max(worst_rel, float((err[normal] / p[normal]).max()))
    print(f"softmax: largest error / bound {worst_fraction:.3f}, absolute error "
          f"{worst_abs:.3g}, relative error (normal results) {worst_rel / 2**-11:.2f} units "
          f"of 2**-11")
    assert worst_fraction > 0.5           # the bound is not loose by orders of magnitude
    assert worst_abs < 2.0 ** -9          # the documented absolute figure stays true


def test_bound_can_fail():
    """The check is not vacuous: a result off by one FP16 step near 1 breaks it."""
    x = np.array([0x4900, 0x0000], np.uint16)                        # 10, 0
    p_hat = softmax_bits(CFG, x)
    bound = softmax_bound(x)
    p = softmax_reference(x)
    wrong = (p_hat.astype(np.int32) + np.array([-8, 0])).astype(np.uint16)
    assert (np.abs(p_hat.view(np.float16).astype(np.float64) - p) <= bound).all()
    assert not (np.abs(wrong.view(np.float16).astype(np.float64) - p) <= bound).all()


def test_bound_refuses_non_finite():
    with pytest.raises(ValueError, match="finite inputs"):
        softmax_bound(np.array([0x7C00, 0], np.uint16))
