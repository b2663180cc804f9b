"""Dependencies between the chains of a program: the graph a scheduler may reorder by.

``docs/deps.md`` states the rules. In short: a program is split into chains exactly as
:meth:`host.model.core.NpuModel.run` executes it (from instruction 0 to the first
``end``); the ``s_wr`` instructions before a chain are that chain's *setup* (those after
the last chain are the program's *trailing* setup). For every chain the scalar
registers it reads are evaluated as the model would see them, and its memory accesses
are expanded over its iterations (``*_inc`` addresses), its 2-D window and its logical
vector length:

* reads: the ``v_rd`` source (IVRF or an MFU VRF), every ``vv`` operand in the VRF its op
  is allocated to (:func:`host.spec.mfu.allocate`), the MRF tile slots of ``mv_mul``;
* writes: every ``v_wr`` destination other than the output queue;
* the queues: a ``v_rd netq`` pops the next ``k`` input vectors, a ``v_wr netq`` pushes
  to the output queue; each queue is an ordered resource, so every two chains that pop
  (push) keep their order (edges of kind ``QUEUE``);
* scalar registers: the registers a chain reads (``ROWS``, ``ITERATIONS``; with a
  product also ``COLS``, the window, ``ROUNDING``, ``Q_STATIC``, ``NARROW`` and, in static
  mode, ``Q_EXPONENT``) and those its setup writes.

Edges ``i -> j`` (``i < j``, ``i`` must stay before ``j``) are drawn for every pair with a
RAW (``i`` writes what ``j`` reads), WAR (``i`` reads what ``j`` writes) or WAW overlap,
one edge per kind and resource. Register edges are only drawn with ``registers=True``:
:func:`reorder` (by default) gives every chain its own register values back, so
registers never constrain the order; with ``setup="move"`` a chain only takes its own
``s_wr`` group along, and the register edges are needed.

API: :func:`chains`, :func:`dependency_graph` (a :class:`DepGraph` with ``edges``,
``to_text``, ``to_dot``, ``to_json``), :func:`check_order`, :func:`reorder`,
:func:`topological_order`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from host.spec.config import NpuConfig
from host.spec.isa import (
    REG_DEFAULTS,
    chain_mfu_ops,
    operand_vrf,
    Instruction,
    IsaError,
    Opcode,
    Reg,
    Space,
    decode,
    encode_program,
    mnemonic,
    parse_chain,
    register_limits,
    vector_spaces,
)
from host.spec.mfu import MfuUnit, allocate

__all__ = [
    "KINDS",
    "MRF",
    "QUEUE_IN",
    "QUEUE_OUT",
    "ChainInfo",
    "DepGraph",
    "Edge",
    "chains",
    "check_order",
    "dependency_graph",
    "reorder",
    "topological_order",
]

#: Edge kinds: read after write, write after read, write after write, queue order.
KINDS = ("RAW", "WAR", "WAW", "QUEUE")
#: Resource names of the two queues and of the matrix memory.
QUEUE_IN, QUEUE_OUT, MRF = "NETQ.in", "NETQ.out", "MRF"

_MVM_REGS = (Reg.COLS, Reg.WIN_W, Reg.WIN_H, Reg.WIN_PITCH, Reg.ROUNDING, Reg.Q_STATIC,
             Reg.NARROW)


# --- intervals ------------------------------------------------------------------------------

def _merge(spans) -> tuple:
    """Half-open ``(start, stop)`` spans as a sorted tuple of disjoint, non-touching ones."""
    out = []
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return tuple(out)


def _intersect(x, y) -> tuple:
    """Intersection of two merged span tuples."""
    out, i, j = [], 0, 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if a < b:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


def _fmt(spans, limit: int = 6) -> str:
    """``[0:2,4:6]``; long lists shortened to their first and last spans."""
    text = [f"{a}:{b}" for a, b in spans]
    if len(text) > limit:
        return f"[{','.join(text[:limit - 1])},...,{text[-1]}] ({len(text)} ranges)"
    return f"[{','.join(text)}]"


def _iterated(base: int, inc: int, iters: int, pieces) -> tuple:
    """Every ``(base + i*inc + off, ... + cnt)`` for ``i < iters``, merged."""
    steps = range(iters) if inc else range(1)
    return _merge((base + i * inc + off, base + i * inc + off + cnt)
                  for i in steps for off, cnt in pieces)


# --- chains ---------------------------------------------------------------------------------

class Edge(NamedTuple):
    """``src`` must run before ``dst`` (chain numbers, ``src < dst``).

    ``kind`` is one of :data:`KINDS`; ``resource`` a space name (``"IVRF"``,
    ``"ASVRF0"``...), ``"NETQ.in"``/``"NETQ.out"`` or ``"REG.<NAME>"``; ``span`` the
    overlapping native-vector addresses as merged ``(start, stop)`` spans (for QUEUE: the
    queue positions of ``src`` and of ``dst``; for registers: empty).
    """
    src: int
    dst: int
    kind: str
    resource: str
    span: tuple = ()

    def describe(self) -> str:
        if self.kind == "QUEUE":
            verb = "pops" if self.resource == QUEUE_IN else "pushes"
            return (f"QUEUE {self.resource}: {verb} {_fmt(self.span[:1])} before "
                    f"{_fmt(self.span[1:])}")
        if not self.span:
            return f"{self.kind} {self.resource}"
        return f"{self.kind} {self.resource}{_fmt(self.span)}"


@dataclass(frozen=True)
class ChainInfo:
    """One chain of a program and everything it touches.

    Attributes
    ----------
    index : chain number (program order, from 0)
    start, stop : instruction indices of its ``v_rd`` and one past its ``end_chain``
    setup : ``((index, Instruction), ...)``: the ``s_wr`` right before it
    instructions : its instructions, ``v_rd`` to ``end_chain``
    iterations, length : ITERATIONS and the logical vector length in native vectors
    inputs : native vectors one iteration reads (the product's columns with a product)
    registers : ``{Reg: value}`` of the registers it reads, as the model sees them
    reg_reads, reg_writes : frozensets of Reg: read by the chain, written by its setup
    reads, writes : ``{resource: spans}`` of vector memories (and ``"MRF"`` tile slots
        in ``reads``), every iteration expanded
    queue_in, queue_out : ``(first, stop)`` input-queue positions it pops, output-queue
        positions it pushes (counted from the start of the run), or None
    parts : ``(text, resource or None, spans)`` per instruction, for display
    """
    index: int
    start: int
    stop: int
    setup: tuple
    instructions: tuple
    iterations: int
    length: int
    inputs: int
    registers: dict
    reg_reads: frozenset
    reg_writes: frozenset
    reads: dict
    writes: dict
    queue_in: tuple | None
    queue_out: tuple | None
    parts: tuple = field(repr=False, default=())

    def summary(self) -> str:
        """``v_rd IVRF[4:8] mv_mul MRF slots 0-7 v_sigm v_wr ASVRF1[0:4]``."""
        words = []
        for text, res, spans in self.parts:
            if res is None:
                words.append(text)
            elif res == MRF:
                slots = ",".join(f"{a}-{b - 1}" for a, b in spans)
                words.append(f"{text} MRF slots {slots}")
            else:
                words.append(f"{text} {res}{_fmt(spans)}")
        return " ".join(words)

    def to_dict(self) -> dict:
        return {
            "index": self.index, "start": self.start, "stop": self.stop,
            "setup": [mnemonic(i) for _, i in self.setup],
            "instructions": [mnemonic(i) for i in self.instructions],
            "summary": self.summary(), "iterations": self.iterations,
            "length": self.length, "inputs": self.inputs,
            "registers": {r.name: v for r, v in sorted(self.registers.items(),
                                                       key=lambda kv: kv[0].value)},
            "reg_writes": sorted(r.name for r in self.reg_writes),
            "reads": {k: [list(s) for s in v] for k, v in self.reads.items()},
            "writes": {k: [list(s) for s in v] for k, v in self.writes.items()},
            "queue_in": None if self.queue_in is None else list(self.queue_in),
            "queue_out": None if self.queue_out is None else list(self.queue_out),
        }


def _defaults(config) -> dict:
    return {r: (config.n if v is None else v) for r, v in REG_DEFAULTS.items()}


def _resolve(program, config):
    """``(fetch, config)`` of a Program, words or Instruction list."""
    if hasattr(program, "instructions") and hasattr(program, "config"):
        config = program.config if config is None else config
        program = program.instructions
    if not isinstance(config, NpuConfig):
        raise TypeError(f"config must be an NpuConfig, not {config!r}")
    items = list(program) if not isinstance(program, np.ndarray) else list(program.ravel())
    cache = {}

    def fetch(i):
        if i >= len(items):
            raise ValueError(f"instruction {i} is past the program's end ({len(items)} "
                             f"instructions) without end")
        if i not in cache:
            item = items[i]
            cache[i] = item if isinstance(item, Instruction) else decode(int(item), i)
        return cache[i]
    return fetch, config


@dataclass(frozen=True)
class _Split:
    chains: list
    trailing: tuple            # (index, Instruction) of the s_wr after the last chain
    final: dict                # registers at ``end``
    end: int                   # index of the ``end``
    config: NpuConfig


def _split(program, config) -> _Split:
    fetch, config = _resolve(program, config)
    regs = _defaults(config)
    limits = register_limits(config)
    setup, out = [], []
    q_in = q_out = 0
    pc = 0
    try:
        while True:
            ins = fetch(pc)
            if ins.opcode is Opcode.END:
                break
            if ins.opcode is Opcode.S_WR:
                lo, hi = limits[ins.func]
                if not lo <= ins.operand <= hi:
                    raise ValueError(f"instruction {pc}: {mnemonic(ins)}: the value must be "
                                     f"from {lo} to {hi}")
                regs[ins.func] = ins.operand
                setup.append((pc, ins))
                pc += 1
            elif ins.opcode is Opcode.V_RD:
                chain = parse_chain(fetch, pc)
                info = _analyse(config, len(out), chain, tuple(setup), regs, fetch, q_in,
                                q_out)
                q_in = info.queue_in[1] if info.queue_in else q_in
                q_out = info.queue_out[1] if info.queue_out else q_out
                out.append(info)
                setup = []
                pc = chain.stop
            else:
                raise ValueError(f"instruction {pc}: {mnemonic(ins)} outside a chain")
    except IsaError as exc:
        raise ValueError(f"illegal program: {exc.message}") from None
    return _Split(out, tuple(setup), dict(regs), pc, config)


def _analyse(config, index, chain, setup, regs, fetch, q_in, q_out) -> ChainInfo:
    n = config.n
    at = chain.start
    length = -(-regs[Reg.ROWS] // n)
    iters = regs[Reg.ITERATIONS]
    if length > config.max_length:
        raise ValueError(f"instruction {at}: ROWS {regs[Reg.ROWS]} needs {length} native "
                         f"vectors, more than max_length {config.max_length}")
    used = {Reg.ROWS, Reg.ITERATIONS}
    # The VRF of every vv operand, by the allocation rule (as the model places them).
    try:
        placed = allocate(chain_mfu_ops(chain), config.mfus, config.unit_sets)
    except ValueError as exc:
        raise ValueError(f"instruction {at}: the chain's ops do not fit the MFUs: "
                         f"{exc}") from None
    vv_spaces = iter([operand_vrf(op.unit, m) for m, ops in enumerate(placed) for op in ops
                      if op.unit in (MfuUnit.ADDSUB, MfuUnit.MUL)])
    for ins in (chain.read,) + chain.writes:
        s = ins.space
        if s is not Space.NETQ and s not in vector_spaces(config):
            raise ValueError(f"instruction {at}: {mnemonic(ins)}: {s.name} does not exist "
                             f"in this build")
    reads, writes, parts = {}, {}, []

    def add(table, res, spans):
        table[res] = _merge(table.get(res, ()) + spans)

    mv = chain.mv_mul
    if mv is not None:
        used.update(_MVM_REGS)
        if regs[Reg.Q_STATIC]:
            used.add(Reg.Q_EXPONENT)
        pix = -(-regs[Reg.COLS] // n)
        win_w, win_h, pitch = regs[Reg.WIN_W], regs[Reg.WIN_H], regs[Reg.WIN_PITCH]
        cols = pix * win_w * win_h
        groups = -(-cols // config.tiles)
        pieces = [(y * pitch + x * pix, pix) for y in range(win_h) for x in range(win_w)]
        slots = _iterated(mv.operand, mv.inc, iters, [(0, length * groups)])
    else:
        cols, pieces, slots = length, [(0, length)], ()
    queue_in = queue_out = None
    rd = chain.read
    if rd.space is Space.NETQ:
        queue_in = (q_in, q_in + iters * cols)
        parts.append(("v_rd", QUEUE_IN, (queue_in,)))
    else:
        spans = _iterated(rd.operand, rd.inc, iters, pieces)
        add(reads, rd.space.name, spans)
        parts.append((mnemonic(rd).split()[0], rd.space.name, spans))
    if mv is not None:
        add(reads, MRF, slots)
        parts.append((mnemonic(mv).split()[0], MRF, slots))
    for ins in chain.ops:
        name = mnemonic(ins).split()[0]
        if ins.opcode is Opcode.VV:
            space = next(vv_spaces)
            spans = _iterated(ins.operand, ins.inc, iters, [(0, length)])
            add(reads, space.name, spans)
            parts.append((name, space.name, spans))
        else:
            parts.append((name, None, ()))
    pushed = 0
    for w in chain.writes:
        if w.space is Space.NETQ:
            pushed += iters * length
            parts.append(("v_wr", QUEUE_OUT, ((q_out + pushed - iters * length,
                                               q_out + pushed),)))
        else:
            spans = _iterated(w.operand, w.inc, iters, [(0, length)])
            add(writes, w.space.name, spans)
            parts.append((mnemonic(w).split()[0], w.space.name, spans))
    if pushed:
        queue_out = (q_out, q_out + pushed)
    parts.append(("end_chain", None, ()))
    instructions = tuple(fetch(i) for i in range(chain.start, chain.stop))
    return ChainInfo(
        index=index, start=chain.start, stop=chain.stop, setup=setup,
        instructions=instructions, iterations=iters, length=length, inputs=cols,
        registers={r: regs[r] for r in used}, reg_reads=frozenset(used),
        reg_writes=frozenset(i.func for _, i in setup), reads=reads, writes=writes,
        queue_in=queue_in, queue_out=queue_out, parts=tuple(parts))


def chains(program, config: NpuConfig | None = None) -> list[ChainInfo]:
    """The chains of ``program`` in execution order, with what each reads and writes.

    ``program`` is a :class:`host.compiler.programs.Program` (its config is used when
    ``config`` is None), an array or list of instruction words, or a list of
    :class:`~host.spec.isa.Instruction`. Execution follows the model: from instruction 0
    to the first ``end``.

    Raises
    ------
    ValueError
        an illegal program (an illegal word, a bad chain, an ``s_wr`` value out of range,
        a VRF the build lacks, ops that do not fit the MFUs, no ``end``), naming the
        instruction.
    TypeError
        ``config`` is not an NpuConfig.
    """
    return _split(program, config).chains


# --- the graph ------------------------------------------------------------------------------

@dataclass
class DepGraph:
    """The dependency graph of a program's chains.

    Attributes
    ----------
    chains : list of ChainInfo
    edges : list of Edge, sorted by ``(dst, src, kind, resource)``
    registers : True when register edges were drawn
    config : NpuConfig
    trailing : ``((index, Instruction), ...)``: ``s_wr`` after the last chain
    final_registers : ``{Reg: value}`` at ``end``
    """
    chains: list
    edges: list
    registers: bool
    config: NpuConfig
    trailing: tuple = ()
    final_registers: dict = field(default_factory=dict)

    def predecessors(self, j: int) -> list[int]:
        return sorted({e.src for e in self.edges if e.dst == j})

    def successors(self, i: int) -> list[int]:
        return sorted({e.dst for e in self.edges if e.src == i})

    def incoming(self, j: int) -> list[Edge]:
        return [e for e in self.edges if e.dst == j]

    def pairs(self) -> set:
        """``{(src, dst)}`` of every edge."""
        return {(e.src, e.dst) for e in self.edges}

    def to_text(self) -> str:
        """One line per chain (what it computes) and one per incoming edge."""
        counts = {k: sum(e.kind == k for e in self.edges) for k in KINDS}
        regs = "register edges drawn" if self.registers else \
            "registers are restored per chain by reorder (no register edges)"
        lines = [f"{len(self.chains)} chains, {len(self.edges)} edges ("
                 + ", ".join(f"{k} {v}" for k, v in counts.items()) + f"); {regs}"]
        for c in self.chains:
            it = f" x{c.iterations}" if c.iterations > 1 else ""
            lines.append(f"chain {c.index} (instructions {c.start}-{c.stop - 1}{it}): "
                         f"{c.summary()}")
            if c.setup:
                lines.append("    setup: " + "; ".join(mnemonic(i) for _, i in c.setup))
            for e in self.incoming(c.index):
                lines.append(f"    after chain {e.src}: {e.describe()}")
        if self.trailing:
            lines.append("trailing setup: " + "; ".join(mnemonic(i) for _, i in self.trailing))
        return "\n".join(lines)

    def to_dot(self) -> str:
        """Graphviz ``digraph``: a node per chain (its summary), an arrow per pair of
        chains labelled with its edges."""
        def q(text):
            return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
        lines = ["digraph deps {", "  node [shape=box, fontname=monospace];"]
        for c in self.chains:
            lines.append(f"  c{c.index} [label={q(f'chain {c.index}: {c.summary()}')}];")
        grouped = {}
        for e in self.edges:
            grouped.setdefault((e.src, e.dst), []).append(e.describe())
        for (s, d), labels in sorted(grouped.items()):
            lines.append(f"  c{s} -> c{d} [label={q(chr(10).join(labels))}];")
        lines.append("}")
        return "\n".join(lines) + "\n"

    def to_json(self) -> str:
        """``{"chains": [...], "edges": [{"src", "dst", "kind", "resource", "span"}],
        "registers": bool}``."""
        return json.dumps({
            "chains": [c.to_dict() for c in self.chains],
            "edges": [{"src": e.src, "dst": e.dst, "kind": e.kind, "resource": e.resource,
                       "span": [list(s) for s in e.span]} for e in self.edges],
            "registers": self.registers,
            "trailing": [mnemonic(i) for _, i in self.trailing],
        })


def _edges(infos, registers: bool) -> list[Edge]:
    edges = []
    for j, cj in enumerate(infos):
        for i in range(j):
            ci = infos[i]
            for kind, a, b in (("RAW", ci.writes, cj.reads), ("WAR", ci.reads, cj.writes),
                               ("WAW", ci.writes, cj.writes)):
                for res in sorted(a.keys() & b.keys()):
                    span = _intersect(a[res], b[res])
                    if span:
                        edges.append(Edge(i, j, kind, res, span))
            if ci.queue_in and cj.queue_in:
                edges.append(Edge(i, j, "QUEUE", QUEUE_IN, (ci.queue_in, cj.queue_in)))
            if ci.queue_out and cj.queue_out:
                edges.append(Edge(i, j, "QUEUE", QUEUE_OUT, (ci.queue_out, cj.queue_out)))
            if registers:
                for kind, a, b in (("RAW", ci.reg_writes, cj.reg_reads),
                                   ("WAR", ci.reg_reads, cj.reg_writes),
                                   ("WAW", ci.reg_writes, cj.reg_writes)):
                    for reg in sorted(a & b, key=lambda r: r.value):
                        edges.append(Edge(i, j, kind, f"REG.{reg.name}"))
    edges.sort(key=lambda e: (e.dst, e.src, KINDS.index(e.kind), e.resource))
    return edges


def dependency_graph(program, config: NpuConfig | None = None, *,
                     registers: bool = False) -> DepGraph:
    """The dependency graph of ``program``'s chains (see the module's rules).

    ``registers``: also draw RAW/WAR/WAW edges on the scalar registers (needed when
    chains are moved with only their own ``s_wr`` group: ``reorder(..., setup="move")``).

    Raises
    ------
    ValueError, TypeError
        as :func:`chains`.
    """
    split = _split(program, config)
    return DepGraph(split.chains, _edges(split.chains, registers), registers, split.config,
                    split.trailing, split.final)


def check_order(graph: DepGraph, order) -> None:
    """Return None when ``order`` (chain numbers, each once) keeps every edge of
    ``graph``; else raise ValueError naming the first broken edge: walking ``order``,
    the first chain placed before a chain it depends on (both chains, the kind and the
    resource).

    Raises
    ------
    ValueError
        ``order`` is not a permutation of the chains, or breaks an edge.
    """
    order = [int(k) for k in order]
    count = len(graph.chains)
    if sorted(order) != list(range(count)):
        raise ValueError(f"order must list each of the {count} chains once, not {order}")
    pos = {k: p for p, k in enumerate(order)}
    for p, j in enumerate(order):
        for e in graph.incoming(j):
            if pos[e.src] > p:
                raise ValueError(f"order puts chain {j} (position {p}) before chain "
                                 f"{e.src} (position {pos[e.src]}), but chain {j} depends "
                                 f"on chain {e.src}: {e.describe()}")


def topological_order(graph: DepGraph, rng=None) -> list[int]:
    """An order that keeps every edge: program order with ``rng`` None, else a random
    one (``rng`` a ``numpy.random.Generator``; each step takes a random ready chain)."""
    count = len(graph.chains)
    preds = {j: set(graph.predecessors(j)) for j in range(count)}
    done, order = set(), []
    while len(order) < count:
        ready = [j for j in range(count) if j not in done and preds[j] <= done]
        pick = ready[0] if rng is None else ready[int(rng.integers(len(ready)))]
        order.append(pick)
        done.add(pick)
    return order


def reorder(program, order, config: NpuConfig | None = None, *, setup: str = "restore",
            check: bool = True) -> np.ndarray:
    """The words (``uint64``) of ``program`` with its chains in ``order``.

    ``setup="restore"`` (default): before each chain, ``s_wr`` for every register the
    chain reads whose value differs from the one it had in the original program; before
    ``end``, ``s_wr`` that leave every register as the original left it. Any order of
    the (register-free) graph then computes what the original computes.
    ``setup="move"``: each chain takes its own ``s_wr`` group along, the trailing group
    stays last; ``order`` must then keep the register edges too.

    ``check``: refuse an order that breaks an edge (of the graph with register edges
    for ``"move"``); ``check=False`` builds it anyway (for experiments).

    Raises
    ------
    ValueError
        an illegal program, a broken order (naming the edge, see :func:`check_order`),
        an unknown ``setup``, a result longer than the build's program memory.
    """
    if setup not in ("restore", "move"):
        raise ValueError(f"setup must be 'restore' or 'move', not {setup!r}")
    graph = dependency_graph(program, config, registers=setup == "move")
    cfg = graph.config
    if check:
        check_order(graph, order)
    else:
        order = [int(k) for k in order]
        if sorted(order) != list(range(len(graph.chains))):
            raise ValueError(f"order must list each of the {len(graph.chains)} chains once, "
                             f"not {order}")
    out = []
    if setup == "move":
        for k in order:
            c = graph.chains[k]
            out += [i for _, i in c.setup] + list(c.instructions)
        out += [i for _, i in graph.trailing]
    else:
        cur = _defaults(cfg)
        for k in order:
            c = graph.chains[k]
            for reg in sorted(c.reg_reads, key=lambda r: r.value):
                if cur[reg] != c.registers[reg]:
                    out.append(Instruction.s_wr(reg, c.registers[reg]))
                    cur[reg] = c.registers[reg]
            out += list(c.instructions)
        for reg in Reg:
            if cur[reg] != graph.final_registers[reg]:
                out.append(Instruction.s_wr(reg, graph.final_registers[reg]))
    out.append(Instruction.end())
    if len(out) > cfg.program_depth:
        raise ValueError(f"the reordered program has {len(out)} instructions, more than "
                         f"program_depth {cfg.program_depth}")
    return encode_program(out)
