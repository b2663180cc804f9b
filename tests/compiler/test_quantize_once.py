"""Quantize once (seed 001; ``docs/compiler.md``, "Quantize once"): the gate products that
consume the same vector with the same quantizer settings are stacked into one product.

Compiled with and without it (``attrs["quantize_once"] = False`` on the node), the same
recurrent networks must give the same output bits and the same counters except the
vector quantizer's, fewer predicted cycles, and vector-quantizer events divided by the
number of fused consumers: each ``x`` and ``h`` is quantized once per stacked product
instead of once per gate. The events expected are counted here independently, by
quantizing the job's inputs and the every-step outputs with ``host.numerics.mvm``.
"""

from __future__ import annotations

import numpy as np
import pytest
from rnn_onnx import rnn_onnx

from host.compiler import programs as P
from host.compiler.network import compile_graph, config_text
from host.compiler.onnx_import import import_onnx
from host.numerics.mvm import quantize_fp16
from host.runtime.device import Device
from host.spec.config import parse_config

BUILD = "n=8,tiles=1"              # the default mantissas (4 bits): the quantizer saturates
QUANTIZER = ("vector_saturations", "vector_nonfinite")


def compiled(model, build, fuse=True):
    graph = import_onnx(model)
    for node in graph.nodes:
        if node.op in ("LSTM", "GRU"):
            node.attrs["quantize_once"] = fuse
    return compile_graph(graph, build)


def run_jobs(net, x):
    """Raw output vectors of every job (uint16 ``(batch, K, n)``) and the counters."""
    jobs = net.jobs(x)
    with Device.open(f"model:{config_text(net.config)}") as dev:
        dev.load_image(net.image)
        dev.clear_counters()
        out = np.stack(list(dev.stream(jobs, outputs=net.image.outputs,
                                       prologue=net.image.job_memories,
                                       vectors=net.image.inputs, runs=net.image.runs,
                                       keep=net.image.keep)))
        return out, dev.counters()


def events(vectors, n, m, length):
    """Vector-quantizer events of quantizing each logical vector of ``vectors`` (uint16
    native vectors ``(..., k, n)``) as the MVM does: lanes past ``length`` zeroed."""
    v = np.array(vectors, np.uint16).reshape(-1, n)
    lanes = np.arange(v.shape[0] * n).reshape(-1, n) % (-(-length // n) * n)
    v[lanes >= length] = 0
    q = quantize_fp16(v, m)
    return int(q.saturated.sum() + q.nonfinite.sum())


def conversions(groups):
    """``(x, h)``: how often a step quantizes ``x`` and ``h`` under ``groups`` (GRU's n
    with ``linear_before_reset = 0`` reads ``r * h``, not ``h``)."""
    return len(groups[0]), len(groups[1])


@pytest.mark.parametrize("op,lbr", [("LSTM", 1), ("GRU", 1), ("GRU", 0)])
def test_same_bits_fewer_cycles_and_events_divided(op, lbr):
    steps, x_len, h_len, batch = 5, 12, 10, 8
    rng = np.random.default_rng(40 + lbr)
    model = rnn_onnx(op, steps, x_len, h_len, rng, every=True, lbr=lbr, scale=0.6)
    x = rng.normal(0, 1.5, (steps, batch, x_len)).astype(np.float32)
    fused, plain = compiled(model, BUILD), compiled(model, BUILD, fuse=False)
    lay_f, lay_p = fused.report()["layers"][0], plain.report()["layers"][0]
    assert lay_f["quantize_once"]["on"] and not lay_p["quantize_once"]["on"], (lay_f, lay_p)
    out_f, cnt_f = run_jobs(fused, x)
    out_p, cnt_p = run_jobs(plain, x)
    # the same bits: every lane of every output vector, every counter but the quantizer's
    assert np.array_equal(out_f, out_p)
    assert {k: v for k, v in cnt_f.items() if k not in QUANTIZER} == \
        {k: v for k, v in cnt_p.items() if k not in QUANTIZER}
    # fewer predicted cycles (one job) and fewer chains
    cyc_f, cyc_p = (n.report()["per_job"]["cycles_predicted"] for n in (fused, plain))
    assert cyc_f < cyc_p, (cyc_f, cyc_p)
    assert lay_f["chains"] < lay_p["chains"]
    # the events, counted here: x of every step, h of every step but the last (each
    # feeds the next step's products; h0 = 0 has none)
    cfg = parse_config(BUILD)
    n, m = cfg.n, cfg.mantissa_bits_v
    ex = events(fused.jobs(x), n, m, x_len)
    eh = events(out_f.reshape(batch, steps, -1, n)[:, :-1], n, m, h_len)
    assert ex > 0 and eh > 0, "no quantizer events: the test would not see a difference"
    groups_f = (lay_f["quantize_once"]["x"], lay_f["quantize_once"]["h"])
    groups_p = (lay_p["quantize_once"]["x"], lay_p["quantize_once"]["h"])
    (xf, hf), (xp, hp) = conversions(groups_f), conversions(groups_p)
    if op == "GRU" and not lbr:
        hf, hp = hf - 1, hp - 1        # n's product reads r * h in both (counted in both)
    got_p, got_f = cnt_p["vector_saturations"], cnt_f["vector_saturations"]
    figures = (f"{op}: x events {ex} quantized {xp} -> {xf} times a step, h events {eh} "
               f"{hp} -> {hf} times; counted {got_p} unfused, {got_f} fused; cycles "
               f"{cyc_p} -> {cyc_f}")
    print(figures)
    assert got_p - got_f == (xp - xf) * ex + (hp - hf) * eh, figures
    if not (op == "GRU" and not lbr):
        assert got_p == xp * ex + hp * eh and got_f == xf * ex + hf * eh, figures
    assert cnt_f["vector_nonfinite"] == cnt_p["vector_nonfinite"] == 0


def test_groups_of_the_compiler():
    """The documented groups: LSTM x (f, i, o | c), h (f, i | o | c); GRU x (z, r, n),
    h (z, r | n); unfused one product per gate."""
    assert P.LSTM_FUSED == (("fio", "c"), ("fi", "o", "c"))
    assert P.GRU_FUSED == (("zrn",), ("zr", "n"))
    assert P.LSTM_UNFUSED == (("f", "i", "o", "c"),) * 2
    assert P.GRU_UNFUSED == (("z", "r", "n"),) * 2


def test_too_narrow_a_build_falls_back_with_a_reason():
    """max_length 4 (N = 8): the three gates' stack of H = 10 (2 vectors each) needs 6
    native vectors: unfused, the report says why, the bits are those of the wide build."""
    rng = np.random.default_rng(41)
    model = rnn_onnx("LSTM", 3, 12, 10, rng, head=5)
    narrow = compiled(model, BUILD + ",max_length=4")
    lay = narrow.report()["layers"][0]["quantize_once"]
    assert not lay["on"] and "max_length is 4" in lay["why_not"] and "6 native" in \
        lay["why_not"], lay
    x = rng.normal(size=(3, 2, 12)).astype(np.float32)
    wide = compiled(model, BUILD)
    assert wide.report()["layers"][0]["quantize_once"]["on"]
    assert np.array_equal(narrow.run(x), wide.run(x))


def test_turned_off_by_the_node_attribute():
    rng = np.random.default_rng(42)
    lay = compiled(rnn_onnx("GRU", 3, 12, 10, rng), BUILD, fuse=False).report()["layers"][0]
    assert lay["quantize_once"] == {"x": ["z", "r", "n"], "h": ["z", "r", "n"], "on": False,
                                    "why_not": "turned off (attrs['quantize_once'] = False)"}


def test_slower_stacks_are_not_taken():
    """GRU 256 on the default build: the stacks leave the schedule too few independent
    products (predicted slower by more than the tolerance): separate products, and the
    report gives both predictions."""
    rng = np.random.default_rng(43)
    net = compiled(rnn_onnx("GRU", 4, 256, 256, rng), "mrf_depth=1024")
    lay = net.report()["layers"][0]["quantize_once"]
    assert not lay["on"] and "predicted at" in lay["why_not"], lay


def test_malformed_groups_are_refused():
    bld = P.Builder(parse_config(BUILD))
    w = {f"{m}_{g}": np.zeros((4, 4)) for m in "WU" for g in "fioc"}
    w |= {f"b_{g}": np.zeros(4) for g in "fioc"}
    z = np.zeros(4)
    with pytest.raises(ValueError, match="h group 'oc' stacks 'c'"):
        P.lstm_layer(bld, bld, w, 4, 4, z, z, groups=(("fioc",), ("fi", "oc")))
    with pytest.raises(ValueError, match=r"x groups \('fio',\) must split the gates 'fioc'"):
        P.lstm_layer(bld, bld, w, 4, 4, z, z, groups=(("fio",), ("f", "i", "o", "c")))
    with pytest.raises(ValueError, match="'fo' is not a contiguous part"):
        P.lstm_layer(bld, bld, w, 4, 4, z, z, groups=(("fio", "c"), ("fo", "i", "c")))
    with pytest.raises(ValueError, match="must start with f"):
        P.lstm_layer(bld, bld, w, 4, 4, z, z, groups=(("ifo", "c"), ("if", "o", "c")))
    with pytest.raises(ValueError, match="order 'hand' is lstm_sequence's unfused order"):
        P.emit_lstm(bld, bld, w, 2, 4, 4, z, z, fuse=True)
    with pytest.raises(ValueError, match="order must be 'hand', 'naive' or 'scheduled'"):
        P.emit_gru(bld, bld, w, 2, 4, 4, z, order="fast")
