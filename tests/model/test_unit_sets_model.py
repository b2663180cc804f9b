"""The reference model and the compiler on builds with per-MFU unit sets (issue 36):
chains that cannot be placed, the VRFs a unit set leaves out, and the same results as the
full build where the chains fit both."""

import itertools

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from host.compiler.asm import assemble
from host.model.core import NpuError, NpuModel
from host.model.mfu import MfuVrfs, run_chain
from host.spec.config import NpuConfig
from host.spec.isa import ErrorCode, Space, vector_spaces
from host.spec.mfu import MfuConfig, MfuOp, VrfBank
from sim.randprog import random_fp16, random_program

SMALL = {"n": 8, "tiles": 1, "mrf_depth": 64, "max_col_tiles": 8, "ivrf_depth": 64,
         "vrf_depth": 32, "netq_depth": 64, "max_length": 4}
#: REDUCE only in the first MFU, activations only in the last.
SPLIT = NpuConfig(**SMALL, unit_sets="addsub+mul+reduce/addsub+mul+act")
#: The second MFU without ADDSUB: no AddSubVrf 1.
NO_ASVRF1 = NpuConfig(**SMALL, unit_sets="addsub+mul+reduce/mul+act")
FULL = NpuConfig(**SMALL)


def _run(cfg, text, *, fill=True):
    model = NpuModel(cfg)
    if fill:
        rng = np.random.default_rng(1)
        for space in vector_spaces(cfg):
            depth = cfg.ivrf_depth if space is Space.IVRF else cfg.vrf_depth
            model.write(space, 0, random_fp16(rng, (depth, cfg.n)))
    model.load_program(assemble(text))
    return model, model.run()


def test_the_model_refuses_a_chain_that_cannot_be_placed():
    text = "v_rd ivrf, 0\nv_relu\nv_max_reduce\nv_wr ivrf, 8\nend_chain\nend\n"
    _, result = _run(FULL, text)
    assert result.ok
    model, result = _run(SPLIT, text)
    assert result.error is ErrorCode.CHAIN_STRUCTURE and result.pc == 0
    assert "needs unit REDUCE, which is not built in MFU 1" in result.message
    assert model.error is ErrorCode.CHAIN_STRUCTURE
    # The op that moved on took the chain to the last MFU: where it fits, it runs there.
    _, result = _run(SPLIT, "v_rd ivrf, 0\nv_max_reduce\nv_relu\nvv_add 3\n"
                            "v_wr ivrf, 8\nend_chain\nend\n")
    assert result.ok


def test_a_vrf_the_unit_set_leaves_out_is_refused_like_a_missing_mfus():
    cfg = NO_ASVRF1
    model = NpuModel(cfg)
    vec = np.zeros((1, cfg.n), np.uint16)
    for call in (lambda: model.write(Space.ASVRF1, 0, vec),
                 lambda: model.read(Space.ASVRF1, 0, 1),
                 lambda: model.write(Space.ASVRF2, 0, vec)):           # a missing MFU's
        with pytest.raises(NpuError) as e:
            call()
        assert e.value.code is ErrorCode.ILLEGAL_FIELD
        assert "is not a vector memory of this build" in str(e.value)
    model.write(Space.MULVRF1, 0, vec)                                  # the one it has
    assert np.array_equal(model.read(Space.MULVRF1, 0, 1), vec)
    for text, pc in [("v_rd ivrf, 0\nv_wr asvrf1, 0\nend_chain\nend\n", 1),
                     ("v_rd asvrf1, 0\nv_wr ivrf, 0\nend_chain\nend\n", 0)]:
        model, result = _run(cfg, text)
        assert result.error is ErrorCode.ILLEGAL_FIELD and result.pc == pc, result
        assert "ASVRF1 does not exist in this build" in result.message
    # The full build has it.
    assert _run(FULL, "v_rd ivrf, 0\nv_wr asvrf1, 0\nend_chain\nend\n")[1].ok


def test_the_mfu_model_refuses_what_the_unit_sets_leave_out():
    cfg = MfuConfig(n=4, mfus=2, vrf_depth=8, unit_sets="addsub+mul+reduce/mul+act")
    vrfs = MfuVrfs(cfg)
    one = np.full((2, 4), 0x3C00, np.uint16)                            # FP16 1.0
    vrfs.write(1, VrfBank.MUL, 0, one)
    with pytest.raises(ValueError, match="MFU 1 has no ADDSUB VRF: it does not build unit "
                                         "ADDSUB"):
        vrfs.write(1, VrfBank.ADDSUB, 0, one)
    x = np.full((2, 4), 0x4000, np.uint16)                              # 2.0
    ops = [MfuOp.unary("relu"), MfuOp.binary("add", 0)]
    with pytest.raises(ValueError, match="needs unit ADDSUB"):
        run_chain(cfg, ops, x, 4, vrfs)
    out = run_chain(cfg, [MfuOp.unary("relu"), MfuOp.binary("mul", 0)], x, 4, vrfs)
    assert np.array_equal(out.out, x)           # relu(1) * 1 from MulVrf 1
    assert out.overflow == (0, 0)


def _state(cfg, prog, spaces):
    model = NpuModel(cfg)
    result, out = prog.run(model)
    assert result.ok, result
    mems = {s: model.read(s, 0, cfg.ivrf_depth if s is Space.IVRF else cfg.vrf_depth)
            for s in spaces}
    return result, out, mems, model.counters()


def test_random_programs_give_the_full_builds_results_where_they_fit_both():
    """With every unit in the first MFU, a chain that fits the unit sets is placed as on
    the full build: outputs, memories, counters and cycles are the full build's."""
    cfg = NpuConfig(**SMALL, mfus=3, unit_sets="all/addsub+mul+act/mul+act")
    full = NpuConfig(**SMALL, mfus=3)
    spaces = vector_spaces(cfg)
    assert Space.ASVRF2 not in spaces
    chains = 0
    for seed in range(6):
        prog = random_program(cfg, 3600 + seed, chains=30)
        got, want = _state(cfg, prog, spaces), _state(full, prog, spaces)
        assert got[0] == want[0], seed                   # result, cycles predicted
        assert np.array_equal(got[1], want[1]), seed
        for s in spaces:
            assert np.array_equal(got[2][s], want[2][s]), (seed, s)
        assert got[3] == want[3], seed
        chains += got[0].chains
    assert chains > 150


def _mlp_onnx(rng):
    """A small classifier: Gemm, Relu, Gemm, Sigmoid, Gemm, Softmax."""
    sizes = [12, 20, 16, 7]
    nodes, inits, cur = [], [], "x"
    for i, (f_in, f_out) in enumerate(itertools.pairwise(sizes)):
        w = rng.normal(0, 1 / np.sqrt(f_in), (f_out, f_in)).astype(np.float32)
        b = rng.normal(0, 0.2, f_out).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes.append(helper.make_node("Gemm", [cur, f"W{i}", f"b{i}"], [f"h{i}"], transB=1))
        cur = f"h{i}"
        if i < 2:
            nodes.append(helper.make_node(("Relu", "Sigmoid")[i], [cur], [f"a{i}"]))
            cur = f"a{i}"
    nodes.append(helper.make_node("Softmax", [cur], ["y"], axis=-1))
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 7])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_compiled_network_gives_the_same_outputs_on_a_build_with_unit_sets():
    """The compiler places every chain by the build's allocation (the activations and
    softmax's reciprocal in MFU 1, the reductions in MFU 0): the outputs are the full
    build's, bit for bit, and so are the counters summed over the MFUs."""
    from host.compiler import compile_onnx
    from host.compiler.network import config_text
    from host.runtime.device import Device
    rng = np.random.default_rng(36)
    model = _mlp_onnx(rng)
    x = rng.normal(0, 1, (5, 12)).astype(np.float32)
    results, programs = {}, {}
    for cfg in (FULL, SPLIT, NO_ASVRF1):
        net = compile_onnx(model, cfg)
        assert net.image.build() == cfg
        programs[cfg.unit_sets] = net.image.program
        with Device.open(f"model:{config_text(cfg)}") as dev:
            y = net.run(x, dev)
            counters = dev.counters()
        mfu = {k: sum(v for name, v in counters.items() if name.endswith(k))
               for k in ("_overflow", "_nan_created")}
        mvm = {k: v for k, v in counters.items() if not k.startswith("mfu")}
        results[cfg.unit_sets] = (y, mfu, mvm)
    # Softmax's last chain multiplies in MFU 1 on SPLIT (after the reciprocal there), so
    # its operand is in MulVrf 1: another program than the full build's.
    assert not np.array_equal(programs[SPLIT.unit_sets], programs[None])
    y, mfu, mvm = results[None]
    assert np.isfinite(y).all() and np.allclose(y.sum(-1), 1, atol=0.05)
    for sets, (y2, mfu2, mvm2) in results.items():
        assert np.array_equal(y2, y), sets
        assert (mfu2, mvm2) == (mfu, mvm), sets
    # The image records the unit sets; a device of another build refuses it.
    split = compile_onnx(model, SPLIT).image
    with pytest.raises(ValueError, match="the image was built for unit_sets="):
        split.check_config(FULL)
    with pytest.raises(ValueError, match=r"the image was built for unit_sets=None"):
        compile_onnx(model, FULL).image.check_config(SPLIT)
