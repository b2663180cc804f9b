"""The model's fast paths change nothing it reports.

* The same random programs run on a model whose kernels are the definitions
  (``mvm_exact``; ``binary_bits`` / ``binary_events_bits``; ``unary_bits`` /
  ``unary_events``) in place of the fast forms give the same outputs, memories, counters
  and cycle predictions.
* What is shared between models that load the same program (decoded instructions, chains,
  checked plans: ``host.model.core._PROGRAMS``) gives the results, errors and cycles of a
  model that works them out afresh; the timing constants are part of what is shared.
* Gathered weights follow MRF writes: a write drops exactly the products it touches.
"""

import numpy as np
import pytest

from host.compiler.programs import mlp_layer
from host.model import core
from host.model import mfu as model_mfu
from host.model.core import NpuModel, Timing
from host.numerics import fp16, unary
from host.numerics import mvm as M
from host.spec.config import NpuConfig
from host.spec.isa import ErrorCode, Space
from sim.randprog import RANDOM_BUILDS, random_program


def _definition_kernels(monkeypatch):
    def mvm(x, codes_w, qw, *, accumulators=True, prepared=None, **kw):
        return M.mvm_exact(x, codes_w, qw, **kw)

    def binary_counts_bits(op, a, b):
        ev = fp16.binary_events_bits(op, a, b)
        return (fp16.binary_bits(op, a, b), int(ev.overflow.sum()),
                int(ev.nan_created.sum()))

    def unary_counts(op, x, *, ops=None):
        ovf, nanc = unary.unary_events(op, x, ops=ops)
        return unary.unary_bits(op, x, ops=ops), int(ovf.sum()), int(nanc.sum())
    monkeypatch.setattr(core, "mvm", mvm)
    monkeypatch.setattr(model_mfu, "binary_counts_bits", binary_counts_bits)
    monkeypatch.setattr(model_mfu, "unary_counts", unary_counts)


def _state(cfg, prog):
    model = NpuModel(cfg)
    result, out = prog.run(model)
    spaces = [Space.IVRF] + [s for m in range(cfg.mfus)
                             for s in (Space.asvrf(m), Space.mulvrf(m))]
    mems = {s: model.read(s, 0, cfg.ivrf_depth if s is Space.IVRF else cfg.vrf_depth)
            for s in spaces}
    return result, out, mems, model.counters()


@pytest.mark.parametrize("name", list(RANDOM_BUILDS))
def test_random_programs_equal_with_the_definitions(name, monkeypatch):
    cfg = RANDOM_BUILDS[name]
    for seed in range(4):
        prog = random_program(cfg, 7000 + seed, chains=30, specials=0.05)
        fast = _state(cfg, prog)
        with monkeypatch.context() as mp:
            _definition_kernels(mp)
            core._PROGRAMS.clear()
            slow = _state(cfg, prog)
        assert fast[0] == slow[0], (name, seed)
        assert np.array_equal(fast[1], slow[1]), (name, seed)
        for space in fast[2]:
            assert np.array_equal(fast[2][space], slow[2][space]), (name, seed, space)
        assert fast[3] == slow[3], (name, seed)


CFG = NpuConfig(n=8, tiles=2)


def _mlp(seed, batch=3):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((20, 28)) * 0.5).astype(np.float16)
    b = (rng.standard_normal(20) * 0.2).astype(np.float16)
    x = rng.standard_normal((batch, 28)).astype(np.float16)
    return mlp_layer(CFG, w, b, x, activation="sigmoid")


def test_shared_program_caches_give_fresh_results():
    prog = _mlp(1)
    core._PROGRAMS.clear()
    fresh = prog.run(NpuModel(CFG))
    again = prog.run(NpuModel(CFG))                 # everything from the shared caches
    assert fresh[0] == again[0] and np.array_equal(fresh[1], again[1])
    # Another timing shares nothing with the default one.
    slow = Timing(chain_overhead=9, unary_latency=21)
    shared = prog.run(NpuModel(CFG, slow))[0]
    core._PROGRAMS.clear()
    alone = prog.run(NpuModel(CFG, slow))[0]
    assert shared == alone and shared.cycles_predicted > fresh[0].cycles_predicted
    # A timing replaced after the program was loaded.
    model = NpuModel(CFG)
    prog.load(model)
    model.timing = slow
    assert model.run() == alone


def test_queue_errors_from_a_kept_plan():
    prog = _mlp(2)
    core._PROGRAMS.clear()
    ok = prog.run(NpuModel(CFG))[0]
    assert ok.ok
    model = NpuModel(CFG)
    prog.load(model)
    model._inq = model._inq[:1]                     # fewer inputs than the chain pops
    kept = model.run()
    core._PROGRAMS.clear()
    model = NpuModel(CFG)
    prog.load(model)
    model._inq = model._inq[:1]
    alone = model.run()
    assert kept.error is ErrorCode.QUEUE_UNDERFLOW
    assert kept == alone and model.error_message == alone.message


def test_mrf_writes_drop_only_the_products_they_touch():
    rng = np.random.default_rng(4)
    a = (rng.standard_normal((16, 16)) * 0.5).astype(np.float16)
    b = (rng.standard_normal((16, 16)) * 0.5).astype(np.float16)
    model = NpuModel(CFG)
    model.write_weights(0, a)
    model.write_weights(8, b)
    assert set(model._gathered) == {(0, 2, 2, 1), (8, 2, 2, 1)}
    model.write_weights(2, a)                       # slots 2 and 3 only
    assert set(model._gathered) == {(0, 2, 2, 1), (2, 2, 2, 1), (8, 2, 2, 1)}
    model.write(Space.MRF, core.NpuModel(CFG).config.n * CFG.tiles * 9, [0])   # slot 9
    assert set(model._gathered) == {(0, 2, 2, 1), (2, 2, 2, 1)}
    # What is kept is what a fresh gather gives.
    for key, (codes, mant, _) in list(model._gathered.items()):
        model._gathered.pop(key)
        fresh = model._weights(*key)
        assert np.array_equal(codes, fresh[0]) and np.array_equal(mant, fresh[1])
