"""The MFU pipeline model (:mod:`host.spec.mfu`): configuration, ops, the allocation rule, the
chain encoding, chains against a direct composition of the element functions, VRF
addressing and the counters."""

import itertools

import numpy as np
import pytest

from host.spec.ops import BinaryOp
from host.numerics.fp16 import binary_bits, binary_events_bits
from host.spec.mfu import (
    UNITS, MfuConfig, MfuOp, MfuUnit, VrfBank, allocate, chain_layout, decode_chain, encode_chain, mfu_layout, vrf_write_layout,
)
from host.model.mfu import MfuCounters, MfuVrfs, run_chain
from host.spec.ops import ReduceOp
from host.numerics.reduction import reduce_bits
from host.spec.ops import UnaryOp
from host.numerics.unary import unary_bits, unary_events

CFG = MfuConfig(n=4, mfus=2, vrf_depth=12, max_length=8)


# --- configuration and ops ------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(n=2), ValueError, "n must be from 4 to 64, not 2"),
    (dict(n=12), ValueError, "n must be a power of two, not 12"),
    (dict(n=128), ValueError, "n must be from 4 to 64, not 128"),
    (dict(n=4.0), TypeError, "n must be an integer, not 4.0"),
    (dict(mfus=1), ValueError, "mfus must be from 2 to 4, not 1"),
    (dict(mfus=5), ValueError, "mfus must be from 2 to 4, not 5"),
    (dict(vrf_depth=0), ValueError, "vrf_depth must be from 1 to 4096, not 0"),
    (dict(vrf_depth=4097), ValueError, "vrf_depth must be from 1 to 4096, not 4097"),
    (dict(max_length=0), ValueError, "max_length must be from 1 to 256, not 0"),
    (dict(max_length=6), ValueError, "max_length must be a power of two, not 6"),
    (dict(max_length=512), ValueError, "max_length must be from 1 to 256, not 512"),
    (dict(counter_bits=0), ValueError, "counter_bits must be from 1 to 64, not 0"),
    (dict(counter_bits=65), ValueError, "counter_bits must be from 1 to 64, not 65"),
    (dict(counter_bits=True), TypeError, "counter_bits must be an integer, not True"),
    (dict(unary_ops=()), ValueError, "unary_ops must name at least one unary op"),
    (dict(unary_ops=("exp", "sqrt")), ValueError, "op must be a UnaryOp or one of"),
    (dict(unary_ops="exp"), TypeError, "ops must be a collection of UnaryOp, not 'exp'"),
])
def test_config_errors(kwargs, exc, message):
    with pytest.raises(exc, match=message):
        MfuConfig(**kwargs)


def test_config_derived():
    cfg = MfuConfig(n=16, mfus=3, vrf_depth=12, max_length=8,
                    unary_ops=["exp", UnaryOp.RELU], counter_bits=5)
    assert cfg.unary_ops == (UnaryOp.RELU, UnaryOp.EXP)
    assert (cfg.addr_bits, cfg.length_bits, cfg.lanes_bits, cfg.mfu_bits) == (4, 4, 5, 2)
    assert cfg.counter_max == 31
    one = MfuConfig(vrf_depth=1, max_length=1, mfus=2)
    assert (one.addr_bits, one.length_bits, one.mfu_bits) == (1, 1, 1)
    assert MfuConfig().unary_ops == tuple(UnaryOp)


def test_op_constructors():
    assert MfuOp.binary("add", 3) == MfuOp(MfuUnit.ADDSUB, BinaryOp.ADD, 3)
    assert MfuOp.binary(BinaryOp.MUL, 0) == MfuOp(MfuUnit.MUL, BinaryOp.MUL, 0)
    assert MfuOp.binary("max", 1).unit is MfuUnit.ADDSUB
    assert MfuOp.unary("exp") == MfuOp(MfuUnit.ACT, UnaryOp.EXP)
    assert MfuOp.unary(4).op is UnaryOp.RECIP
    assert MfuOp.reduce("sum") == MfuOp(MfuUnit.REDUCE, ReduceOp.SUM)
    assert str(MfuOp.binary("b_sub_a", 5)) == "addsub.b_sub_a(5)"
    assert str(MfuOp.reduce("max")) == "reduce.max"


@pytest.mark.parametrize("make, exc, message", [
    (lambda: MfuOp.binary("add", -1), ValueError, "addr must be at least 0, not -1"),
    (lambda: MfuOp.binary("add", None), TypeError, "addr must be an integer, not None"),
    (lambda: MfuOp.binary("div", 0), ValueError, "op must be a BinaryOp or one of"),
    (lambda: MfuOp.unary("sqrt"), ValueError, "op must be a UnaryOp or one of"),
    (lambda: MfuOp.reduce("min"), ValueError, "op must be a ReduceOp or one of"),
    (lambda: MfuOp(MfuUnit.MUL, BinaryOp.ADD, 0), ValueError,
     "op of unit MUL must be BinaryOp.MUL"),
    (lambda: MfuOp(MfuUnit.ADDSUB, BinaryOp.MUL, 0), ValueError,
     "op of unit ADDSUB must not be BinaryOp.MUL"),
    (lambda: MfuOp(MfuUnit.ACT, BinaryOp.ADD), TypeError,
     "op of unit ACT must be a UnaryOp"),
    (lambda: MfuOp(MfuUnit.ACT, UnaryOp.EXP, 3), ValueError,
     "addr must be None for unit ACT, not 3"),
    (lambda: MfuOp(2, UnaryOp.EXP), TypeError, "unit must be an MfuUnit, not 2"),
])
def test_op_errors(make, exc, message):
    with pytest.raises(exc, match=message):
        make()


def test_vrf_bank_numbering():
    assert [b.unit for b in VrfBank] == [MfuUnit.ADDSUB, MfuUnit.MUL]
    assert UNITS == 4 and [u.value for u in MfuUnit] == [0, 1, 2, 3]


# --- allocation --------------------------------------------------------------------------------

A, M, X, R = (MfuOp.binary("add", 0), MfuOp.binary("mul", 0), MfuOp.unary("relu"),
              MfuOp.reduce("max"))


def test_allocate_examples():
    assert allocate([], 2) == ((), ())
    assert allocate([R, A, X], 2) == ((R, A, X), ())
    # Any order within an MFU; a repeated unit moves on.
    assert allocate([X, M, A, R, X], 2) == ((X, M, A, R), (X,))
    assert allocate([A, A], 2) == ((A,), (A,))
    # An op never goes back to an earlier MFU, even where its unit is free there.
    assert allocate([A, X, A, M], 2) == ((A, X), (A, M))
    assert allocate([A, A, A], 3) == ((A,), (A,), (A,))


def test_allocate_errors():
    with pytest.raises(ValueError, match=r"op 2 \(addsub.add\(0\)\) needs unit ADDSUB after "
                                         r"MFU 1, the last of 2 MFUs"):
        allocate([A, A, A], 2)
    with pytest.raises(ValueError, match=r"op 4 \(act.relu\) needs unit ACT"):
        allocate([X, M, X, A, X], 2)
    with pytest.raises(TypeError, match="ops must be a sequence of MfuOp, not a single"):
        allocate(A, 2)
    with pytest.raises(TypeError, match=r"ops\[1\] must be an MfuOp, not 'exp'"):
        allocate([A, "exp"], 2)


def _partitionable(units, mfus):
    """Independent rule: some split of the sequence into at most ``mfus`` consecutive
    groups has no unit twice within a group."""
    n = len(units)
    for cuts in range(min(mfus, max(n, 1))):
        for points in itertools.combinations(range(1, n), cuts):
            bounds = (0, *points, n)
            if all(len(set(units[a:b])) == b - a for a, b in zip(bounds, bounds[1:])):
                return True
    return n == 0


def test_allocate_is_greedy_and_legal_iff_partitionable():
    rng = np.random.default_rng(3)
    pool = [A, M, X, R]
    for _ in range(3000):
        ops = [pool[i] for i in rng.integers(0, 4, int(rng.integers(0, 10)))]
        mfus = int(rng.integers(1, 5))
        try:
            placed = allocate(ops, mfus)
        except ValueError:
            assert not _partitionable([o.unit for o in ops], mfus), ops
            continue
        assert _partitionable([o.unit for o in ops], mfus)
        assert [o for p in placed for o in p] == ops
        for m, group in enumerate(placed):
            assert len({o.unit for o in group}) == len(group)
            # A group starts only because the previous one already had its first unit.
            if m and group:
                assert group[0].unit in {o.unit for o in placed[m - 1]}


# --- encoding ----------------------------------------------------------------------------------

def test_layout_sizes_and_positions():
    cfg = CFG                             # addr_bits 4, length_bits 4, lanes_bits 3
    per_mfu = UNITS * 3 + 3 + 4 + 4 + 3 + 1
    assert mfu_layout(cfg).size == per_mfu == 27
    assert chain_layout(cfg).size == 2 * per_mfu + 4 + 3
    ops = [MfuOp.reduce("sum"), MfuOp.binary("b_sub_a", 5), MfuOp.unary("exp"),
           MfuOp.binary("mul", 9)]
    word = encode_chain(cfg, ops, 3, 2)
    # Written out by hand from the documented field order (docs/mfu.md section 4).
    mfu0 = (3 | 1 << 2) | (0 | 1 << 2) << 3 | (2 | 1 << 2) << 6 | (1 | 1 << 2) << 9
    mfu0 |= 2 << 12 | 5 << 15 | 9 << 19 | 3 << 23 | 1 << 26
    mfu1 = 0                              # nothing used, every field 0
    expected = mfu0 | mfu1 << per_mfu | 3 << 2 * per_mfu | 2 << (2 * per_mfu + 4)
    assert word == expected


def test_encode_decode_roundtrip():
    rng = np.random.default_rng(5)
    cfg = MfuConfig(n=8, mfus=3, vrf_depth=40, max_length=16)
    for _ in range(500):
        length = int(rng.integers(1, 17))
        ops = []
        for _ in range(int(rng.integers(0, 9))):
            unit = int(rng.integers(0, 4))
            addr = int(rng.integers(0, cfg.vrf_depth - length + 1))
            ops.append([MfuOp.binary(BinaryOp(int(rng.choice([0, 1, 2, 4]))), addr),
                        MfuOp.binary("mul", addr),
                        MfuOp.unary(UnaryOp(int(rng.integers(0, 6)))),
                        MfuOp.reduce(ReduceOp(int(rng.integers(0, 2))))][unit])
        try:
            allocate(ops, cfg.mfus)
        except ValueError:
            continue
        lanes_last = int(rng.integers(1, 9))
        word = encode_chain(cfg, ops, length, lanes_last)
        assert 0 <= word < 1 << chain_layout(cfg).size
        assert decode_chain(cfg, word) == (tuple(ops), length, lanes_last)


def test_encode_errors():
    with pytest.raises(ValueError, match="length must be from 1 to 8, not 9"):
        encode_chain(CFG, [], 9, 1)
    with pytest.raises(ValueError, match="lanes_last must be from 1 to 4, not 0"):
        encode_chain(CFG, [], 1, 0)
    with pytest.raises(ValueError, match=r"addsub.add\(10\) on MFU 0: addr \+ L = 10 \+ 3 "
                                         r"must be at most vrf_depth 12"):
        encode_chain(CFG, [MfuOp.binary("add", 10)], 3, 1)
    with pytest.raises(ValueError, match="needs unit ACT after MFU 1"):
        encode_chain(CFG, [X, X, X], 1, 1)
    with pytest.raises(TypeError, match="cfg must be an MfuConfig"):
        encode_chain(None, [], 1, 1)


def test_decode_errors():
    layout = mfu_layout(CFG)
    chain = chain_layout(CFG)

    def word(slots, length=1, lanes_last=1, **fields):
        entry = {"order": [{"unit": u, "used": used} for u, used in slots], **fields}
        return chain.const({"mfu": [entry, {}], "length": length,
                            "lanes_last": lanes_last}).as_value().value

    used = [(MfuUnit.ACT, 1), (MfuUnit.ADDSUB, 0), (MfuUnit.MUL, 1), (MfuUnit.ADDSUB, 0)]
    with pytest.raises(ValueError, match="MFU 0: used slot after unused slot 1"):
        decode_chain(CFG, word(used))
    twice = [(MfuUnit.ACT, 1), (MfuUnit.ACT, 1), (MfuUnit.ADDSUB, 0), (MfuUnit.ADDSUB, 0)]
    with pytest.raises(ValueError, match="MFU 0: unit ACT in two slots"):
        decode_chain(CFG, word(twice))
    with pytest.raises(ValueError, match="length must be from 1 to 8, not 0"):
        decode_chain(CFG, word([(MfuUnit.ACT, 0)] * 4, length=0))
    # An undefined BinaryOp code (5) in a used ADDSUB slot.
    add = word([(MfuUnit.ADDSUB, 1)] + [(MfuUnit.ADDSUB, 0)] * 3)
    offset = dict((name, f.offset) for name, f in layout)["addsub_op"]
    with pytest.raises(ValueError, match="MFU 0, unit ADDSUB: 5 is not a valid BinaryOp"):
        decode_chain(CFG, add | (5 << offset))


def test_vrf_write_layout():
    fields = {name: (f.offset, f.width) for name, f in vrf_write_layout(CFG)}
    assert fields == {"mfu": (0, 1), "bank": (1, 1), "addr": (2, 4), "values": (6, 64)}
    # In beats (lanes < n): a beat address (vector address * beats + beat), l lanes.
    beats = MfuConfig(n=16, lanes=4, mfus=3, vrf_depth=12, max_length=8)
    fields = {name: (f.offset, f.width) for name, f in vrf_write_layout(beats)}
    assert fields == {"mfu": (0, 2), "bank": (2, 1), "addr": (3, 4 + 2), "values": (9, 64)}


# --- chains ------------------------------------------------------------------------------------

def _values(rng, shape):
    """Random FP16 patterns with many specials and values large enough to overflow."""
    x = rng.integers(0, 1 << 16, shape).astype(np.uint16)
    specials = np.array([0, 0x8000, 1, 0x3FF, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00,
                         0x7D00, 0x3C00, 0x7A00], np.uint16)
    return np.where(rng.random(shape) < 0.3, rng.choice(specials, shape), x)


def _direct(cfg, ops, x, lanes_last, vrfs):
    """The chain recomputed element by element from the element functions: native vector
    by native vector for the element-wise ops, the logical vector for reductions."""
    placed = allocate(ops, cfg.mfus)
    mfu_of = [m for m, group in enumerate(placed) for _ in group]
    ovf, nan = [0] * cfg.mfus, [0] * cfg.mfus
    x = x.copy()
    for op, m in zip(ops, mfu_of):
        if op.unit is MfuUnit.REDUCE:
            logical = x.reshape(-1)[:(len(x) - 1) * cfg.n + lanes_last]
            r = reduce_bits(op.op, logical)
            x = np.full_like(x, r.value)
            ovf[m] += r.overflow
            nan[m] += r.nan_created
            continue
        for j in range(len(x)):
            if op.unit is MfuUnit.ACT:
                o, c = unary_events(op.op, x[j], ops=cfg.unary_ops)
                x[j] = unary_bits(op.op, x[j], ops=cfg.unary_ops)
            else:
                vrf = vrfs.addsub[m] if op.unit is MfuUnit.ADDSUB else vrfs.mul[m]
                b = vrf[op.addr + j]
                o, c = binary_events_bits(op.op, x[j], b)
                x[j] = binary_bits(op.op, x[j], b)
            ovf[m] += int(o.sum())
            nan[m] += int(c.sum())
    return x, tuple(ovf), tuple(nan)


def _random_ops(rng, cfg, length):
    while True:
        ops = []
        for _ in range(int(rng.integers(0, 9))):
            addr = int(rng.integers(0, cfg.vrf_depth - length + 1))
            ops.append([MfuOp.binary(BinaryOp(int(rng.choice([0, 1, 2, 4]))), addr),
                        MfuOp.binary("mul", addr),
                        MfuOp.unary(UnaryOp(int(rng.integers(0, 6)))),
                        MfuOp.reduce(ReduceOp(int(rng.integers(0, 2))))]
                       [int(rng.integers(0, 4))])
        try:
            allocate(ops, cfg.mfus)
            return ops
        except ValueError:
            pass


@pytest.mark.parametrize("cfg", [CFG, MfuConfig(n=8, mfus=3, vrf_depth=20, max_length=4,
                                                 unary_ops=("exp", "relu"))])
def test_chains_against_direct_composition(cfg):
    rng = np.random.default_rng(11)
    vrfs = MfuVrfs(cfg)
    for m in range(cfg.mfus):
        vrfs.addsub[m][:] = _values(rng, (cfg.vrf_depth, cfg.n))
        vrfs.mul[m][:] = _values(rng, (cfg.vrf_depth, cfg.n))
    events = 0
    for _ in range(300):
        length = int(rng.integers(1, cfg.max_length + 1))
        ops = _random_ops(rng, cfg, length)
        x = _values(rng, (length, cfg.n))
        lanes_last = int(rng.integers(1, cfg.n + 1))
        result = run_chain(cfg, ops, x, lanes_last, vrfs)
        out, ovf, nan = _direct(cfg, ops, x, lanes_last, vrfs)
        assert (result.out == out).all() and result.out.dtype == np.uint16
        assert (result.overflow, result.nan_created) == (ovf, nan)
        events += sum(ovf) + sum(nan)
    assert events > 0


def test_vrf_addressing():
    """Native vector j meets VRF address addr + j, of the MFU the op is placed on."""
    cfg = CFG
    vrfs = MfuVrfs(cfg)
    for m in range(cfg.mfus):
        for bank in VrfBank:
            # Distinct exact values: 1024 * m + 512 * bank + 4 * address + lane (+1).
            vals = (np.arange(cfg.vrf_depth * cfg.n).reshape(cfg.vrf_depth, cfg.n) + 1
                    + 1024 * m + 512 * bank.value).astype(np.float16)
            vrfs.write(m, bank, 0, vals.view(np.uint16))
    minus_zero = np.full((3, cfg.n), 0x8000, np.uint16)        # x + (-0) = x exactly
    out = run_chain(cfg, [MfuOp.binary("add", 4)], minus_zero, cfg.n, vrfs).out
    assert (out == vrfs.addsub[0][4:7]).all()
    # A second ADDSUB op lands on MFU 1 and reads that MFU's AddSubVrf.
    out = run_chain(cfg, [MfuOp.binary("add", 2), MfuOp.binary("a_sub_b", 5)], minus_zero,
                    cfg.n, vrfs).out
    expect = binary_bits("a_sub_b", vrfs.addsub[0][2:5], vrfs.addsub[1][5:8])
    assert (out == expect).all()
    one = np.full((2, cfg.n), 0x3C00, np.uint16)
    out = run_chain(cfg, [MfuOp.binary("mul", 10)], one, cfg.n, vrfs).out
    assert (out == vrfs.mul[0][10:12]).all()
    # b_sub_a is vrf - x.
    out = run_chain(cfg, [MfuOp.binary("b_sub_a", 0)], one, cfg.n, vrfs).out
    assert (out.view(np.float16) == vrfs.addsub[0][0:2].view(np.float16) - 1).all()


def test_chain_errors():
    vrfs = MfuVrfs(CFG)
    x = np.zeros((3, 4), np.uint16)
    with pytest.raises(ValueError, match=r"mul\(10\) on MFU 0: addr \+ L = 10 \+ 3 must be "
                                         r"at most vrf_depth 12"):
        run_chain(CFG, [MfuOp.binary("mul", 10)], x, 4, vrfs)
    with pytest.raises(ValueError, match=r"x_bits must have shape \(L, 4\) with L 1 to 8, "
                                         r"not \(9, 4\)"):
        run_chain(CFG, [], np.zeros((9, 4), np.uint16), 4, vrfs)
    with pytest.raises(ValueError, match=r"not \(3, 5\)"):
        run_chain(CFG, [], np.zeros((3, 5), np.uint16), 4, vrfs)
    with pytest.raises(TypeError, match="x_bits must be a uint16 array"):
        run_chain(CFG, [], x.astype(np.int32), 4, vrfs)
    with pytest.raises(ValueError, match="lanes_last must be from 1 to 4, not 5"):
        run_chain(CFG, [], x, 5, vrfs)
    with pytest.raises(TypeError, match="vrfs must be the MfuVrfs of this cfg"):
        run_chain(CFG, [], x, 4, MfuVrfs(MfuConfig(n=4, vrf_depth=13)))
    with pytest.raises(ValueError, match="needs unit REDUCE after MFU 1"):
        run_chain(CFG, [R, R, R], x, 4, vrfs)
    with pytest.raises(ValueError, match=r"addr \+ 3 vectors must be at most vrf_depth 12, "
                                         r"not 13"):
        vrfs.write(0, VrfBank.MUL, 10, x)
    with pytest.raises(ValueError, match="mfu must be from 0 to 1, not 2"):
        vrfs.write(2, VrfBank.MUL, 0, x)


def test_lanes_last_only_for_reductions():
    cfg = CFG
    vrfs = MfuVrfs(cfg)
    x = np.array([[0x3C00, 0x4000, 0x4200, 0x7BFF]], np.uint16)     # 1, 2, 3, 65504
    sums = [run_chain(cfg, [MfuOp.reduce("sum")], x, k, vrfs).out[0, 0] for k in (1, 2, 3)]
    assert sums == [0x3C00, 0x4200, 0x4600]                          # 1, 3, 6
    out = run_chain(cfg, [MfuOp.unary("relu")], x, 1, vrfs).out
    assert (out == x).all()                                          # every lane computed


def test_counters_per_mfu_and_saturation():
    cfg = MfuConfig(n=4, mfus=2, vrf_depth=4, max_length=2, counter_bits=3)
    vrfs = MfuVrfs(cfg)
    vrfs.write(0, VrfBank.MUL, 0, np.full((2, 4), 0x7BFF, np.uint16))
    vrfs.write(1, VrfBank.MUL, 0, np.full((2, 4), 0x7C00, np.uint16))
    big = np.full((1, 4), 0x7BFF, np.uint16)
    # MFU 0: 65504 * 65504 overflows on 4 lanes; MFU 1: inf * inf is no event.
    result = run_chain(cfg, [MfuOp.binary("mul", 0), MfuOp.binary("mul", 0)], big, 4, vrfs)
    assert result.overflow == (4, 0) and result.nan_created == (0, 0)
    zero = np.zeros((1, 4), np.uint16)
    # MFU 1 only: relu(0) = 0 on MFU 0... then 0 * inf on MFU 1 creates 4 NaNs.
    result2 = run_chain(cfg, [MfuOp.unary("relu"), MfuOp.unary("pass"),
                              MfuOp.binary("mul", 0)], zero, 4, vrfs)
    assert result2.overflow == (0, 0) and result2.nan_created == (0, 4)
    counters = MfuCounters(cfg)
    counters.add(result)
    assert counters.overflow == (4, 0)
    counters.add(result)
    assert counters.overflow == (7, 0)                   # 8 saturates at 2**3 - 1
    counters.add(result2)
    counters.add(result2)
    assert counters.nan_created == (0, 7)
    counters.clear()
    assert counters.overflow == counters.nan_created == (0, 0)


def test_reduction_events_counted():
    cfg = CFG
    x = np.full((2, 4), 0x7BFF, np.uint16)                           # 8 x 65504
    result = run_chain(cfg, [MfuOp.unary("pass"), MfuOp.reduce("sum")], x, 4, MfuVrfs(cfg))
    assert result.out[0, 0] == 0x7C00
    # The tree of 8 leaves overflows at its 4 first-level nodes; later ones add infs.
    assert result.overflow == (4, 0)
