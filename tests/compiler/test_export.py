"""Exported layers (``host.compiler.export``, ``npu export``) against the reference model.

Every exported module runs in a fresh interpreter in which the project's packages cannot
be imported (``python -I -S`` with only NumPy's directory on ``sys.path``; the runner
checks that ``import host`` fails). One interpreter runs every module of the test session
(``_run_isolated``). Each job's outputs are compared with a fresh ``NpuModel`` run of
that job (or, for images whose jobs share state, with one model streaming the jobs as
``Device.stream`` does), and the counters with the sum over the jobs, saturated.

Programs: every network of ``host.compiler.programs`` on two builds, and random programs
of ``sim.randprog`` on three builds (N = 4/8/16, T = 1/2, mantissa widths 4/6/8, 2 or 3
MFUs, one with 8-bit counters so that saturation happens). ``make test`` runs
``EXPORT_PROGRAMS`` = 36 random programs by default; set the environment variable
``NPU_EXPORT_PROGRAMS=1000`` for the issue's thousand.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from host.cli import main
from host.compiler import programs as P
from host.compiler.export import ExportError, bundle_source, export_image
from host.compiler.image import program_image
from host.model.core import NpuModel
from host.spec.config import NpuConfig
from host.spec.counters import counter_names
from host.spec.isa import Space
from sim.randprog import random_fp16, random_program

EXPORT_PROGRAMS = int(os.environ.get("NPU_EXPORT_PROGRAMS", "36"))
JOBS = 3

BUILDER_CONFIGS = {
    "n8t1": NpuConfig(n=8, tiles=1, mrf_depth=512, max_col_tiles=32, ivrf_depth=512,
                      vrf_depth=256, netq_depth=256, max_length=8),
    "n16t2": NpuConfig(n=16, tiles=2, mrf_depth=256, max_col_tiles=32, ivrf_depth=512,
                       vrf_depth=256, netq_depth=256, max_length=4),
}

RANDOM_CONFIGS = {
    "n4t1m4": NpuConfig(n=4, tiles=1, mantissa_bits_v=4, mantissa_bits_w=4, mrf_depth=128,
                        max_col_tiles=8, counter_bits=8, ivrf_depth=32, vrf_depth=32,
                        netq_depth=64, max_length=4, mfus=2),
    "n8t2m6": NpuConfig(n=8, tiles=2, mantissa_bits_v=6, mantissa_bits_w=8, mrf_depth=128,
                        max_col_tiles=8, ivrf_depth=32, vrf_depth=32, netq_depth=64,
                        max_length=4, mfus=3),
    "n16t2m8": NpuConfig(n=16, tiles=2, mantissa_bits_v=8, mantissa_bits_w=6,
                         mrf_depth=64, max_col_tiles=8, ivrf_depth=32, vrf_depth=32,
                         netq_depth=64, max_length=4, mfus=2,
                         unary_ops=("relu", "sigmoid", "tanh", "exp")),
}

RUNNER = textwrap.dedent('''
    import importlib.util, json, sys
    sys.path.append(sys.argv[2])                 # NumPy's directory, nothing of the project
    try:
        import host
    except ImportError:
        pass
    else:
        sys.exit("the project's packages are importable: " + host.__file__)
    import numpy as np
    for k, (module, inputs, result) in enumerate(json.load(open(sys.argv[1]))):
        name = f"exported_{k}"
        spec = importlib.util.spec_from_file_location(name, module)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        out, counters = mod.run(np.load(inputs))
        np.savez(result, outputs=out, counters=json.dumps(counters))
        del sys.modules[name]
    mods = [m for m in sys.modules if m == "host" or m.startswith(("host.", "sim.", "amaranth"))]
    if mods:
        sys.exit(f"project modules were imported: {mods}")
''')


def _numpy_dir() -> str:
    return os.path.dirname(os.path.dirname(np.__file__))


def _run_isolated(tmp, cases):
    """Run every case's exported module on its inputs in one fresh interpreter without
    the project; returns ``{name: (outputs, counters)}``."""
    work = tmp / "runner"
    work.mkdir(exist_ok=True)
    jobs = []
    for name, case in cases.items():
        np.save(work / f"{name}.in.npy", case["inputs"])
        jobs.append((case["py"], str(work / f"{name}.in.npy"), str(work / f"{name}.out.npz")))
    (work / "jobs.json").write_text(json.dumps(jobs))
    (work / "runner.py").write_text(RUNNER)
    proc = subprocess.run([sys.executable, "-I", "-S", str(work / "runner.py"),
                           str(work / "jobs.json"), _numpy_dir()], cwd=work,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {}
    for name, (_, _, out) in zip(cases, jobs):
        with np.load(out) as f:
            results[name] = (f["outputs"], json.loads(str(f["counters"])))
    return results


def _reference(image, config, inputs, sequential):
    """Outputs ``(jobs, outputs, n)`` and summed, saturated counters of the model: a fresh
    model per job, or one model streaming the jobs (``job_memories`` before each)."""
    outs, total = [], dict.fromkeys(counter_names(config), 0)
    model = None
    for x in inputs:
        if model is None or not sequential:
            model = NpuModel(config)
            for space, addr, data in image.memories:
                model.write(space, addr, data)
            model.load_program(image.program)
        else:
            model.clear_counters()
        for space, addr, data in image.job_memories:
            model.write(space, addr, data)
        if len(x):
            model.push_input(x)
        result = model.run()
        assert result.ok, result
        outs.append(model.pop_output(image.outputs))
        for name, value in model.counters().items():
            total[name] += value
    top = (1 << config.counter_bits) - 1
    return np.array(outs, np.uint16), {k: min(top, v) for k, v in total.items()}


def _compare(case, got):
    outputs, counters = got
    want_out, want_counters = case["want"]
    assert outputs.dtype == np.uint16 and outputs.shape == want_out.shape
    for j in range(len(want_out)):
        assert np.array_equal(outputs[j], want_out[j]), f"job {j} differs"
    assert list(counters) == list(want_counters)
    assert counters == want_counters


def _rand(rng, *shape, scale=0.5):
    return (rng.standard_normal(shape) * scale).astype(np.float16)


def _builder_programs(cfg):
    rng = np.random.default_rng(7)
    lstm = {**{f"W_{g}": _rand(rng, 19, 13) for g in "fioc"},
            **{f"U_{g}": _rand(rng, 19, 19) for g in "fioc"},
            **{f"b_{g}": _rand(rng, 19) for g in "fioc"}}
    gru = {**{f"W_{k}": _rand(rng, 10, 21) for k in "zrn"},
           **{f"U_{k}": _rand(rng, 10, 10) for k in "zrn"},
           **{f"b_{k}": _rand(rng, 10) for k in ("z", "r", "n", "hn")}}
    return {
        "mlp": P.mlp_layer(cfg, _rand(rng, 21, 37), _rand(rng, 21), _rand(rng, 3, 37), "relu"),
        "lstm_seq": P.lstm_sequence(cfg, lstm, _rand(rng, 3, 13), _rand(rng, 19),
                                    _rand(rng, 19)),
        "lstm_step": P.lstm_step(cfg, lstm, _rand(rng, 13), _rand(rng, 19), _rand(rng, 19)),
        "gru": P.gru_step(cfg, gru, _rand(rng, 21), _rand(rng, 10)),
        "conv1x1": P.conv1x1(cfg, _rand(rng, 11, 6), _rand(rng, 11), _rand(rng, 3, 5, 6)),
        "conv2d_k3s1": P.conv2d(cfg, _rand(rng, 7, 5, 3, 3), _rand(rng, 7),
                                _rand(rng, 6, 6, 5), stride=1),
        "conv2d_k2s2": P.conv2d(cfg, _rand(rng, 7, 5, 2, 2), _rand(rng, 7),
                                _rand(rng, 6, 7, 5), stride=2),
        "softmax": P.softmax_head(cfg, _rand(rng, 23, 9, scale=1.0), _rand(rng, 23),
                                  _rand(rng, 9)),
    }


def _job_inputs(rng, image, config, specials):
    x = random_fp16(rng, (JOBS, image.inputs, config.n), specials)
    return x


def _add_case(cases, tmp, name, image, config, rng, specials=0.02, sequential=None):
    start = time.perf_counter()
    py, npz = export_image(image, tmp / "layers" / f"{name}.py", config=config)
    seconds = time.perf_counter() - start
    seq = "SEQUENTIAL = True" in Path(py).read_text()
    if sequential is not None:
        assert seq is sequential, name
    inputs = _job_inputs(rng, image, config, specials)
    cases[name] = {"py": py, "npz": npz, "inputs": inputs, "config": config,
                   "image": image, "sequential": seq, "export_seconds": seconds,
                   "want": _reference(image, config, inputs, seq)}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Every case exported, its reference computed, and all run in one isolated
    interpreter: ``(cases, results, timings)``."""
    tmp = tmp_path_factory.mktemp("export")
    (tmp / "layers").mkdir()
    rng = np.random.default_rng(2026)
    cases = {}
    for cname, cfg in BUILDER_CONFIGS.items():
        for pname, prog in _builder_programs(cfg).items():
            _add_case(cases, tmp, f"{pname}_{cname}", program_image(prog), cfg, rng,
                      sequential=False)
    # The LSTM with its state in `memories` (written once): every job continues from
    # the h and c the previous one left, so the jobs must run in order.
    cfg = BUILDER_CONFIGS["n8t1"]
    prog = _builder_programs(cfg)["lstm_seq"]
    _add_case(cases, tmp, "lstm_seq_carried_n8t1", program_image(prog, per_job_vectors=False),
              cfg, rng, sequential=True)
    per_config = -(-EXPORT_PROGRAMS // len(RANDOM_CONFIGS))
    for cname, cfg in RANDOM_CONFIGS.items():
        for seed in range(per_config):
            prog = random_program(cfg, seed, chains=8)
            # every fourth: the random memory image written once (jobs may then share
            # state, which the export must detect)
            image = program_image(prog, per_job_vectors=seed % 4 != 3)
            if seed % 8 == 7:          # and now and then the InitialVrf rewritten per job
                image.job_memories = [m for m in image.memories if m[0] is Space.IVRF]
                image.memories = [m for m in image.memories if m[0] is not Space.IVRF]
            _add_case(cases, tmp, f"rand_{cname}_{seed}", image, cfg, rng, specials=0.05)
    start = time.perf_counter()
    results = _run_isolated(tmp, cases)
    run_seconds = time.perf_counter() - start
    return cases, results, {"run_seconds": run_seconds}


def test_every_exported_layer_equals_the_model(exported):
    cases, results, timings = exported
    for name, case in cases.items():
        _compare(case, results[name])
    export = [c["export_seconds"] for c in cases.values()]
    print(f"\n{len(cases)} layers: export {sum(export):.2f} s in all (max {max(export):.2f}"
          f" s), isolated run {timings['run_seconds']:.2f} s")


def test_random_programs_cover_both_modes_and_saturation(exported):
    cases, _, _ = exported
    rand = {k: c for k, c in cases.items() if k.startswith("rand_")}
    assert len(rand) >= EXPORT_PROGRAMS
    seq = [c for c in rand.values() if c["sequential"]]
    assert seq and len(seq) < len(rand)
    # Sharing state matters in some of them: a fresh model per job would differ.
    differs = 0
    for case in seq:
        fresh = _reference(case["image"], case["config"], case["inputs"], False)
        differs += not np.array_equal(fresh[0], case["want"][0])
    assert differs
    top = (1 << RANDOM_CONFIGS["n4t1m4"].counter_bits) - 1
    assert any(top in c["want"][1].values() for k, c in rand.items() if "n4t1m4" in k)


def test_a_wrong_output_or_counter_is_caught(exported):
    cases, results, _ = exported
    name = "mlp_n8t1"
    outputs, counters = results[name]
    _compare(cases[name], (outputs, counters))
    bad = outputs.copy()
    bad[1, 0, 0] ^= 1
    with pytest.raises(AssertionError, match="job 1"):
        _compare(cases[name], (bad, counters))
    wrong = dict(counters, vector_saturations=counters["vector_saturations"] + 1)
    with pytest.raises(AssertionError):
        _compare(cases[name], (outputs, wrong))


def test_a_changed_kernel_is_caught(tmp_path):
    """An exported module whose kernel code differs from the model's (here: the MVM's
    vector mantissa width off by one) fails the comparison: the test can fail."""
    cfg = BUILDER_CONFIGS["n8t1"]
    image = program_image(_builder_programs(cfg)["mlp"])
    py, _ = export_image(image, tmp_path / "layer.py")
    text = Path(py).read_text()
    assert f"MANTISSA_BITS_V = {cfg.mantissa_bits_v}\n" in text
    Path(py).write_text(text.replace(f"MANTISSA_BITS_V = {cfg.mantissa_bits_v}\n",
                                     f"MANTISSA_BITS_V = {cfg.mantissa_bits_v + 1}\n"))
    rng = np.random.default_rng(3)
    inputs = _job_inputs(rng, image, cfg, 0.0)
    case = {"py": py, "inputs": inputs, "want": _reference(image, cfg, inputs, False)}
    got = _run_isolated(tmp_path, {"changed": case})["changed"]
    with pytest.raises(AssertionError):
        _compare(case, got)


def test_module_is_readable_and_self_describing(exported):
    cases, _, _ = exported
    case = cases["lstm_seq_n16t2"]
    text = Path(case["py"]).read_text()
    assert text.startswith('"""')
    for field in ("n = 16", "tiles = 2", "mantissa_bits_v", "mantissa_bits_w", "mrf_depth",
                  "counter_bits", "mfus", "vrf_depth", "netq_depth", "max_length",
                  "unary_ops"):
        assert field in text.split('"""')[1], field
    assert "from __future__ import annotations" in text
    imports = {line.split()[1] for line in text.splitlines()
               if line.startswith(("import ", "from "))}
    assert imports <= {"__future__", "numpy", "os", "enum", "numbers", "typing",
                       "dataclasses", "math", "threading"}, imports
    assert "def chain_00_" in text and "_mv_mul_slot" in text and "sigm" in text
    assert "def mvm_mvm(" in text and "def unary__evaluate(" in text \
        and "def fp16__evaluate(" in text
    assert os.path.exists(case["npz"])
    assert os.path.splitext(case["npz"])[0] == os.path.splitext(case["py"])[0]


def test_bundle_has_each_definition_once():
    source, data, names = bundle_source()
    defs = [line.split("(")[0].split(":")[0] for line in source.splitlines()
            if line.startswith(("def ", "class "))]
    assert len(defs) == len(set(defs))
    assert set(names.values()) <= {d.split()[1] for d in defs}
    assert any(k.startswith("rom/") for k in data)


def test_export_refuses_jobs_that_leave_inputs(tmp_path):
    cfg = BUILDER_CONFIGS["n8t1"]
    image = program_image(_builder_programs(cfg)["mlp"])
    image.inputs += 1                      # one vector more than a job pops
    with pytest.raises(ExportError, match="input vectors"):
        export_image(image, tmp_path / "layer.py")


def test_cli_export(tmp_path, capsys):
    cfg = BUILDER_CONFIGS["n8t1"]
    image = program_image(_builder_programs(cfg)["gru"])
    image.save(tmp_path / "net.npz")
    assert main(["export", str(tmp_path / "net.npz"), "-o", str(tmp_path / "gru.py")]) == 0
    assert (tmp_path / "gru.py").exists() and (tmp_path / "gru.npz").exists()
    assert "wrote" in capsys.readouterr().out
    (tmp_path / "bad.npz").write_text("not an image")
    assert main(["export", str(tmp_path / "bad.npz"), "-o", str(tmp_path / "x.py")]) == 2
    assert "cannot load image" in capsys.readouterr().err
    assert not (tmp_path / "x.py").exists()
    assert main(["export", str(tmp_path / "net.npz")]) == 2          # no -o


def test_lstm_gate_products_share_one_product(tmp_path):
    """The gates' products of one input are grouped (one quantization, one matrix product
    for a batch of at least 8 jobs) and the layer still equals the model."""
    cfg = BUILDER_CONFIGS["n16t2"]
    image = program_image(_builder_programs(cfg)["lstm_seq"])
    py, _ = export_image(image, tmp_path / "lstm.py", config=cfg)
    text = Path(py).read_text()
    assert text.count(", group=(") >= 8
    rng = np.random.default_rng(4)
    inputs = _job_inputs(rng, image, cfg, 0.0)
    inputs = np.concatenate([inputs] + [_job_inputs(rng, image, cfg, 0.01) for _ in range(4)])
    assert len(inputs) >= 8
    case = {"py": py, "inputs": inputs, "want": _reference(image, cfg, inputs, False)}
    got = _run_isolated(tmp_path, {"lstm": case})["lstm"]
    _compare(case, got)


def test_a_kept_group_result_needs_an_equal_input(tmp_path):
    """A group member whose input differs from the one the group's product was made from
    (a chain in between rewrote it) runs its own product: never a stale result."""
    import ast
    import importlib.util
    import re

    cfg = BUILDER_CONFIGS["n16t2"]
    image = program_image(_builder_programs(cfg)["lstm_seq"])
    py, _ = export_image(image, tmp_path / "lstm_g.py", config=cfg)
    call = re.search(r"_product\(x, '[^']+', (pix=\d+), (lanes_cols=\d+).*?"
                     r"group=(\([^)]*\))\)", Path(py).read_text())
    group = ast.literal_eval(call.group(3))
    pix, lanes = int(call.group(1)[4:]), int(call.group(2)[11:])
    spec = importlib.util.spec_from_file_location("lstm_g_layer", py)
    layer = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = layer             # its dataclasses look themselves up there
    try:
        spec.loader.exec_module(layer)
    finally:
        del sys.modules[spec.name]
    rng = np.random.default_rng(8)
    width = layer.WEIGHTS[group[0]][1].shape[1]
    xs = [random_fp16(rng, (12, width // cfg.n, cfg.n), 0.0) for _ in range(2)]
    kw = {"pix": pix, "lanes_cols": lanes, "rounding": 0, "static_exponent_code": None,
              "narrow_width": 64, "group": group}

    def alone(x, key):
        x = x.copy()
        if lanes < cfg.n:
            x[:, pix - 1::pix, lanes:] = 0
        codes, qw = layer.WEIGHTS[key]
        return layer.mvm_mvm(x.reshape(len(x), -1), codes, qw, n=cfg.n,
                             mantissa_bits_v=cfg.mantissa_bits_v,
                             mantissa_bits_w=cfg.mantissa_bits_w,
                             accumulators=False).out_bits

    counts = dict.fromkeys(layer.COUNTERS, 0)
    for x, key in ((xs[0], group[0]), (xs[1], group[1]), (xs[1], group[2]),
                   (xs[0], group[2])):
        got = layer._product(x.copy(), key, counts=counts, **kw)
        assert np.array_equal(got.reshape(len(x), -1), alone(x, key)), key
    # What a run keeps is its thread's: a group's product in one thread leaves its kept
    # results there, none in another thread's run.
    import threading
    layer._run_cache("grouped").clear()
    seen = {}

    def worker():
        layer._product(xs[0].copy(), group[0], counts=dict(counts), **kw)
        seen["kept"] = set(layer._run_cache("grouped"))

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen["kept"] == set(group) - {group[0]} and not layer._run_cache("grouped")
