"""Scheduling by the dependency graph (``host.compiler.schedule``, ``docs/compiler.md``,
"Scheduling"): the compiled LSTM reaches the hand-written ``lstm_sequence``'s MVM
utilization on the model's prediction; a schedule keeps every edge of
``host.compiler.deps`` and computes the same bits (outputs, memories, counters) as
program order, on the recurrent layers and on random programs."""

from __future__ import annotations

import numpy as np
import pytest
from program_checks import outcome, same_bits
from rnn_onnx import rnn_onnx

from host.compiler import compile_onnx
from host.compiler import programs as P
from host.compiler.deps import check_order, dependency_graph, reorder
from host.compiler.schedule import schedule, schedule_tail
from host.model.core import NpuModel
from host.spec.config import parse_config
from host.spec.isa import Instruction, Space
from sim.randprog import RANDOM_BUILDS, lstm_weights, random_program

#: The default build with room for the eight 256 x 256 matrices (the default MRF holds
#: 512 tile slots; the LSTM needs 1024).
BUILD_256 = "mrf_depth=1024"
SMALL = parse_config("n=8,tiles=1,mrf_depth=256,program_depth=4096")


def lstm_hand_cycles(cfg, steps, size, rng):
    """Predicted cycles of the hand-written ``lstm_sequence`` (every step's h out)."""
    w = lstm_weights(rng, size, size)
    xs = rng.normal(size=(steps, size)).astype(np.float16)
    h0 = np.zeros(size, np.float16)
    prog = P.lstm_sequence(cfg, w, xs, h0, h0)
    result, _ = prog.run(NpuModel(cfg))
    assert result.ok
    return result.cycles_predicted


def test_compiled_lstm_256_reaches_the_hand_written_utilization():
    """LSTM, input and hidden size 256, 10 steps, every step's h out, on the default build
    (N = 16, T = 2, MRF 1024 slots): compiled from ONNX (quantize-once, naive order and
    the scheduler), its MVM utilization in the model's prediction of one job reaches that
    of ``lstm_sequence``; the naive order alone does not."""
    steps, size = 10, 256
    rng = np.random.default_rng(1)
    cfg = parse_config(BUILD_256)
    net = compile_onnx(rnn_onnx("LSTM", steps, size, size, rng, every=True), cfg)
    compiled = net.report()["per_job"]["cycles_predicted"]
    hand = lstm_hand_cycles(cfg, steps, size, rng)
    # the same layer in the naive order (no schedule), for contrast
    bld = P.Builder(cfg)
    w = lstm_weights(rng, size, size)
    P.emit_lstm(bld, bld, w, steps, size, size, np.zeros(size, np.float16),
                np.zeros(size, np.float16), step_writes=["netq"], fuse=True, order="naive")
    bld.push(np.zeros((steps, size), np.float16))
    naive, _ = bld.finish().run(NpuModel(cfg))
    useful = steps * 8 * size * size
    util = {k: useful / (cfg.macs_per_cycle * c) for k, c in
            (("compiled", compiled), ("hand", hand), ("naive", naive.cycles_predicted))}
    figures = (f"predicted cycles: compiled {compiled} (MVM utilization "
               f"{100 * util['compiled']:.1f} %), lstm_sequence {hand} "
               f"({100 * util['hand']:.1f} %), naive order {naive.cycles_predicted} "
               f"({100 * util['naive']:.1f} %)")
    print(figures)
    assert util["compiled"] >= util["hand"] - 0.002, figures
    assert util["naive"] < util["hand"] - 0.05, figures
    layer = net.report()["layers"][0]
    assert layer["quantize_once"]["on"] and layer["runs"] == 1, layer


@pytest.mark.parametrize("op,fuse,lbr", [("LSTM", False, 1), ("LSTM", True, 1),
                                         ("GRU", True, 1), ("GRU", False, 0),
                                         ("GRU", True, 0)])
def test_scheduled_layer_computes_the_same_bits(op, fuse, lbr):
    """The naive order and its schedule: every output, memory word and counter equal;
    the schedule keeps every edge and is faster."""
    rng = np.random.default_rng(3)
    x_len, h_len, steps = 13, 11, 4
    cfg = SMALL
    if op == "LSTM":
        w = lstm_weights(rng, x_len, h_len)
    else:
        w = {f"{m}_{k}": rng.normal(0, 0.4, (h_len, x_len if m == "W" else h_len))
             for m in "WU" for k in "zrn"} | {f"b_{k}": rng.normal(0, 0.3, h_len)
                                               for k in ("z", "r", "n", "hn")}
    xs = rng.normal(size=(steps, x_len))
    h0 = rng.normal(0, 0.5, h_len).astype(np.float16)

    def build(order):
        bld = P.Builder(cfg)
        if op == "LSTM":
            P.emit_lstm(bld, bld, w, steps, x_len, h_len, h0, h0, step_writes=["netq"],
                        fuse=fuse, order=order)
        else:
            P.emit_gru(bld, bld, w, steps, x_len, h_len, h0, linear_before_reset=bool(lbr),
                       step_writes=["netq"], fuse=fuse, order=order)
        bld.push(xs)
        return bld.finish()
    naive, scheduled = build("naive"), build("scheduled")
    assert naive.text != scheduled.text
    a, b = outcome(naive, naive.words), outcome(scheduled, scheduled.words)
    assert same_bits(a, b)
    assert b.cycles < a.cycles, (a.cycles, b.cycles)
    # the order it found keeps every edge of the naive program's graph
    graph = dependency_graph(naive)
    order = schedule(naive)
    assert check_order(graph, order) is None and order != sorted(order)


def test_schedule_tail_keeps_the_chains_before_it_and_the_registers():
    """A chain before the layer stays first and unchanged; a chain emitted after the
    scheduled tail sees the registers the Builder expects (same bits as unscheduled)."""
    rng = np.random.default_rng(4)
    cfg = SMALL
    w = lstm_weights(rng, 9, 10)
    wd = rng.normal(0, 0.3, (10, 9))
    xs = rng.normal(size=(3, 9))
    last = rng.normal(size=16)

    def build(scheduled):
        bld = P.Builder(cfg)
        slot = bld.matrix(wd)
        bld.chain("netq", rows=10, mv_mul=slot, cols=9, writes=["netq"])
        start = len(bld.instructions)
        P.emit_lstm(bld, bld, w, 3, 9, 10, np.zeros(10), np.zeros(10), step_writes=["netq"],
                    fuse=True, order="naive")
        if scheduled:
            moved = schedule_tail(bld, start)
            assert sorted(moved) == list(range(len(moved))) and moved != sorted(moved)
        h = bld.alloc(Space.IVRF, 2)
        bld.chain("netq", rows=16, writes=[h, "netq"])     # another ROWS after the tail
        bld.push(xs[0])
        bld.push(xs)
        bld.push(last)
        return bld.finish(), start
    (plain, start), (moved, _) = build(False), build(True)
    assert moved.instructions[:start] == plain.instructions[:start]
    assert same_bits(outcome(plain, plain.words), outcome(moved, moved.words))


def test_schedule_refuses_bad_arguments():
    bld = P.Builder(SMALL)
    bld.chain("netq", rows=8, writes=["netq"])
    bld.chain("netq", rows=9, writes=["netq"])
    inside = next(i for i, ins in enumerate(bld.instructions) if ins.opcode.name == "V_WR")
    with pytest.raises(ValueError, match=f"start {inside} is inside a chain"):
        schedule_tail(bld, inside)
    with pytest.raises(ValueError, match="start must be from 0"):
        schedule_tail(bld, len(bld.instructions) + 1)
    prog = list(bld.instructions) + [Instruction.end()]
    with pytest.raises(ValueError, match="beam and width must be at least 1"):
        schedule(prog, SMALL, beam=0)
    with pytest.raises(ValueError, match="first must be from 0 to the 2 chains"):
        schedule(prog, SMALL, first=3)
    assert schedule(prog, SMALL) == [0, 1]            # both pop the queue: one order


@pytest.mark.parametrize("name,seed", [(name, seed) for seed in (1, 2)
                                       for name in RANDOM_BUILDS])
def test_schedules_of_random_programs_keep_the_results(name, seed):
    """Random legal programs (iterations, windows, the queues, every VRF): the scheduled
    order keeps every edge, and the program reordered by ``deps.reorder`` computes the
    same bits."""
    prog = random_program(RANDOM_BUILDS[name], seed, chains=30)
    graph = dependency_graph(prog)
    order = schedule(prog, beam=2)
    assert check_order(graph, order) is None
    assert same_bits(outcome(prog, prog.words), outcome(prog, reorder(prog, order)))
