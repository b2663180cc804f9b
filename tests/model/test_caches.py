"""What NpuModel keeps between runs (decoded instructions, gathered weights) never outlives
the program or the weights it came from: a rewrite of either gives the results of a fresh
model."""

import numpy as np

from host.compiler.programs import mlp_layer
from host.model import NpuModel
from host.spec.config import NpuConfig
from host.spec.isa import Space

CFG = NpuConfig(n=8, tiles=2)


def _case(seed):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((12, 20)) * 0.5).astype(np.float16)
    b = (rng.standard_normal(12) * 0.2).astype(np.float16)
    x = rng.standard_normal((2, 20)).astype(np.float16)
    return mlp_layer(CFG, w, b, x)


def _fresh(program):
    return program.run(NpuModel(CFG))[1]


def test_new_weights_in_the_same_slots_are_used():
    first, second = _case(1), _case(2)
    model = NpuModel(CFG)
    assert np.array_equal(first.run(model)[1], _fresh(first))
    # The same program and slots, other weights written through each MRF write path.
    for slot, matrix in second.matrices:
        model.write_weights(slot, matrix)
    for space, addr, data in second.vectors:
        model.write(space, addr, data)
    model.push_input(second.inputs)
    model.run()
    assert np.array_equal(model.pop_output(second.outputs), _fresh(second))
    # Raw MRF words: write back the first case's words.
    scratch = NpuModel(CFG)
    first.load(scratch)
    words = scratch.read(Space.MRF, 0, CFG.mrf_words)
    model.write(Space.MRF, 0, words)
    for space, addr, data in first.vectors:
        model.write(space, addr, data)
    model.push_input(first.inputs)
    model.run()
    assert np.array_equal(model.pop_output(first.outputs), _fresh(first))


def test_a_new_program_is_decoded_anew():
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((12, 20)) * 0.5).astype(np.float16)
    b = (rng.standard_normal(12) * 0.2).astype(np.float16)
    x = rng.standard_normal((2, 20)).astype(np.float16)
    relu, sigmoid = mlp_layer(CFG, w, b, x), mlp_layer(CFG, w, b, x, activation="sigmoid")
    model = NpuModel(CFG)
    assert np.array_equal(relu.run(model)[1], _fresh(relu))
    out = sigmoid.run(model)[1]              # same length, other unary op in the program
    assert np.array_equal(out, _fresh(sigmoid)) and not np.array_equal(out, _fresh(relu))
