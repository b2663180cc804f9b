"""Dependencies between chains (``host.compiler.deps``, ``docs/deps.md``).

* The graphs of the GRU, LSTM and convolution builders and of a hand-written program
  against edge sets derived by hand from the chains the builders emit (the memory
  layout is the builders' allocation order, written out in each test).
* The expanded read and write sets of every chain against what the reference model
  itself plans for that chain (``NpuModel._plan``, recorded while it runs).
* Property: random topological orders (reordered with ``reorder``) of random programs
  and of the builder programs compute the same outputs, memories, counters and final
  registers as the program order, bit for bit.
* Broken orders: ``check_order`` names the first broken edge, and breaking an edge
  really changes the results (so the edges are not decoration).
* ``npu deps``: text, ``--json``, ``--dot``, and exit status 2 for bad files.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from program_checks import outcome, same_bits

from host.cli import main
from host.compiler import programs as P
from host.compiler.deps import (
    Edge,
    chains,
    check_order,
    dependency_graph,
    reorder,
    topological_order,
)
from host.compiler.image import program_image
from host.model.core import NpuModel
from host.spec.config import NpuConfig
from host.spec.isa import Instruction as I
from host.spec.isa import Reg, Space, decode_program
from sim.randprog import RANDOM_BUILDS, random_program

CFG = NpuConfig(n=8, tiles=1, mrf_depth=512, max_col_tiles=32, ivrf_depth=512,
                vrf_depth=256, netq_depth=256, max_length=8)
RANDOM_CONFIGS = RANDOM_BUILDS
X, H = 5, 6          # not multiples of N; one native vector each at N = 8


def rand(rng, *shape):
    return (rng.standard_normal(shape) * 0.5).astype(np.float16)


def gru(cfg=CFG, seed=1):
    rng = np.random.default_rng(seed)
    w = {f"W_{k}": rand(rng, H, X) for k in "zrn"} | {f"U_{k}": rand(rng, H, H) for k in "zrn"}
    w |= {f"b_{k}": rand(rng, H) for k in ("z", "r", "n", "hn")}
    return P.gru_step(cfg, w, rand(rng, X), rand(rng, H))


def lstm(cfg=CFG, steps=1, seed=2):
    rng = np.random.default_rng(seed)
    w = {f"{m}_{g}": rand(rng, H, X if m == "W" else H) for m in "WU" for g in "fioc"}
    w |= {f"b_{g}": rand(rng, H) for g in "fioc"}
    xs = rand(rng, steps, X)
    if steps == 1:
        return P.lstm_step(cfg, w, xs[0], rand(rng, H), rand(rng, H))
    return P.lstm_sequence(cfg, w, xs, rand(rng, H), rand(rng, H))


def conv(cfg=CFG, seed=3):
    rng = np.random.default_rng(seed)
    return P.conv2d(cfg, rand(rng, 4, 3, 3, 3), rand(rng, 4), rand(rng, 5, 6, 3), stride=2)


def edge_set(graph, spans=True):
    return {(e.src, e.dst, e.kind, e.resource) + ((e.span,) if spans else ())
            for e in graph.edges}


# --- hand-derived graphs ----------------------------------------------------------------------

def test_gru_graph_by_hand():
    # MRF: W_z 0, W_r 1, W_n 2, U_z 3, U_r 4, U_n 5. ASVRF0: b_z 0, b_r 1, b_n 2, b_hn 3,
    # xw_z 4, xw_r 5, h_op 6. ASVRF1: xw_n 0, n_op 1. IVRF: x 0, h 1, n_iv 2.
    # MULVRF0: z 0, r 1. Chains: 0 x <- netq; 1..3 xw_k = W_k x + b_k; 4 z, 5 r (read h,
    # xw_z / xw_r); 6 n (reads h, b_hn, r, xw_n; writes n_iv, n_op); 7 h' (reads n_iv,
    # h_op, z, n_op; writes h, h_op, netq).
    g = dependency_graph(gru())
    raw, war = "RAW", "WAR"
    expected = {
        (0, 1, raw, "IVRF", ((0, 1),)), (0, 2, raw, "IVRF", ((0, 1),)),
        (0, 3, raw, "IVRF", ((0, 1),)),
        (1, 4, raw, "ASVRF0", ((4, 5),)), (2, 5, raw, "ASVRF0", ((5, 6),)),
        (3, 6, raw, "ASVRF1", ((0, 1),)), (5, 6, raw, "MULVRF0", ((1, 2),)),
        (4, 7, raw, "MULVRF0", ((0, 1),)), (6, 7, raw, "IVRF", ((2, 3),)),
        (6, 7, raw, "ASVRF1", ((1, 2),)),
        # h' overwrites h, which the three U products read.
        (4, 7, war, "IVRF", ((1, 2),)), (5, 7, war, "IVRF", ((1, 2),)),
        (6, 7, war, "IVRF", ((1, 2),)),
    }
    assert edge_set(g) == expected
    c = g.chains[6]
    assert c.reads == {"IVRF": ((1, 2),), "MRF": ((5, 6),), "ASVRF0": ((3, 4),),
                       "MULVRF0": ((1, 2),), "ASVRF1": ((0, 1),)}
    assert c.writes == {"IVRF": ((2, 3),), "ASVRF1": ((1, 2),)}
    assert g.chains[0].queue_in == (0, 1) and g.chains[7].queue_out == (0, 1)
    assert g.chains[6].summary() == ("v_rd IVRF[1:2] mv_mul MRF slots 5-5 vv_add ASVRF0[3:4] "
                                     "vv_mul MULVRF0[1:2] vv_add ASVRF1[0:1] v_tanh "
                                     "v_wr IVRF[2:3] v_wr ASVRF1[1:2] end_chain")


def test_lstm_step_graph_by_hand():
    # MRF: W_f..W_c 0..3, U_f..U_c 4..7. ASVRF0: b_f..b_c 0..3, xw[0] f..c 4..7, xw[1]
    # 8..11. IVRF: x[0] 0, x[1] 1, h 2. MULVRF0: c 0, i 1, o 2. ASVRF1: fc 0.
    # Chains: 0 x <- netq; 1..4 xw_g; 5 f (c*sigm -> fc); 6 i; 7 o; 8 c (reads i, fc,
    # writes c); 9 h = tanh(c) * o -> h, netq.
    g = dependency_graph(lstm())
    expected = {(0, k, "RAW", "IVRF", ((0, 1),)) for k in (1, 2, 3, 4)}
    expected |= {(k, k + 4, "RAW", "ASVRF0", ((k + 3, k + 4),)) for k in (1, 2, 3, 4)}
    expected |= {
        (5, 8, "RAW", "ASVRF1", ((0, 1),)),          # fc
        (5, 8, "WAR", "MULVRF0", ((0, 1),)),         # f reads the old c, c overwrites it
        (6, 8, "RAW", "MULVRF0", ((1, 2),)),         # i
        (7, 9, "RAW", "MULVRF0", ((2, 3),)),         # o
        (8, 9, "RAW", "MULVRF0", ((0, 1),)),         # c
    }
    expected |= {(k, 9, "WAR", "IVRF", ((2, 3),)) for k in (5, 6, 7, 8)}   # h
    assert edge_set(g) == expected


def test_lstm_sequence_keeps_the_input_queue_order():
    # Two steps: chain 0 copies x0, chain 5 (after the four x0 products) copies x1 into
    # the other x buffer; both pop the input queue, in that order.
    g = dependency_graph(lstm(steps=2))
    pops = [c.index for c in g.chains if c.queue_in]
    assert pops == [0, 5]
    assert [g.chains[k].queue_in for k in pops] == [(0, 1), (1, 2)]
    assert Edge(0, 5, "QUEUE", "NETQ.in", ((0, 1), (1, 2))) in g.edges
    pushes = [c.index for c in g.chains if c.queue_out]
    assert len(pushes) == 2
    assert Edge(*pushes, "QUEUE", "NETQ.out", ((0, 1), (1, 2))) in g.edges
    # The second step's products read x1 (IVRF 1), written by chain 5 only.
    assert {e.src for e in g.edges if e.resource == "IVRF" and e.span == ((1, 2),)
            and e.kind == "RAW"} == {5}


def test_conv2d_graph_by_hand():
    # 5 x 6 x 3 image, one vector per pixel from IVRF 0 (row major), 3 x 3 kernel,
    # stride 2: two chains (output rows), 2 iterations each, window pitch 6, inc 2.
    # Row 0 reads pixels y*6 + x + 2i (y, x < 3, i < 2); row 1 the same from 12.
    # The 9 column tiles x 1 row tile are slots 0-8; the bias is ASVRF0 0.
    g = dependency_graph(conv())
    a, b = g.chains
    assert (a.iterations, a.length, a.inputs) == (2, 1, 9)
    assert a.reads == {"IVRF": ((0, 5), (6, 11), (12, 17)), "MRF": ((0, 9),),
                       "ASVRF0": ((0, 1),)}
    assert b.reads["IVRF"] == ((12, 17), (18, 23), (24, 29))
    assert a.writes == b.writes == {}
    assert (a.queue_out, b.queue_out) == ((0, 2), (2, 4))
    # Only reads overlap (IVRF 12..16): the one edge is the output queue's order.
    assert edge_set(g) == {(0, 1, "QUEUE", "NETQ.out", ((0, 2), (2, 4)))}


def test_conv1x1_is_one_iterated_chain():
    rng = np.random.default_rng(4)
    prog = P.conv1x1(CFG, rand(rng, 10, 3), rand(rng, 10), rand(rng, 2, 3, 3))
    (c,) = chains(prog)
    assert (c.iterations, c.length) == (6, 2)
    assert c.reads["IVRF"] == ((0, 6),) and c.reads["MRF"] == ((0, 2),)
    assert c.queue_out == (0, 12)
    assert dependency_graph(prog).edges == []


def hand_program():
    """Iterations with strides, a queue pop and push, a 2 x 2 window, a WAW (N = 8)."""
    return [
        I.s_wr(Reg.ITERATIONS, 3),
        I.v_rd(Space.IVRF, 0, 2), I.v_wr(Space.ASVRF0, 10, 1), I.end_chain(),       # 0
        I.s_wr(Reg.ITERATIONS, 1),
        I.v_rd(Space.IVRF, 1), I.v_wr(Space.IVRF, 3), I.end_chain(),                # 1
        I.v_rd(Space.NETQ), I.vv("add", 12), I.v_wr(Space.IVRF, 4), I.v_wr(Space.NETQ),
        I.end_chain(),                                                               # 2
        I.s_wr(Reg.ROWS, 16), I.s_wr(Reg.COLS, 8), I.s_wr(Reg.WIN_W, 2),
        I.s_wr(Reg.WIN_H, 2), I.s_wr(Reg.WIN_PITCH, 4),
        I.v_rd(Space.IVRF, 0), I.mv_mul(0), I.v_wr(Space.MULVRF0, 0), I.v_wr(Space.NETQ),
        I.end_chain(),                                                               # 3
        I.v_rd(Space.NETQ), I.v_wr(Space.MULVRF0, 1), I.end_chain(),                 # 4
        I.s_wr(Reg.Q_STATIC, 1),
        I.end(),
    ]


def test_hand_program_graph():
    g = dependency_graph(hand_program(), CFG)
    c = g.chains
    # Chain 0 reads IVRF 0, 2, 4 (not the hull 0..4): chain 1's write of IVRF 3 is free.
    assert c[0].reads == {"IVRF": ((0, 1), (2, 3), (4, 5))}
    assert c[0].writes == {"ASVRF0": ((10, 13),)}
    assert c[2].queue_in == (0, 1) and c[4].queue_in == (1, 3)       # ROWS 16: 2 vectors
    assert c[3].reads == {"IVRF": ((0, 2), (4, 6)), "MRF": ((0, 8),)}  # 2 rows x 4 tiles
    assert c[3].writes == {"MULVRF0": ((0, 2),)}
    assert c[3].registers[Reg.WIN_PITCH] == 4 and Reg.Q_EXPONENT not in c[3].reg_reads
    assert edge_set(g) == {
        (0, 2, "RAW", "ASVRF0", ((12, 13),)), (0, 2, "WAR", "IVRF", ((4, 5),)),
        (2, 3, "RAW", "IVRF", ((4, 5),)), (2, 3, "QUEUE", "NETQ.out", ((0, 1), (1, 3))),
        (2, 4, "QUEUE", "NETQ.in", ((0, 1), (1, 3))),
        (3, 4, "WAW", "MULVRF0", ((1, 2),)),
    }
    assert [mn for _, mn in g.trailing] == [I.s_wr(Reg.Q_STATIC, 1)]
    assert g.final_registers[Reg.Q_STATIC] == 1 and g.final_registers[Reg.ROWS] == 16
    # With register edges: chain 1 resets ITERATIONS, which chain 0 read (WAR) and
    # wrote (WAW); chains 2..4 read it (RAW from both writers).
    r = dependency_graph(hand_program(), CFG, registers=True)
    regs = {(e.src, e.dst, e.kind, e.resource) for e in r.edges if e.resource.startswith("REG")}
    assert {(0, 1, "WAR", "REG.ITERATIONS"), (0, 1, "WAW", "REG.ITERATIONS"),
            (1, 2, "RAW", "REG.ITERATIONS"), (3, 4, "RAW", "REG.ROWS"),
            (2, 3, "WAR", "REG.ROWS")} <= regs
    assert (0, 3, "RAW", "REG.WIN_W") not in regs


# --- against the model's own plan ------------------------------------------------------------

def model_accesses(prog):
    """Run ``prog`` on the model and record, per chain, the spans it plans to read and
    write (every iteration) and the MRF slots of its product."""
    model = NpuModel(prog.config)
    seen = []
    plan = model._plan

    def spy(chain):
        p = plan(chain)
        reads, writes = {}, {}
        for table, accesses in ((reads, p["reads"]), (writes, p["writes"])):
            for space, a, cnt, inc, *_ in accesses:
                for i in range(p["iters"]):
                    table.setdefault(space.name, set()).update(
                        range(a + i * inc, a + i * inc + cnt))
        if chain.mv_mul is not None:
            mv = chain.mv_mul
            reads["MRF"] = {mv.operand + i * mv.inc + s for i in range(p["iters"])
                            for s in range(p["length"] * p["groups"])}
        seen.append((reads, writes))
        return p

    model._plan = spy
    result, _ = prog.run(model)
    assert result.ok, result
    return seen


def addresses(table):
    return {k: {a for lo, hi in v for a in range(lo, hi)} for k, v in table.items()}


@pytest.mark.parametrize("name,seed", [("n8t2m3", 11), ("n4t3m2", 12), ("n8t2m3", 13)])
def test_access_sets_match_the_model(name, seed):
    prog = random_program(RANDOM_CONFIGS[name], seed, chains=30)
    infos = chains(prog)
    seen = model_accesses(prog)
    assert len(infos) == len(seen) == prog.refs["chains"]
    for info, (reads, writes) in zip(infos, seen):
        assert addresses(info.reads) == reads, f"chain {info.index}"
        assert addresses(info.writes) == writes, f"chain {info.index}"


def test_builder_access_sets_match_the_model():
    for prog in (gru(), lstm(steps=2), conv()):
        for info, (reads, writes) in zip(chains(prog), model_accesses(prog)):
            assert (addresses(info.reads), addresses(info.writes)) == (reads, writes)


# --- reordering ---------------------------------------------------------------------------------

def same(a, b) -> bool:
    """Equal outputs, memories, counters, final registers and chains."""
    return same_bits(a, b) and (a.registers, a.chains) == (b.registers, b.chains)


def hand_prog():
    rng = np.random.default_rng(5)
    prog = P.Program(CFG, hand_program())
    prog.vectors = [(s, 0, rng.integers(0, 0x7800, (64, 8)).astype(np.uint16))
                    for s in (Space.IVRF, Space.ASVRF0, Space.MULVRF0)]
    prog.matrices = [(0, rand(rng, 16, 32))]
    prog.inputs = rng.integers(0, 0x7800, (3, 8)).astype(np.uint16)
    prog.outputs = 3
    return prog


def builder_programs():
    return {"gru": gru(), "lstm2": lstm(steps=2), "conv2d": conv(), "hand": hand_prog()}


def check_orders(prog, count, seed, setup="restore"):
    graph = dependency_graph(prog, registers=setup == "move")
    want = outcome(prog, prog.words)
    rng = np.random.default_rng(seed)
    orders = {tuple(topological_order(graph, rng)) for _ in range(count)}
    for order in orders:
        assert check_order(graph, order) is None
        got = outcome(prog, reorder(prog, order, setup=setup))
        assert same(got, want), f"order {order} changed the results"
    return graph, orders


@pytest.mark.parametrize("name,seed", [(name, seed) for seed in range(1, 7)
                                       for name in RANDOM_CONFIGS])
def test_random_orders_of_random_programs(name, seed):
    prog = random_program(RANDOM_CONFIGS[name], seed, chains=40)
    graph, orders = check_orders(prog, 5, seed)
    assert len(orders) > 1                         # some freedom was there to exercise
    assert len(graph.edges) > 10                   # and constraints too (small memories)


@pytest.mark.parametrize("name", ["gru", "lstm2", "conv2d", "hand"])
def test_random_orders_of_builder_programs(name):
    prog = builder_programs()[name]
    _, orders = check_orders(prog, 10, 7)
    # The convolution's chains all push the output queue: one order only.
    assert len(orders) > 1 if name != "conv2d" else orders == {(0, 1)}


@pytest.mark.parametrize("seed", [21, 22])
def test_moving_setup_groups_needs_the_register_edges(seed):
    prog = random_program(RANDOM_CONFIGS["n8t2m3"], seed, chains=25)
    check_orders(prog, 3, seed, setup="move")
    check_orders(gru(), 3, seed, setup="move")


def test_reorder_restores_registers():
    prog = hand_prog()
    words = reorder(prog, [1, 0, 2, 3, 4])
    text = P.Program(CFG, decode_program(words)).text.splitlines()
    # Chain 1 first runs once (the default), chain 0 then needs its 3 iterations and
    # chain 2 its 1 again; ROWS 16 comes before chain 4, the window before chain 3; the
    # trailing Q_STATIC comes back before end.
    assert text[:4] == ["v_rd ivrf, 1", "v_wr ivrf, 3", "end_chain", "s_wr iterations, 3"]
    assert text[-2:] == ["s_wr q_static, 1", "end"]
    assert same(outcome(prog, words), outcome(prog, prog.words))


# --- broken orders ------------------------------------------------------------------------------

def test_check_order_names_the_first_broken_edge():
    g = dependency_graph(gru())
    order = [0, 1, 2, 3, 4, 5, 7, 6]
    with pytest.raises(ValueError) as exc:
        check_order(g, order)
    msg = str(exc.value)
    assert "chain 7" in msg and "chain 6" in msg and "RAW ASVRF1[1:2]" in msg
    with pytest.raises(ValueError, match=r"chain 1 .* chain 0 .*RAW IVRF\[0:1\]"):
        check_order(g, [1, 0, 2, 3, 4, 5, 6, 7])
    with pytest.raises(ValueError, match="each of the 8 chains once"):
        check_order(g, [0, 1, 2])
    with pytest.raises(ValueError, match="QUEUE NETQ.out"):
        check_order(dependency_graph(conv()), [1, 0])
    with pytest.raises(ValueError, match="QUEUE NETQ.in"):
        check_order(dependency_graph(hand_program(), CFG), [0, 1, 4, 2, 3])
    with pytest.raises(ValueError, match="WAW MULVRF0"):
        check_order(dependency_graph(hand_program(), CFG), [0, 1, 2, 4, 3])
    with pytest.raises(ValueError, match="RAW ASVRF1"):
        reorder(gru(), order)
    assert check_order(g, range(8)) is None


@pytest.mark.parametrize("order,kind", [
    ([0, 1, 2, 3, 4, 5, 7, 6], "RAW"),        # h' before n
    ([0, 1, 3, 5, 2, 4, 6, 7], "RAW"),        # r before xw_r
    ([1, 0, 2, 3, 4, 5, 6, 7], "RAW"),        # a product before x arrives
])
def test_breaking_an_edge_changes_the_results(order, kind):
    prog = gru()
    graph = dependency_graph(prog)
    with pytest.raises(ValueError, match=kind):
        check_order(graph, order)
    assert not same(outcome(prog, reorder(prog, order, check=False)),
                    outcome(prog, prog.words))


def test_breaking_a_queue_or_waw_edge_changes_the_results():
    prog = hand_prog()
    want = outcome(prog, prog.words)
    for order, kind in (([0, 1, 4, 2, 3], "QUEUE NETQ.in"), ([0, 1, 2, 4, 3], "WAW MULVRF0")):
        with pytest.raises(ValueError, match=kind):
            check_order(dependency_graph(prog), order)
        assert not same(outcome(prog, reorder(prog, order, check=False)), want)


def test_breaking_a_war_edge_changes_the_results():
    # Chain 0 copies IVRF 0 to ASVRF0 0; chain 1 then overwrites IVRF 0 with IVRF 1.
    prog = P.Program(CFG, [I.v_rd(Space.IVRF, 0), I.v_wr(Space.ASVRF0, 0), I.end_chain(),
                           I.v_rd(Space.IVRF, 1), I.v_wr(Space.IVRF, 0), I.end_chain(),
                           I.end()])
    prog.vectors = [(Space.IVRF, 0, np.arange(16, dtype=np.uint16).reshape(2, 8))]
    graph = dependency_graph(prog)
    assert edge_set(graph) == {(0, 1, "WAR", "IVRF", ((0, 1),))}
    with pytest.raises(ValueError, match=r"WAR IVRF\[0:1\]"):
        check_order(graph, [1, 0])
    assert not same(outcome(prog, reorder(prog, [1, 0], check=False)),
                    outcome(prog, prog.words))


def test_register_edges_matter_when_setup_groups_move():
    # Chain 1 inherits ITERATIONS 3 from chain 0's setup: moved first with only its own
    # (empty) setup it runs once. The memory graph allows the swap; the register graph
    # does not, and "restore" makes the swap safe.
    prog = P.Program(CFG, [I.s_wr(Reg.ITERATIONS, 3), I.v_rd(Space.IVRF, 0, 1),
                           I.v_wr(Space.ASVRF0, 0, 1), I.end_chain(),
                           I.v_rd(Space.IVRF, 8, 1), I.v_wr(Space.ASVRF0, 8, 1),
                           I.end_chain(), I.end()])
    prog.vectors = [(Space.IVRF, 0, np.arange(128, dtype=np.uint16).reshape(16, 8))]
    assert dependency_graph(prog).edges == []
    with pytest.raises(ValueError, match="REG.ITERATIONS"):
        check_order(dependency_graph(prog, registers=True), [1, 0])
    want = outcome(prog, prog.words)
    assert not same(outcome(prog, reorder(prog, [1, 0], setup="move", check=False)), want)
    assert same(outcome(prog, reorder(prog, [1, 0])), want)


def test_illegal_programs_are_refused():
    with pytest.raises(ValueError, match="without end"):
        chains([I.v_rd(Space.IVRF), I.v_wr(Space.IVRF, 1), I.end_chain()], CFG)
    with pytest.raises(ValueError, match="outside a chain"):
        chains([I.v_wr(Space.IVRF, 1), I.end()], CFG)
    with pytest.raises(ValueError, match="iterations"):
        chains([I.s_wr(Reg.ITERATIONS, 0), I.end()], CFG)
    with pytest.raises(ValueError, match="illegal program"):
        chains(np.array([0], np.uint64), CFG)
    with pytest.raises(ValueError, match="MULVRF3"):
        chains([I.v_rd(Space.IVRF), I.v_wr(Space.MULVRF3), I.end_chain(), I.end()], CFG)


def test_words_and_instructions_give_the_same_graph():
    prog = gru()
    a = dependency_graph(prog)
    b = dependency_graph(prog.words, CFG)
    c = dependency_graph(prog.instructions, CFG)
    assert a.edges == b.edges == c.edges
    assert json.loads(a.to_json()) == json.loads(b.to_json())


# --- npu deps -----------------------------------------------------------------------------------

def test_cli_deps(tmp_path, capsys):
    prog = gru()
    path = tmp_path / "gru.npz"
    program_image(prog).save(path)
    graph = dependency_graph(prog)

    assert main(["deps", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("8 chains, 13 edges (RAW 10, WAR 3, WAW 0, QUEUE 0)")
    k = next(i for i, line in enumerate(out) if line.startswith("chain 7 "))
    assert "v_rd IVRF[2:3]" in out[k] and "v_wr NETQ.out[0:1]" in out[k]
    assert "    after chain 6: RAW IVRF[2:3]" in out[k + 1:]

    assert main(["deps", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(e["src"], e["dst"], e["kind"], e["resource"]) for e in data["edges"]] == \
        [(e.src, e.dst, e.kind, e.resource) for e in graph.edges]
    assert data["chains"][0]["queue_in"] == [0, 1]

    assert main(["deps", str(path), "--dot"]) == 0
    dot = capsys.readouterr().out
    assert dot.startswith("digraph deps {") and 'c6 -> c7 [label="' in dot
    assert dot.count(" -> ") == len(graph.pairs())

    assert main(["deps", str(path), "--registers"]) == 0
    assert "REG.COLS" in capsys.readouterr().out


def test_cli_deps_bad_files(tmp_path, capsys):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    assert main(["deps", str(bad)]) == 2
    assert "npu: error: cannot load image" in capsys.readouterr().err
    assert main(["deps", str(tmp_path / "missing.npz")]) == 2
    assert "cannot load image" in capsys.readouterr().err
    # A readable image whose program is illegal (a chain without end_chain).
    image = program_image(gru())
    image.program = np.array([w for w in image.program if (int(w) & 31) != 8], np.uint64)
    path = tmp_path / "broken.npz"
    image.save(path)
    assert main(["deps", str(path)]) == 2
    assert "npu: error:" in capsys.readouterr().err
    assert main(["deps", str(bad), "--dot", "--json"]) == 2
