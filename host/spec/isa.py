"""The NPU's instruction set, written once (``docs/isa.md``).

Everything the gateware decoder, the reference model (:mod:`host.model.core`), the assembler
(:mod:`host.compiler.asm`), the program builder and the testbenches need to agree on lives here:
the opcodes, memory spaces, scalar registers and error codes as Amaranth enums, and the
64-bit instruction word as an Amaranth ``data.StructLayout`` (:data:`INSTRUCTION_LAYOUT`).
The same layout packs and unpacks words in plain Python (:meth:`Instruction.encode`,
:func:`decode`, NumPy ``uint64`` arrays through :func:`encode_program` and
:func:`decode_program`); the field offsets are read from the layout, never typed twice.

Instruction word (bit 0 is the least significant)::

    [0, 5)    opcode    Opcode
    [5, 9)    space     Space (v_rd, v_wr)
    [9, 14)   func      BinaryOp (vv_*), UnaryOp (v_<unary>), ReduceOp (v_*_reduce), Reg (s_wr)
    [14, 16)  reserved  zero
    [16, 32)  inc       per-iteration address increment (*_inc forms), unsigned
    [32, 64)  operand   address (in native vectors, MRF: tile slot) or the s_wr value

Fields an opcode does not use must be zero: every legal word has exactly one text form,
so ``disassemble(assemble(text))`` is canonical.

Operation codes are not redefined here: ``vv_*`` carry :class:`host.numerics.fp16.BinaryOp`,
unary ops :class:`host.numerics.unary.UnaryOp`, reductions :class:`host.numerics.reduction.ReduceOp`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from amaranth.hdl import unsigned
from amaranth.lib import data, enum

from host.spec.formats import NARROW_WIDTH_MAX, check_int
from host.spec.ops import BinaryOp
from host.spec.ops import ReduceOp
from host.spec.ops import UnaryOp

__all__ = [
    "WORD_BITS", "Opcode", "Space", "Reg", "ErrorCode", "FUNC_LAYOUT", "INSTRUCTION_LAYOUT",
    "FIELDS", "REG_DEFAULTS", "Instruction", "IsaError", "decode", "encode_program",
    "decode_program", "MNEMONICS", "mnemonic", "Chain", "parse_chain", "chain_mfu_ops",
    "operand_vrf", "vector_spaces", "mrf_address",
    "mrf_location", "UNARY_NAMES", "MAX_WRITES", "register_limits",
]

#: Width of one instruction word.
WORD_BITS = 64


class Opcode(enum.Enum, shape=5):
    """Instruction opcodes. Code 0 is unassigned, so an all-zero (erased) word is illegal."""
    V_RD = 1        #: start a chain: read a logical vector
    V_WR = 2        #: write the chain's result (one or more per chain)
    MV_MUL = 3      #: multiply by the logical matrix at an MRF tile slot
    VV = 4          #: element-wise binary op (func: BinaryOp) with a VRF operand
    V_UNARY = 5     #: unary function (func: UnaryOp)
    V_REDUCE = 6    #: reduction over the logical vector (func: ReduceOp)
    S_WR = 7        #: set a scalar register (func: Reg) to the operand
    END_CHAIN = 8   #: close the chain
    END = 9         #: end of program


class Space(enum.Enum, shape=4):
    """Memory spaces. MFU ``m`` has its AddSubVrf at ``2 + 2m`` and its MulVrf at ``3 + 2m``.

    ``NETQ`` in ``v_rd`` pops the network input queue, in ``v_wr`` pushes the output queue.
    ``MRF`` is only reachable by the host (``read``/``write``) and by ``mv_mul``.
    """
    NETQ = 0
    IVRF = 1
    ASVRF0 = 2
    MULVRF0 = 3
    ASVRF1 = 4
    MULVRF1 = 5
    ASVRF2 = 6
    MULVRF2 = 7
    ASVRF3 = 8
    MULVRF3 = 9
    MRF = 15

    @classmethod
    def asvrf(cls, mfu: int) -> "Space":
        """The AddSubVrf of MFU ``mfu`` (0..3)."""
        return cls(2 + 2 * check_int("mfu", mfu, 0, 3))

    @classmethod
    def mulvrf(cls, mfu: int) -> "Space":
        """The MulVrf of MFU ``mfu`` (0..3)."""
        return cls(3 + 2 * check_int("mfu", mfu, 0, 3))

    @property
    def mfu(self) -> int | None:
        """Index of the MFU owning this VRF, or None for NETQ, IVRF and MRF."""
        return (self.value - 2) // 2 if 2 <= self.value <= 9 else None

    @property
    def is_vector(self) -> bool:
        """True for the memories that hold native FP16 vectors (IVRF and the MFU VRFs)."""
        return 1 <= self.value <= 9


class Reg(enum.Enum, shape=5):
    """Scalar registers, set by ``s_wr``; they keep their value until written again.

    ========== ===== ==========================================================
    register   code  meaning (range checked when written)
    ========== ===== ==========================================================
    ROWS       0     elements of the chain's result vector (1..max_length*N)
    COLS       1     elements of the MVM input vector, per window pixel (1..max_col_tiles*N)
    ITERATIONS 2     times each following chain runs (1..2**16)
    ROUNDING   3     vector quantizer rounding (``host.spec.formats.Rounding``)
    Q_STATIC   4     0: dynamic vector exponent, 1: static (``Q_EXPONENT``)
    Q_EXPONENT 5     E8M0 code of the static vector exponent (0..255; above 142 is
                     rejected by ``mv_mul`` in static mode)
    NARROW     6     narrow-accumulator check width k (1..64)
    WIN_W      7     window width in pixels (1..max_col_tiles)
    WIN_H      8     window height in pixels (1..max_col_tiles)
    WIN_PITCH  9     native vectors from one window row to the next (0..2**24-1)
    ========== ===== ==========================================================
    """
    ROWS = 0
    COLS = 1
    ITERATIONS = 2
    ROUNDING = 3
    Q_STATIC = 4
    Q_EXPONENT = 5
    NARROW = 6
    WIN_W = 7
    WIN_H = 8
    WIN_PITCH = 9


#: Power-on values of the scalar registers; ``None`` means "N" (the native dimension).
REG_DEFAULTS = {
    Reg.ROWS: None, Reg.COLS: None, Reg.ITERATIONS: 1, Reg.ROUNDING: 0, Reg.Q_STATIC: 0,
    Reg.Q_EXPONENT: 127, Reg.NARROW: NARROW_WIDTH_MAX, Reg.WIN_W: 1, Reg.WIN_H: 1, Reg.WIN_PITCH: 0,
}

#: ``v_wr`` instructions one chain may have; a further one is CHAIN_STRUCTURE.
MAX_WRITES = 4


def register_limits(config) -> dict:
    """``Reg: (lowest, highest)``: the values ``s_wr`` accepts on a build ``config``
    (a :class:`host.spec.config.NpuConfig`); any other value is REGISTER_VALUE."""
    return {
        Reg.ROWS: (1, config.max_elements), Reg.COLS: (1, config.max_col_tiles * config.n),
        Reg.ITERATIONS: (1, 1 << 16), Reg.ROUNDING: (0, 1), Reg.Q_STATIC: (0, 1),
        Reg.Q_EXPONENT: (0, 255), Reg.NARROW: (1, NARROW_WIDTH_MAX),
        Reg.WIN_W: (1, config.max_col_tiles), Reg.WIN_H: (1, config.max_col_tiles),
        Reg.WIN_PITCH: (0, (1 << 24) - 1),
    }


class ErrorCode(enum.Enum, shape=8):
    """The device's sticky error flag: the first error of a run, kept until cleared."""
    NONE = 0
    ILLEGAL_OPCODE = 1      #: unassigned opcode or function code, or an op not built
    ILLEGAL_FIELD = 2       #: a field that must be zero is not, or a bad space
    CHAIN_STRUCTURE = 3     #: instruction outside a chain, chain without v_rd or v_wr, ...
    ADDRESS_RANGE = 4       #: a vector or MRF range beyond its memory
    SIZE_RANGE = 5          #: a logical size beyond max_length / max_col_tiles
    REGISTER_VALUE = 6      #: s_wr value out of range for its register
    QUEUE_UNDERFLOW = 7     #: v_rd netq (or a host pop) with too few vectors queued
    QUEUE_OVERFLOW = 8      #: v_wr netq (or a host push) beyond netq_depth
    PROGRAM_RANGE = 9       #: program longer than program_depth, or run past its end
    HAZARD = 10             #: a chain writes where it has still to read, or twice
    MRF_WORD = 11           #: an MRF word with an exponent code above 142


#: The func field: one of four enums, by opcode (a union, 5 bits).
FUNC_LAYOUT = data.UnionLayout({
    "binary": BinaryOp, "unary": UnaryOp, "reduce": ReduceOp, "reg": Reg,
})

INSTRUCTION_LAYOUT = data.StructLayout({
    "opcode": Opcode,
    "space": Space,
    "func": FUNC_LAYOUT,
    "reserved": unsigned(2),
    "inc": unsigned(16),
    "operand": unsigned(32),
})
assert INSTRUCTION_LAYOUT.size == WORD_BITS


def _field(name):
    f = INSTRUCTION_LAYOUT[name]
    return f.offset, f.width


#: ``name: (offset, width)`` of each field of the instruction word.
FIELDS = {name: _field(name) for name, _ in INSTRUCTION_LAYOUT}

_FUNC_ENUM = {
    Opcode.VV: BinaryOp, Opcode.V_UNARY: UnaryOp, Opcode.V_REDUCE: ReduceOp, Opcode.S_WR: Reg,
}
_USES_SPACE = (Opcode.V_RD, Opcode.V_WR)
_USES_INC = (Opcode.V_RD, Opcode.V_WR, Opcode.MV_MUL, Opcode.VV)
_USES_OPERAND = (Opcode.V_RD, Opcode.V_WR, Opcode.MV_MUL, Opcode.VV, Opcode.S_WR)


class IsaError(Exception):
    """An illegal instruction or program: ``code`` (ErrorCode), ``index`` (instruction
    number in the program, or None) and a message saying what is wrong."""

    def __init__(self, code: ErrorCode, message: str, index: int | None = None):
        super().__init__(message)
        self.code = ErrorCode(code)
        self.index = index
        self.message = message


@dataclass(frozen=True)
class Instruction:
    """One decoded instruction.

    Attributes
    ----------
    opcode : Opcode
    space : Space (``v_rd``/``v_wr``; NETQ otherwise, encoded as 0)
    func : BinaryOp, UnaryOp, ReduceOp or Reg for the opcodes that have one, else 0
    inc : int, 0..65535, address increment per iteration (0: the plain form)
    operand : int, 0..2**32-1: address in native vectors (``mv_mul``: MRF tile slot) or
        the ``s_wr`` value

    Raises
    ------
    IsaError
        on construction when the fields do not form a legal word (what :func:`decode`
        also refuses), with code ILLEGAL_OPCODE or ILLEGAL_FIELD.
    """
    opcode: Opcode
    space: Space = Space.NETQ
    func: object = 0
    inc: int = 0
    operand: int = 0

    def __post_init__(self):
        op = self.opcode
        if not isinstance(op, Opcode):
            raise IsaError(ErrorCode.ILLEGAL_OPCODE, f"opcode must be an Opcode, not {op!r}")
        if not isinstance(self.space, Space):
            raise IsaError(ErrorCode.ILLEGAL_FIELD, f"space must be a Space, not "
                                                    f"{self.space!r}")
        kind = _FUNC_ENUM.get(op)
        if kind is None:
            if self.func != 0:
                raise IsaError(ErrorCode.ILLEGAL_FIELD,
                               f"{op.name.lower()} has no function field, got {self.func!r}")
        elif not isinstance(self.func, kind):
            raise IsaError(ErrorCode.ILLEGAL_OPCODE,
                           f"{op.name.lower()} needs a {kind.__name__}, not {self.func!r}")
        for name, bits in (("inc", FIELDS["inc"][1]), ("operand", FIELDS["operand"][1])):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
                    or not 0 <= value < (1 << bits):
                raise IsaError(ErrorCode.ILLEGAL_FIELD, f"{name} must be an integer from 0 "
                                                        f"to {(1 << bits) - 1}, not {value!r}")
            object.__setattr__(self, name, int(value))
        if op not in _USES_SPACE and self.space is not Space.NETQ:
            raise IsaError(ErrorCode.ILLEGAL_FIELD, f"{op.name.lower()} has no space field")
        if op in _USES_SPACE and self.space is Space.MRF:
            raise IsaError(ErrorCode.ILLEGAL_FIELD,
                           f"{op.name.lower()} cannot access the MRF (only mv_mul reads it)")
        if op not in _USES_INC and self.inc:
            raise IsaError(ErrorCode.ILLEGAL_FIELD, f"{op.name.lower()} has no inc field")
        if op not in _USES_OPERAND and self.operand:
            raise IsaError(ErrorCode.ILLEGAL_FIELD, f"{op.name.lower()} has no operand")
        if op in _USES_SPACE and self.space is Space.NETQ and (self.operand or self.inc):
            raise IsaError(ErrorCode.ILLEGAL_FIELD,
                           f"{op.name.lower()} netq takes no address or increment")

    # --- constructors ------------------------------------------------------------------

    @classmethod
    def v_rd(cls, space, addr: int = 0, inc: int = 0) -> "Instruction":
        return cls(Opcode.V_RD, Space(space), 0, inc, addr)

    @classmethod
    def v_wr(cls, space, addr: int = 0, inc: int = 0) -> "Instruction":
        return cls(Opcode.V_WR, Space(space), 0, inc, addr)

    @classmethod
    def mv_mul(cls, slot: int, inc: int = 0) -> "Instruction":
        return cls(Opcode.MV_MUL, Space.NETQ, 0, inc, slot)

    @classmethod
    def vv(cls, op, addr: int, inc: int = 0) -> "Instruction":
        return cls(Opcode.VV, Space.NETQ, BinaryOp.parse(op), inc, addr)

    @classmethod
    def unary(cls, op) -> "Instruction":
        return cls(Opcode.V_UNARY, Space.NETQ, UnaryOp.parse(op))

    @classmethod
    def reduce(cls, op) -> "Instruction":
        return cls(Opcode.V_REDUCE, Space.NETQ, ReduceOp.parse(op))

    @classmethod
    def s_wr(cls, reg, value: int) -> "Instruction":
        return cls(Opcode.S_WR, Space.NETQ, Reg(reg), 0, value)

    @classmethod
    def end_chain(cls) -> "Instruction":
        return cls(Opcode.END_CHAIN)

    @classmethod
    def end(cls) -> "Instruction":
        return cls(Opcode.END)

    # --- encoding ------------------------------------------------------------------------

    def encode(self) -> int:
        """The 64-bit instruction word (an ``int``)."""
        func = self.func.value if isinstance(self.func, enum.Enum) else self.func
        values = {"opcode": self.opcode.value, "space": self.space.value, "func": func,
                  "reserved": 0, "inc": self.inc, "operand": self.operand}
        word = 0
        for name, (offset, _) in FIELDS.items():
            word |= values[name] << offset
        return word

    def __str__(self):
        return mnemonic(self)


def decode(word: int, index: int | None = None) -> Instruction:
    """Decode one instruction word.

    Raises
    ------
    IsaError
        ILLEGAL_OPCODE (unassigned opcode or function code), ILLEGAL_FIELD (reserved or
        unused bits set, bad space); ``index`` is passed through for the message.
    """
    word = int(word)
    if not 0 <= word < (1 << WORD_BITS):
        raise IsaError(ErrorCode.ILLEGAL_FIELD, f"word {word:#x} is not a 64-bit word", index)
    f = {name: (word >> off) & ((1 << width) - 1) for name, (off, width) in FIELDS.items()}
    where = f" at instruction {index}" if index is not None else ""
    try:
        op = Opcode(f["opcode"])
    except ValueError:
        raise IsaError(ErrorCode.ILLEGAL_OPCODE,
                       f"unassigned opcode {f['opcode']}{where} (word {word:#018x})",
                       index) from None
    if f["reserved"]:
        raise IsaError(ErrorCode.ILLEGAL_FIELD, f"reserved bits set{where} "
                                                f"(word {word:#018x})", index)
    try:
        space = Space(f["space"])
    except ValueError:
        raise IsaError(ErrorCode.ILLEGAL_FIELD,
                       f"unassigned space {f['space']}{where} (word {word:#018x})",
                       index) from None
    kind = _FUNC_ENUM.get(op)
    func = f["func"]
    if kind is not None:
        try:
            func = kind(func)
        except ValueError:
            raise IsaError(ErrorCode.ILLEGAL_OPCODE,
                           f"unassigned {kind.__name__} code {func} for "
                           f"{op.name.lower()}{where}", index) from None
    try:
        return Instruction(op, space, func, f["inc"], f["operand"])
    except IsaError as e:
        raise IsaError(e.code, f"{e.message}{where} (word {word:#018x})", index) from None


def encode_program(instructions) -> np.ndarray:
    """Instructions (or words) to a NumPy ``uint64`` array."""
    return np.array([i.encode() if isinstance(i, Instruction) else int(i)
                     for i in instructions], dtype=np.uint64)


def decode_program(words) -> list[Instruction]:
    """Decode a ``uint64`` array (or ints) into instructions; raises :class:`IsaError`
    with the index of the first illegal word."""
    return [decode(int(w), i) for i, w in enumerate(np.asarray(words, dtype=np.uint64))]


# --- mnemonics ------------------------------------------------------------------------------

#: Mnemonic suffix of each unary op (Brainwave names).
UNARY_NAMES = {UnaryOp.RELU: "relu", UnaryOp.SIGMOID: "sigm", UnaryOp.TANH: "tanh",
               UnaryOp.EXP: "exp", UnaryOp.RECIP: "recip", UnaryOp.PASS: "pass"}

#: ``mnemonic: (opcode, func)`` for every instruction (without the ``_inc`` forms).
MNEMONICS = {
    "v_rd": (Opcode.V_RD, 0), "v_wr": (Opcode.V_WR, 0), "mv_mul": (Opcode.MV_MUL, 0),
    **{f"vv_{op.name.lower()}": (Opcode.VV, op) for op in BinaryOp},
    **{f"v_{UNARY_NAMES[op]}": (Opcode.V_UNARY, op) for op in UnaryOp},
    **{f"v_{op.name.lower()}_reduce": (Opcode.V_REDUCE, op) for op in ReduceOp},
    "s_wr": (Opcode.S_WR, 0), "end_chain": (Opcode.END_CHAIN, 0), "end": (Opcode.END, 0),
}
_NAME_OF = {v: k for k, v in MNEMONICS.items()}


def mnemonic(instr: Instruction) -> str:
    """Canonical text of one instruction (the assembler's syntax)."""
    op = instr.opcode
    if op in (Opcode.VV, Opcode.V_UNARY, Opcode.V_REDUCE):
        name = _NAME_OF[(op, instr.func)]
    else:
        name = _NAME_OF[(op, 0)]
    suffix = "_inc" if instr.inc else ""
    if op in _USES_SPACE:
        if instr.space is Space.NETQ:
            return f"{name} netq"
        args = [instr.space.name.lower(), str(instr.operand)]
    elif op in (Opcode.MV_MUL, Opcode.VV):
        args = [str(instr.operand)]
    elif op is Opcode.S_WR:
        return f"s_wr {instr.func.name.lower()}, {instr.operand}"
    else:
        return name
    if instr.inc:
        args.append(str(instr.inc))
    return f"{name}{suffix} " + ", ".join(args)


# --- chains ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Chain:
    """One chain: ``v_rd [mv_mul] op* v_wr+ end_chain``.

    ``start`` is the index of its ``v_rd``, ``stop`` the index after its ``end_chain``.
    """
    read: Instruction
    mv_mul: Instruction | None
    ops: tuple
    writes: tuple
    start: int
    stop: int


def chain_mfu_ops(chain: Chain) -> list:
    """The ``host.spec.mfu.MfuOp`` of each of ``chain``'s element-wise, unary and
    reduction ops, in order: what ``host.spec.mfu.allocate`` places on the MFUs."""
    from host.spec.mfu import MfuOp
    make = {Opcode.VV: lambda i: MfuOp.binary(i.func, i.operand),
            Opcode.V_UNARY: lambda i: MfuOp.unary(i.func)}
    return [make.get(ins.opcode, lambda i: MfuOp.reduce(i.func))(ins) for ins in chain.ops]


def operand_vrf(unit, mfu: int) -> Space:
    """The VRF from which an ADDSUB or MUL op (``unit``, a ``host.spec.mfu.MfuUnit``)
    allocated to MFU ``mfu`` reads its operand: AddSubVrf or MulVrf of that MFU."""
    from host.spec.mfu import MfuUnit
    return Space.asvrf(mfu) if unit is MfuUnit.ADDSUB else Space.mulvrf(mfu)


def vector_spaces(config) -> tuple[Space, ...]:
    """The vector memories of build ``config`` (an ``NpuConfig``), in code order: the IVRF,
    then the AddSubVrf and MulVrf of each MFU that builds the unit reading it (ADDSUB,
    MUL; ``NpuConfig.unit_sets``). A vector space not listed does not exist in the build:
    the core refuses it with ILLEGAL_FIELD, the link with BAD_SPACE."""
    from host.spec.mfu import MfuUnit
    spaces = [Space.IVRF]
    for m in range(config.mfus):
        units = config.units(m)
        spaces += [s for s, u in ((Space.asvrf(m), MfuUnit.ADDSUB),
                                  (Space.mulvrf(m), MfuUnit.MUL)) if u in units]
    return tuple(spaces)


def parse_chain(fetch, start: int) -> Chain:
    """Parse the chain whose ``v_rd`` is instruction ``start``.

    ``fetch(i)`` returns instruction ``i`` (it may raise :class:`IsaError` itself, for an
    illegal word or one past the program's end).

    Structure: one ``v_rd``; at most one ``mv_mul``, right after it; element-wise, unary
    and reduction ops in order; one to :data:`MAX_WRITES` ``v_wr`` after the last op;
    ``end_chain``.

    Raises
    ------
    IsaError
        CHAIN_STRUCTURE, naming the instruction index and what is wrong.
    """
    def bad(i, what):
        raise IsaError(ErrorCode.CHAIN_STRUCTURE, f"instruction {i}: {what}", i)

    read = fetch(start)
    if read.opcode is not Opcode.V_RD:
        bad(start, f"a chain starts with v_rd, not {mnemonic(read)}")
    i = start + 1
    mv = None
    ops, writes = [], []
    while True:
        ins = fetch(i)
        op = ins.opcode
        if op is Opcode.MV_MUL:
            if mv is not None or ops or writes:
                bad(i, "mv_mul must come right after the chain's v_rd, once")
            mv = ins
        elif op in (Opcode.VV, Opcode.V_UNARY, Opcode.V_REDUCE):
            if writes:
                bad(i, f"{mnemonic(ins)} after a v_wr; the writes end the chain")
            ops.append(ins)
        elif op is Opcode.V_WR:
            if len(writes) == MAX_WRITES:
                bad(i, f"more than {MAX_WRITES} v_wr in one chain")
            writes.append(ins)
        elif op is Opcode.END_CHAIN:
            if not writes:
                bad(i, "chain without v_wr")
            return Chain(read, mv, tuple(ops), tuple(writes), start, i + 1)
        else:
            bad(i, f"{mnemonic(ins)} inside a chain (missing end_chain?)")
        i += 1


# --- MRF addressing -------------------------------------------------------------------------

def mrf_address(config, engine: int, row: int, slot: int) -> int:
    """Flat host address of an MRF word: ``(slot * T + engine) * N + row``.

    ``config`` is an ``MvmConfig`` or ``NpuConfig``. A tile (N words, one per dot-product
    engine) is contiguous, and so are the T tiles of one slot.

    Raises
    ------
    TypeError, ValueError
        naming the argument out of range.
    """
    engine = check_int("engine", engine, 0, config.tiles - 1)
    row = check_int("row", row, 0, config.n - 1)
    slot = check_int("slot", slot, 0, config.mrf_depth - 1)
    return (slot * config.tiles + engine) * config.n + row


def mrf_location(config, address: int) -> tuple[int, int, int]:
    """Inverse of :func:`mrf_address`: ``(engine, row, slot)``."""
    address = check_int("address", address, 0, config.tiles * config.n * config.mrf_depth - 1)
    row = address % config.n
    rest = address // config.n
    return rest % config.tiles, row, rest // config.tiles
