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

FP16 data (every vector, matrix, bias, image and state argument) goes through
:func:`host.numerics.mvm.fp16_bits`: ``float16``, ``float32`` and ``float64`` arrays are
values, rounded to FP16 to nearest even (a ``RuntimeWarning`` counts those that overflow
to inf); ``uint16`` arrays are FP16 bit patterns; any other dtype (other integers, bool,
object, complex) raises ``TypeError`` naming the argument. Shapes must match exactly
(a bias has the matrix's row count, an input the matrix's column count): a mismatch
raises ``ValueError`` naming both shapes, never pads or truncates. Only the padding of
a logical vector to whole native vectors is implicit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from host.numerics import bfp
from host.numerics.mvm import fp16_bits
from host.spec.config import NpuConfig
from host.spec.formats import MAX_EXPONENT_CODE, MVM_EXP_MAX, ZERO_BLOCK_EXP, Rounding, check_int
from host.spec.isa import (
    REG_DEFAULTS, Instruction, Reg, Space, encode_program, mnemonic, operand_vrf,
    vector_spaces,
)
from host.spec.mfu import MfuOp, MfuUnit, allocate, format_unit_sets

__all__ = [
    "Ref", "Program", "Builder", "native", "logical", "mlp_layer", "lstm_sequence",
    "lstm_step", "gru_step", "conv1x1", "conv2d", "softmax_head", "emit_lstm", "emit_gru",
    "gru_sequence", "lstm_layer", "gru_layer", "RecurrentLayer", "LSTM_FUSED", "LSTM_UNFUSED",
    "GRU_FUSED", "GRU_UNFUSED",
]


def native(x, n: int, name: str = "x") -> np.ndarray:
    """FP16 data ``(..., length)`` as native vectors ``(count, n)`` of uint16 bits.

    Each logical vector (last axis) is zero padded to ``ceil(length / n)`` native
    vectors; leading axes become consecutive vectors.

    Parameters
    ----------
    x : float16, float32 or float64 values, or uint16 FP16 bit patterns
        (:func:`host.numerics.mvm.fp16_bits`: floats are rounded to nearest even).
    n : int
        The native dimension.
    name : str
        The argument's name in error messages.

    Raises
    ------
    TypeError
        ``x`` has another dtype (e.g. ``int64``, ``bool``).
    ValueError
        ``x`` is a scalar (no axis).

    Warns
    -----
    RuntimeWarning
        finite float values that overflow to inf in the rounding.

    >>> native(np.float32([1.5, 2, 3.7]), 4)
    array([[15872, 16384, 17254,     0]], dtype=uint16)
    """
    bits = fp16_bits(x, name)
    if bits.ndim == 0:
        raise ValueError(f"{name} must have at least one axis (..., length), not a scalar")
    return bfp.split_vector(bits, n).reshape(-1, n)


def logical(vectors, length: int) -> np.ndarray:
    """Native vectors ``(count, n)`` back to a logical FP16 bit vector of ``length``.

    The inverse of :func:`native` for one logical vector: ``count`` must be
    ``ceil(length / n)``, so only the zero padding of the last vector is dropped.

    Raises
    ------
    TypeError
        ``vectors`` is not float (rounded to FP16) or uint16 (bits).
    ValueError
        ``vectors`` is not 2-D, or ``length`` needs another number of native vectors.
    """
    v = fp16_bits(vectors, "vectors")
    if v.ndim != 2:
        raise ValueError(f"vectors must have shape (count, n), not {v.shape}")
    return bfp.merge_vector(v, length)


def _matrix(x, name: str) -> np.ndarray:
    """``x`` as FP16 bits of a non-empty 2-D matrix."""
    bits = fp16_bits(x, name)
    if bits.ndim != 2 or 0 in bits.shape:
        raise ValueError(f"{name} must be a matrix of shape (rows >= 1, cols >= 1), not "
                         f"{bits.shape}")
    return bits


def _vector(x, name: str) -> np.ndarray:
    """``x`` as FP16 bits of a non-empty 1-D vector."""
    bits = fp16_bits(x, name)
    if bits.ndim != 1 or not len(bits):
        raise ValueError(f"{name} must be a vector of shape (length >= 1,), not {bits.shape}")
    return bits


def _sequence(xs) -> np.ndarray:
    """A recurrent layer's inputs ``xs`` as FP16 bits ``(steps, X)``; one input ``(X,)``
    is one step."""
    xs = fp16_bits(xs, "xs")
    if xs.ndim == 1:
        xs = xs[None]
    if xs.ndim != 2 or 0 in xs.shape:
        raise ValueError(f"xs must have shape (X,) or (steps >= 1, X >= 1), not {xs.shape}")
    return xs


def _shaped(x, name: str, shape: tuple, why: str) -> np.ndarray:
    """``x`` as FP16 bits of exactly ``shape``, which ``why`` (e.g. ``w of shape (4, 6)``)
    requires."""
    bits = fp16_bits(x, name)
    if bits.shape != tuple(shape):
        raise ValueError(f"{name} has shape {bits.shape}, but {why} needs shape "
                         f"{tuple(shape)}")
    return bits


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
    matrix_exponents : dict ``{tile slot: int (rows, column tiles)}``
        Block exponents of the matrices placed with calibrated exponents
        (:meth:`Builder.matrix`): their MRF words are those of :meth:`Builder.mrf_words`,
        not those of the device's quantizer
    inputs : uint16 ``(k, n)`` vectors to push to the input queue
    outputs : native vectors the program pushes to the output queue
    refs : named places of interest (``Ref``) for reading results back
    """
    config: NpuConfig
    instructions: list
    vectors: list = field(default_factory=list)
    matrices: list = field(default_factory=list)
    matrix_exponents: dict = field(default_factory=dict)
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
            if slot in self.matrix_exponents:
                addr, words = Builder(self.config).mrf_words(slot, matrix,
                                                             self.matrix_exponents[slot])
                model.write(Space.MRF, addr, words)
            else:
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
        self._next = dict.fromkeys(vector_spaces(config), 0)
        self._slot = 0
        self.program = Program(config, self.instructions)
        self._inputs = []

    def tiles(self, elements: int) -> int:
        return -(-elements // self.n)

    def alloc(self, space: Space, length: int) -> Ref:
        """Reserve ``length`` native vectors in ``space`` (ValueError when it is full or
        does not exist in the build)."""
        if space not in self._next:
            raise ValueError(f"{space.name} does not exist in this build (mfus "
                             f"{self.config.mfus}, unit sets "
                             f"{format_unit_sets(self.config.unit_sets, self.config.mfus)})")
        depth = self.config.ivrf_depth if space is Space.IVRF else self.config.vrf_depth
        addr = self._next[space]
        if addr + length > depth:
            raise ValueError(f"{space.name} is full: {addr} + {length} > {depth}")
        self._next[space] = addr + length
        return Ref(space, addr, length)

    def place(self, space: Space, values, name: str = "values") -> Ref:
        """Allocate and fill a logical vector in ``space``.

        ``values`` is FP16 data ``(..., length)`` as :func:`native` takes it (floats
        rounded to nearest even, uint16 bits); each logical vector is zero padded to whole
        native vectors, leading axes placed one after the other. The caller checks that
        ``length`` is what the program needs (the layer builders do).

        Raises
        ------
        TypeError
            ``values`` has a dtype other than float16/32/64 or uint16 (names ``name``).
        ValueError
            ``values`` is a scalar; ``space`` is full.
        """
        vectors = native(values, self.n, name)
        ref = self.alloc(space, len(vectors))
        self.program.vectors.append((space, ref.addr, vectors))
        return ref

    def matrix(self, w, name: str = "w", exponents=None) -> int:
        """Place an FP16 matrix ``(rows, cols)`` in the MRF; returns its base tile slot.

        ``w`` is float16/32/64 values (rounded to nearest even) or uint16 FP16 bits.
        ``exponents``: None (the device's quantizer makes the MRF words, max-based) or
        calibrated block exponents as :meth:`mrf_words` takes them, recorded in the
        program's ``matrix_exponents``.

        Raises
        ------
        TypeError
            ``w`` has another dtype (the message names ``name``).
        ValueError
            ``w`` is not a non-empty 2-D array; the MRF is full; ``exponents`` as
            :meth:`mrf_words` refuses them.
        """
        bits = _matrix(w, name)
        rows, cols = bits.shape
        need = self.config.mvm.slots_needed(self.tiles(rows), self.tiles(cols))
        if self._slot + need > self.config.mrf_depth:
            raise ValueError(f"the MRF is full: {self._slot} + {need} > "
                             f"{self.config.mrf_depth}")
        slot = self._slot
        if exponents is not None:
            self.mrf_words(slot, bits, exponents, name)            # checks them
            self.program.matrix_exponents[slot] = np.array(exponents, np.int32)
        self._slot += need
        self.program.matrices.append((slot, bits))
        return slot

    def mrf_words(self, slot: int, w, exponents, name: str = "w") -> tuple[int, list]:
        """Raw MRF words of a matrix quantized with the given block exponents, laid out
        from tile slot ``slot`` as :meth:`NpuModel.write_weights
        <host.model.core.NpuModel.write_weights>` lays out the words of the on-chip
        quantizer (tile ``(r, c)`` in slot ``slot + r * G + c // T`` of engine ``c % T``,
        ``G = ceil(C / T)``; one word per tile row).

        For weights calibrated on the host (``host.quant``): the image carries these words
        instead of the ones the device's quantizer would make with dynamic exponents.

        Parameters
        ----------
        slot : int
            The matrix's base tile slot (what :meth:`matrix` returned).
        w : FP16 matrix ``(rows, cols)`` as :meth:`matrix` takes it
        exponents : int array ``(rows, ceil(cols / N))``
            One unbiased exponent per tile row block (``host.quant.weight_exponents``),
            at most 15 (the MVM's limit); all-zero blocks may have any (their words are
            written with -127, as the device's quantizer writes them).
        name : str
            The matrix's name in error messages.

        Returns
        -------
        (addr, words)
            The first MRF word address (``slot * T * N``) and the words of every slot the
            matrix occupies (``slots_needed`` slots; unused engines' words are 0, as in
            :func:`host.compiler.image.program_image`).

        Raises
        ------
        TypeError, ValueError
            ``w`` as :meth:`matrix`; ``exponents`` of another shape, not integers, or
            outside ``[-127, 15]`` (the message names ``name``).
        """
        cfg = self.config
        n, t = self.n, cfg.tiles
        bits = _matrix(w, name)
        rows, cols = bits.shape
        big_r, big_c = self.tiles(rows), self.tiles(cols)
        e = np.asarray(exponents)
        if e.shape != (rows, big_c) or not np.issubdtype(e.dtype, np.integer):
            raise ValueError(f"{name}: exponents must be an integer array of shape "
                             f"({rows}, {big_c}), one per tile row block, not {e.dtype} "
                             f"{e.shape}")
        if e.size and (e.min() < ZERO_BLOCK_EXP or e.max() > MVM_EXP_MAX):
            raise ValueError(f"{name}: block exponents must be from {ZERO_BLOCK_EXP} to "
                             f"{MVM_EXP_MAX}, not {int(e.min())}..{int(e.max())}")
        values = np.zeros((big_r * n, big_c * n), np.float16)
        values[:rows, :cols] = bits.view(np.float16)
        exps = np.full((big_r * n, big_c), ZERO_BLOCK_EXP, np.int32)
        exps[:rows] = e
        exps[~(values.reshape(big_r * n, big_c, n) != 0).any(axis=-1)] = ZERO_BLOCK_EXP
        q = bfp.quantize(values, n, cfg.mantissa_bits_w, Rounding.NEAREST_EVEN, exponent=exps)
        packed = bfp.pack(q).reshape(big_r * n * big_c, -1)
        groups = -(-big_c // t)
        need = cfg.mvm.slots_needed(big_r, big_c)
        words = [0] * (need * t * n)
        for r in range(big_r):
            for c in range(big_c):
                base = ((r * groups + c // t) * t + c % t) * n
                for i in range(n):
                    words[base + i] = int.from_bytes(packed[(r * n + i) * big_c + c].tobytes(),
                                                      "little")
        return slot * t * n, words

    def push(self, values, name: str = "values") -> int:
        """Queue input values (FP16 ``(..., length)`` as :func:`native` takes them, each
        logical vector zero padded to whole native vectors); returns the native vectors
        added.

        Raises
        ------
        TypeError
            ``values`` has a dtype other than float16/32/64 or uint16 (names ``name``).
        ValueError
            ``values`` is a scalar.
        """
        vectors = native(values, self.n, name)
        self._inputs.append(vectors)
        return len(vectors)

    def set(self, reg: Reg, value: int) -> None:
        if self._regs[reg] != value:
            self.instructions.append(Instruction.s_wr(reg, value))
            self._regs[reg] = value

    def chain(self, read, *, rows: int, mv_mul: int | None = None, cols: int | None = None,
              ops=(), writes=(), iterations: int = 1, window=None,
              static_exponent: int | None = None) -> None:
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
        static_exponent : None or int, with ``mv_mul``
            The E8M0 code (0..142) of a static input exponent for the product
            (``Q_STATIC = 1``, ``Q_EXPONENT``); None: the dynamic exponent (``Q_STATIC =
            0``). Registers are written only when they change, so programs without static
            exponents have no extra instruction.
        """
        if mv_mul is not None and static_exponent is not None:
            static_exponent = check_int("static_exponent", static_exponent, 0,
                                        MAX_EXPONENT_CODE)
        self.set(Reg.ITERATIONS, iterations)
        self.set(Reg.ROWS, rows)
        if mv_mul is not None:
            self.set(Reg.Q_STATIC, 0 if static_exponent is None else 1)
            if static_exponent is not None:
                self.set(Reg.Q_EXPONENT, static_exponent)
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
        for m, placed in enumerate(allocate(mfu_ops, self.config.mfus,
                                            self.config.unit_sets)):
            for op in placed:
                if op.unit in (MfuUnit.ADDSUB, MfuUnit.MUL):
                    want = operand_vrf(op.unit, m)
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


# --- MLP ------------------------------------------------------------------------------------

def mlp_layer(config: NpuConfig, w, b, xs, activation="relu") -> Program:
    """``y = act(W x + b)`` for every row of ``xs`` (a batch from the input queue).

    Per input: ``y = unary(act, binary(ADD, mvm(W, x), b))``, pushed to the output
    queue. One chain, repeated ``len(xs)`` times with ITERATIONS.

    Parameters
    ----------
    config : NpuConfig
    w : ``(rows, cols)``
    b : ``(rows,)``
    xs : ``(cols,)`` (one input) or ``(batch, cols)``
    activation : unary op name

    FP16 data as :func:`host.numerics.mvm.fp16_bits` takes it: float16/32/64 values
    (rounded to nearest even) or uint16 bit patterns.

    Raises
    ------
    TypeError
        an FP16 argument of another dtype (the message names it).
    ValueError
        ``b`` or ``xs`` does not match ``w``'s shape (the message names both shapes);
        ``w`` is not a non-empty matrix; ``xs`` is empty.
    """
    w = _matrix(w, "w")
    rows, cols = w.shape
    b = _shaped(b, "b", (rows,), f"w of shape {w.shape}")
    xs = fp16_bits(xs, "xs")
    if not (xs.shape == (cols,) or (xs.ndim == 2 and xs.shape[1] == cols and len(xs))):
        raise ValueError(f"xs has shape {xs.shape}, but w of shape {w.shape} needs inputs "
                         f"of shape ({cols},) or (batch >= 1, {cols})")
    xs = xs.reshape(-1, cols)
    bld = Builder(config)
    slot = bld.matrix(w, "w")
    bias = bld.place(Space.ASVRF0, b, "b")
    bld.push(xs, "xs")
    bld.chain("netq", rows=rows, mv_mul=slot, cols=cols,
              ops=[("vv", "add", bias), ("unary", activation)], writes=["netq"],
              iterations=len(xs))
    return bld.finish()


# --- LSTM (seed 004, table 1) ------------------------------------------------------------------

_GATES = ("f", "i", "o", "c")


def _weights(weights, matrices, biases, h_len: int, x_len: int, sizes: str) -> dict:
    """The FP16 bits of a weight dict: ``W_*`` ``(H, X)``, ``U_*`` ``(H, H)``, ``b_*``
    ``(H,)``; ``sizes`` says where H and X come from, for the messages."""
    missing = [k for k in matrices + biases if k not in weights]
    if missing:
        raise ValueError(f"weights lacks {', '.join(map(repr, missing))}")
    out = {}
    for k in matrices:
        shape = (h_len, x_len) if k.startswith("W_") else (h_len, h_len)
        out[k] = _shaped(weights[k], f"weights[{k!r}]", shape, sizes)
    for k in biases:
        out[k] = _shaped(weights[k], f"weights[{k!r}]", (h_len,), sizes)
    return out


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

    FP16 data (``weights``' arrays, ``xs``, ``h0``, ``c0``) as
    :func:`host.numerics.mvm.fp16_bits` takes it: float16/32/64 values (rounded to
    nearest even) or uint16 bit patterns. ``xs`` may be one input ``(X,)``.

    Raises
    ------
    TypeError
        an FP16 argument of another dtype (the message names it).
    ValueError
        a shape that does not match the others (``c0`` and the biases must have ``h0``'s
        shape ``(H,)``, ``W_*`` must be ``(H, X)``, ``U_*`` ``(H, H)``; the message names
        both shapes); an empty ``xs`` or ``h0``; a missing weight.
    """
    xs = _sequence(xs)
    steps, x_len = xs.shape
    h0 = _vector(h0, "h0")
    h_len = len(h0)
    c0 = _shaped(c0, "c0", h0.shape, f"h0 of shape {h0.shape}")
    wts = _weights(weights, [f"{m}_{g}" for m in "WU" for g in _GATES],
                   [f"b_{g}" for g in _GATES], h_len, x_len,
                   f"h0 of shape {h0.shape} and xs of shape {xs.shape}")
    bld = Builder(config)
    state = emit_lstm(bld, bld, wts, steps, x_len, h_len, h0, c0, step_writes=["netq"])
    bld.push(xs, "xs")
    prog = bld.finish()
    prog.refs.update(h=state["h"], c=state["c"])
    return prog


def lstm_step(config: NpuConfig, weights, x, h0, c0) -> Program:
    """One LSTM step (:func:`lstm_sequence` with one input ``x`` of shape ``(X,)``).

    Raises
    ------
    TypeError, ValueError
        as :func:`lstm_sequence`; ``ValueError`` also when ``x`` is not 1-D.
    """
    x = _vector(x, "x")
    return lstm_sequence(config, weights, x[None], h0, c0)


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

    FP16 data (``weights``' arrays, ``x``, ``h0``) as :func:`host.numerics.mvm.fp16_bits`
    takes it: float16/32/64 values (rounded to nearest even) or uint16 bit patterns.

    Raises
    ------
    TypeError
        an FP16 argument of another dtype (the message names it).
    ValueError
        ``x`` or ``h0`` not a non-empty vector; a weight whose shape does not match them
        (``W_*`` ``(H, X)``, ``U_*`` ``(H, H)``, ``b_*`` ``(H,)``; the message names both
        shapes); a missing weight.
    """
    x = _vector(x, "x")
    h0 = _vector(h0, "h0")
    # Checked here too, so that a refusal names this function's own arguments.
    _weights(weights, ["W_z", "W_r", "W_n", "U_z", "U_r", "U_n"],
             ["b_z", "b_r", "b_n", "b_hn"], len(h0), len(x),
             f"h0 of shape {h0.shape} and x of shape {x.shape}")
    return gru_sequence(config, weights, x[None], h0)


# --- convolutions (seed 004, tables 2 and 3) ------------------------------------------------

def _image(image, channels: int, why: str) -> np.ndarray:
    """``image`` as the FP16 bits of a non-empty ``(H, W, channels)`` image."""
    bits = fp16_bits(image, "image")
    if bits.ndim != 3 or bits.shape[2] != channels or 0 in bits.shape:
        raise ValueError(f"image has shape {bits.shape}, but {why} needs shape "
                         f"(H >= 1, W >= 1, {channels})")
    return bits


def _place_image(bld: Builder, image) -> tuple[Ref, int]:
    """Store an ``(H, W, C)`` image (FP16 bits) in the IVRF, pixel by pixel
    (``ceil(C/N)`` native vectors each, row major); returns its Ref and the vectors per
    pixel."""
    pix = bld.tiles(image.shape[2])
    vectors = bfp.split_vector(image, bld.n).reshape(-1, bld.n)
    ref = bld.alloc(Space.IVRF, len(vectors))
    bld.program.vectors.append((Space.IVRF, ref.addr, vectors))
    return ref, pix


def conv1x1(config: NpuConfig, w, b, image, activation="relu") -> Program:
    """A 1x1 convolution: ``y[p] = act(mvm(W, image[p]) + b)`` for every pixel ``p`` of
    the ``(H, W, C_in)`` image (row major), ``w`` of shape ``(C_out, C_in)``. One chain
    iterated over the pixels with ``v_rd_inc``; the outputs go to the output queue in
    pixel order (``ceil(C_out/N)`` vectors each).

    FP16 data (``w``, ``b``, ``image``) as :func:`host.numerics.mvm.fp16_bits` takes it:
    float16/32/64 values (rounded to nearest even) or uint16 bit patterns.

    Raises
    ------
    TypeError
        an FP16 argument of another dtype (the message names it).
    ValueError
        ``b`` not ``(C_out,)``, ``image`` not ``(H, W, C_in)`` (the message names both
        shapes); ``w`` not a non-empty matrix.
    """
    w = _matrix(w, "w")
    c_out, c_in = w.shape
    b = _shaped(b, "b", (c_out,), f"w of shape {w.shape}")
    image = _image(image, c_in, f"w of shape {w.shape}")
    bld = Builder(config)
    img, pix = _place_image(bld, image)
    slot = bld.matrix(w, "w")
    bias = bld.place(Space.ASVRF0, b, "b")
    pixels = image.shape[0] * image.shape[1]
    bld.chain((img, pix), rows=c_out, mv_mul=slot, cols=c_in,
              ops=[("vv", "add", bias), ("unary", activation)], writes=["netq"],
              iterations=pixels)
    return bld.finish()


def _kernel(w) -> np.ndarray:
    """``w`` as the FP16 bits of a non-empty ``(C_out, C_in, K, K)`` kernel."""
    bits = fp16_bits(w, "w")
    if bits.ndim != 4 or bits.shape[2] != bits.shape[3] or 0 in bits.shape:
        raise ValueError(f"w must have shape (C_out, C_in, K, K), all >= 1, not "
                         f"{bits.shape}")
    return bits


def conv_matrix(w, n: int) -> np.ndarray:
    """The MVM matrix (``float16``) of a ``K x K`` convolution ``w`` (``(C_out, C_in, K,
    K)``): columns ordered (ky, kx, channel padded to whole native vectors), the order
    the window gathers its pixels in.

    Raises
    ------
    TypeError
        ``w`` is not float16/32/64 (values, rounded to nearest even) or uint16 (bits).
    ValueError
        ``w`` does not have the shape ``(C_out, C_in, K, K)``.
    """
    w = _kernel(w)
    n = check_int("n", n, 1)
    c_out, c_in, k, _ = w.shape
    pix = -(-c_in // n)
    m = np.zeros((c_out, k, k, pix * n), np.uint16)
    m[..., :c_in] = w.transpose(0, 2, 3, 1)
    return m.reshape(c_out, k * k * pix * n).view(np.float16)


def conv2d(config: NpuConfig, w, b, image, stride: int = 1, activation="relu") -> Program:
    """A ``K x K`` convolution with ``stride``, no padding ("valid"), of an ``(H, W, C_in)``
    image: ``y[oy, ox] = act(mvm(conv_matrix(w), patch(oy, ox)) + b)`` where the patch is
    the window's K x K pixels, each padded to whole native vectors with zero lanes. The
    window registers (WIN_W = WIN_H = K, WIN_PITCH = one image row) gather the patch;
    one chain per output row iterates over the row's pixels with ``v_rd_inc`` by
    ``stride`` pixels. Outputs go to the output queue, row major.

    FP16 data (``w``, ``b``, ``image``) as :func:`host.numerics.mvm.fp16_bits` takes it:
    float16/32/64 values (rounded to nearest even) or uint16 bit patterns.

    Raises
    ------
    TypeError
        an FP16 argument of another dtype (the message names it); ``stride`` not an int.
    ValueError
        ``w`` not ``(C_out, C_in, K, K)``; ``b`` not ``(C_out,)``; ``image`` not
        ``(H, W, C_in)`` with ``H, W >= K`` (the message names both shapes);
        ``stride < 1``.
    """
    w = _kernel(w)
    c_out, c_in, k, _ = w.shape
    b = _shaped(b, "b", (c_out,), f"w of shape {w.shape}")
    image = _image(image, c_in, f"w of shape {w.shape}")
    stride = check_int("stride", stride, 1)
    height, width = image.shape[:2]
    if height < k or width < k:
        raise ValueError(f"image has shape {image.shape}, but w of shape {w.shape} needs "
                         f"at least {k} x {k} pixels (no padding)")
    out_h, out_w = (height - k) // stride + 1, (width - k) // stride + 1
    bld = Builder(config)
    img, pix = _place_image(bld, image)
    slot = bld.matrix(conv_matrix(w, config.n), "w")
    bias = bld.place(Space.ASVRF0, b, "b")
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

    FP16 data (``w`` ``(rows, cols)``, ``b`` ``(rows,)``, ``x`` ``(cols,)``) as
    :func:`host.numerics.mvm.fp16_bits` takes it: float16/32/64 values (rounded to
    nearest even) or uint16 bit patterns.

    Raises
    ------
    TypeError
        an FP16 argument of another dtype (the message names it).
    ValueError
        ``b`` or ``x`` does not match ``w``'s shape (the message names both shapes);
        ``w`` is not a non-empty matrix.
    """
    w = _matrix(w, "w")
    rows, cols = w.shape
    b = _shaped(b, "b", (rows,), f"w of shape {w.shape}")
    x = _shaped(x, "x", (cols,), f"w of shape {w.shape}")
    bld = Builder(config)
    nt = bld.tiles
    slot = bld.matrix(w, "w")
    bias = bld.place(Space.ASVRF0, b, "b")
    z_iv = bld.alloc(Space.IVRF, nt(rows))
    z_op = bld.alloc(Space.ASVRF0, nt(rows))
    e_iv = bld.alloc(Space.IVRF, nt(rows))
    e_op = bld.alloc(Space.MULVRF0, nt(rows))
    bld.push(x, "x")
    bld.chain("netq", rows=rows, mv_mul=slot, cols=cols, ops=[("vv", "add", bias)],
              writes=[z_iv, z_op])
    bld.chain(z_iv, rows=rows, ops=[("reduce", "max"), ("vv", "b_sub_a", z_op),
                                    ("unary", "exp")], writes=[e_iv, e_op])
    bld.chain(e_iv, rows=rows, ops=[("reduce", "sum"), ("unary", "recip"),
                                    ("vv", "mul", e_op)], writes=["netq"])
    return bld.finish()


# --- recurrent layers inside a larger program (the network compiler) ---------------------------

#: Quantize-once groups (``docs/compiler.md``, "Quantize once"): the gates whose products
#: on ``x`` (first tuple) and on ``h`` (second) share one stacked product, so that the
#: vector is quantized once for them. The unfused forms give every gate its own product.
#: LSTM: ``x`` feeds two stacks (f, i, o and c; one stack of four leaves the schedule one
#: independent product short of hiding the recurrence's waits, 11 % slower at 256), ``h``
#: three (f and i, whose chains differ only in ``f``'s multiply by ``c``: ``i`` is
#: multiplied by exact ones; o; c). GRU: ``x`` one stack of z, r, n; ``h`` z and r.
LSTM_FUSED = (("fio", "c"), ("fi", "o", "c"))
LSTM_UNFUSED = (("f", "i", "o", "c"), ("f", "i", "o", "c"))
GRU_FUSED = (("zrn",), ("zr", "n"))
GRU_UNFUSED = (("z", "r", "n"), ("z", "r", "n"))

_ONE = np.uint16(0x3C00)                      # FP16 1.0


def _check_groups(groups, gates: str, alone: str, what: str) -> tuple:
    """``(x_groups, h_groups)`` as tuples of strings, checked: each a partition of
    ``gates`` in their order of appearance; every ``h`` group inside one ``x`` group (its
    slice of the stacked ``W x + b`` is contiguous); the gates of ``alone`` alone."""
    try:
        xg, hg = (tuple(str(g) for g in part) for part in groups)
    except (TypeError, ValueError):
        raise ValueError(f"{what} groups must be two sequences of gate strings (x, h), not "
                         f"{groups!r}") from None
    for name, part in (("x", xg), ("h", hg)):
        if sorted("".join(part)) != sorted(gates) or not all(part):
            raise ValueError(f"the {what} {name} groups {part!r} must split the gates "
                             f"{gates!r}, each once")
    for g in hg:
        if len(g) > 1 and any(a in g for a in alone):
            raise ValueError(f"the {what} h group {g!r} stacks {alone!r}, whose chain "
                             f"differs from the others'")
        if not any(g in s for s in xg):
            raise ValueError(f"the {what} h group {g!r} is not a contiguous part of one x "
                             f"group of {xg!r}")
    return xg, hg


def _stack_rows(parts, h_len: int, n: int, fill) -> np.ndarray:
    """``parts`` (``(H, K)`` or ``(H,)`` each, one dtype) stacked, each padded with rows
    of ``fill`` to whole native vectors (so that every part starts on a native vector);
    one part is returned as it is."""
    if len(parts) == 1:
        return parts[0]
    rows = -(-h_len // n) * n
    out = np.full((len(parts) * rows,) + parts[0].shape[1:], fill, parts[0].dtype)
    for k, part in enumerate(parts):
        out[k * rows:k * rows + h_len] = part
    return out


def _stacked(mats, h_len: int, n: int, name: str) -> np.ndarray:
    """The FP16 bits of ``mats`` (``(H, K)`` or ``(H,)`` each) stacked, padded with zero
    rows (:func:`_stack_rows`)."""
    return _stack_rows([fp16_bits(m, name) for m in mats], h_len, n, 0)


def _stacked_exponents(exps, h_len: int, n: int) -> np.ndarray:
    """Block exponents ``(H, column tiles)`` of each gate stacked as :func:`_stacked`
    stacks their matrices (the padding rows are zero blocks, exponent
    ``ZERO_BLOCK_EXP``)."""
    return _stack_rows([np.asarray(e, np.int32) for e in exps], h_len, n, ZERO_BLOCK_EXP)


def _check_rnn_quant(quant) -> dict:
    """A recurrent layer's ``quant`` (:func:`lstm_layer`) as a dict, its codes checked."""
    if quant is None:
        return {}
    if not isinstance(quant, dict) or set(quant) - {"x", "h", "W", "U", "x_shift"}:
        raise ValueError(f"quant must be a dict of 'x', 'h', 'W', 'U', 'x_shift', not "
                         f"{quant!r}")
    for key in ("x", "h"):
        if quant.get(key) is not None:
            check_int(f"quant[{key!r}]", quant[key], 0, MAX_EXPONENT_CODE)
    shift = quant.get("x_shift")
    if shift is not None and not (isinstance(shift, (float, int, np.floating))
                                  and np.isfinite(shift) and shift
                                  and float(np.float16(shift)) == shift):
        raise ValueError(f"quant['x_shift'] must be a nonzero FP16 number, not {shift!r}")
    return quant


class RecurrentLayer:
    """One LSTM or GRU layer placed in memory (:func:`lstm_layer`, :func:`gru_layer`);
    :meth:`step` emits one time step's chains in their naive order (the copy of ``x``
    when needed, the products on ``x``, the gates, the state update), for a scheduler
    (:mod:`host.compiler.schedule`) to interleave.

    Attributes
    ----------
    refs : dict
        Refs of the state (``"h"``; ``"c"`` for an LSTM): updated in place every step,
        where the next step (or the next run of the program) finds it.
    groups : tuple
        The ``(x, h)`` product groups in force.
    source : ``"netq"`` or Ref
        Where each step's input comes from.
    """

    def __init__(self, bld: Builder, source, quant=None):
        self.bld = bld
        self.source = source
        self.refs = {}
        self.quant = _check_rnn_quant(quant)
        #: Static input exponents (E8M0 codes, or None: dynamic) of the products on x
        #: and on h.
        self.x_exp, self.h_exp = self.quant.get("x"), self.quant.get("h")
        #: The constant added to every element of x before the products (calibration's
        #: input offset, -m), or None.
        self.x_shift = self.quant.get("x_shift")

    def _matrix(self, mem, kind: str, g: str, wts: dict) -> int:
        """Place the stacked matrix of ``kind`` (``"W"`` or ``"U"``) for gate group
        ``g``, with its gates' calibrated block exponents when ``quant`` has them."""
        name = f"weights['{kind}_{g}']"
        w = _stacked([wts[f"{kind}_{k}"] for k in g], self.h_len, self.bld.n, name)
        exps = self.quant.get(kind)
        if exps is None:
            return mem.matrix(w, name)
        return mem.matrix(w, name, _stacked_exponents([exps[k] for k in g], self.h_len,
                                                      self.bld.n))

    def _region(self, mem, space, gates: str, cache: dict, key) -> dict:
        """Per gate of ``gates``, its Ref in one region of ``space`` holding them all."""
        if (key, space) not in cache:
            ht = self.bld.tiles(self.h_len)
            r = mem.alloc(space, len(gates) * ht)
            cache[(key, space)] = {g: Ref(space, r.addr + k * ht, ht)
                                   for k, g in enumerate(gates)}
        return cache[(key, space)]

    @staticmethod
    def _span(refs, gates: str) -> Ref:
        """The Ref covering ``gates``' consecutive Refs."""
        first = refs[gates[0]]
        return Ref(first.space, first.addr, first.length * len(gates))

    def _rows(self, gates: str) -> int:
        return self.h_len if len(gates) == 1 else \
            len(gates) * self.bld.tiles(self.h_len) * self.bld.n

    def _x_setup(self, mem, wts, xspace: dict):
        """Matrices, biases and the double-buffered ``W x + b`` of the x groups; ``xspace``
        maps each gate to the VRF its ``W x + b`` is read from; the copy buffers of ``x``
        when several products read an input from the queue."""
        xg = self.groups[0]
        self.w_slot = {g: self._matrix(mem, "W", g, wts) for g in xg}
        self.w_bias = {g: mem.place(Space.ASVRF0,
                                    _stacked([wts[f"b_{k}"] for k in g], self.h_len,
                                             self.bld.n, f"weights['b_{g}']"), f"b_{g}")
                       for g in xg}
        self.xw, self.xw_writes = [], []           # per buffer: gate -> Ref; group -> Refs
        for p in range(2):
            cache, refs, writes = {}, {}, {}
            for g in xg:
                spaces = list(dict.fromkeys(xspace[k] for k in g))
                for space in spaces:
                    region = self._region(mem, space, g, cache, g)
                    refs.update({k: r for k, r in region.items() if xspace[k] is space})
                writes[g] = [self._span(cache[(g, space)], g) for space in spaces]
            self.xw.append(refs)
            self.xw_writes.append(writes)
        # x is copied into the IVRF when several products read it from the queue, and
        # whenever it is shifted (the copy's chain adds the shift: one MFU add, FP16).
        copy = (self.source == "netq" and len(xg) > 1) or self.x_shift is not None
        self.x = [mem.alloc(Space.IVRF, self.bld.tiles(self.x_len)) for _ in range(2)] \
            if copy else None
        self.x_ops = []
        if self.x_shift is not None:
            tiles = self.bld.tiles(self.x_len)
            shift = mem.place(Space.ASVRF0, fp16_bits(np.full(tiles * self.bld.n,
                                                              float(self.x_shift)),
                                                      "quant['x_shift']"), "x_shift")
            self.x_ops = [("vv", "add", shift)]

    def _x_chains(self, t: int) -> None:
        bld, p = self.bld, t % 2
        if self.x is not None:
            bld.chain(self.source, rows=self.x_len, ops=self.x_ops, writes=[self.x[p]])
        read = self.x[p] if self.x is not None else self.source
        for g in self.groups[0]:
            bld.chain(read, rows=self._rows(g), mv_mul=self.w_slot[g], cols=self.x_len,
                      ops=[("vv", "add", self.w_bias[g])], writes=self.xw_writes[p][g],
                      static_exponent=self.x_exp)

    def _xw(self, t: int, gates: str) -> Ref:
        """The slice of this step's ``W x + b`` an h group adds (in its first gate's VRF)."""
        refs = self.xw[t % 2]
        return self._span(refs, gates)

    def step(self, t: int, writes=()) -> None:                     # pragma: no cover
        raise NotImplementedError


class _Lstm(RecurrentLayer):
    def __init__(self, bld, mem, wts, x_len, h_len, h0, c0, groups, source, quant):
        super().__init__(bld, source, quant)
        self.x_len, self.h_len = x_len, h_len
        self.groups = _check_groups(groups, "fioc", "c", "LSTM")
        nt = bld.tiles
        ht = nt(h_len)
        state = getattr(mem, "state", mem.place)
        self._x_setup(mem, wts, dict.fromkeys("fioc", Space.ASVRF0))
        self.u_slot = {g: self._matrix(mem, "U", g, wts) for g in self.groups[1]}
        self.h = state(Space.IVRF, h0, "h0")
        self.c = state(Space.MULVRF0, c0, "c0")
        # f's chain multiplies by c; in a stack with others, they are multiplied by ones
        # that follow c (FP16 x * 1 = x exactly: no rounding, no event).
        fg = next(g for g in self.groups[1] if "f" in g)
        self.c_operand = self.c
        if len(fg) > 1:
            if fg[0] != "f":
                raise ValueError(f"the LSTM h group {fg!r} must start with f (its operand "
                                 f"is c followed by ones)")
            ones = mem.place(Space.MULVRF0, np.full((len(fg) - 1) * ht * bld.n, _ONE),
                             "ones")
            if ones.addr != self.c.addr + ht:
                raise ValueError("the ones after c are not contiguous with it in MULVRF0")
            self.c_operand = Ref(Space.MULVRF0, self.c.addr, len(fg) * ht)
        out_space = {"f": Space.ASVRF1, "i": Space.MULVRF0, "o": Space.MULVRF0}
        cache, self.gate = {}, {}
        self.writes = {}
        for g in self.groups[1]:
            if g == "c":
                continue
            for space in dict.fromkeys(out_space[k] for k in g):
                region = self._region(mem, space, g, cache, g)
                self.gate.update({k: r for k, r in region.items() if out_space[k] is space})
            self.writes[g] = [self._span(cache[(g, s)], g)
                              for s in dict.fromkeys(out_space[k] for k in g)]
        self.refs = {"h": self.h, "c": self.c}

    def step(self, t: int, writes=()) -> None:
        """Emit step ``t``: the x products, one chain per h group (``f``, ``i``, ``o``
        sigmoid, ``f`` times ``c``; ``c = tanh(.) * i + f c``), ``h = tanh(c) * o``
        written to ``h`` and ``writes``."""
        bld = self.bld
        self._x_chains(t)
        for g in self.groups[1]:
            ops = [("vv", "add", self._xw(t, g))]
            if g == "c":
                ops += [("unary", "tanh"), ("vv", "mul", self.gate["i"]),
                        ("vv", "add", self.gate["f"])]
                out = [self.c]
            else:
                ops.append(("unary", "sigmoid"))
                if "f" in g:
                    ops.append(("vv", "mul", self.c_operand))
                out = self.writes[g]
            bld.chain(self.h, rows=self._rows(g), mv_mul=self.u_slot[g], cols=self.h_len,
                      ops=ops, writes=out, static_exponent=self.h_exp)
        bld.chain(self.c, rows=self.h_len, ops=[("unary", "tanh"),
                                                ("vv", "mul", self.gate["o"])],
                  writes=[self.h, *writes])


class _Gru(RecurrentLayer):
    def __init__(self, bld, mem, wts, x_len, h_len, h0, lbr, groups, source, quant):
        super().__init__(bld, source, quant)
        self.x_len, self.h_len, self.lbr = x_len, h_len, bool(lbr)
        self.groups = _check_groups(groups, "zrn", "n", "GRU")
        nt = bld.tiles
        ht = nt(h_len)
        state = getattr(mem, "state", mem.place)
        xspace = {"z": Space.ASVRF0, "r": Space.ASVRF0,
                  "n": Space.ASVRF1 if self.lbr else Space.ASVRF0}
        self._x_setup(mem, wts, xspace)
        self.u_slot = {g: self._matrix(mem, "U", g, wts) for g in self.groups[1]}
        self.b_hn = mem.place(Space.ASVRF0, wts["b_hn"], "b_hn") if self.lbr else None
        self.h = state(Space.IVRF, h0, "h0")
        self.h_op = state(Space.ASVRF0, h0, "h0")
        cache, self.gate, self.writes = {}, {}, {}
        for g in self.groups[1]:
            if g != "n":
                self.gate.update(self._region(mem, Space.MULVRF0, g, cache, g))
                self.writes[g] = [self._span(self.gate, g)]
        self.n_iv = mem.alloc(Space.IVRF, ht)
        self.n_op = mem.alloc(Space.ASVRF1, ht)
        self.rh = None if self.lbr else mem.alloc(Space.IVRF, ht)
        self.refs = {"h": self.h}

    def step(self, t: int, writes=()) -> None:
        """Emit step ``t`` (:func:`emit_gru`'s arithmetic): the x products, z and r
        (sigmoid), n, ``h' = (h - n) * z + n`` written to ``h`` (IVRF and ASVRF0) and
        ``writes``."""
        bld = self.bld
        self._x_chains(t)
        for g in self.groups[1]:
            if g != "n":
                bld.chain(self.h, rows=self._rows(g), mv_mul=self.u_slot[g], cols=self.h_len,
                          ops=[("vv", "add", self._xw(t, g)), ("unary", "sigmoid")],
                          writes=self.writes[g], static_exponent=self.h_exp)
            elif self.lbr:
                bld.chain(self.h, rows=self.h_len, mv_mul=self.u_slot["n"], cols=self.h_len,
                          ops=[("vv", "add", self.b_hn), ("vv", "mul", self.gate["r"]),
                               ("vv", "add", self._xw(t, "n")), ("unary", "tanh")],
                          writes=[self.n_iv, self.n_op], static_exponent=self.h_exp)
            else:
                bld.chain(self.h, rows=self.h_len, ops=[("vv", "mul", self.gate["r"])],
                          writes=[self.rh])
                bld.chain(self.rh, rows=self.h_len, mv_mul=self.u_slot["n"], cols=self.h_len,
                          ops=[("vv", "add", self._xw(t, "n")), ("unary", "tanh")],
                          writes=[self.n_iv, self.n_op], static_exponent=self.h_exp)
        bld.chain(self.n_iv, rows=self.h_len,
                  ops=[("vv", "b_sub_a", self.h_op), ("vv", "mul", self.gate["z"]),
                       ("vv", "add", self.n_op)], writes=[self.h, self.h_op, *writes])


def lstm_layer(bld: Builder, mem, wts: dict, x_len: int, h_len: int, h0, c0, *,
               fuse: bool = True, groups=None, source="netq", quant=None) -> RecurrentLayer:
    """Place an LSTM layer (``wts`` as :func:`lstm_sequence`'s ``weights``, FP16 data as
    :func:`host.numerics.mvm.fp16_bits` takes it; ``mem`` as :func:`emit_lstm`'s) and
    return it; its :meth:`~RecurrentLayer.step` emits a step.

    ``fuse`` (quantize once): the gates' products on ``x`` and on ``h`` stacked as
    :data:`LSTM_FUSED` says, else one product per gate (:data:`LSTM_UNFUSED`); ``groups``
    (``(x groups, h groups)``) overrides both. Every result bit is the same either way:
    the rows of a stacked product are the rows of the separate ones (each gate's block
    padded with zero rows to whole native vectors), quantizing the same vector with the
    same settings, and the extra multiply of a stacked sigmoid gate is by 1.0.
    ``source``: ``"netq"`` (each step pops ``x_len`` elements from the input queue) or a
    Ref the step reads (the previous layer's ``h``). ``quant``: None, or calibrated
    settings (``host.quant``): ``"x"`` and ``"h"``, the E8M0 codes of static input
    exponents for the products on ``x`` and on ``h`` (None: dynamic), ``"W"`` and
    ``"U"``, per gate the block exponents of its ``(H, column tiles)`` matrix (None: the
    device's max-based rule); a stacked matrix takes its gates' exponents stacked, so
    quantize once still changes no bit. ``"x_shift"``: a nonzero FP16 number added to
    every element of ``x`` (rounded to FP16) before the products read it: each step
    copies ``x`` into the IVRF through that add (calibration's input offset, ``-m``;
    the biases carry ``W m``).

    Raises
    ------
    ValueError
        malformed ``groups`` or ``quant``; a memory full (from ``mem``).
    """
    groups = groups if groups is not None else (LSTM_FUSED if fuse else LSTM_UNFUSED)
    return _Lstm(bld, mem, wts, x_len, h_len, h0, c0, groups, source, quant)


def gru_layer(bld: Builder, mem, wts: dict, x_len: int, h_len: int, h0, *,
              linear_before_reset: bool = True, fuse: bool = True, groups=None,
              source="netq", quant=None) -> RecurrentLayer:
    """Place a GRU layer (:func:`emit_gru`'s ``wts`` and arithmetic) and return it;
    ``fuse`` / ``groups`` / ``source`` / ``quant`` as :func:`lstm_layer`
    (:data:`GRU_FUSED`, :data:`GRU_UNFUSED`; ``quant["h"]`` also quantizes ``r * h``).
    Without ``linear_before_reset`` the product of n reads ``r * h``, not ``h``, so n
    never shares h's product.

    Raises
    ------
    ValueError
        malformed ``groups`` or ``quant``; a memory full (from ``mem``).
    """
    groups = groups if groups is not None else (GRU_FUSED if fuse else GRU_UNFUSED)
    return _Gru(bld, mem, wts, x_len, h_len, h0, linear_before_reset, groups, source,
                quant)


def _emit_steps(bld, layer, steps, step_writes, final_writes, order):
    def step(t):
        layer.step(t, [*step_writes, *(final_writes if t == steps - 1 else ())])
    if order == "scheduled":
        from host.compiler.schedule import emit_scheduled
        emit_scheduled(bld, steps, step)
    else:
        for t in range(steps):
            step(t)


def _check_order(order: str) -> None:
    if order not in ("hand", "naive", "scheduled"):
        raise ValueError(f"order must be 'hand', 'naive' or 'scheduled', not {order!r}")


def emit_lstm(bld: Builder, mem, wts: dict, steps: int, x_len: int, h_len: int, h0, c0, *,
              source="netq", step_writes=(), final_writes=(), fuse: bool = False,
              order: str = "hand") -> dict:
    """Emit an LSTM over ``steps`` inputs into ``bld``, for a program that holds more
    than this layer.

    ``mem`` places the layer's data: ``mem.matrix(w, name) -> slot``,
    ``mem.place(space, values, name) -> Ref`` (biases), ``mem.alloc(space, length) -> Ref``
    (scratch) and, if it has one, ``mem.state(space, values, name) -> Ref`` for ``h0``,
    ``c0`` (the state the program overwrites; a network writes it before every job),
    else ``mem.place``. ``wts`` holds FP16 bits as :func:`lstm_sequence`'s ``weights``.
    ``source`` is where the steps' inputs come from (``"netq"``: ``steps`` logical
    vectors of ``x_len`` elements; or a Ref). Every step's ``h`` chain writes ``h`` and
    ``step_writes`` (``["netq"]``: every step's ``h`` to the output queue); the last one
    also ``final_writes``.

    ``order="hand"`` with ``fuse=False`` (the default) emits :func:`lstm_sequence`'s
    chains, hand-interleaved (with ``mem = bld``, the same memory layout and
    instructions). Otherwise the layer of :func:`lstm_layer` (``fuse``: quantize once)
    emits each step in its naive order (``"naive"``), or that order reordered by
    :func:`host.compiler.schedule.schedule_tail` (``"scheduled"``); the results are the
    same bits in every case.

    Returns the Refs ``{"h", "c"}`` of the final state (and ``"scratch"``).

    Raises
    ------
    ValueError
        an unknown ``order``; ``fuse`` with ``order="hand"``.
    """
    _check_order(order)
    if order == "hand":
        if fuse:
            raise ValueError("order 'hand' is lstm_sequence's unfused order; a fused LSTM "
                             "is emitted 'naive' or 'scheduled'")
        return _emit_lstm_hand(bld, mem, wts, steps, x_len, h_len, h0, c0, source=source,
                               step_writes=step_writes, final_writes=final_writes)
    layer = lstm_layer(bld, mem, wts, x_len, h_len, h0, c0, fuse=fuse, source=source)
    _emit_steps(bld, layer, steps, step_writes, final_writes, order)
    return {"h": layer.h, "c": layer.c, "scratch": layer.x or []}


def _emit_lstm_hand(bld: Builder, mem, wts: dict, steps: int, x_len: int, h_len: int, h0,
                    c0, *, source="netq", step_writes=(), final_writes=()) -> dict:
    """:func:`lstm_sequence`'s hand-interleaved chains (see :func:`emit_lstm`)."""
    nt = bld.tiles
    state = getattr(mem, "state", mem.place)
    slots = {k: mem.matrix(wts[k], f"weights[{k!r}]") for k in
             [f"W_{g}" for g in _GATES] + [f"U_{g}" for g in _GATES]}
    bias = {g: mem.place(Space.ASVRF0, wts[f"b_{g}"], f"b_{g}") for g in _GATES}
    xw = [{g: mem.alloc(Space.ASVRF0, nt(h_len)) for g in _GATES} for _ in range(2)]
    x = [mem.alloc(Space.IVRF, nt(x_len)) for _ in range(2)]
    h = state(Space.IVRF, h0, "h0")
    c = state(Space.MULVRF0, c0, "c0")
    i_gate = mem.alloc(Space.MULVRF0, nt(h_len))
    o_gate = mem.alloc(Space.MULVRF0, nt(h_len))
    fc = mem.alloc(Space.ASVRF1, nt(h_len))

    def copy(t):
        if t < steps:
            bld.chain(source, rows=x_len, writes=[x[t % 2]])

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
        gate("f", [("unary", "sigmoid"), ("vv", "mul", c)], fc)
        gate("i", [("unary", "sigmoid")], i_gate)
        gate("o", [("unary", "sigmoid")], o_gate)
        gate("c", [("unary", "tanh"), ("vv", "mul", i_gate), ("vv", "add", fc)], c)
        for g in "fio":
            product(t + 1, g)
        bld.chain(c, rows=h_len, ops=[("unary", "tanh"), ("vv", "mul", o_gate)],
                  writes=[h, *step_writes, *(final_writes if t == steps - 1 else ())])
        product(t + 1, "c")
    return {"h": h, "c": c, "scratch": x}


def emit_gru(bld: Builder, mem, wts: dict, steps: int, x_len: int, h_len: int, h0, *,
             linear_before_reset: bool = True, source="netq", step_writes=(),
             final_writes=(), fuse: bool = False, order: str = "hand") -> dict:
    """Emit a GRU over ``steps`` inputs into ``bld`` (``mem``, ``source``, ``step_writes``,
    ``final_writes`` as :func:`emit_lstm`; ``h0`` is state). ``wts``: ``W_z, W_r, W_n``
    ``(H, X)``, ``U_z, U_r, U_n`` ``(H, H)``, ``b_z, b_r, b_n`` and, with
    ``linear_before_reset``, ``b_hn`` ``(H,)``. Per step, ``+``, ``*`` FP16 ``binary``
    ops::

        xw_k = mvm(W_k, x) + b_k                       k in z, r, n
        z = sigmoid(mvm(U_z, h) + xw_z)
        r = sigmoid(mvm(U_r, h) + xw_r)
        n = tanh((mvm(U_n, h) + b_hn) * r + xw_n)      linear_before_reset (gru_step's)
        n = tanh(mvm(U_n, h * r) + xw_n)               otherwise (ONNX's default; b_n
                                                       then holds both of n's biases)
        h' = (h - n) * z + n                           written to h (IVRF and ASVRF0)

    ``order="hand"`` with ``fuse=False`` (the default): each step's chains in that order
    with one ``x`` buffer (with ``linear_before_reset``, one step and ``mem = bld``,
    :func:`gru_step`'s chains and layout exactly). Otherwise the layer of
    :func:`gru_layer` (double-buffered ``x``; ``fuse``: quantize once), ``"naive"`` or
    ``"scheduled"`` as :func:`emit_lstm`. Returns the Refs ``{"h"}`` (and ``"scratch"``).

    Raises
    ------
    ValueError
        an unknown ``order``; ``fuse`` with ``order="hand"``.
    """
    _check_order(order)
    if order == "hand":
        if fuse:
            raise ValueError("order 'hand' is gru_sequence's unfused order; a fused GRU is "
                             "emitted 'naive' or 'scheduled'")
        return _emit_gru_plain(bld, mem, wts, steps, x_len, h_len, h0,
                               linear_before_reset=linear_before_reset, source=source,
                               step_writes=step_writes, final_writes=final_writes)
    layer = gru_layer(bld, mem, wts, x_len, h_len, h0, linear_before_reset=linear_before_reset,
                      fuse=fuse, source=source)
    _emit_steps(bld, layer, steps, step_writes, final_writes, order)
    return {"h": layer.h, "scratch": (layer.x or []) + [layer.n_iv] +
            ([layer.rh] if layer.rh is not None else [])}


def _emit_gru_plain(bld: Builder, mem, wts: dict, steps: int, x_len: int, h_len: int, h0, *,
                    linear_before_reset: bool = True, source="netq", step_writes=(),
                    final_writes=()) -> dict:
    """:func:`gru_sequence`'s chains (see :func:`emit_gru`)."""
    nt = bld.tiles
    state = getattr(mem, "state", mem.place)
    lbr = bool(linear_before_reset)
    slots = {k: mem.matrix(wts[k], f"weights[{k!r}]") for k in
             ("W_z", "W_r", "W_n", "U_z", "U_r", "U_n")}
    bias = {k: mem.place(Space.ASVRF0, wts[f"b_{k}"], f"b_{k}")
            for k in (("z", "r", "n", "hn") if lbr else ("z", "r", "n"))}
    xw = {"z": mem.alloc(Space.ASVRF0, nt(h_len)), "r": mem.alloc(Space.ASVRF0, nt(h_len)),
          "n": mem.alloc(Space.ASVRF1 if lbr else Space.ASVRF0, nt(h_len))}
    xv = mem.alloc(Space.IVRF, nt(x_len))
    h = state(Space.IVRF, h0, "h0")
    h_op = state(Space.ASVRF0, h0, "h0")            # h as an add/sub operand
    z = mem.alloc(Space.MULVRF0, nt(h_len))
    r = mem.alloc(Space.MULVRF0, nt(h_len))
    n_iv = mem.alloc(Space.IVRF, nt(h_len))
    n_op = mem.alloc(Space.ASVRF1, nt(h_len))
    rh = None if lbr else mem.alloc(Space.IVRF, nt(h_len))
    for t in range(steps):
        bld.chain(source, rows=x_len, writes=[xv])
        for k in ("z", "r", "n"):
            bld.chain(xv, rows=h_len, mv_mul=slots[f"W_{k}"], cols=x_len,
                      ops=[("vv", "add", bias[k])], writes=[xw[k]])
        for k, out in (("z", z), ("r", r)):
            bld.chain(h, rows=h_len, mv_mul=slots[f"U_{k}"], cols=h_len,
                      ops=[("vv", "add", xw[k]), ("unary", "sigmoid")], writes=[out])
        if lbr:
            bld.chain(h, rows=h_len, mv_mul=slots["U_n"], cols=h_len,
                      ops=[("vv", "add", bias["hn"]), ("vv", "mul", r),
                           ("vv", "add", xw["n"]), ("unary", "tanh")], writes=[n_iv, n_op])
        else:
            bld.chain(h, rows=h_len, ops=[("vv", "mul", r)], writes=[rh])
            bld.chain(rh, rows=h_len, mv_mul=slots["U_n"], cols=h_len,
                      ops=[("vv", "add", xw["n"]), ("unary", "tanh")], writes=[n_iv, n_op])
        bld.chain(n_iv, rows=h_len, ops=[("vv", "b_sub_a", h_op), ("vv", "mul", z),
                                         ("vv", "add", n_op)],
                  writes=[h, h_op, *step_writes, *(final_writes if t == steps - 1 else ())])
    return {"h": h, "scratch": [xv, n_iv] + ([rh] if rh is not None else [])}


def gru_sequence(config: NpuConfig, weights, xs, h0, *, linear_before_reset: bool = True) \
        -> Program:
    """A GRU over the sequence ``xs`` (``(T, X)``) from state ``h0`` (``(H,)``): the
    arithmetic of :func:`emit_gru` (``weights`` as :func:`gru_step`'s; without
    ``linear_before_reset`` no ``b_hn``: ``b_n`` is both of n's biases). Every step's
    ``h`` is pushed to the output queue; ``refs["h"]`` holds the last. One step with
    ``linear_before_reset`` is :func:`gru_step`'s program.

    Raises
    ------
    TypeError, ValueError
        as :func:`gru_step` (``xs`` must be ``(X,)`` or ``(T >= 1, X >= 1)``).
    """
    xs = _sequence(xs)
    steps, x_len = xs.shape
    h0 = _vector(h0, "h0")
    h_len = len(h0)
    wts = _weights(weights, ["W_z", "W_r", "W_n", "U_z", "U_r", "U_n"],
                   ["b_z", "b_r", "b_n"] + (["b_hn"] if linear_before_reset else []),
                   h_len, x_len, f"h0 of shape {h0.shape} and xs of shape {xs.shape}")
    bld = Builder(config)
    refs = emit_gru(bld, bld, wts, steps, x_len, h_len, h0,
                    linear_before_reset=linear_before_reset, step_writes=["netq"])
    bld.push(xs, "xs")
    prog = bld.finish()
    prog.refs.update(h=refs["h"])
    return prog
