"""One compiled network, three devices, the same bits: the reference model, the network's
NumPy export (run in an interpreter that cannot import the project) and the simulated
board (link and core under Verilator; marked ``sim``). Issue 33's must-show; the network
has a residual join, so the DAG lowering's two-consumer tensors are on the board too.

The board is ``sim.board.SMALL_CONFIG``, the build ``tests/hw/test_link_hw.py`` and the
device tests use, so its Verilator model is built once for all of them.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx_checks import make_model

from host.compiler.export import export_image
from host.compiler.network import compile_onnx, config_text
from host.runtime.device import Device
from sim.board import SMALL_CONFIG
from tests.compiler.test_export import _run_isolated

ROWS = 6


def _residual_mlp(rng):
    """x(12) -> fc1(8) -> relu -> fc2(8) -> add(relu) -> fc3(5)."""
    w = {"W1": rng.normal(0, 0.4, (8, 12)), "b1": rng.normal(0, 0.1, 8),
         "W2": rng.normal(0, 0.4, (8, 8)), "b2": rng.normal(0, 0.1, 8),
         "W3": rng.normal(0, 0.4, (5, 8)), "b3": rng.normal(0, 0.1, 5)}
    nodes = [helper.make_node("Gemm", ["x", "W1", "b1"], ["h1"], "fc1", transB=1),
             helper.make_node("Relu", ["h1"], ["r1"], "relu1"),
             helper.make_node("Gemm", ["r1", "W2", "b2"], ["h2"], "fc2", transB=1),
             helper.make_node("Add", ["h2", "r1"], ["s"], "residual"),
             helper.make_node("Gemm", ["s", "W3", "b3"], ["y"], "fc3", transB=1)]
    inits = [numpy_helper.from_array(a.astype(np.float32), k) for k, a in w.items()]
    return make_model(nodes, inits, ["N", 12], "y", ["N", 5])


def pytest_generate_tests(metafunc):
    if "board" in metafunc.fixturenames:
        kinds = ["model", "export"]
        if metafunc.config.getoption("--sim") in ("all", "verilator"):
            kinds.append(pytest.param("sim", marks=pytest.mark.sim))
        metafunc.parametrize("board", kinds)


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(12)
    net = compile_onnx(_residual_mlp(rng), config_text(SMALL_CONFIG))
    x = rng.normal(0, 1, (ROWS, 12)).astype(np.float32)
    dev = Device.open(f"model:{config_text(SMALL_CONFIG)}")
    try:
        want = _stream(dev, net, x)
    finally:
        dev.close()
    return net, x, want


def _stream(dev, net, x):
    dev.load_image(net.image)
    dev.clear_counters()
    out = list(dev.stream(net.jobs(x), outputs=net.image.outputs,
                          prologue=net.image.job_memories, vectors=net.image.inputs))
    return np.array(out, np.uint16), dev.counters()


def test_compiled_network_gives_the_same_bits_everywhere(case, board, tmp_path):
    net, x, (want, want_counters) = case
    if board == "model":                      # the API's own path, bit for bit
        got = net.run(x)
        from host.compiler.network import signature_outputs
        assert np.array_equal(got.view(np.uint32),
                              signature_outputs(want, net.signature).view(np.uint32))
        return
    if board == "export":
        py, _ = export_image(net.image, tmp_path / "layer.py")
        out, counters = _run_isolated(tmp_path, {"net": {
            "py": str(py), "inputs": np.asarray(net.jobs(x), np.uint16)}})["net"]
    else:
        from sim.board import SimTransport
        dev = Device(SimTransport(SMALL_CONFIG, simulator="verilator"), timeout=300.0)
        try:
            out, counters = _stream(dev, net, x)
        finally:
            dev.close()
    assert np.array_equal(np.asarray(out, np.uint16), want)
    assert counters == want_counters
