"""Lowering: a chain of IR layers (:mod:`host.compiler.ir`) to one NPU program.

One job is one batch row: the program pops the row's native vectors from the input queue,
runs every layer and pushes the result's native vectors to the output queue. The rules
(``docs/compiler.md`` section 4):

* ``Dense`` (with the element-wise ops that follow it, as long as the build's MFUs take
  them in one chain) is one chain: ``v_rd`` (the input queue for the first layer, else
  the IVRF), ``mv_mul`` of its matrix, ``vv_add`` of its bias (ASVRF0), the unary ops,
  ``v_wr`` to the IVRF (or the output queue for the last layer).
* Weights are placed in the MRF by a slot allocator (the next free tile slot,
  ``MvmConfig.slots_needed`` slots per matrix) and quantized once, into the image, by the
  reference model's weight quantizer (:func:`host.compiler.image.program_image`).
* Biases are written once into ASVRF0 (the AddSubVrf of MFU 0) by an allocator.
* Intermediate vectors live in the IVRF; a first-fit allocator frees each one after the
  layer that reads it.
* Element-wise ops without a ``Dense`` before them (or ones the previous chain's MFUs
  cannot take) are a chain of their own, without a product.
* ``Softmax`` is :func:`host.compiler.programs.softmax_head`'s two chains: the logits are
  written to the IVRF and ASVRF0; ``max_reduce``, ``vv_b_sub_a``, ``exp`` (to the IVRF and
  MULVRF0); ``sum_reduce``, ``recip``, ``vv_mul``.
* ``Flatten`` and ``View`` move nothing: a job's row is already its flattened elements.
* ``LSTM`` / ``GRU`` (the first layer: a job is one sequence, ``steps`` input vectors of
  ``I`` elements from the input queue) is :func:`host.compiler.programs.emit_lstm` /
  :func:`~host.compiler.programs.emit_gru`, unrolled over the steps. With a ``LastStep``
  after it only the last ``h`` is kept (written to the output queue, or left in the IVRF
  for the next layer); without, every step's ``h`` goes to the output queue (then it
  must be the network's output). The state (``h0``, ``c0``) is written before every job
  (``Lowered.job_vectors``, the image's ``job_memories``); weights and biases once.

A model the build cannot hold raises :class:`CompileError` naming the layer, the memory
(or limit) and both sizes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from host.compiler.ir import ELEMENTWISE, RECURRENT, Graph, IRError
from host.compiler.programs import Builder, Ref
from host.spec.config import NpuConfig
from host.spec.isa import Space
from host.spec.mfu import MfuOp, allocate
from host.spec.ops import UnaryOp

__all__ = ["CompileError", "Lowered", "lower"]


class CompileError(ValueError):
    """A graph the lowering cannot map onto the build; the message names the layer, the
    memory or limit, and both sizes."""


@dataclass
class LayerInfo:
    """What one IR node became (one row of the report)."""
    name: str
    op: str
    input_shape: list
    output_shape: list
    macs: int = 0
    mrf_slots: list = field(default_factory=list)      # [first, count] or []
    vrf: dict = field(default_factory=dict)            # space name -> native vectors
    chains: int = 0

    def to_json(self) -> dict:
        return {"name": self.name, "op": self.op, "input_shape": self.input_shape,
                "output_shape": self.output_shape, "macs": self.macs,
                "mrf_slots": self.mrf_slots, "vrf": self.vrf, "chains": self.chains}


@dataclass
class Lowered:
    """The lowering's result: the program, one :class:`LayerInfo` per IR node, the IVRF
    high-water mark and the input/output sizes in elements and native vectors."""
    program: object
    layers: list
    ivrf_peak: int
    in_features: int
    out_features: int
    in_rows: int = 1            # logical vectors per job (a sequence: its steps), each
    out_rows: int = 1           # padded to whole native vectors
    job_vectors: list = field(default_factory=list)   # (Space, addr, data) before each job

    @property
    def in_vectors(self) -> int:
        n = self.program.config.n
        return self.in_rows * -(-(self.in_features // self.in_rows) // n)


class _Ivrf:
    """First-fit allocator of IVRF native vectors, with free."""

    def __init__(self, depth: int):
        self.depth = depth
        self.used: list[tuple[int, int]] = []        # (addr, length), sorted
        self.peak = 0

    def alloc(self, length: int, where: str) -> Ref:
        addr = 0
        for a, n in self.used:
            if addr + length <= a:
                break
            addr = max(addr, a + n)
        if addr + length > self.depth:
            live = sum(n for _, n in self.used)
            raise CompileError(f"{where}: the IVRF needs {addr + length} native vectors "
                               f"({length} for this layer's result, {live} still live), the "
                               f"build has ivrf_depth {self.depth}")
        self.used.append((addr, length))
        self.used.sort()
        self.peak = max(self.peak, addr + length)
        return Ref(Space.IVRF, addr, length)

    def free(self, ref) -> None:
        if isinstance(ref, Ref) and ref.space is Space.IVRF:
            self.used.remove((ref.addr, ref.length))


def _shape(t) -> list:
    return [None if d is None else int(d) for d in t.shape]



def lower(graph: Graph, config: NpuConfig) -> Lowered:
    """Lower ``graph`` (one input, one output, a chain of nodes each reading the previous
    one's result) to a :class:`~host.compiler.programs.Program` for ``config``.

    Raises
    ------
    CompileError
        a graph that is not one chain; a layer wider than the build's ``max_length`` or
        ``max_col_tiles``; a memory (MRF, IVRF, ASVRF0, the queues, program memory) too
        small; a unary function the build lacks. The message names the layer.
    """
    try:
        graph.validate()
    except IRError as exc:
        raise CompileError(str(exc)) from None
    n = config.n
    tiles = lambda e: -(-e // n)
    nodes = list(graph.nodes)
    if not nodes:
        raise CompileError("the graph has no nodes")
    current = graph.inputs[0]
    for node in nodes:
        if node.inputs[0] != current or len(graph.consumers(current)) != 1:
            raise CompileError(f"{node.where()} reads {node.inputs[0]!r}: the lowering "
                               f"takes one chain of layers, each reading the previous "
                               f"layer's result only")
        current = node.outputs[0]
    if graph.outputs != [current]:
        raise CompileError(f"the graph's output {graph.outputs} is not the last layer's "
                           f"result {current!r}")

    def check_width(node, elements: int, what: str) -> None:
        if tiles(elements) > config.max_length:
            raise CompileError(f"{node.where()}: its {what} of {elements} elements needs "
                               f"{tiles(elements)} native vectors, the build's max_length "
                               f"is {config.max_length} (N = {n})")

    def check_unary(node, name: str) -> None:
        op = UnaryOp[name.upper()]
        if op not in config.unary_ops:
            raise CompileError(f"{node.where()} needs the unary function {name}, which the "
                               f"build lacks (unary_ops: "
                               f"{', '.join(o.name.lower() for o in config.unary_ops)})")

    # --- group the nodes into stages (one chain each, softmax two) -------------------------
    stages = []                       # dicts: kind, node(s), ops, rows, cols
    for node in nodes:
        x = graph.tensors[node.inputs[0]]
        y = graph.tensors[node.outputs[0]]
        prev = stages[-1] if stages else None
        if node.op in ("Flatten", "View"):
            continue
        if node.op == "LastStep":
            if prev is None or prev["kind"] != "rnn" or not prev["every"]:
                raise CompileError(f"{node.where()}: selecting the last step works only on "
                                   f"the every-step output of an LSTM or GRU")
            prev["every"] = False
            prev["nodes"].append(node)
            continue
        if prev is not None and prev["kind"] == "rnn" and prev["every"]:
            rnn = prev["nodes"][0]
            raise CompileError(f"{node.where()} reads every step of {rnn.where()}: only its "
                               f"last step (Y_h, or a Gather / Slice of the last step of Y) "
                               f"can feed further layers; every step only as the network's "
                               f"output")
        if node.op in RECURRENT:
            if stages:
                raise CompileError(f"{node.where()}: an {node.op} must be the network's first "
                                   f"layer (it reads the job's sequence from the input "
                                   f"queue), not read {node.inputs[0]!r}")
            for fn in ("sigmoid", "tanh"):
                check_unary(node, fn)
            w = graph.initializers[node.inputs[1]]
            stages.append({"kind": "rnn", "nodes": [node], "every": True,
                           "w_arrays": [graph.initializers[i] for i in node.inputs[1:]],
                           "rows": int(node.attrs["hidden"]), "cols": w.shape[1],
                           "steps": int(node.attrs["steps"])})
            continue
        if node.op == "Dense":
            w = graph.initializers[node.inputs[1]]
            b = graph.initializers[node.inputs[2]] if len(node.inputs) > 2 else None
            stages.append({"kind": "dense", "nodes": [node], "w": w, "b": b, "unary": [],
                           "rows": w.shape[0], "cols": w.shape[1]})
        elif node.op in ELEMENTWISE:
            name = ELEMENTWISE[node.op]
            check_unary(node, name)
            last = stages[-1] if stages else None
            if last is not None and last["kind"] in ("dense", "unary"):
                ops = ([MfuOp.binary("add", 0)] if last.get("b") is not None else []) + \
                    [MfuOp.unary(u) for u in last["unary"] + [name]]
                try:
                    allocate(ops, config.mfus)
                    last["unary"].append(name)
                    last["nodes"].append(node)
                    continue
                except ValueError:
                    pass
            stages.append({"kind": "unary", "nodes": [node], "unary": [name],
                           "rows": x.features, "cols": None})
        elif node.op == "Softmax":
            check_unary(node, "exp")
            check_unary(node, "recip")
            stages.append({"kind": "softmax", "nodes": [node], "rows": y.features,
                           "cols": None})
        else:                                              # pragma: no cover (validated)
            raise CompileError(f"{node.where()}: the lowering has no rule for {node.op}")
    if not stages:
        raise CompileError("the graph computes nothing (only Flatten)")
    if stages[0]["kind"] == "softmax":                     # logits straight from the queue
        stages.insert(0, {"kind": "unary", "nodes": [], "unary": [],
                          "rows": stages[0]["rows"], "cols": None})

    # --- emit --------------------------------------------------------------------------
    bld = Builder(config)
    ivrf = _Ivrf(config.ivrf_depth)
    vrf_next = {}
    for m in range(config.mfus):
        vrf_next[Space.asvrf(m)] = vrf_next[Space.mulvrf(m)] = 0
    job_vectors = []
    in_rows, out_rows = 1, 1
    infos = {id(nd): LayerInfo(nd.origin[0] or nd.name, nd.origin[1] or nd.op,
                               _shape(graph.tensors[nd.inputs[0]]),
                               _shape(graph.tensors[nd.outputs[0]])) for nd in nodes}
    slot_next = 0

    def vrf(space: Space, length: int, where: str, what: str) -> int:
        start = vrf_next[space]
        if start + length > config.vrf_depth:
            raise CompileError(f"{where}: {space.name} needs {start + length} native vectors "
                               f"({length} for {what}), the build has vrf_depth "
                               f"{config.vrf_depth}")
        vrf_next[space] = start + length
        return start

    def account(node, space: Space, length: int) -> None:
        if node is not None:
            info = infos[id(node)]
            info.vrf[space.name] = info.vrf.get(space.name, 0) + length

    src = "netq"
    for k, st in enumerate(stages):
        if st["kind"] == "rnn":
            src, slot_next, rows_out = _emit_rnn(
                st, bld, config, ivrf, vrf, account, infos, slot_next, job_vectors,
                last=k == len(stages) - 1, check_width=check_width)
            in_rows = st["steps"]
            out_rows = rows_out
            continue
        head = st["nodes"][0] if st["nodes"] else stages[k + 1]["nodes"][0]
        where = head.where()
        rows = st["rows"]
        check_width(head, rows, "result")
        last = k == len(stages) - 1
        feeds_softmax = not last and stages[k + 1]["kind"] == "softmax"
        if st["kind"] == "softmax":
            z_iv, z_op = src
            e_iv = ivrf.alloc(tiles(rows), where)
            account(head, Space.IVRF, tiles(rows))
            e_op = Ref(Space.MULVRF0, vrf(Space.MULVRF0, tiles(rows), where, "exp(z - max)"),
                       tiles(rows))
            account(head, Space.MULVRF0, tiles(rows))
            bld.chain(z_iv, rows=rows, ops=[("reduce", "max"), ("vv", "b_sub_a", z_op),
                                            ("unary", "exp")], writes=[e_iv, e_op])
            ivrf.free(z_iv)
            dst = "netq" if last else ivrf.alloc(tiles(rows), where)
            bld.chain(e_iv, rows=rows, ops=[("reduce", "sum"), ("unary", "recip"),
                                            ("vv", "mul", e_op)], writes=[dst])
            ivrf.free(e_iv)
            infos[id(head)].chains += 2
            src = dst
            continue
        ops, slot, cols = [], None, None
        if st["kind"] == "dense":
            cols = st["cols"]
            if tiles(cols) > config.max_col_tiles:
                raise CompileError(f"{where}: its input of {cols} elements needs "
                                   f"{tiles(cols)} native vectors, the build's "
                                   f"max_col_tiles is {config.max_col_tiles} (N = {n})")
            need = config.mvm.slots_needed(tiles(rows), tiles(cols))
            if slot_next + need > config.mrf_depth:
                raise CompileError(f"{where}: the MRF needs {slot_next + need} tile slots "
                                   f"({need} for this layer's {rows} x {cols} matrix, "
                                   f"{slot_next} for the layers before it), the build has "
                                   f"mrf_depth {config.mrf_depth}")
            slot = bld.matrix(st["w"], f"{where} W")
            assert slot == slot_next
            slot_next += need
            info = infos[id(head)]
            info.macs = rows * cols
            info.mrf_slots = [slot, need]
            if st["b"] is not None:
                addr = vrf(Space.ASVRF0, tiles(rows), where, "its bias")
                bld.program.vectors.append((Space.ASVRF0, addr,
                                            _native(st["b"], n)))
                ops.append(("vv", "add", Ref(Space.ASVRF0, addr, tiles(rows))))
                account(head, Space.ASVRF0, tiles(rows))
        ops += [("unary", u) for u in st["unary"]]
        if last:
            writes = ["netq"]
        elif feeds_softmax:
            sm = stages[k + 1]["nodes"][0]
            z_iv = ivrf.alloc(tiles(rows), sm.where())
            z_op = Ref(Space.ASVRF0, vrf(Space.ASVRF0, tiles(rows), sm.where(), "the logits"),
                       tiles(rows))
            account(sm, Space.IVRF, tiles(rows))
            account(sm, Space.ASVRF0, tiles(rows))
            writes = [z_iv, z_op]
        else:
            writes = [ivrf.alloc(tiles(rows), where)]
        if not feeds_softmax and not last:
            account(head, Space.IVRF, tiles(rows))
        bld.chain(src, rows=rows, mv_mul=slot, cols=cols, ops=ops, writes=writes)
        if st["nodes"]:
            infos[id(head)].chains += 1
        ivrf.free(src)
        src = (writes[0], writes[1]) if feeds_softmax else writes[0]
    program = bld.finish()

    in_features = graph.tensors[graph.inputs[0]].features
    out_features = graph.tensors[graph.outputs[0]].features
    where = f"the network ({len(nodes)} nodes)"
    rnn = [st for st in stages if st["kind"] == "rnn"]
    if rnn and len(program.instructions) > config.program_depth:
        st = rnn[0]
        own = st["instructions"]
        raise CompileError(
            f"{st['nodes'][0].where()}: program memory needs {len(program.instructions)} "
            f"instructions ({own} for this layer's {st['steps']} unrolled steps, about "
            f"{own // st['steps']} per step; {len(program.instructions) - own} for the rest), "
            f"the build has program_depth {config.program_depth}; a sequence this long "
            f"needs a step program run once per time step, which the compiler does not "
            f"make yet")
    if len(program.instructions) > config.program_depth:
        raise CompileError(f"{where}: the program has {len(program.instructions)} "
                           f"instructions, the build has program_depth {config.program_depth}")
    in_vectors = in_rows * tiles(in_features // in_rows)
    for what, count in (("input", in_vectors), ("output", program.outputs)):
        if count > config.netq_depth:
            raise CompileError(f"{where}: one job's {what} is {count} native vectors, the "
                               f"build has netq_depth {config.netq_depth}")
    # the first chain pops the input; a layer that reads more than max_col_tiles or a
    # standalone op wider than max_length was refused above.
    first = stages[0]
    if first["kind"] not in ("dense", "rnn"):
        check_width(first["nodes"][0] if first["nodes"] else stages[1]["nodes"][0],
                    in_features, "input")
    return Lowered(program, [infos[id(nd)] for nd in nodes], ivrf.peak, in_features,
                   out_features, in_rows, out_rows, job_vectors)


class _RnnMemory:
    """The memory callbacks of :func:`host.compiler.programs.emit_lstm` / ``emit_gru``
    over the lowering's allocators: MRF slots checked against ``mrf_depth``, VRF vectors
    against ``vrf_depth``, IVRF by the first-fit allocator; the state goes to the per-job
    vectors. Errors name the layer, the memory and both sizes."""

    def __init__(self, node, bld, config, ivrf, vrf, account, slot_next, job_vectors):
        self.node, self.bld, self.config = node, bld, config
        self.ivrf, self.vrf, self.account = ivrf, vrf, account
        self.slot_next, self.job_vectors = slot_next, job_vectors
        self.first_slot = slot_next
        self.ivrf_refs = []

    def matrix(self, w, name):
        n = self.config.n
        rows, cols = w.shape
        need = self.config.mvm.slots_needed(-(-rows // n), -(-cols // n))
        if self.slot_next + need > self.config.mrf_depth:
            raise CompileError(
                f"{self.node.where()}: the MRF needs {self.slot_next + need} tile slots "
                f"({self.slot_next - self.first_slot + need} so far for this layer's "
                f"matrices, {need} for its {rows} x {cols} {name}; {self.first_slot} for "
                f"the layers before it), the build has mrf_depth {self.config.mrf_depth}")
        slot = self.bld.matrix(w, f"{self.node.where()} {name}")
        assert slot == self.slot_next
        self.slot_next += need
        return slot

    def alloc(self, space, length, what="scratch"):
        where = self.node.where()
        if space is Space.IVRF:
            ref = self.ivrf.alloc(length, where)
            self.ivrf_refs.append(ref)
        else:
            if space not in self.vrf_spaces():
                raise CompileError(f"{where} needs {space.name}, the build has mfus "
                                   f"{self.config.mfus}")
            ref = Ref(space, self.vrf(space, length, where, what), length)
        self.account(self.node, space, length)
        return ref

    def vrf_spaces(self):
        return {Space.asvrf(m) for m in range(self.config.mfus)} | \
            {Space.mulvrf(m) for m in range(self.config.mfus)}

    def place(self, space, values, name="values"):
        data = _native(values, self.config.n)
        ref = self.alloc(space, len(data), name)
        self.bld.program.vectors.append((space, ref.addr, data))
        return ref

    def state(self, space, values, name="state"):
        data = _native(values, self.config.n)
        ref = self.alloc(space, len(data), name)
        self.job_vectors.append((space, ref.addr, data))
        return ref


def _emit_rnn(st, bld, config, ivrf, vrf, account, infos, slot_next, job_vectors, *, last,
              check_width):
    """Emit an LSTM / GRU stage; returns (where its result is, next MRF slot, output
    rows per job)."""
    from host.compiler.programs import emit_gru, emit_lstm
    node = st["nodes"][0]
    graph_w = st["w_arrays"]
    hidden, size, steps = st["rows"], st["cols"], st["steps"]
    check_width(node, hidden, "state")
    n = config.n
    for what, cols in (("input", size), ("state", hidden)):
        if -(-cols // n) > config.max_col_tiles:
            raise CompileError(f"{node.where()}: its {what} of {cols} elements needs "
                               f"{-(-cols // n)} native vectors, the build's max_col_tiles "
                               f"is {config.max_col_tiles} (N = {n})")
    w, r, b, h0 = graph_w[:4]
    gates = "fioc" if node.op == "LSTM" else "zrn"
    wts = {}
    for k, g in enumerate(gates):
        wts[f"W_{g}"] = w[k * hidden:(k + 1) * hidden]
        wts[f"U_{g}"] = r[k * hidden:(k + 1) * hidden]
        wts[f"b_{g}"] = b[k * hidden:(k + 1) * hidden]
    mem = _RnnMemory(node, bld, config, ivrf, vrf, account, slot_next, job_vectors)
    every = st["every"]
    final = ["netq"] if last and not every else []
    start = len(bld.instructions)
    if node.op == "LSTM":
        refs = emit_lstm(bld, mem, wts, steps, size, hidden, h0, graph_w[4],
                         step_writes=["netq"] if every else [], final_writes=final)
    else:
        lbr = bool(node.attrs.get("linear_before_reset", 0))
        if lbr:
            wts["b_hn"] = b[3 * hidden:]
        refs = emit_gru(bld, mem, wts, steps, size, hidden, h0, linear_before_reset=lbr,
                        step_writes=["netq"] if every else [], final_writes=final)
    st["instructions"] = len(bld.instructions) - start
    info = infos[id(node)]
    info.macs = steps * len(gates) * hidden * (size + hidden)
    info.mrf_slots = [slot_next, mem.slot_next - slot_next]
    info.chains = sum(1 for i in bld.instructions[start:] if i.opcode.name == "END_CHAIN")
    keep = None if last else refs["h"]
    for ref in mem.ivrf_refs:
        if ref != keep:
            ivrf.free(ref)
    return (keep if keep is not None else "netq"), mem.slot_next, (steps if every else 1)


def _native(values, n: int) -> np.ndarray:
    from host.compiler.programs import native
    return native(np.asarray(values, np.float32), n, "bias")
