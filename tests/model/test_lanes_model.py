"""The reference model does not depend on ``lanes`` (issue 36 item 1): the same programs on
builds of N = 8 at l = 8, 4 and 2 give the same outputs, memories, counters, error and pc.

The model computes in native vectors whatever the build's lanes (it is the definition
the gateware at every l is compared with), so these are the results a device of any l
must give."""

import numpy as np

from host.compiler.asm import assemble
from host.model.core import NpuModel
from host.spec.config import NpuConfig
from host.spec.isa import Space, vector_spaces
from sim.randprog import random_fp16, random_program

SMALL = {"n": 8, "tiles": 1, "mrf_depth": 64, "max_col_tiles": 8, "ivrf_depth": 64,
         "vrf_depth": 32, "netq_depth": 64, "max_length": 4}
BUILDS = [NpuConfig(**SMALL, lanes=lanes) for lanes in (8, 4, 2)]


def _depth(cfg, space):
    return cfg.ivrf_depth if space is Space.IVRF else cfg.vrf_depth


def _state(model, result, out):
    cfg = model.config
    mems = {s: model.read(s, 0, _depth(cfg, s)) for s in vector_spaces(cfg)}
    return (result.chains, result.instructions, result.error, result.pc, result.message,
            out, mems, model.counters())


def _same(a, b, what):
    assert a[:5] == b[:5], what
    assert np.array_equal(a[5], b[5]), what
    for s in a[6]:
        assert np.array_equal(a[6][s], b[6][s]), (what, s)
    assert a[7] == b[7], what


def test_random_programs_give_the_same_results_at_every_lanes():
    chains = events = 0
    for seed in range(8):
        prog = random_program(BUILDS[0], 3700 + seed, chains=30)
        runs = []
        for cfg in BUILDS:
            model = NpuModel(cfg)
            result, out = prog.run(model)
            assert result.ok, (cfg.lanes, result)
            runs.append(_state(model, result, out))
        for cfg, state in zip(BUILDS[1:], runs[1:]):
            _same(state, runs[0], (seed, cfg.lanes))
        chains += result.chains
        events += sum(v for k, v in runs[0][7].items() if k.startswith("mfu"))
    assert chains > 200 and events > 0, (chains, events)


def test_reductions_and_an_error_give_the_same_results_at_every_lanes():
    """Reductions over lengths 1..max_length with a partial last vector (the order that
    beats must keep), and a program that fails: the same bits, counters, error and pc."""
    text = ("s_wr rows, 27\nv_rd ivrf, 0\nv_max_reduce\nv_wr ivrf, 32\nend_chain\n"
            "s_wr rows, 13\nv_rd ivrf, 4\nv_sum_reduce\nvv_a_sub_b 0\nv_wr asvrf0, 8\n"
            "end_chain\n"
            "s_wr rows, 5\nv_rd ivrf, 8\nv_exp\nv_sum_reduce\nv_wr ivrf, 40\nend_chain\n"
            "s_wr rows, 9\nv_rd ivrf, 63\nv_wr ivrf, 50\nend_chain\nend\n")
    states = []
    for cfg in BUILDS:
        model = NpuModel(cfg)
        rng = np.random.default_rng(36)
        for space in vector_spaces(cfg):
            model.write(space, 0, random_fp16(rng, (_depth(cfg, space), cfg.n), 0.2))
        model.load_program(assemble(text))
        result = model.run()
        states.append(_state(model, result, np.zeros((0, cfg.n), np.uint16)))
    # The last chain reads past the IVRF: every build stops there with the same error.
    assert states[0][2].name == "ADDRESS_RANGE" and states[0][0] == 3, states[0][:5]
    for cfg, state in zip(BUILDS[1:], states[1:]):
        _same(state, states[0], cfg.lanes)
