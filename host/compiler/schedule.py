"""Scheduling: a program's chains reordered by their dependency graph to keep the MVM busy.

The compiler emits each recurrent step in its naive order (the products on ``x``, the
gates, the state update) and lets :func:`schedule` find the interleaving that
:func:`host.compiler.programs.lstm_sequence` spells out by hand (``docs/compiler.md``,
"Scheduling"): the next step's products on ``x`` run on the MVM while a gate's chain
passes the MFU pipeline ahead of the chain that waits for it.

The method is list scheduling with a small beam, over the graph of
:func:`host.compiler.deps.dependency_graph` (every edge kept: a chain is placed only
after every chain it depends on, and :func:`host.compiler.deps.check_order` verifies the
result). Each candidate placement is timed by the reference model's own clock
(``host.model.core._Clock``, the resources of ``docs/npu.md`` section 4: in-order issue
into a scoreboard, the reader, the MVM's loader and sequencer, the in-order MFU
pipeline), not by a second timing model, and partial orders are ranked by a lower bound
on the cycles of the whole program:

* the MVM: the cycle it can start the next product, plus every product not yet placed
  (their sequencer cycles, ``R * max(ceil(C / T), B)`` each, where ``B = n / lanes``:
  at ``lanes < n`` a row block leaves for the MFU in B beats);
* the critical path: for every chain whose producers (RAW edges) are all placed, the
  cycle its inputs are ready (or the issuer and the MFU pipeline are free) plus its
  height, the longest chain of RAW successors after it, each weighed by its cycles on
  an empty core.

A partial order that leaves the MVM idle (a gate placed before the product that would
have covered its wait) raises the first bound; one that queues products ahead of the
chain the recurrence waits for (the MFU pipeline is in order) raises the second. Ties go
to the greater height, then to program order.

:func:`schedule_tail` applies it to the chains a :class:`~host.compiler.programs.Builder`
emitted from some point on, in place (registers are set before each chain as
:func:`host.compiler.deps.reorder` does with ``setup="restore"``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from host.compiler.deps import DepGraph, check_order, dependency_graph
from host.spec.isa import Instruction, Opcode, Reg, Space, chain_mfu_ops, parse_chain

__all__ = [
    "BEAM",
    "OVERLAP",
    "WARM_UP",
    "WIDTH",
    "WINDOW",
    "chain_start",
    "emit_scheduled",
    "schedule",
    "schedule_tail",
]

#: Partial orders kept at each position of the beam search.
BEAM = 8
#: Ready chains each partial order tries next (those of greatest height), besides the
#: highest product among the rest.
WIDTH = 4


@dataclass(frozen=True)
class _Cost:
    """What the clock needs of one chain, and its weight on an empty core."""
    n_instr: int
    iterations: int
    c_in: int
    length: int
    cols: int | None
    ops: tuple
    reads: tuple
    writes: tuple
    dests: int
    mvm: int              # sequencer cycles of its products (0 without a product)
    alone: int            # issue to retirement with nothing else running
    mfu_tail: int         # MFU occupancy at least (fill and outputs)


def _costs(graph: DepGraph, clock_type, timing) -> list[_Cost]:
    cfg = graph.config
    beats = cfg.n // cfg.lanes
    out = []
    for c in graph.chains:
        instr = list(c.instructions)
        parsed = parse_chain(lambda i, base=c.start, ins=instr: ins[i - base], c.start)
        ops = tuple(chain_mfu_ops(parsed))
        spans = lambda table: tuple((Space[res], a, b) for res, sp in table.items()
                                    if res != "MRF" for a, b in sp)
        product = parsed.mv_mul is not None
        dests = sum(1 for i in instr if i.opcode is Opcode.V_WR)
        groups = -(-c.inputs // cfg.tiles)
        cost = _Cost(len(instr), c.iterations, c.inputs, c.length,
                     c.inputs if product else None, ops, spans(c.reads), spans(c.writes),
                     dests, c.iterations * c.length * max(groups, beats) if product else 0,
                     0, 0)
        fresh = clock_type(cfg, timing)
        _run(fresh, cost, 0)
        fill, _ = fresh._fill(ops, c.length)
        out.append(cost.__class__(**{**cost.__dict__, "alone": fresh.done,
                                     "mfu_tail": fill + c.length * beats * max(dests, 1)}))
    return out


def _run(clock, cost: _Cost, setup: int) -> None:
    """Advance ``clock`` by one chain (its ``setup`` s_wr first)."""
    if setup:
        clock.instructions(setup)
    clock.chain(cost.n_instr)
    for _ in range(cost.iterations):
        clock.instance(cost.c_in, cost.length, cost.cols, list(cost.ops), list(cost.reads),
                       list(cost.writes), cost.dests)


def _fork(clock, keep: int):
    """A copy of ``clock`` whose list attributes hold only their last ``keep`` entries
    (all the clock looks back at)."""
    new = copy.copy(clock)
    for name, value in vars(clock).items():
        if isinstance(value, list):
            setattr(new, name, value[-keep:])
    return new


class _State:
    __slots__ = (
        "clock",
        "frontier",
        "mvm_left",
        "order",
        "pending",
        "placed",
        "raw_ready",
        "ready",
        "regs",
        "score",
    )

    def copy(self, keep: int) -> _State:
        s = _State()
        s.clock = _fork(self.clock, keep)
        s.regs = dict(self.regs)
        s.order = list(self.order)
        s.placed = set(self.placed)
        s.pending = self.pending.copy()
        s.ready = set(self.ready)
        s.frontier = set(self.frontier)
        s.raw_ready = dict(self.raw_ready)
        s.mvm_left = self.mvm_left
        return s


def _candidates(ready, height, costs, width: int) -> list[int]:
    """The ready chains a partial order tries next: the ``width`` of greatest height (the
    critical path first) and the highest product among the others (a filler for the
    MVM)."""
    by_height = sorted(ready, key=lambda k: (-height[k], k))
    out = by_height[:width]
    extra = next((k for k in by_height[width:] if costs[k].mvm), None)
    return out + ([extra] if extra is not None else [])


def schedule(program, config=None, *, first: int = 0, beam: int = BEAM,
             width: int = WIDTH, graph: DepGraph | None = None, timing=None) -> list[int]:
    """A chain order of ``program`` (a Program, words or Instruction list with its
    ``end``; ``config`` as :func:`host.compiler.deps.dependency_graph`) that keeps every
    edge of its dependency graph and keeps the MVM busy (see the module docstring).
    Chains ``0 .. first-1`` keep their places; ``beam`` partial orders are kept at each
    position (1: greedy), each trying the ``width`` ready chains of greatest height and
    the highest ready product. ``graph`` may be given when already computed; ``timing``
    is the model's :class:`host.model.core.Timing` (default: the gateware's).

    Returns the order (chain numbers), checked with :func:`host.compiler.deps.check_order`.

    Raises
    ------
    ValueError
        an illegal program (from :mod:`host.compiler.deps`); ``first`` or ``beam`` out of
        range.
    """
    from host.model.core import Timing, _Clock, mvm_latency, output_fifo_depth
    graph = graph if graph is not None else dependency_graph(program, config)
    cfg = graph.config
    count = len(graph.chains)
    if not 0 <= first <= count:
        raise ValueError(f"first must be from 0 to the {count} chains, not {first}")
    if beam < 1 or width < 1:
        raise ValueError(f"beam and width must be at least 1, not {beam} and {width}")
    timing = Timing() if timing is None else timing
    if not isinstance(timing, Timing):
        raise TypeError(f"timing must be a host.model.core.Timing, not {timing!r}")
    front, _ = mvm_latency(cfg)
    costs = _costs(graph, _Clock, timing)
    beats = cfg.n // cfg.lanes
    keep = max(16, cfg.direct_depth * beats + 2 * timing.direct_slice + 4,
               timing.in_flight + 4, timing.decode_queue + 4)
    if beats > 1:                 # the clock's departures from the MVM's output FIFO
        keep = max(keep, output_fifo_depth(cfg))
    preds = [set() for _ in range(count)]
    succs = [set() for _ in range(count)]
    raw_preds = [set() for _ in range(count)]
    raw_succs = [set() for _ in range(count)]
    for e in graph.edges:
        preds[e.dst].add(e.src)
        succs[e.src].add(e.dst)
        if e.kind == "RAW":
            raw_preds[e.dst].add(e.src)
            raw_succs[e.src].add(e.dst)
    height = [0] * count
    for k in reversed(range(count)):
        height[k] = costs[k].alone + max((height[s] for s in raw_succs[k]), default=0)

    def setup_count(state, k):
        regs = graph.chains[k].registers
        return sum(1 for r, v in regs.items() if state.regs[r] != v)

    def place(state, k):
        _run(state.clock, costs[k], setup_count(state, k))
        state.regs.update(graph.chains[k].registers)
        state.order.append(k)
        state.placed.add(k)
        state.ready.discard(k)
        state.frontier.discard(k)
        state.mvm_left -= costs[k].mvm
        retire = state.clock.retired[-1]
        for s in succs[k]:
            state.pending[s] -= 1
            if state.pending[s] == 0:
                state.ready.add(s)
        for s in raw_succs[k]:
            state.raw_ready[s] = max(state.raw_ready.get(s, 0), retire)
            if raw_preds[s] <= state.placed:
                state.frontier.add(s)

    def bound(state):
        clk = state.clock
        mvm = max(clk.seq_free, clk.issue_free + timing.read_latency + front) \
            + state.mvm_left if state.mvm_left else clk.seq_free
        crit = 0
        for k in state.frontier:
            start = max(state.raw_ready.get(k, 0), clk.issue_free)
            crit = max(crit, start + height[k],
                       clk.mfu_free + costs[k].mfu_tail + height[k] - costs[k].alone)
        return max(mvm, crit), crit

    init = _State()
    init.clock = _Clock(cfg, timing)
    init.regs = {r: (cfg.n if v is None else v) for r, v in _reg_defaults().items()}
    init.order, init.placed = [], set()
    init.pending = np.array([len(p) for p in preds], np.int64)
    init.ready = {k for k in range(count) if not preds[k]}
    init.frontier = {k for k in range(count) if not raw_preds[k]}
    init.raw_ready = {}
    init.mvm_left = sum(c.mvm for c in costs)
    for k in range(first):
        if k not in init.ready:                   # pragma: no cover (program order is valid)
            raise ValueError(f"chain {k} is not ready in program order")
        place(init, k)
    states = [init]
    for _ in range(first, count):
        grown = {}
        for state in states:
            for k in _candidates(state.ready, height, costs, width):
                new = state.copy(keep)
                place(new, k)
                score = bound(new)
                new.score = (score[0], score[1], -height[k], k)
                key = frozenset(new.placed)
                if key not in grown or new.score < grown[key].score:
                    grown[key] = new
        states = sorted(grown.values(), key=lambda s: s.score)[:beam]
    best = min(states, key=lambda s: (s.clock.total(), s.score))
    order = best.order
    check_order(_Indexed(graph), order)
    return order


class _Indexed:
    """``graph`` with its incoming edges indexed by chain, for
    :func:`host.compiler.deps.check_order` (which asks for them chain by chain)."""

    def __init__(self, graph: DepGraph):
        self.chains = graph.chains
        self._incoming = [[] for _ in graph.chains]
        for e in graph.edges:
            self._incoming[e.dst].append(e)

    def incoming(self, j: int) -> list:
        return self._incoming[j]


def _reg_defaults() -> dict:
    from host.spec.isa import REG_DEFAULTS
    return REG_DEFAULTS


#: Chains before the moved ones that the clock replays first, so that the timing of the
#: first moved chains sees a busy core (they stay where they are).
WARM_UP = 12


def _boundaries(instrs) -> list[tuple[int, int]]:
    """``(first, v_rd)`` instruction indices of each chain: its first setup ``s_wr``
    (the ``v_rd`` when it has none) and its ``v_rd``."""
    out, setup = [], None
    inside = False
    for k, ins in enumerate(instrs):
        op = ins.opcode
        if inside:
            inside = op is not Opcode.END_CHAIN
        elif op is Opcode.S_WR:
            setup = k if setup is None else setup
        elif op is Opcode.V_RD:
            out.append((k if setup is None else setup, k))
            setup, inside = None, True
    return out


def _registers(cfg, instrs) -> dict:
    """The registers after ``instrs`` (power-on values, then every ``s_wr``)."""
    cur = {r: (cfg.n if v is None else v) for r, v in _reg_defaults().items()}
    for ins in instrs:
        if ins.opcode is Opcode.S_WR:
            cur[ins.func] = ins.operand
    return cur


def chain_start(bld, chains: int) -> int:
    """The instruction index where the last ``chains`` chains ``bld`` emitted begin (at
    their setup), for :func:`schedule_tail` to move them again with what follows."""
    bounds = _boundaries(bld.instructions)
    return bounds[-chains][0] if 0 < chains <= len(bounds) else \
        (0 if chains > 0 else len(bld.instructions))


def schedule_tail(bld, start: int, *, beam: int = BEAM) -> list[int]:
    """Reorder, in place, the chains ``bld`` (a :class:`~host.compiler.programs.Builder`)
    emitted from instruction ``start`` on (``start`` at a chain's setup or ``v_rd``; the
    chains before it stay) by :func:`schedule`. Before each chain, ``s_wr`` set the
    registers it reads to the values it had; after the last, the registers are left as
    the Builder left them (so that it goes on emitting as before).

    Only the moved chains enter the dependency graph (every edge from a chain before
    them is kept by keeping that chain first), and the clock replays the :data:`WARM_UP`
    chains before them: the cost does not grow with the program before ``start``.

    Returns the new order of the moved chains (their numbers in emission order, counted
    from the first chain at or after ``start``).

    Raises
    ------
    ValueError
        ``start`` inside a chain or its setup; an illegal program (from
        :mod:`host.compiler.deps`).
    """
    instrs = bld.instructions
    cfg = bld.config
    if not 0 <= start <= len(instrs):
        raise ValueError(f"start must be from 0 to {len(instrs)}, not {start}")
    bounds = _boundaries(instrs)
    ends = [k + 1 for k, ins in enumerate(instrs) if ins.opcode is Opcode.END_CHAIN]
    for (first_ins, v_rd), stop in zip(bounds, ends):
        if first_ins < start <= v_rd and start != first_ins:
            raise ValueError(f"start {start} is inside the setup of the chain at "
                             f"instruction {v_rd}")
        if v_rd < start < stop:
            raise ValueError(f"start {start} is inside a chain")
    moved = [b for b in bounds if b[0] >= start]
    if not moved:
        return []
    before = [b for b in bounds if b[0] < start]
    warm = before[-WARM_UP][0] if len(before) >= WARM_UP else 0
    # The sub-program: the registers at ``warm``, the warm-up chains, the moved ones.
    regs = _registers(cfg, instrs[:warm])
    defaults = _registers(cfg, [])
    preamble = [Instruction.s_wr(r, v) for r, v in regs.items() if v != defaults[r]]
    graph = dependency_graph(preamble + list(instrs[warm:]) + [Instruction.end()], cfg)
    first = len(graph.chains) - len(moved)
    order = schedule(None, first=first, beam=beam, graph=graph)
    cur = _registers(cfg, instrs[:start])
    tail = []
    for k in order[first:]:
        c = graph.chains[k]
        for reg in sorted(c.reg_reads, key=lambda r: r.value):
            if cur[reg] != c.registers[reg]:
                tail.append(Instruction.s_wr(reg, c.registers[reg]))
                cur[reg] = c.registers[reg]
        tail += list(c.instructions)
    for reg in Reg:
        if cur[reg] != graph.final_registers[reg]:
            tail.append(Instruction.s_wr(reg, graph.final_registers[reg]))
    instrs[start:] = tail
    return [k - first for k in order[first:]]


#: Steps emitted and scheduled at a time by :func:`emit_scheduled`.
WINDOW = 12
#: Steps of the previous window scheduled again with the next one.
OVERLAP = 2


def emit_scheduled(bld, steps: int, emit_step, *, window: int = WINDOW,
                   overlap: int = OVERLAP, beam: int = BEAM) -> None:
    """Emit ``steps`` time steps with ``emit_step(t)`` (which emits step ``t``'s chains
    into ``bld`` in their naive order) and schedule them (:func:`schedule_tail`) in
    windows of ``window`` steps: each window is scheduled together with the chains of
    the last ``overlap`` steps before it, so that the scheduler can interleave across
    the window's edge, and the cost grows linearly with the steps.

    Raises
    ------
    ValueError
        ``window`` or ``overlap`` out of range (``window >= 1``, ``overlap >= 0``).
    """
    if window < 1 or overlap < 0:
        raise ValueError(f"window must be at least 1 and overlap at least 0, not "
                         f"{window} and {overlap}")
    start = len(bld.instructions)
    per_step = None
    t = 0
    while t < steps:
        cut = start if t == 0 or not overlap else \
            max(start, chain_start(bld, overlap * per_step))
        before = len(_boundaries(bld.instructions)) if per_step is None else 0
        for k in range(t, min(steps, t + window)):
            emit_step(k)
            if per_step is None:
                per_step = max(1, len(_boundaries(bld.instructions)) - before)
        schedule_tail(bld, cut, beam=beam)
        t += window
