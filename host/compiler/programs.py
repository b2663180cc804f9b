"""A small program builder: chains and memory images for common network layers.

Each generator returns a :class:`Program`: the instructions, the memory image (vectors
for the InitialVrf and MFU VRFs, matrices for the MRF), the input vectors to push and the
number of output vectors to pop. ``program.run(model)`` loads it into an
:class:`~host.model.core.NpuModel` and runs it. The exact arithmetic of each program (which
FP16 operation meets which operand in which order) is stated in its docstring; the tests
recompute it from :mod:`host.numerics.mvm` primitives.

Programs (seed 004, tables 1 to 3): :func:`mlp_layer`, :func:`lstm_sequence` /
:func:`lstm_step`, :func:`gru_step`, :func:`conv1x1`, :func:`conv2d`, :func:`softmax_head`.
Logical sizes need not be multiples of N.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from host.numerics import bfp
from host.spec.config import NpuConfig
from host.spec.formats import Rounding
from host.spec.isa import REG_DEFAULTS, Instruction, Reg, Space, encode_program, mnemonic
from host.spec.mfu import MfuOp, MfuUnit, allocate

__all__ = [
    "Ref", "Program", "Builder", "native", "logical", "mlp_layer", "lstm_sequence",
    "lstm_step", "gru_step", "conv1x1", "conv2d", "softmax_head",
]


def native(x, n: int) -> np.ndarray:
    """FP16 values or bits ``(..., length)`` as native vectors ``(count, n)`` uint16
    (zero padded; leading axes become consecutive vectors)."""
    x = np.asarray(x)
    bits = x.view(np.uint16) if x.dtype == np.float16 else x.astype(np.uint16)
    return bfp.split_vector(bits, n).reshape(-1, n)


def logical(vectors, length: int) -> np.ndarray:
    """Native vectors ``(count, n)`` back to a logical FP16 bit vector of ``length``."""
    v = np.asarray(vectors, np.uint16)
    return v.reshape(-1)[:length]


class Ref(NamedTuple):
    """A logical vector in a memory: ``space``, first native vector ``addr``, ``length``
    in native vectors."""
    space: Space
    addr: int
    length: int


@dataclass
class Program:
    """A program and the memory image it needs.

    Attributes
    ----------
    config : NpuConfig
    instructions : list of Instruction (ending with ``end``)
    vectors : list of ``(Space, addr, uint16 (k, n))`` to write before running
    matrices : list of ``(tile slot, uint16 (rows, cols))`` FP16 matrices for
        ``NpuModel.write_weights``
    inputs : uint16 ``(k, n)`` vectors to push to the input queue
    outputs : native vectors the program pushes to the output queue
    refs : named places of interest (``Ref``) for reading results back
    """
    config: NpuConfig
    instructions: list
    vectors: list = field(default_factory=list)
    matrices: list = field(default_factory=list)
    inputs: np.ndarray = None
    outputs: int = 0
    refs: dict = field(default_factory=dict)

    @property
    def words(self) -> np.ndarray:
        return encode_program(self.instructions)

    @property
    def text(self) -> str:
        return "".join(mnemonic(i) + "\n" for i in self.instructions)

    def load(self, model, rounding=Rounding.NEAREST_EVEN) -> None:
        """Write the image, load the program and push the inputs into ``model``."""
        for space, addr, data in self.vectors:
            model.write(space, addr, data)
        for slot, matrix in self.matrices:
            model.write_weights(slot, matrix, rounding)
        model.load_program(self.words)
        if self.inputs is not None and len(self.inputs):
            model.push_input(self.inputs)

    def run(self, model):
        """:meth:`load`, run; returns ``(RunResult, outputs (count, n) uint16)``."""
        self.load(model)
        result = model.run()
        out = model.pop_output(min(self.outputs, model.output_level))
        return result, out


class Builder:
    """Emits chains, tracks the scalar registers (an ``s_wr`` only when a value changes)
    and allocates memory for the image.

    Raises ``ValueError`` when a memory is full or a vv operand is not in the VRF its op
    is allocated to.
    """

    def __init__(self, config: NpuConfig):
        self.config = config
        self.n = config.n
        self.instructions: list[Instruction] = []
        self._regs = {r: (config.n if v is None else v) for r, v in REG_DEFAULTS.items()}
        self._next = {Space.IVRF: 0}
        for m in range(config.mfus):
            self._next[Space.asvrf(m)] = 0
            self._next[Space.mulvrf(m)] = 0
        self._slot = 0
        self.program = Program(config, self.instructions)
        self._inputs = []

    def tiles(self, elements: int) -> int:
        return -(-elements // self.n)

    def alloc(self, space: Space, length: int) -> Ref:
        """Reserve ``length`` native vectors in ``space``."""
        depth = self.config.ivrf_depth if space is Space.IVRF else self.config.vrf_depth
        addr = self._next[space]
        if addr + length > depth:
            raise ValueError(f"{space.name} is full: {addr} + {length} > {depth}")
        self._next[space] = addr + length
        return Ref(space, addr, length)

    def place(self, space: Space, values) -> Ref:
        """Allocate and fill a logical vector (FP16 values or bits) in ``space``."""
        vectors = native(values, self.n)
        ref = self.alloc(space, len(vectors))
        self.program.vectors.append((space, ref.addr, vectors))
        return ref

    def matrix(self, w) -> int:
        """Place an FP16 matrix ``(rows, cols)`` in the MRF; returns its base tile slot."""
        w = np.asarray(w)
        bits = w.view(np.uint16) if w.dtype == np.float16 else w.astype(np.uint16)
        rows, cols = bits.shape
        need = self.config.mvm.slots_needed(self.tiles(rows), self.tiles(cols))
        if self._slot + need > self.config.mrf_depth:
            raise ValueError(f"the MRF is full: {self._slot} + {need} > "
                             f"{self.config.mrf_depth}")
        slot = self._slot
        self._slot += need
        self.program.matrices.append((slot, bits))
        return slot

    def push(self, values) -> int:
        """Queue input values (FP16 ``(..., length)``); returns the native vectors added."""
        vectors = native(values, self.n)
        self._inputs.append(vectors)
        return len(vectors)

    def set(self, reg: Reg, value: int) -> None:
        if self._regs[reg] != value:
            self.instructions.append(Instruction.s_wr(reg, value))
            self._regs[reg] = value

    def chain(self, read, *, rows: int, mv_mul: int | None = None, cols: int | None = None,
              ops=(), writes=(), iterations: int = 1, window=None) -> None:
        """Emit one chain.

        Parameters
        ----------
        read : Ref, ``(Ref, inc)`` or ``"netq"``
        rows : result length in elements (ROWS)
        mv_mul : base tile slot, or ``(slot, inc)``; ``cols`` (COLS) with it
        ops : sequence of ``("vv", BinaryOp or name, Ref[, inc])``, ``("unary", op)``,
            ``("reduce", op)``
        writes : sequence of Ref, ``(Ref, inc)`` or ``"netq"``
        iterations : ITERATIONS
        window : ``(win_w, win_h, pitch)`` for the MVM input, or None (1 x 1)
        """
        self.set(Reg.ITERATIONS, iterations)
        self.set(Reg.ROWS, rows)
        if mv_mul is not None:
            self.set(Reg.COLS, cols)
            w_w, w_h, pitch = window if window is not None else (1, 1, self._regs[Reg.WIN_PITCH])
            self.set(Reg.WIN_W, w_w)
            self.set(Reg.WIN_H, w_h)
            self.set(Reg.WIN_PITCH, pitch)
        self.instructions.append(self._access(Instruction.v_rd, read))
        if mv_mul is not None:
            slot, inc = mv_mul if isinstance(mv_mul, tuple) else (mv_mul, 0)
            self.instructions.append(Instruction.mv_mul(slot, inc))
        mfu_ops, instrs, refs = [], [], []
        for op in ops:
            kind = op[0]
            if kind == "vv":
                ref, inc = op[2], (op[3] if len(op) > 3 else 0)
                mfu_ops.append(MfuOp.binary(op[1], ref.addr))
                instrs.append(Instruction.vv(op[1], ref.addr, inc))
                refs.append(ref)
            elif kind == "unary":
                mfu_ops.append(MfuOp.unary(op[1]))
                instrs.append(Instruction.unary(op[1]))
            else:
                mfu_ops.append(MfuOp.reduce(op[1]))
                instrs.append(Instruction.reduce(op[1]))
        k = 0
        for m, placed in enumerate(allocate(mfu_ops, self.config.mfus)):
            for op in placed:
                if op.unit in (MfuUnit.ADDSUB, MfuUnit.MUL):
                    want = Space.asvrf(m) if op.unit is MfuUnit.ADDSUB else Space.mulvrf(m)
                    if refs[k].space is not want:
                        raise ValueError(f"operand {k} ({op}) lands in MFU {m} and reads "
                                         f"{want.name}, not {refs[k].space.name}")
                    k += 1
        self.instructions.extend(instrs)
        for w in writes:
            self.instructions.append(self._access(Instruction.v_wr, w))
            if w == "netq":
                self.program.outputs += self.tiles(rows) * iterations
        self.instructions.append(Instruction.end_chain())

    @staticmethod
    def _access(make, target):
        if target == "netq":
            return make(Space.NETQ)
        ref, inc = target if isinstance(target, tuple) and not isinstance(target, Ref) \
            else (target, 0)
        return make(ref.space, ref.addr, inc)

    def finish(self) -> Program:
        """Append ``end`` and return the program."""
        self.instructions.append(Instruction.end())
        if self._inputs:
            self.program.inputs = np.concatenate(self._inputs)
        return self.program


def _f16(x):
    return np.asarray(x, np.float16)


# --- MLP ------------------------------------------------------------------------------------

def mlp_layer(config: NpuConfig, w, b, xs, activation="relu") -> Program:
    """``y = act(W x + b)`` for every row of ``xs`` (a batch from the input queue).

    Per input: ``y = unary(act, binary(ADD, mvm(W, x), b))``, pushed to the output
    queue. One chain, repeated ``len(xs)`` times with ITERATIONS.
    """
    w, b, xs = _f16(w), _f16(b), np.atleast_2d(_f16(xs))
    rows, cols = w.shape
    bld = Builder(config)
    slot = bld.matrix(w)
    bias = bld.place(Space.ASVRF0, b)
    bld.push(xs)
    bld.chain("netq", rows=rows, mv_mul=slot, cols=cols,
              ops=[("vv", "add", bias), ("unary", activation)], writes=["netq"],
              iterations=len(xs))
    return bld.finish()


# --- LSTM (seed 004, table 1) ------------------------------------------------------------------

_GATES = ("f", "i", "o", "c")


def lstm_sequence(config: NpuConfig, weights, xs, h0, c0) -> Program:
    """An LSTM over the sequence ``xs`` (``(T, X)``), state ``h0``, ``c0`` (``(H,)``).

    ``weights`` maps ``"W_f", "W_i", "W_o", "W_c"`` (``(H, X)``), ``"U_f"`` .. ``"U_c"``
    (``(H, H)``) and ``"b_f"`` .. ``"b_c"`` (``(H,)``) to FP16 arrays. For each step, with
    ``+``, ``*`` the FP16 ``binary`` ops and ``mvm`` the MVM::

        xw_k = mvm(W_k, x) + b_k                       k in f, i, o, c
        f = sigmoid(mvm(U_f, h) + xw_f);  fc = f * c
        i = sigmoid(mvm(U_i, h) + xw_i)
        c = tanh(mvm(U_c, h) + xw_c) * i + fc
        o = sigmoid(mvm(U_o, h) + xw_o)
        h = tanh(c) * o                                pushed to the output queue

    Each step's chains run in the order: copy of the next ``x`` from the input queue, the
    gates f, i, o, c (the o product covers the wait of c for f and i), the next step's
    input products for f, i and o, the ``h`` chain, the next step's input product for c
    (``docs/npu.md`` section 4). The input products after c keep the MVM busy while
    the c chain passes the MFU pipeline; the c input product, issued after the ``h``
    chain, keeps it busy while the ``h`` chain does, so that the next step's f gate finds
    ``h`` written. The ``x`` and ``xw`` buffers alternate by step.
    ``refs["h"]``, ``refs["c"]`` hold the final state.
    """
    xs = np.atleast_2d(_f16(xs))
    steps, x_len = xs.shape
    h_len = len(h0)
    bld = Builder(config)
    nt = bld.tiles
    slots = {k: bld.matrix(weights[k]) for k in
             [f"W_{g}" for g in _GATES] + [f"U_{g}" for g in _GATES]}
    bias = {g: bld.place(Space.ASVRF0, weights[f"b_{g}"]) for g in _GATES}
    xw = [{g: bld.alloc(Space.ASVRF0, nt(h_len)) for g in _GATES} for _ in range(2)]
    x = [bld.alloc(Space.IVRF, nt(x_len)) for _ in range(2)]
    h = bld.place(Space.IVRF, h0)
    c = bld.place(Space.MULVRF0, c0)
    i_gate = bld.alloc(Space.MULVRF0, nt(h_len))
    o_gate = bld.alloc(Space.MULVRF0, nt(h_len))
    fc = bld.alloc(Space.ASVRF1, nt(h_len))
    bld.push(xs)

    def copy(t):
        if t < steps:
            bld.chain("netq", rows=x_len, writes=[x[t % 2]])

    def product(t, g):
        if t < steps:
            bld.chain(x[t % 2], rows=h_len, mv_mul=slots[f"W_{g}"], cols=x_len,
                      ops=[("vv", "add", bias[g])], writes=[xw[t % 2][g]])

    copy(0)
    for g in _GATES:
        product(0, g)
    for t in range(steps):
        p = t % 2

        def gate(g, ops, out):
            bld.chain(h, rows=h_len, mv_mul=slots[f"U_{g}"], cols=h_len,
                      ops=[("vv", "add", xw[p][g])] + ops, writes=[out])

        copy(t + 1)
        # o before c: c needs f and i, so a product stands between them and c's.
        gate("f", [("unary", "sigmoid"), ("vv", "mul", c)], fc)
        gate("i", [("unary", "sigmoid")], i_gate)
        gate("o", [("unary", "sigmoid")], o_gate)
        gate("c", [("unary", "tanh"), ("vv", "mul", i_gate), ("vv", "add", fc)], c)
        for g in "fio":
            product(t + 1, g)
        bld.chain(c, rows=h_len, ops=[("unary", "tanh"), ("vv", "mul", o_gate)],
                  writes=[h, "netq"])
        product(t + 1, "c")
    prog = bld.finish()
    prog.refs.update(h=h, c=c)
    return prog


def lstm_step(config: NpuConfig, weights, x, h0, c0) -> Program:
    """One LSTM step (:func:`lstm_sequence` with one input)."""
    return lstm_sequence(config, weights, np.atleast_2d(_f16(x)), h0, c0)


# --- GRU ------------------------------------------------------------------------------------

def gru_step(config: NpuConfig, weights, x, h0) -> Program:
    """One GRU step. ``weights``: ``"W_z", "W_r", "W_n"`` (``(H, X)``), ``"U_z", "U_r",
    "U_n"`` (``(H, H)``), ``"b_z", "b_r", "b_n", "b_hn"`` (``(H,)``)::

        xw_k = mvm(W_k, x) + b_k                       k in z, r, n
        z = sigmoid(mvm(U_z, h) + xw_z)
        r = sigmoid(mvm(U_r, h) + xw_r)
        n = tanh((mvm(U_n, h) + b_hn) * r + xw_n)
        h' = (h - n) * z + n                           pushed to the output queue

    (``vv_b_sub_a`` forms ``h - n`` with the chain value ``n`` as ``a``.)
    ``refs["h"]`` holds ``h'``.
    """
    x = _f16(x)
    x_len, h_len = len(x), len(h0)
    bld = Builder(config)
    nt = bld.tiles
    slots = {k: bld.matrix(weights[k]) for k in
             ("W_z", "W_r", "W_n", "U_z", "U_r", "U_n")}
    bias = {k: bld.place(Space.ASVRF0, weights[f"b_{k}"]) for k in ("z", "r", "n", "hn")}
    xw = {"z": bld.alloc(Space.ASVRF0, nt(h_len)), "r": bld.alloc(Space.ASVRF0, nt(h_len)),
          "n": bld.alloc(Space.ASVRF1, nt(h_len))}
    xv = bld.alloc(Space.IVRF, nt(x_len))
    h = bld.place(Space.IVRF, h0)
    h_op = bld.place(Space.ASVRF0, h0)              # h as an add/sub operand
    z = bld.alloc(Space.MULVRF0, nt(h_len))
    r = bld.alloc(Space.MULVRF0, nt(h_len))
    n_iv = bld.alloc(Space.IVRF, nt(h_len))
    n_op = bld.alloc(Space.ASVRF1, nt(h_len))
    bld.push(x)
    bld.chain("netq", rows=x_len, writes=[xv])
    for k in ("z", "r", "n"):
        bld.chain(xv, rows=h_len, mv_mul=slots[f"W_{k}"], cols=x_len,
                  ops=[("vv", "add", bias[k])], writes=[xw[k]])
    for k, out in (("z", z), ("r", r)):
        bld.chain(h, rows=h_len, mv_mul=slots[f"U_{k}"], cols=h_len,
                  ops=[("vv", "add", xw[k]), ("unary", "sigmoid")], writes=[out])
    bld.chain(h, rows=h_len, mv_mul=slots["U_n"], cols=h_len,
              ops=[("vv", "add", bias["hn"]), ("vv", "mul", r), ("vv", "add", xw["n"]),
                   ("unary", "tanh")], writes=[n_iv, n_op])
    bld.chain(n_iv, rows=h_len, ops=[("vv", "b_sub_a", h_op), ("vv", "mul", z),
                                     ("vv", "add", n_op)], writes=[h, h_op, "netq"])
    prog = bld.finish()
    prog.refs.update(h=h)
    return prog


# --- convolutions (seed 004, tables 2 and 3) ------------------------------------------------

def _image(bld: Builder, image) -> tuple[Ref, int]:
    """Store an ``(H, W, C)`` image in the IVRF, pixel by pixel (``ceil(C/N)`` native
    vectors each, row major); returns its Ref and the vectors per pixel."""
    image = _f16(image)
    height, width, ch = image.shape
    pix = bld.tiles(ch)
    vectors = bfp.split_vector(image.view(np.uint16), bld.n).reshape(-1, bld.n)
    ref = bld.alloc(Space.IVRF, len(vectors))
    bld.program.vectors.append((Space.IVRF, ref.addr, vectors))
    return ref, pix


def conv1x1(config: NpuConfig, w, b, image, activation="relu") -> Program:
    """A 1x1 convolution: ``y[p] = act(mvm(W, image[p]) + b)`` for every pixel ``p`` of
    the ``(H, W, C_in)`` image (row major), ``w`` of shape ``(C_out, C_in)``. One chain
    iterated over the pixels with ``v_rd_inc``; the outputs go to the output queue in
    pixel order (``ceil(C_out/N)`` vectors each)."""
    w, b = _f16(w), _f16(b)
    c_out, c_in = w.shape
    bld = Builder(config)
    img, pix = _image(bld, image)
    slot = bld.matrix(w)
    bias = bld.place(Space.ASVRF0, b)
    pixels = image.shape[0] * image.shape[1]
    bld.chain((img, pix), rows=c_out, mv_mul=slot, cols=c_in,
              ops=[("vv", "add", bias), ("unary", activation)], writes=["netq"],
              iterations=pixels)
    return bld.finish()


def conv_matrix(w, n: int) -> np.ndarray:
    """The MVM matrix of a ``K x K`` convolution ``w`` (``(C_out, C_in, K, K)``): columns
    ordered (ky, kx, channel padded to whole native vectors), the order the window
    gathers its pixels in."""
    w = _f16(w)
    c_out, c_in, k, _ = w.shape
    pix = -(-c_in // n)
    m = np.zeros((c_out, k, k, pix * n), np.float16)
    m[..., :c_in] = w.transpose(0, 2, 3, 1)
    return m.reshape(c_out, k * k * pix * n)


def conv2d(config: NpuConfig, w, b, image, stride: int = 1, activation="relu") -> Program:
    """A ``K x K`` convolution with ``stride``, no padding ("valid"), of an ``(H, W, C_in)``
    image: ``y[oy, ox] = act(mvm(conv_matrix(w), patch(oy, ox)) + b)`` where the patch is
    the window's K x K pixels, each padded to whole native vectors with zero lanes. The
    window registers (WIN_W = WIN_H = K, WIN_PITCH = one image row) gather the patch;
    one chain per output row iterates over the row's pixels with ``v_rd_inc`` by
    ``stride`` pixels. Outputs go to the output queue, row major."""
    w, b = _f16(w), _f16(b)
    c_out, c_in, k, _ = w.shape
    height, width = image.shape[:2]
    out_h, out_w = (height - k) // stride + 1, (width - k) // stride + 1
    bld = Builder(config)
    img, pix = _image(bld, image)
    slot = bld.matrix(conv_matrix(w, config.n))
    bias = bld.place(Space.ASVRF0, b)
    for oy in range(out_h):
        start = Ref(Space.IVRF, img.addr + oy * stride * width * pix, pix)
        bld.chain((start, stride * pix), rows=c_out, mv_mul=slot, cols=c_in,
                  ops=[("vv", "add", bias), ("unary", activation)], writes=["netq"],
                  iterations=out_w, window=(k, k, width * pix))
    return bld.finish()


# --- softmax head -----------------------------------------------------------------------------

def softmax_head(config: NpuConfig, w, b, x) -> Program:
    """Logits ``z = mvm(W, x) + b`` and ``softmax(z)`` over the logical vector::

        m = max_reduce(z)                  (broadcast)
        e = exp(z - m)                     (vv_b_sub_a: z from the VRF minus the chain's m)
        s = recip(sum_reduce(e))
        y = s * e                          pushed to the output queue

    The reductions cover exactly ``len(b)`` elements (``host.numerics.reduction``'s tree).
    """
    w, b, x = _f16(w), _f16(b), _f16(x)
    rows, cols = w.shape
    bld = Builder(config)
    nt = bld.tiles
    slot = bld.matrix(w)
    bias = bld.place(Space.ASVRF0, b)
    z_iv = bld.alloc(Space.IVRF, nt(rows))
    z_op = bld.alloc(Space.ASVRF0, nt(rows))
    e_iv = bld.alloc(Space.IVRF, nt(rows))
    e_op = bld.alloc(Space.MULVRF0, nt(rows))
    bld.push(x)
    bld.chain("netq", rows=rows, mv_mul=slot, cols=cols, ops=[("vv", "add", bias)],
              writes=[z_iv, z_op])
    bld.chain(z_iv, rows=rows, ops=[("reduce", "max"), ("vv", "b_sub_a", z_op),
                                    ("unary", "exp")], writes=[e_iv, e_op])
    bld.chain(e_iv, rows=rows, ops=[("reduce", "sum"), ("unary", "recip"),
                                    ("vv", "mul", e_op)], writes=["netq"])
    return bld.finish()
