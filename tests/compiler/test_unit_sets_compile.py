"""The compiler on builds with per-MFU unit sets (issue 36): recurrent layers, whose
chains are laid out for MFUs with every unit, compile where the unit sets place those
chains alike and are refused, naming the layer and the unit sets, where they do not.
(An MLP with softmax on three builds: ``tests/model/test_unit_sets_model.py``.)"""

import re

import numpy as np
import pytest
from rnn_onnx import rnn_onnx

from host.compiler import compile_onnx
from host.compiler.lower import CompileError
from host.spec.config import parse_config


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_recurrent_layers_on_builds_with_unit_sets(op):
    model = rnn_onnx(op, 3, 6, 8, np.random.default_rng(0))
    x = np.random.default_rng(1).normal(0, 1, (3, 1, 6)).astype(np.float32)
    full = compile_onnx(model, parse_config("n=8,tiles=1")).run(x)
    # Every unit in the first MFU: each chain is placed as on the full build.
    net = compile_onnx(model, parse_config("n=8,tiles=1,unit_sets=all/addsub+mul+act"))
    assert np.array_equal(net.run(x), full)
    split = parse_config("n=8,tiles=1,unit_sets=addsub+mul+reduce/addsub+mul+act")
    if op == "GRU":             # its operands land in the same VRFs: it compiles
        assert np.array_equal(compile_onnx(model, split).run(x), full)
        return
    with pytest.raises(CompileError, match=re.escape(
            "node 'rnn0' (LSTM): its chains are laid out for MFUs that build every unit, "
            "and this build's unit sets (addsub+mul+reduce/addsub+mul+act) place them "
            "otherwise: operand 1 (mul.mul(0)) lands in MFU 1 and reads MULVRF1, not "
            "MULVRF0")):
        compile_onnx(model, split)


def test_an_export_of_a_unit_set_build_equals_the_model(tmp_path):
    """The exported NumPy layer of a build without MFU 1's AddSubVrf (its MFU builds no
    ADDSUB) runs as the compiled network, bit for bit."""
    from onnx import TensorProto, helper, numpy_helper

    from host.compiler.export import export_image
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (8, 8)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "b")]
    nodes = [helper.make_node("Gemm", ["x", "W", "b"], ["h"], name="fc", transB=1),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["N", 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    cfg = parse_config("n=8,tiles=1,unit_sets=all/mul+act")
    net = compile_onnx(model, cfg)
    path, _ = export_image(net.image, tmp_path / "layer.py")
    import importlib.util
    spec = importlib.util.spec_from_file_location("unit_sets_layer", path)
    layer = importlib.util.module_from_spec(spec)
    import sys
    sys.modules[spec.name] = layer
    try:
        spec.loader.exec_module(layer)
        x = rng.normal(0, 1, (4, 8)).astype(np.float16)
        out, _ = layer.run(x.view(np.uint16).reshape(4, 1, 8))
    finally:
        del sys.modules[spec.name]
    want = net.run(x.astype(np.float32))
    got = out.view(np.float16).reshape(4, 8).astype(np.float32)
    assert np.array_equal(got, want)
