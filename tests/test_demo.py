"""``make demo`` (``bench/demo.py``) and the zoo bench (``bench/zoo.py``) on a tiny zoo made
here: two seeds of a 12 -> 8 -> 4 MLP classifier built with ``onnx.helper``, laid out as
the real zoo (``<name>/seed<k>/model.onnx``, ``data.npz``, ``meta.json``).

The table, the sweep and the records need no matplotlib; the plots do (the ``demo`` extra,
which make venv installs).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bench import demo, zoo
from host.compiler import compile_onnx


def _tiny_model(rng):
    w0 = rng.normal(0, 0.5, (8, 12)).astype(np.float32)
    b0 = rng.normal(0, 0.1, 8).astype(np.float32)
    w1 = rng.normal(0, 0.5, (4, 8)).astype(np.float32)
    b1 = rng.normal(0, 0.1, 4).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in
             ((w0, "W0"), (b0, "b0"), (w1, "W1"), (b1, "b1"),
              (np.array([-1, 12], np.int64), "shape"))]
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "W0", "b0"], ["h"], name="fc0", transB=1),
             helper.make_node("Relu", ["h"], ["a"], name="relu"),
             helper.make_node("Gemm", ["a", "W1", "b1"], ["y"], name="fc1", transB=1)]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), \
        (w0, b0, w1, b1)


@pytest.fixture(scope="module")
def tiny_zoo(tmp_path_factory):
    """``<root>/tiny/seed0`` and ``seed1``: labels are the FP32 model's classes with every
    fifth one changed, so FP32 accuracy is 80 %."""
    root = tmp_path_factory.mktemp("zoo")
    for seed in (0, 1):
        rng = np.random.default_rng(seed)
        model, (w0, b0, w1, b1) = _tiny_model(rng)
        d = root / "tiny" / f"seed{seed}"
        d.mkdir(parents=True)
        onnx.save(model, d / "model.onnx")
        x = rng.normal(0, 1, (40, 3, 4)).astype(np.float32)
        logits = np.maximum(x.reshape(40, 12) @ w0.T + b0, 0) @ w1.T + b1
        y = logits.argmax(1)
        y[::5] = (y[::5] + 1) % 4
        np.savez(d / "data.npz", x_test=x, y_test=y.astype(np.int64), x_calib=x[:8],
                 idx_test=np.arange(40))
        (d / "meta.json").write_text(json.dumps({"name": "tiny", "task": "a test",
                                                 "fp32_accuracy": 0.8}))
    return root


def test_entries_and_run_batch(tiny_zoo):
    entries = zoo.zoo_entries(0, ("tiny", "absent"), tiny_zoo)
    assert [(e.name, e.seed) for e in entries] == [("tiny", 0)]
    e = entries[0]
    ref = zoo.predictions(zoo.fp32_outputs(e.onnx, e.x_test))
    assert zoo.accuracy(ref, e.y_test) == 80.0
    net = compile_onnx(e.onnx, zoo.BUILD_8BIT)
    fast = zoo.run_batch(net, e.x_test, check_rows=4)
    assert np.array_equal(fast.view(np.uint32), net.run(e.x_test).view(np.uint32))


def test_demo_rows_table_and_sweep(tiny_zoo):
    entry = zoo.zoo_entries(0, ("tiny",), tiny_zoo)[0]
    row = demo.evaluate_entry(entry, calibrated=False)
    assert "error" not in row
    assert row["fp32"] == 80.0 and row["bit8_agreement"] == 100.0
    net = compile_onnx(entry.onnx)
    assert row["cycles"] == net.report()["per_job"]["cycles_predicted"]
    # per layer: the two Gemms, their cycles adding up to one inference's
    assert [lay[:3] for lay in row["layers"]] == [("fc0", "Gemm", 96), ("fc1", "Gemm", 32)]
    assert sum(lay[3] for lay in row["layers"]) == row["cycles"]
    bad = {"model": "broken", "samples": 3, "fp32": 50.0, "error": "OnnxImportError: Conv"}
    table = demo.format_table([row, bad])
    lines = table.splitlines()
    assert lines[0].split()[:2] == ["model", "test"] and "MVM utilization" in lines[0]
    assert lines[2].split()[:3] == ["tiny", "40", "80.0"]
    assert "broken" in lines[3] and "does not compile" in lines[3]
    assert "broken: OnnxImportError: Conv" in table
    assert "NPU calibrated" in demo.format_table([row], calibrated=True)

    sweep = demo.mantissa_sweep(entry, bits=(3, 8), samples=20)
    assert sweep["samples"] == 20 and sweep["bits"] == [3, 8] and len(sweep["max"]) == 2
    text = demo.sweep_table([sweep])
    assert text.splitlines()[0].split() == ["model", "rows", "FP32", "3", "bits", "8", "bits"]
    assert text.splitlines()[1].split()[:2] == ["tiny", "20"]


def test_demo_main_needs_zoo_models(tmp_path, capsys):
    code = demo.main(["--zoo", str(tmp_path), "--out", str(tmp_path), "--no-sim"])
    assert code == 1
    assert f"no zoo models under {tmp_path}" in capsys.readouterr().err


def test_demo_main_on_a_zoo_named_like_the_real_one(tiny_zoo, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(zoo, "NAMES", ("tiny",))
    code = demo.main(["--zoo", str(tiny_zoo), "--out", str(tmp_path), "--no-sim",
                      "--sweep-samples", "10"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "tiny" in out and "1 of 1 models compiled" in out and "skipped (--no-sim)" in out
    saved = json.loads((tmp_path / "demo.json").read_text())
    assert saved["rows"][0]["model"] == "tiny" and saved["sweeps"][0]["samples"] == 10


def test_zoo_bench_records(tiny_zoo, monkeypatch):
    records = zoo.run(root=tiny_zoo, names=("tiny",), seeds=(0, 1))
    by = {r["name"]: r for r in records}
    fp32 = by["zoo tiny accuracy, FP32 (onnxruntime)"]
    assert fp32["value"] == 80.0 and fp32["unit"] == "%"
    assert fp32["config"]["per_seed"] == [80.0, 80.0] and fp32["config"]["std"] == 0.0
    assert fp32["config"]["seeds"] == [0, 1] and fp32["config"]["test_samples"] == 40
    for name in ("accuracy, NPU 8-bit mantissas", "accuracy, NPU default build",
                 "agreement with FP32 class, NPU 8-bit mantissas",
                 "agreement with FP32 class, NPU default build",
                 "accuracy change, NPU 8-bit mantissas minus FP32",
                 "cycles per inference, default build", "MVM utilization, default build"):
        assert f"zoo tiny {name}" in by, name
    change = by["zoo tiny accuracy change, NPU 8-bit mantissas minus FP32"]["config"]
    assert change["within_half_point_by_agreement"] == (change["pooled_agreement"] >= 99.5)
    assert change["within_half_point_by_accuracy"] == all(
        abs(d) <= 0.5 for d in change["per_seed"])
    assert change["lowest_agreement"] <= change["pooled_agreement"]
    monkeypatch.setattr(zoo, "NAMES", ("tiny",))
    table = zoo.markdown_table(records).splitlines()
    assert table[0].startswith("| model | seeds x test rows | FP32 (onnxruntime) |")
    assert table[2].startswith("| tiny | 2 x 40 | 80.0 ± 0.0 |")


def test_plots(tiny_zoo, tmp_path):
    import matplotlib  # noqa: F401  (the demo extra, which make venv installs)
    entry = zoo.zoo_entries(0, ("tiny",), tiny_zoo)[0]
    row = demo.evaluate_entry(entry, calibrated=False)
    sweep = demo.mantissa_sweep(entry, bits=(3, 4), samples=10)
    for path in (demo.plot_accuracy([sweep], tmp_path / "a.png"),
                 demo.plot_utilization([row], tmp_path / "u.png")):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sim_check_picks_the_smallest_model_and_compares_bits(tiny_zoo):
    """:func:`bench.demo.sim_check` with the reference model of the simulated board's build
    standing in for the board (the board itself runs in ``make demo``)."""
    from host.compiler.network import config_text
    from host.runtime.device import Device
    from sim.board import SMALL_CONFIG
    entries = zoo.zoo_entries(0, ("tiny",), tiny_zoo) + zoo.zoo_entries(1, ("tiny",), tiny_zoo)
    device = f"model:{config_text(SMALL_CONFIG)}"
    with Device.open(device) as dev:
        got = demo.sim_check(entries, device, SMALL_CONFIG, 3, dev=dev)
    assert got["model"] == "tiny" and got["samples"] == 3 and got["equal"] is True
    assert got["labels"] == entries[0].y_test[:3].tolist()
