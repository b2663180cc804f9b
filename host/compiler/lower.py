"""Lowering: an IR graph (:mod:`host.compiler.ir`) to one NPU program.

One job is one batch row: the program pops the row's native vectors from the input queue,
runs every layer and pushes the result's native vectors to the output queue. The graph
is a DAG: a tensor read by several layers stays in memory until the last of them has run.
The rules (``docs/compiler.md`` section 4):

* **Layout.** Every tensor is a map of ``C`` channels, ``H x W`` pixels (a vector of
  ``F`` features is one pixel of ``F`` channels): a pixel is ``P = ceil(C/N)`` native
  vectors (its channels, zero padded), pixels row major. A map read through a window
  with padding (``Conv``, pools) is stored with the padding materialised around it (a
  ring of zero pixels; of the lowest FP16 for a ``MaxPool``), so the windowed read is a
  plain ``v_rd`` with ``WIN_W``, ``WIN_H``, ``WIN_PITCH``. An image input arrives, and
  a map output leaves, as ``H * W`` rows of ``C`` elements (``Lowered.in_map`` /
  ``out_map``): the runtime moves each batch row between ONNX's channel-major order and
  these pixels (:func:`host.compiler.network.signature_jobs`).
* **Stages.** Each layer is a stage of one or more chains: ``Dense`` and ``Conv`` one
  product chain per output row (or one for the whole map when its addresses advance
  evenly), with stride as ``v_rd_inc``; a ``Dense`` after ``Flatten`` of a map is a
  convolution whose window is the whole map (its weight columns permuted at compile time
  to the device's pixel-major order); pools by separable passes of ``vv_max`` / ``vv_add``
  chains (rows, then columns) and a final multiply for the average; ``Softmax`` two
  chains; element-wise ops one chain without a product. Element-wise ops (unary, ``Clip``,
  ``Affine``, ``Add`` / ``Sub`` / ``Mul`` with a tensor already computed) are fused into
  the chain that produces their input when nothing else reads it and the build's MFUs
  take them.
* **Homes.** A tensor lives where its readers need it: the IVRF for a chain that reads
  it (one copy per ring value), the VRF of the MFU an element-wise op lands in for an
  operand (the producing chain writes it there too, up to ``MAX_WRITES`` places), the
  output queue for the network's output. The graph's input is read straight from the
  queue by its one reader when it can be, else copied into its homes first.
* **Memories.** Weights go to the MRF at the next free tile slot and are quantized once,
  into the image (:func:`host.compiler.image.program_image`); constants (biases, clip
  bounds, reciprocals) once into the VRFs, at the top of each where nothing rewritten per
  job goes; tensors and scratch into the IVRF and VRFs under first-fit allocators that
  free each one after its last reader. A padding ring is
  written once into the image when no other tensor ever uses its addresses, else
  rewritten by chains in every job before the map is produced.
* ``Flatten`` and ``View`` move nothing. ``LSTM`` / ``GRU`` are
  :func:`host.compiler.lower_rnn.emit_recurrent` (``docs/compiler.md`` section 7).

A model the build cannot hold raises :class:`CompileError` naming the layer, the memory
(or limit) and both sizes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from host.compiler.ir import BINARY, ELEMENTWISE, POOLS, RECURRENT, Graph, IRError, window_out
from host.compiler.layers import CompileError, LayerInfo
from host.compiler.lower_rnn import emit_recurrent
from host.compiler.programs import Builder, Ref
from host.spec.config import NpuConfig
from host.spec.isa import MAX_WRITES, Space, operand_vrf, vector_spaces
from host.spec.mfu import MfuOp, MfuUnit, allocate
from host.spec.ops import UnaryOp

__all__ = ["LOWEST", "CompileError", "LayerInfo", "Lowered", "lower", "window_matrix"]

#: The value of the ring around a MaxPool's input: the lowest finite FP16, which never
#: wins a max against a value of the map (and puts no infinity into the MFUs).
LOWEST = -65504.0
_INC_MAX = (1 << 16) - 1          # the instruction's inc field
_ITERATIONS_MAX = 1 << 16


@dataclass
class Lowered:
    """The lowering's result: the program, one :class:`LayerInfo` per IR node (in the
    graph's order), the IVRF high-water mark and the input/output sizes in elements and
    native vectors."""
    program: object
    layers: list
    ivrf_peak: int
    in_features: int
    out_features: int
    in_rows: int = 1            # logical vectors per job (a sequence: its steps; a map:
    out_rows: int = 1           # its pixels), each padded to whole native vectors
    job_vectors: list = field(default_factory=list)   # (Space, addr, data) before each job
    in_map: tuple = None        # (C, H, W) of an input / output kept as a map of several
    out_map: tuple = None       # pixels (its rows are pixels: the runtime transposes), or None

    @property
    def in_vectors(self) -> int:
        n = self.program.config.n
        return self.in_rows * -(-(self.in_features // self.in_rows) // n)


def window_matrix(w, n: int) -> np.ndarray:
    """The MVM matrix (float32 ``(C_out, kh * kw * P * n)``) of a convolution ``w``
    (``(C_out, C_in, kh, kw)``, ``P = ceil(C_in / n)``): columns in the order the window
    gathers its input, pixel by pixel (``ky``, then ``kx``), each pixel's channels zero
    padded to ``P`` native vectors. :func:`host.compiler.programs.conv_matrix` is the
    square-kernel FP16 form.

    Raises
    ------
    ValueError
        ``w`` is not 4-D.
    """
    w = np.asarray(w, np.float32)
    if w.ndim != 4:
        raise ValueError(f"w must have shape (C_out, C_in, kh, kw), not {w.shape}")
    c_out, c_in, kh, kw = w.shape
    p = -(-c_in // n)
    m = np.zeros((c_out, kh, kw, p * n), np.float32)
    m[..., :c_in] = w.transpose(0, 2, 3, 1)
    return m.reshape(c_out, kh * kw * p * n)


# --- memories -----------------------------------------------------------------------------

class _Memory:
    """First-fit allocator of one vector memory, in native vectors, with free, for what
    the program rewrites in every job (tensors, scratch); and, from the top down in the
    ``reserve`` vectors kept for them, the constants written once with the image, which
    therefore never share an address with anything else. Every allocation is recorded
    with its owner (the padding-ring check reads the history)."""

    def __init__(self, space: Space, depth: int, depth_name: str, reserve: int = 0):
        self.space, self.depth, self.depth_name = space, depth, depth_name
        self.reserve = reserve
        self.constants = 0                           # vectors of constants placed
        self.used: list[tuple[int, int]] = []        # (addr, length), sorted
        self.peak = 0
        self.history: list[tuple[int, int, str]] = []

    def _name(self) -> str:
        return "the IVRF" if self.space is Space.IVRF else self.space.name

    def alloc(self, length: int, where: str, what: str = "this layer's result",
              owner: str | None = None) -> Ref:
        addr = 0
        for a, n in self.used:
            if addr + length <= a:
                break
            addr = max(addr, a + n)
        if addr + length > self.depth - self.reserve:
            live = sum(n for _, n in self.used)
            held = f", {self.reserve} held by constants" if self.reserve else ""
            raise CompileError(f"{where}: {self._name()} needs "
                               f"{addr + length + self.reserve} native vectors ({length} for "
                               f"{what}, {live} still live{held}), the build has "
                               f"{self.depth_name} {self.depth}")
        self.used.append((addr, length))
        self.used.sort()
        self.peak = max(self.peak, addr + length)
        self.history.append((addr, length, owner or f"#{len(self.history)}"))
        return Ref(self.space, addr, length)

    def alloc_constant(self, length: int, where: str, what: str) -> Ref:
        """Vectors never freed, one after the other (in address order, as the recurrent
        builders want them) in the ``reserve`` at the top of the memory. Beyond the
        reserve (all of them when it is 0) they overlap the first-fit allocations:
        :func:`lower` then lowers again with the reserve they need."""
        if self.constants + length > self.depth:
            raise CompileError(f"{where}: {self._name()} needs {self.constants + length} "
                               f"native vectors for constants ({length} for {what}), the "
                               f"build has {self.depth_name} {self.depth}")
        base = self.depth - self.reserve if self.reserve else 0
        ref = Ref(self.space, base + self.constants, length)
        self.constants += length
        return ref

    def free(self, ref) -> None:
        if isinstance(ref, Ref) and ref.space is self.space:
            self.used.remove((ref.addr, ref.length))


@dataclass(frozen=True)
class _Map:
    """A tensor's layout on the device: ``c`` channels, ``h x w`` pixels of ``p`` native
    vectors each."""
    c: int
    h: int
    w: int
    p: int

    @property
    def pixels(self) -> int:
        return self.h * self.w


class _Acc(NamedTuple):
    """Where a sweep finds pixel ``(y, x)`` of its grid: ``base + y * row + x * col`` in
    ``target`` (a Space; ``"netq"`` pops / pushes in order)."""
    target: object
    base: int = 0
    row: int = 0
    col: int = 0


@dataclass
class _Home:
    """One stored copy of a tensor: its memory, the padding ring around it (top, left,
    bottom, right pixels, filled with ``fill``) and, once allocated, its ``ref``."""
    space: Space
    shape: _Map
    ring: tuple = (0, 0, 0, 0)
    fill: float = 0.0
    ref: Ref = None

    @property
    def width(self) -> int:
        return self.shape.w + self.ring[1] + self.ring[3]

    @property
    def pitch(self) -> int:
        return self.width * self.shape.p

    @property
    def size(self) -> int:
        return (self.shape.h + self.ring[0] + self.ring[2]) * self.pitch

    def at(self, y: int, x: int) -> int:
        """The first native vector of pixel ``(y, x)`` (negative: in the ring)."""
        return self.ref.addr + ((y + self.ring[0]) * self.width + x + self.ring[1]) \
            * self.shape.p

    def acc(self, y: int = 0, x: int = 0, sy: int = 1, sx: int = 1) -> _Acc:
        """The access of a sweep whose pixel ``(i, j)`` is this map's ``(y + i*sy,
        x + j*sx)``."""
        return _Acc(self.space, self.at(y, x), sy * self.pitch, sx * self.shape.p)

    def ring_runs(self) -> list:
        """The ring's addresses as ``(start, length, count, stride)`` runs (relative to
        the home's first vector): the top rows and the first row's left border, the
        right and left borders between rows, the last row's right border and the bottom
        rows."""
        t, l, b, r = self.ring
        p, wd, h, w = self.shape.p, self.width, self.shape.h, self.shape.w
        runs = []
        if t * wd + l:
            runs.append((0, (t * wd + l) * p, 1, 0))
        if h > 1 and l + r:
            runs.append(((t * wd + l + w) * p, (l + r) * p, h - 1, wd * p))
        if r + b * wd:
            runs.append((((t + h - 1) * wd + l + w) * p, (r + b * wd) * p, 1, 0))
        return runs


@dataclass
class _Const:
    """A constant operand: one value per channel, the same at every pixel (``values``
    ``(C,)``), or one per pixel and channel of the sweep's grid (``(gh, gw, C)``)."""
    values: np.ndarray

    @property
    def uniform(self) -> bool:
        return self.values.ndim == 1


def _const(values, shape: _Map) -> _Const:
    """A constant given per element of a batch row in C-major order (the ONNX order of a
    ``(C, H, W)`` row, or of its flattening) as a :class:`_Const` of the device layout."""
    full = np.asarray(values, np.float64).reshape(shape.c, shape.h, shape.w)
    full = full.transpose(1, 2, 0)
    if np.all(full == full[:1, :1]):
        return _Const(full[0, 0].copy())
    return _Const(full)


def _divisors_up_to(count: int, limit: int) -> int:
    """The largest divisor of ``count`` that is at most ``limit`` (at least 1)."""
    for d in range(min(count, max(limit, 1)), 0, -1):
        if count % d == 0:
            return d
    return 1


def _where(node) -> str:
    """How messages name a stage's layer (the input's copy has none)."""
    return node.where() if node is not None else "the network's input"


def _shape(t) -> list:
    return [None if d is None else int(d) for d in t.shape]


def _native(values, n: int, name: str = "bias") -> np.ndarray:
    """Native vectors of float values, rounded once to FP16 (float64 directly, not through
    float32)."""
    from host.compiler.programs import native
    values = np.asarray(values)
    if values.dtype not in (np.float16, np.float32, np.float64):
        values = values.astype(np.float64)
    return native(values, n, name)


# --- planning -----------------------------------------------------------------------------

def _mfu_ops(ops) -> list:
    """The MfuOps of a chain's op specs (operand addresses do not matter here)."""
    out = []
    for op in ops:
        if op[0] == "vv":
            out.append(MfuOp.binary(op[1], 0))
        elif op[0] == "unary":
            out.append(MfuOp.unary(op[1]))
        else:
            out.append(MfuOp.reduce(op[1]))
    return out


def _spaces(ops, config: NpuConfig) -> list:
    """The VRF each ``vv`` op of a chain reads its operand from (allocation order, with
    the build's unit sets), or raises ValueError when the ops do not fit the MFUs."""
    placed = allocate(_mfu_ops(ops), config.mfus, config.unit_sets)
    return [operand_vrf(op.unit, m) for m, mops in enumerate(placed) for op in mops
            if op.unit in (MfuUnit.ADDSUB, MfuUnit.MUL)]


class _Plan:
    """The stages of a graph, the layout of every tensor and where each one lives."""

    def __init__(self, graph: Graph, config: NpuConfig):
        self.graph, self.config = graph, config
        self.n = config.n
        self.nodes = self._live_nodes()
        if not self.nodes:
            raise CompileError("the graph has no nodes")
        self.root: dict[str, str] = {}
        self.shape: dict[str, _Map] = {}
        self.input = graph.inputs[0]
        self.output = None
        self.stages: list[dict] = []
        self.producer: dict[str, int] = {}       # root -> stage index
        self._layouts()
        self._group()
        self._homes()

    # ..... the nodes that matter ..........................................................

    def _live_nodes(self) -> list:
        need, live = set(self.graph.outputs), []
        for node in reversed(self.graph.nodes):
            if any(o in need for o in node.outputs):
                live.append(node)
                need.update(node.inputs)
        return live[::-1]

    def tiles(self, elements: int) -> int:
        return -(-elements // self.n)

    def flat(self, features: int) -> _Map:
        return _Map(features, 1, 1, self.tiles(features))

    def image(self, c: int, h: int, w: int) -> _Map:
        return _Map(c, h, w, self.tiles(c))

    # ..... layouts ...........................................................................

    def _layouts(self) -> None:
        g = self.graph
        x = g.tensors[self.input]
        windowed = any(nd.op == "Conv" or nd.op in POOLS for nd in self.nodes)
        self.root[self.input] = self.input
        if windowed and len(x.shape) == 4 and x.shape[0] is None:
            # an image: H * W rows of C elements (the runtime moves each batch row from
            # ONNX's channel-major order to pixels, signature "input_layout")
            self.shape[self.input] = self.image(*x.shape[1:])
        else:
            self.shape[self.input] = self.flat(x.features)
        for node in self.nodes:
            out = node.outputs[0]
            if node.op in ("Flatten", "View"):
                self.root[out] = self.root[node.inputs[0]]
                continue
            self.root[out] = out
            xs = self.shape.get(self.root.get(node.inputs[0]))
            t = g.tensors[out]
            if node.op == "Dense":
                self.shape[out] = self.flat(t.features)
            elif node.op == "Conv" or node.op in POOLS:
                _, c, h, w = g.tensors[node.inputs[0]].shape
                if xs != self.image(c, h, w):
                    raise CompileError(f"{node.where()} reads {node.inputs[0]!r} as a "
                                       f"({c}, {h}, {w}) image, but it is laid out as "
                                       f"{xs.pixels} pixel(s) of {xs.c} channels (a "
                                       f"flattened tensor cannot be reshaped back)")
                self.shape[out] = self.image(*t.shape[1:])
            elif node.op in RECURRENT or node.op == "LastStep":
                self.shape[out] = self.flat(int(t.shape[-1]))
            elif node.op == "Softmax":
                if xs.pixels != 1:
                    raise CompileError(f"{node.where()}: Softmax over a map of {xs.pixels} "
                                       f"pixels of {xs.c} channels is not supported (the "
                                       f"reductions need the row's elements packed: "
                                       f"softmax over a flat vector)")
                self.shape[out] = xs
            else:
                if node.op in BINARY:
                    ys = self.shape[self.root[node.inputs[1]]]
                    if ys != xs:
                        raise CompileError(f"{node.where()}: its operands are laid out "
                                           f"differently ({xs} and {ys})")
                self.shape[out] = xs
        self.output = self.root[g.outputs[0]]
        # a root read by the rest of the graph: count its readers (views are not readers)
        self.uses: dict[str, int] = {}
        for node in self.nodes:
            if node.op in ("Flatten", "View"):
                continue
            for i in node.inputs:
                if i in self.root:
                    r = self.root[i]
                    self.uses[r] = self.uses.get(r, 0) + 1
        self.uses[self.output] = self.uses.get(self.output, 0) + 1

    # ..... stages ...........................................................................

    def _check_unary(self, node, name: str) -> None:
        op = UnaryOp[name.upper()]
        if op not in self.config.unary_ops:
            raise CompileError(f"{node.where()} needs the unary function {name}, which the "
                               f"build lacks (unary_ops: "
                               f"{', '.join(o.name.lower() for o in self.config.unary_ops)})")

    def node_ops(self, node, chain: str) -> list:
        """The op specs of an element-wise node whose chain value is the root ``chain``."""
        g, op = self.graph, node.op
        shape = self.shape[chain]
        if op in ELEMENTWISE:
            self._check_unary(node, ELEMENTWISE[op])
            return [("unary", ELEMENTWISE[op])]
        if op in BINARY:
            first = self.root[node.inputs[0]] == chain
            other = self.root[node.inputs[1] if first else node.inputs[0]]
            name = BINARY[op] if op != "Sub" else ("a_sub_b" if first else "b_sub_a")
            return [("vv", name, ("t", other))]
        if op == "Affine":
            x = g.tensors[node.inputs[0]]
            row = [d for d in x.shape if d is not None] if None in x.shape else x.shape[1:]
            ops = []
            for init, name, neutral in ((node.inputs[1], "mul", 1.0),
                                        (node.inputs[2], "add", 0.0)):
                v = g.initializers[init].astype(np.float64)
                if np.all(v == neutral):
                    continue
                full = np.broadcast_to(v.reshape((-1,) + (1,) * (len(row) - 1)), row)
                ops.append(("vv", name, _const(full, shape)))
            return ops
        if op == "Clip":
            lo, hi = node.attrs.get("lo"), node.attrs.get("hi")
            ops = []
            if lo is not None:
                if lo == 0 and UnaryOp.RELU in self.config.unary_ops:
                    ops.append(("unary", "relu"))
                else:
                    ops.append(("vv", "max", _Const(np.full(shape.c, float(lo)))))
            if hi is not None:
                # min(x, hi) = -max(-x, -hi): both negations are exact
                neg = _Const(np.full(shape.c, -1.0))
                ops += [("vv", "mul", neg), ("vv", "max", _Const(np.full(shape.c, -float(hi)))),
                        ("vv", "mul", neg)]
            return ops
        if op == "LeakyRelu":
            return [("vv", "mul", _Const(np.full(shape.c, float(node.attrs["alpha"])))),
                    ("vv", "max", ("t", chain))]
        raise CompileError(f"{node.where()}: the lowering has no rule for {op}")  # validated

    def base_ops(self, st) -> list:
        """The ops of a stage's last chain before any fused op."""
        kind = st["kind"]
        if kind == "mvm":
            b = st["bias"]
            return [("vv", "add", _Const(np.asarray(b, np.float64)))] if b is not None else []
        if kind == "pool":
            return st["final"]
        if kind == "map":
            return st["own"]
        return []

    def _new(self, st: dict) -> dict:
        st.setdefault("ops", [])
        self.stages.append(st)
        self.producer[st["out"]] = len(self.stages) - 1
        return st

    def _fuse(self, node) -> bool:
        """Append an element-wise ``node`` to the stage that produces its input, if that
        stage ends in a chain that can take it: nothing else reads the input, the other
        operand (if any) exists before that stage runs, and the build's MFUs take the
        ops."""
        if node.op == "LeakyRelu":              # reads its input twice: never fused
            return False
        roots = [self.root[i] for i in node.inputs if i in self.root]
        for chain in sorted(set(roots), key=lambda r: -self.producer.get(r, -1)):
            k = self.producer.get(chain)
            if k is None or roots.count(chain) > 1:
                continue
            st = self.stages[k]
            if st["kind"] not in ("mvm", "map", "pool") or st["out"] != chain \
                    or chain == self.output or self.uses.get(chain) != 1:
                continue
            if any(self.producer.get(r, -1) >= k for r in roots if r != chain):
                continue
            ops = self.node_ops(node, chain)
            try:
                _spaces(self.base_ops(st) + st["ops"] + ops, self.config)
            except ValueError:
                continue
            st["ops"] += ops
            st["nodes"].append(node)
            st["out"] = self.root[node.outputs[0]]
            self.producer[st["out"]] = k
            return True
        return False

    def _group(self) -> None:
        g = self.graph
        for node in self.nodes:
            out = self.root[node.outputs[0]]
            if node.op in ("Flatten", "View"):
                continue
            if node.op in RECURRENT or node.op == "LastStep":
                self._plan_recurrent(node)
                continue
            src = self.root[node.inputs[0]]
            k = self.producer.get(src)
            if k is not None and self.stages[k]["kind"] == "rnn" and self.stages[k]["every"]:
                rnn = self.stages[k]["nodes"][-1]
                raise CompileError(f"{node.where()} reads every step of {rnn.where()}: only "
                                   f"its last step (Y_h, or a Gather / Slice of the last step "
                                   f"of Y) can feed further layers, or another LSTM / GRU "
                                   f"(stacked); every step only as the network's output")
            if node.op == "Dense":
                b = g.initializers[node.inputs[2]] if len(node.inputs) > 2 else None
                xs = self.shape[src]
                self._new({"kind": "mvm", "nodes": [node], "src": src, "out": out, "bias": b,
                           "kernel": (xs.h, xs.w), "strides": (1, 1), "pads": (0, 0, 0, 0)})
            elif node.op == "Conv":
                b = g.initializers[node.inputs[2]] if len(node.inputs) > 2 else None
                w = g.initializers[node.inputs[1]]
                self._new({"kind": "mvm", "nodes": [node], "src": src, "out": out, "bias": b,
                           "kernel": tuple(w.shape[2:]), "strides": node.attrs["strides"],
                           "pads": node.attrs["pads"],
                           "fill": float(node.attrs.get("pad_value", 0.0))})
            elif node.op in POOLS:
                self._new(self._pool_stage(node, src, out))
            elif node.op == "Softmax":
                for fn in ("exp", "recip"):
                    self._check_unary(node, fn)
                self._new({"kind": "softmax", "nodes": [node], "src": src, "out": out})
            else:
                if self._fuse(node):
                    continue
                # standalone: the chain reads the input produced last, the other (if any)
                # is the operand
                roots = [self.root[i] for i in node.inputs if i in self.root]
                chain = max(roots, key=lambda r: self.producer.get(r, -1))
                self._new({"kind": "map", "nodes": [node], "src": chain, "out": out,
                           "own": self.node_ops(node, chain)})
        if not self.stages:
            raise CompileError("the graph computes nothing (only Flatten)")

    def _plan_recurrent(self, node) -> None:
        """An ``LSTM`` / ``GRU`` stage (a layer reading the input queue, or stacked on the
        every-step output of the stage before), or the ``LastStep`` that keeps only the
        last step (``docs/compiler.md`` section 7)."""
        g = self.graph
        src = self.root[node.inputs[0]]
        k = self.producer.get(src)
        prev = self.stages[k] if k is not None else None
        if node.op == "LastStep":
            if prev is None or prev["kind"] != "rnn" or not prev["every"]:
                raise CompileError(f"{node.where()}: selecting the last step works only on "
                                   f"the every-step output of an LSTM or GRU")
            prev["every"] = False
            prev["nodes"].append(node)
            prev["out"] = self.root[node.outputs[0]]
            self.producer[prev["out"]] = k
            return
        shift = self._input_shift(k, src)
        if shift is not None:           # the layer's own copy of x adds it (lower_rnn)
            self.stages.pop()
            del self.producer[src]
            src, k, prev = self.input, None, None
        stacked = prev is not None and prev["kind"] == "rnn" and prev["every"] \
            and self.uses.get(src) == 1
        if not stacked and (self.stages or src != self.input):
            raise CompileError(f"{node.where()}: an {node.op} must be the network's first "
                               f"layer (it reads the job's sequence from the input "
                               f"queue) or read another LSTM / GRU's every-step output, "
                               f"not read {node.inputs[0]!r}")
        for fn in ("sigmoid", "tanh"):
            self._check_unary(node, fn)
        w = g.initializers[node.inputs[1]]
        layer = {"node": node, "rows": int(node.attrs["hidden"]), "cols": w.shape[1],
                 "w_arrays": [g.initializers[i] for i in node.inputs[1:]],
                 "x_shift": shift}
        out = self.root[node.outputs[0]]
        if stacked:                      # a stacked layer: one stage, emitted step by step
            prev["layers"].append(layer)
            prev["nodes"].append(node)
            prev["rows"] = layer["rows"]
            prev["out"] = out
            self.producer[out] = k
            return
        self._new({"kind": "rnn", "nodes": [node], "every": True, "layers": [layer],
                   "src": src, "out": out, "w_arrays": layer["w_arrays"],
                   "rows": layer["rows"], "cols": layer["cols"],
                   "steps": int(node.attrs["steps"])})

    def _input_shift(self, k, src: str) -> float | None:
        """The shift of ``Affine`` nodes of the network input with scale 1 and, all but
        one shift 0, one nonzero FP16 shift (calibration's input offset,
        ``docs/calibration.md`` section 8; an exported one comes back as a ``Mul`` by
        ones and an ``Add``) when they are the only stage so far (stage ``k``) and only
        a recurrent layer reads them (as ``src``, through ``View`` nodes); else None.
        Adding 0 and multiplying by 1 are exact in FP16 and leave ``x - m`` as it is,
        so the layer's one add of ``-m`` computes the same bits."""
        if k is None or k != 0 or len(self.stages) != 1 or self.uses.get(src) != 1:
            return None
        st = self.stages[0]
        if st["kind"] != "map" or st["src"] != self.input or st["out"] != src \
                or any(nd.op != "Affine" for nd in st["nodes"]):
            return None
        shifts = []
        for nd in st["nodes"]:
            scale, shift = (self.graph.initializers[i].astype(np.float64)
                            for i in nd.inputs[1:])
            if not np.all(scale == 1.0):
                return None
            if np.any(shift != 0.0):
                shifts.append(shift)
        if len(shifts) != 1 or not np.all(shifts[0] == shifts[0].flat[0]):
            return None
        value = float(shifts[0].flat[0])
        return value if float(np.float16(value)) == value else None

    def _pool_stage(self, node, src: str, out: str) -> dict:
        """A pool as separable passes: ``vertical`` (kh > 1) combines ``kh`` rows of the
        input into ``V`` (``oh`` rows of ``Vw = (ow-1)*sw + kw`` pixels), ``horizontal``
        combines ``kw`` pixels of ``V`` (or of the input) with stride ``sw``; the average
        multiplies by the reciprocal count at the end."""
        kh, kw = node.attrs["kernel"]
        sh, sw = node.attrs["strides"]
        t, l, b, r = node.attrs["pads"]
        xs = self.shape[src]
        ys = self.shape[out]
        oh, ow = ys.h, ys.w
        op = "max" if node.op == "MaxPool" else "add"
        vertical = kh > 1
        horizontal = not (kw == 1 and sw == 1)
        final = [("vv", op, ("acc",))] if (kw > 1 or not horizontal) and (kh > 1 or kw > 1) \
            else []
        if node.op == "AveragePool" and kh * kw > 1:
            if node.attrs.get("count_include_pad", 0) and any((t, l, b, r)):
                count = np.full((oh, ow), float(kh * kw))
            else:
                rows = [min(y * sh - t + kh, xs.h) - max(y * sh - t, 0) for y in range(oh)]
                cols = [min(x * sw - l + kw, xs.w) - max(x * sw - l, 0) for x in range(ow)]
                count = np.outer(rows, cols).astype(np.float64)
            recip = np.repeat((1.0 / count)[:, :, None], ys.c, axis=2)
            const = _Const(recip[0, 0].copy()) if np.all(count == count[0, 0]) else \
                _Const(recip)
            final = final + [("vv", "mul", const)]
        return {"kind": "pool", "nodes": [node], "src": src, "out": out, "op": op,
                "kernel": (kh, kw), "strides": (sh, sw), "pads": (t, l, b, r),
                "vertical": vertical, "horizontal": horizontal, "final": final,
                "fill": LOWEST if op == "max" else 0.0}

    # ..... homes ...........................................................................

    def ring_need(self, st) -> tuple:
        """The ring (top, left, bottom, right) a windowed stage reads around its input."""
        kh, kw = st["kernel"]
        sh, sw = st["strides"]
        t, l, b, r = st["pads"]
        xs = self.shape[st["src"]]
        oh = window_out(xs.h, kh, sh, t, b)
        ow = window_out(xs.w, kw, sw, l, r)
        return (t, l, max(0, (oh - 1) * sh + kh - t - xs.h),
                max(0, (ow - 1) * sw + kw - l - xs.w))

    def chains_ops(self, st) -> list:
        """The op lists of the stage's chains whose fit the planning checks: every one
        that reads a tensor operand (and softmax's second chain)."""
        if st["kind"] == "softmax":
            return [[("reduce", "max"), ("vv", "b_sub_a", ("t", st["src"])),
                     ("unary", "exp")],
                    [("reduce", "sum"), ("unary", "recip"), ("vv", "mul", None)]]
        return [self.base_ops(st) + st["ops"]]

    def _collect(self):
        """Who reads what: ``readers[root]`` = ``[(stage, ring or None, fill)]`` for the
        stages whose chains read ``root`` from memory, ``operands[root]`` = ``{space:
        [stage, ...]}`` for the stages that take it as a ``vv`` operand."""
        readers: dict[str, list] = {}
        operands: dict[str, dict] = {}
        for k, st in enumerate(self.stages):
            if not st.get("pop"):
                ring, fill = None, None
                if st["kind"] == "pool" or (st["kind"] == "mvm"
                                            and st["nodes"][0].op == "Conv"):
                    need = self.ring_need(st)
                    if any(need):
                        ring, fill = need, st.get("fill", 0.0)
                readers.setdefault(st["src"], []).append((k, ring, fill))
            for ops in self.chains_ops(st):
                try:
                    spaces = _spaces(ops, self.config)
                except ValueError as exc:
                    raise CompileError(f"{st['nodes'][0].where()}: its chain does not fit "
                                       f"the build's {self.config.mfus} MFUs: {exc}") from None
                for op, space in zip([o for o in ops if o[0] == "vv"], spaces):
                    if isinstance(op[2], tuple) and op[2][0] == "t":
                        operands.setdefault(op[2][1], {}).setdefault(space, []).append(k)
        return readers, operands

    def _homes(self) -> None:
        """Decide where every tensor lives: ``homes[root]``, a list of ``(space, ring,
        fill)`` (IVRF copies first, then VRF copies, then ``("netq", None, None)`` for the
        network's output); ``reads[stage]``, which IVRF copy a stage reads;
        ``last_use[root]``, the last stage that needs ``root``."""
        inp = self.input
        for st in self.stages:
            if st["kind"] == "rnn":
                st["pop"] = True                 # the recurrent emitter pops the sequence
        readers, operands = self._collect()
        if self.stages[0]["kind"] != "rnn":
            rd = readers.get(inp, [])
            if len(rd) == 1 and rd[0][1] is None and inp not in operands \
                    and self._pops(self.stages[rd[0][0]]):
                self.stages[rd[0][0]]["pop"] = True
            else:
                self.stages.insert(0, {"kind": "copy", "nodes": [], "src": inp, "out": inp,
                                       "ops": [], "pop": True})
            readers, operands = self._collect()
        self.producer = {}
        for k, st in enumerate(self.stages):
            self.producer[st["out"]] = k
        for k, st in enumerate(self.stages):
            if st["kind"] != "rnn":
                continue
            out = st["out"]
            st["last"] = out == self.output and self.uses.get(out) == 1
            rnn = st["nodes"][0]
            if st["every"] and not st["last"]:
                raise CompileError(f"{rnn.where()}: its every-step output must be the "
                                   f"network's output")
            if not st["last"] and (out in operands or out == self.output or
                                   any(ring for _, ring, _ in readers.get(out, []))):
                raise CompileError(f"{rnn.where()}: its last step is read as an operand, "
                                   f"through a window, or both as the network's output and "
                                   f"by other layers; only plain reads of an LSTM / GRU "
                                   f"result are supported")
        self.homes: dict[str, list] = {}
        self.reads: dict[int, int] = {}
        self.last_use: dict[str, int] = {}
        for root, rd in readers.items():
            homes = []
            for k, ring, fill in rd:
                if ring is None:
                    continue
                at = next((i for i, h in enumerate(homes) if h[2] == fill), None)
                if at is None:
                    homes.append((Space.IVRF, ring, fill))
                else:
                    merged = tuple(max(a, c) for a, c in zip(homes[at][1], ring))
                    homes[at] = (Space.IVRF, merged, fill)
            if not homes:
                homes.append((Space.IVRF, (0, 0, 0, 0), 0.0))
            for k, ring, fill in rd:
                self.reads[k] = 0 if ring is None else \
                    next(i for i, h in enumerate(homes) if h[2] == fill)
                self.last_use[root] = max(self.last_use.get(root, -1), k)
            self.homes[root] = homes
        for root, spaces in operands.items():
            homes = self.homes.setdefault(root, [])
            for space in sorted(spaces, key=lambda s: s.value):
                homes.append((space, (0, 0, 0, 0), 0.0))
                self.last_use[root] = max([self.last_use.get(root, -1)] + spaces[space])
        if not any(st["kind"] == "rnn" and st["last"] for st in self.stages):
            self.homes.setdefault(self.output, []).append(("netq", None, None))
        for root, homes in self.homes.items():
            if len(homes) > MAX_WRITES:
                head = self.stages[self.producer[root]]["nodes"]
                who = head[0].where() if head else "the network's input"
                raise CompileError(f"{who}: its result is needed in {len(homes)} places "
                                   f"({', '.join(str(h[0]) for h in homes)}), a chain writes "
                                   f"at most {MAX_WRITES}")

    def _pops(self, st) -> bool:
        """Whether a stage can pop its input from the queue (in order, no window)."""
        if st["kind"] == "map":
            return True
        if st["kind"] == "mvm":
            return self.shape[st["src"]].pixels == 1
        return st["kind"] == "rnn"


# --- emission ------------------------------------------------------------------------------

class _Emitter:
    """Emit a :class:`_Plan`'s stages with the allocators; ``fill`` names the homes whose
    rings are rewritten by chains in every job (see :func:`lower`)."""

    def __init__(self, plan: _Plan, fill: set, reserve: dict):
        self.plan, self.config, self.fill = plan, plan.config, fill
        cfg = self.config
        self.n = cfg.n
        self.bld = Builder(cfg)
        self.ivrf = _Memory(Space.IVRF, cfg.ivrf_depth, "ivrf_depth")
        self.vrfs = {s: _Memory(s, cfg.vrf_depth, "vrf_depth", reserve.get(s, 0))
                     for s in vector_spaces(cfg)[1:]}
        self.mems = {Space.IVRF: self.ivrf, **self.vrfs}
        self.slot_next = 0
        self.job_vectors = []
        self.consts: dict = {}
        self.rings: list = []               # (owner, home) with a ring
        self.where_home: dict[str, list] = {}   # root -> [_Home]
        self.infos = {id(nd): LayerInfo(nd.origin[0] or nd.name, nd.origin[1] or nd.op,
                                        _shape(plan.graph.tensors[nd.inputs[0]]),
                                        _shape(plan.graph.tensors[nd.outputs[0]]))
                      for nd in plan.graph.nodes}

    # ..... helpers ...........................................................................

    def account(self, node, space, length: int) -> None:
        if node is not None:
            info = self.infos[id(node)]
            name = space.name if isinstance(space, Space) else str(space)
            info.vrf[name] = info.vrf.get(name, 0) + length

    def vrf(self, space: Space, length: int, where: str, what: str) -> int:
        """Permanent VRF vectors (the recurrent emitter's callback: biases, its state and
        scratch, which nothing else uses)."""
        return self.vrfs[space].alloc_constant(length, where, what).addr

    def check_width(self, node, elements: int, what: str) -> None:
        n = self.n
        if -(-elements // n) > self.config.max_length:
            raise CompileError(f"{node.where()}: its {what} of {elements} elements needs "
                               f"{-(-elements // n)} native vectors, the build's max_length "
                               f"is {self.config.max_length} (N = {n})")

    def const(self, c: _Const, space: Space, g: int, grid, head) -> _Acc:
        """Place a constant (once per value, space and instance length) and return its
        access."""
        n = self.n
        if c.uniform:
            data = np.tile(_native(c.values, n, "constant"), (g, 1))
            key = (space, data.tobytes())
            acc = lambda addr: _Acc(space, addr, 0, 0)
        else:
            data = _native(c.values.reshape(-1, c.values.shape[-1]), n, "constant")
            key = (space, data.tobytes())
            p = len(data) // (grid[0] * grid[1])
            acc = lambda addr: _Acc(space, addr, grid[1] * p, p)
        if key not in self.consts:
            ref = self.mems[space].alloc_constant(len(data), _where(head), "a constant")
            self.bld.program.vectors.append((space, ref.addr, data))
            self.account(head, space, len(data))
            self.consts[key] = ref.addr
        return acc(self.consts[key])

    def home(self, root: str, space) -> _Home:
        return next(h for h in self.where_home[root] if h != "netq" and h.space is space)

    def writes(self, root: str) -> list:
        out = []
        for h in self.where_home.get(root, []):
            out.append(_Acc("netq") if h == "netq" else h.acc())
        return out

    # ..... homes ...........................................................................

    def alloc_homes(self, root: str, head) -> None:
        plan = self.plan
        shape = plan.shape[root]
        homes = []
        for k, (space, ring, fill) in enumerate(plan.homes.get(root, [])):
            if space == "netq":
                homes.append("netq")
                continue
            h = _Home(space, shape, ring, fill)
            owner = f"{root}@{k}"
            h.ref = self.mems[space].alloc(h.size, _where(head), "this layer's result",
                                           owner=owner)
            self.account(head, space, h.size)
            if any(ring):
                self.rings.append((owner, h))
                if owner in self.fill:
                    self.fill_ring(h, head)
                else:
                    # the ring is written once with the image: no other tensor ever uses
                    # these addresses (checked after the emission, see lower())
                    data = np.full((h.size, self.n), np.float16(fill)).view(np.uint16)
                    self.bld.program.vectors.append((space, h.ref.addr, data))
            homes.append(h)
        self.where_home[root] = homes

    def fill_ring(self, h: _Home, head) -> None:
        """Chains that rewrite a home's ring (in every job, before the map is written)."""
        n, cfg = self.n, self.config
        for start, length, count, stride in h.ring_runs():
            size = _divisors_up_to(length, cfg.max_length)
            # any vector memory will do for the constant: the build's last VRF
            src = self.const(_Const(np.full(size * n, h.fill)), vector_spaces(cfg)[-1],
                             1, (1, 1), head)
            src_ref = Ref(src.target, src.base, size)
            dst = h.ref.addr + start
            if size == length:
                self.chain_count(head, 1)
                self.bld.chain(src_ref, rows=size * n, iterations=count,
                               writes=[(Ref(Space.IVRF, dst, size), stride if count > 1
                                        else 0)])
            else:
                for k in range(count):
                    self.chain_count(head, 1)
                    self.bld.chain(src_ref, rows=size * n, iterations=length // size,
                                   writes=[(Ref(Space.IVRF, dst + k * stride, size), size)])

    def chain_count(self, head, k: int) -> None:
        if head is not None:
            self.infos[id(head)].chains += k

    def free_after(self, k: int) -> None:
        for root, last in self.plan.last_use.items():
            if last == k:
                for h in self.where_home.get(root, []):
                    if h != "netq":
                        self.mems[h.space].free(h.ref)

    # ..... the sweep: one pass of chains over a grid of pixels ..........................

    def sweep(self, head, *, grid, channels: int, p: int, read, ops, writes, mv=None,
              static_exponent=None) -> None:
        """Emit the chains of one pass over a ``grid`` of ``(rows, cols)`` pixels of
        ``p`` native vectors: each pixel is read from ``read`` (an :class:`_Acc`), goes
        through ``ops`` (``("vv", op, _Acc | _Const | ("t", root))``, ``("unary", f)``)
        and is written to every :class:`_Acc` of ``writes``. With ``mv = (slot, cols,
        window)`` an instance is one pixel's product (``channels`` its rows); without, an
        instance is ``g`` pixels whose vectors are adjacent in every memory (the largest
        ``g`` dividing the row with ``g * p <= max_length``). The pass is one chain when
        every access advances evenly over the grid, else one chain per row."""
        cfg, n = self.config, self.n
        gh, gw = grid
        spaces = iter(_spaces(ops, cfg))
        placed = []                          # ops with their operand's space
        for op in ops:
            if op[0] != "vv":
                placed.append(op)
                continue
            space, arg = next(spaces), op[2]
            if not isinstance(arg, (_Acc, _Const)) and arg[0] == "t":
                arg = self.home(arg[1], space).acc()
            if isinstance(arg, _Acc) and arg.target is not space:
                raise AssertionError(f"{head.where()}: an operand in {arg.target.name} for "
                                     f"an op that reads {space.name}")
            placed.append(("vv", op[1], space, arg))
        memory = [a for a in [read, *writes] + [op[3] for op in placed if op[0] == "vv"
                                                and isinstance(op[3], _Acc)]
                  if a.target != "netq"]
        g = 1 if mv is not None or any(a.col != p for a in memory) else \
            _divisors_up_to(gw, cfg.max_length // p)
        final = [("vv", op[1], self.const(op[3], op[2], g, grid, head)
                  if isinstance(op[3], _Const) else op[3]) if op[0] == "vv" else op
                 for op in placed]
        accs = [read, *writes, *[op[2] for op in final if op[0] == "vv"]]
        length = g * p
        rows = channels if g == 1 else length * n
        kw = {}
        if mv is not None:
            kw = {"mv_mul": mv[0], "cols": mv[1], "window": mv[2]}
            if static_exponent is not None:
                kw["static_exponent"] = static_exponent

        def emit(shift, count: int, inc) -> None:
            """One chain of ``count`` instances; ``shift(a)``: the first instance's
            offset in access ``a``; ``inc(a)``: the step from one instance to the
            next."""
            def at(a):
                if a.target == "netq":
                    return "netq"
                step = inc(a) if count > 1 else 0
                if step > _INC_MAX:
                    raise CompileError(f"{head.where()}: an address step of {step} native "
                                       f"vectors is beyond the instruction's {_INC_MAX}")
                return (Ref(a.target, a.base + shift(a), length), step)
            chain_ops = [("vv", op[1], *at(op[2])) if op[0] == "vv" else op for op in final]
            self.bld.chain(at(read), rows=rows, ops=chain_ops, writes=[at(a) for a in writes],
                           iterations=count, **kw)
            self.chain_count(head, 1)

        per_row = gw // g
        if per_row == 1:                     # one instance a row: iterate over the rows
            for y in range(0, gh, _ITERATIONS_MAX):
                emit(lambda a, y=y: y * a.row, min(_ITERATIONS_MAX, gh - y), lambda a: a.row)
        elif all(a.target == "netq" or a.row == gw * a.col for a in accs):
            total = gh * per_row             # rows follow each other: one run over all
            for i in range(0, total, _ITERATIONS_MAX):
                emit(lambda a, i=i: i * g * a.col, min(_ITERATIONS_MAX, total - i),
                     lambda a: g * a.col)
        else:
            for y in range(gh):
                emit(lambda a, y=y: y * a.row, per_row, lambda a: g * a.col)


    # ..... stages ...........................................................................

    def run(self) -> None:
        plan = self.plan
        for k, st in enumerate(plan.stages):
            kind = st["kind"]
            head = st["nodes"][0] if st["nodes"] else None
            if kind != "rnn":
                self.alloc_homes(st["out"], head)
            if kind == "mvm":
                if head.op == "Dense":
                    self._emit_dense(k, st)
                else:
                    self._emit_conv(k, st)
            elif kind == "pool":
                self._emit_pool(k, st)
            elif kind == "softmax":
                self._emit_softmax(k, st)
            elif kind == "rnn":
                self._emit_rnn(k, st)
            else:
                self._emit_map(k, st)
            self.free_after(k)

    def source(self, k: int, st):
        """The :class:`_Home` a stage reads (None: it pops the input queue)."""
        if st.get("pop"):
            return None
        return [h for h in self.where_home[st["src"]] if h != "netq"][self.plan.reads[k]]

    def _emit_dense(self, k: int, st) -> None:
        """A ``Dense``: one product chain (a flat input), or a window over the whole map
        it reads through ``Flatten`` (the weight columns permuted to the pixel-major
        layout)."""
        node = st["nodes"][0]
        w = self.plan.graph.initializers[node.inputs[1]]
        xs = self.plan.shape[st["src"]]
        if xs.pixels > 1:
            w = window_matrix(w.reshape(w.shape[0], xs.c, xs.h, xs.w), self.n)
        quant = node.attrs.get("quant") or {}
        self._emit_mvm(k, st, w, static_exponent=quant.get("input_exponent"))

    def _emit_conv(self, k: int, st) -> None:
        """A ``Conv``: one product chain per output row (window ``kw x kh`` over the
        padded map, stride by ``v_rd_inc``), or one for the whole map."""
        node = st["nodes"][0]
        w = self.plan.graph.initializers[node.inputs[1]]
        quant = node.attrs.get("quant") or {}            # a static input exponent (host.quant)
        self._emit_mvm(k, st, window_matrix(w, self.n),
                       static_exponent=quant.get("input_exponent"))

    def _emit_mvm(self, k: int, st, matrix, static_exponent=None) -> None:
        plan, cfg, n = self.plan, self.config, self.n
        node = st["nodes"][0]
        where = node.where()
        xs, ys = plan.shape[st["src"]], plan.shape[st["out"]]
        kh, kw = st["kernel"]
        sh, sw = st["strides"]
        t, l, _, _ = st["pads"]
        rows, c_in = ys.c, xs.c
        self.check_width(node, rows, "result")
        col_tiles = xs.p * kh * kw
        if col_tiles > cfg.max_col_tiles:
            if kh * kw == 1:
                raise CompileError(f"{where}: its input of {c_in} elements needs "
                                   f"{col_tiles} native vectors, the build's max_col_tiles "
                                   f"is {cfg.max_col_tiles} (N = {n})")
            raise CompileError(f"{where}: its {kh} x {kw} window of {c_in}-channel pixels "
                               f"({xs.p} native vector(s) each) needs {col_tiles} column "
                               f"tiles, the build's max_col_tiles is {cfg.max_col_tiles} "
                               f"(N = {n})")
        need = cfg.mvm.slots_needed(-(-rows // n), col_tiles)
        if self.slot_next + need > cfg.mrf_depth:
            raise CompileError(f"{where}: the MRF needs {self.slot_next + need} tile slots "
                               f"({need} for this layer's {rows} x {matrix.shape[1]} matrix, "
                               f"{self.slot_next} for the layers before it), the build has "
                               f"mrf_depth {cfg.mrf_depth}")
        slot = self.bld.matrix(matrix, f"{where} W")
        assert slot == self.slot_next
        self.slot_next += need
        info = self.infos[id(node)]
        info.macs = ys.pixels * rows * c_in * kh * kw
        info.mrf_slots = [slot, need]
        src = self.source(k, st)
        if src is None:
            read = _Acc("netq")
        else:
            read = src.acc(-t, -l, sh, sw)
        window = None if (kh, kw) == (1, 1) else (kw, kh, src.pitch if src else 0)
        self.sweep(node, grid=(ys.h, ys.w), channels=rows, p=ys.p, read=read,
                   ops=self.plan.base_ops(st) + st["ops"], writes=self.writes(st["out"]),
                   mv=(slot, c_in, window), static_exponent=static_exponent)

    def _emit_map(self, k: int, st) -> None:
        """Element-wise ops (or a copy) over a map, pixel rows at a time."""
        xs = self.plan.shape[st["src"]]
        head = st["nodes"][0] if st["nodes"] else None
        src = self.source(k, st)
        read = _Acc("netq") if src is None else src.acc()
        ops = self.plan.base_ops(st) + st["ops"]
        if xs.p > self.config.max_length:
            first = head or next(nd for nd in self.plan.nodes
                                 if self.plan.input in nd.inputs)
            self.check_width(first, xs.c, "input" if head is None or
                             st["src"] == self.plan.input else "result")
        self.sweep(head, grid=(xs.h, xs.w), channels=xs.c, p=xs.p, read=read, ops=ops,
                   writes=self.writes(st["out"]))

    def _emit_pool(self, k: int, st) -> None:
        """A pool by separable passes (``_Plan._pool_stage``): ``V`` combines the ``kh``
        rows of each output row (accumulated in ASVRF0, the last tap written to the IVRF
        for the next pass), ``H`` the ``kw`` pixels of each output pixel (ASVRF0); the
        last chain applies the average's reciprocal and the fused ops and writes the
        result's homes. Padded positions read the ring (0, or ``LOWEST`` for a max)."""
        plan = self.plan
        node = st["nodes"][0]
        where = node.where()
        xs, ys = plan.shape[st["src"]], plan.shape[st["out"]]
        p, lanes = xs.p, xs.p * self.n
        self.check_width(node, xs.c, "pixel")
        kh, kw = st["kernel"]
        sh, sw = st["strides"]
        t, l, _, _ = st["pads"]
        oh, ow = ys.h, ys.w
        src = self.source(k, st)
        scratch = []

        def scratch_map(space, rows, cols, what):
            ref = self.mems[space].alloc(rows * cols * p, where, what)
            self.account(node, space, rows * cols * p)
            scratch.append(ref)
            return _Acc(space, ref.addr, cols * p, p)

        def step(acc):
            return [("vv", st["op"], acc)]

        # The running sums are the first op's operand (of step() and of last()): in the
        # VRF of the first MFU with that op's unit.
        acc_space = _spaces(step(None), self.config)[0]

        def last(acc):
            # the final chain's ops: the accumulation (the plan's ("acc",) placeholder)
            # reads ``acc``, then the reciprocal and the fused ops
            return [("vv", o[1], acc) if o[0] == "vv" and o[2] == ("acc",) else o
                    for o in plan.base_ops(st) + st["ops"]]

        vw = (ow - 1) * sw + kw                # V's columns; V (i, j) combines X (i*sh - t
        if st["vertical"]:                     # + ky, j - l) over ky
            v_as = scratch_map(acc_space, oh, vw, "the pool's row sums")
            if st["horizontal"]:
                v_iv = scratch_map(Space.IVRF, oh, vw, "the pool's row sums")
            for ky in range(kh):
                if ky == 0:
                    ops, wr = [], [v_as]
                elif ky < kh - 1:
                    ops, wr = step(v_as), [v_as]
                elif st["horizontal"]:
                    ops, wr = step(v_as), [v_iv]
                else:
                    ops, wr = last(v_as), self.writes(st["out"])
                self.sweep(node, grid=(oh, vw), channels=lanes, p=p,
                           read=src.acc(ky - t, -l, sh, 1), ops=ops, writes=wr)
            h_src = v_iv if st["horizontal"] else None
        else:
            h_src = src.acc(-t, -l, sh, 1)
        if st["horizontal"]:
            h_as = scratch_map(acc_space, oh, ow, "the pool's sums") if kw > 1 else None
            for kx in range(kw):
                read = _Acc(h_src.target, h_src.base + kx * p, h_src.row, sw * p)
                if kx == kw - 1:
                    ops, wr = last(h_as), self.writes(st["out"])
                elif kx == 0:
                    ops, wr = [], [h_as]
                else:
                    ops, wr = step(h_as), [h_as]
                self.sweep(node, grid=(oh, ow), channels=lanes, p=p, read=read, ops=ops,
                           writes=wr)
        elif not st["vertical"]:               # a 1 x 1 window, stride 1: a copy
            self.sweep(node, grid=(oh, ow), channels=lanes, p=p,
                       read=src.acc(-t, -l, sh, 1), ops=last(None),
                       writes=self.writes(st["out"]))
        for ref in scratch:
            self.mems[ref.space].free(ref)

    def _emit_softmax(self, k: int, st) -> None:
        """``host.compiler.programs.softmax_head``'s two chains on a flat vector."""
        node = st["nodes"][0]
        where = node.where()
        xs = self.plan.shape[st["src"]]
        rows, length = xs.c, xs.p
        self.check_width(node, rows, "input")
        # The operands' VRFs: where the allocation puts each chain's vv op.
        first = [("reduce", "max"), ("vv", "b_sub_a", None), ("unary", "exp")]
        second = [("reduce", "sum"), ("unary", "recip"), ("vv", "mul", None)]
        z_space, e_space = _spaces(first, self.config)[0], _spaces(second, self.config)[0]
        z_iv = self.source(k, st).ref
        z_op = self.home(st["src"], z_space).ref
        e_iv = self.ivrf.alloc(length, where, "exp(z - max)")
        e_op = self.vrfs[e_space].alloc(length, where, "exp(z - max)")
        self.account(node, Space.IVRF, length)
        self.account(node, e_space, length)
        self.bld.chain(Ref(Space.IVRF, z_iv.addr, length), rows=rows,
                       ops=[op if op[0] != "vv" else op[:2] + (z_op,) for op in first],
                       writes=[e_iv, e_op])
        wr = ["netq" if a.target == "netq" else Ref(a.target, a.base, length)
              for a in self.writes(st["out"])]
        self.bld.chain(e_iv, rows=rows,
                       ops=[op if op[0] != "vv" else op[:2] + (e_op,) for op in second],
                       writes=wr)
        self.chain_count(node, 2)
        self.ivrf.free(e_iv)
        self.vrfs[e_space].free(e_op)

    def _emit_rnn(self, k: int, st) -> None:
        # reserve: program memory for the stages after this one (and ``end``), which
        # the emitter leaves when it chooses the steps per run
        result, self.slot_next, rows = emit_recurrent(
            st, self.bld, self.config, self.ivrf, self.vrf, self.account, self.infos,
            self.slot_next, self.job_vectors, source="netq", last=st["last"],
            check_width=self.check_width, reserve=1 + 16 * (len(self.plan.stages) - k - 1))
        self.rnn_rows = rows
        if result != "netq":
            h = _Home(Space.IVRF, self.plan.shape[st["out"]], ref=result)
            self.where_home[st["out"]] = [h]


def lower(graph: Graph, config: NpuConfig) -> Lowered:
    """Lower ``graph`` (one input, one output; a DAG of the IR's ops) to a
    :class:`~host.compiler.programs.Program` for ``config`` (rules: the module's
    docstring, ``docs/compiler.md`` section 4).

    Raises
    ------
    CompileError
        a graph the lowering does not take (an op on a layout it cannot read, such as a
        Softmax over a map of several pixels); a layer wider than the build's
        ``max_length`` or ``max_col_tiles``; a memory (MRF, IVRF, a VRF, the queues,
        program memory) too small; a unary function the build lacks. The message names
        the layer, and for a memory both sizes.
    """
    try:
        graph.validate()
    except IRError as exc:
        raise CompileError(str(exc)) from None
    if len(graph.inputs) != 1 or len(graph.outputs) != 1:
        raise CompileError(f"the lowering takes one input and one output, not "
                           f"{graph.inputs} and {graph.outputs}")
    plan = _Plan(graph, config)
    # What the image writes once must keep its value across jobs. Constants: the first
    # emission tells how many vectors of each VRF they take; the next keeps that many at
    # the top for them. Padding rings: a ring whose addresses another allocation also
    # uses is rewritten by chains in every job instead. Neither changes the IVRF's
    # allocations, so this settles in at most three emissions.
    fill, reserve = set(), {}
    for _ in range(3):
        em = _Emitter(plan, fill, reserve)
        em.run()
        need = {s: m.constants for s, m in em.vrfs.items()}
        clobbered = _clobbered(em)
        if clobbered <= fill and all(need[s] <= reserve.get(s, 0) for s in need):
            break
        fill = fill | clobbered
        reserve = {s: max(need[s], reserve.get(s, 0)) for s in need}
    else:                                                       # pragma: no cover
        raise AssertionError("the memory layout did not settle")
    return _finish(graph, config, plan, em)


def _clobbered(em: _Emitter) -> set:
    """The owners of ring homes whose ring addresses another allocation also uses."""
    out = set()
    for owner, h in em.rings:
        mask = np.zeros(em.ivrf.depth, bool)
        for start, length, count, stride in h.ring_runs():
            for k in range(count):
                a = h.ref.addr + start + k * stride
                mask[a:a + length] = True
        for addr, length, who in em.ivrf.history:
            if who != owner and mask[addr:addr + length].any():
                out.add(owner)
                break
    return out


def _finish(graph: Graph, config: NpuConfig, plan: _Plan, em: _Emitter) -> Lowered:
    program = em.bld.finish()
    n = config.n
    in_features = graph.tensors[graph.inputs[0]].features
    out_features = graph.tensors[graph.outputs[0]].features
    where = f"the network ({len(graph.nodes)} nodes)"
    rnn = [st for st in plan.stages if st["kind"] == "rnn"]
    if rnn and len(program.instructions) > config.program_depth:
        st = rnn[0]
        own, per_run = st["instructions"], st["steps_per_run"]
        raise CompileError(
            f"{st['nodes'][0].where()}: program memory needs {len(program.instructions)} "
            f"instructions ({own} for this layer's {per_run} steps per run, about "
            f"{own // per_run} per step; {len(program.instructions) - own} for the rest), "
            f"the build has program_depth {config.program_depth}")
    if len(program.instructions) > config.program_depth:
        raise CompileError(f"{where}: the program has {len(program.instructions)} "
                           f"instructions, the build has program_depth {config.program_depth}")
    xs, ys = plan.shape[plan.input], plan.shape[plan.output]
    in_rows = rnn[0]["steps"] if rnn else xs.pixels
    out_rows = getattr(em, "rnn_rows", 1) if rnn and rnn[-1]["out"] == plan.output \
        else ys.pixels
    in_vectors = in_rows * -(-(in_features // in_rows) // n)
    runs = max((st.get("runs", 1) for st in rnn), default=1)      # a job's runs (section 7)
    for what, count in (("input", in_vectors // runs), ("output", program.outputs)):
        if count > config.netq_depth:
            each = "one job's" if runs == 1 else f"one run's (of {runs} per job)"
            raise CompileError(f"{where}: {each} {what} is {count} native vectors, the "
                               f"build has netq_depth {config.netq_depth}")
    in_map = (xs.c, xs.h, xs.w) if not rnn and xs.pixels > 1 else None
    rnn_out = bool(rnn) and rnn[-1]["out"] == plan.output
    out_map = (ys.c, ys.h, ys.w) if not rnn_out and ys.pixels > 1 else None
    return Lowered(program, [em.infos[id(nd)] for nd in graph.nodes], em.ivrf.peak,
                   in_features, out_features, in_rows, out_rows, em.job_vectors,
                   in_map, out_map)
