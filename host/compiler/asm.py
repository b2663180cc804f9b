"""Assembler and disassembler of the NPU's instruction set (``docs/isa.md``).

Text form: one instruction per line, operands separated by commas, ``#`` starts a
comment, blank lines are ignored, names are case-insensitive. ::

    s_wr rows, 100            # result length in elements
    s_wr cols, 40
    v_rd netq                 # pop ceil(40/N) native vectors
    mv_mul 0                  # the matrix at MRF tile slot 0
    vv_add 12                 # + the vector at AddSubVrf0[12..]
    v_sigm
    v_wr ivrf, 8
    v_wr_inc asvrf1, 0, 7     # the *_inc forms add inc * iteration to the address
    end_chain
    end

Operands: memory spaces by name (``netq``, ``ivrf``, ``asvrf0`` .. ``asvrf3``,
``mulvrf0`` .. ``mulvrf3``), registers by name (``rows``, ``cols``, ``iterations``, ...),
numbers in decimal, ``0x`` hex or ``0b`` binary. ``v_rd netq`` and ``v_wr netq`` take no
address. The ``_inc`` forms (``v_rd_inc``, ``v_wr_inc``, ``mv_mul_inc``, ``vv_*_inc``)
take the increment as their last operand, at least 1; the plain forms have increment 0.
The programs have no jumps (repetition is the ITERATIONS register), hence no labels.

:func:`disassemble` writes the canonical text (lower case, one space after the mnemonic,
``", "`` between operands, decimal numbers), and ``assemble(disassemble(words))`` gives
the same words back. Errors raise :class:`AsmError` with the line number.
"""

from __future__ import annotations

import re

import numpy as np

from host.spec.isa import (
    MNEMONICS, ErrorCode, Instruction, IsaError, Opcode, Reg, Space, decode_program, encode_program,
    mnemonic, parse_chain,
)

__all__ = ["AsmError", "assemble", "assemble_instructions", "disassemble", "check_structure"]

_HAS_INC = (Opcode.V_RD, Opcode.V_WR, Opcode.MV_MUL, Opcode.VV)
_NUMBER = re.compile(r"^(0x[0-9a-f_]+|0b[01_]+|[0-9][0-9_]*)$")


class AsmError(ValueError):
    """A bad program: ``line`` (1-based, or None for the whole program) and ``message``."""

    def __init__(self, line: int | None, message: str):
        self.line = line
        self.message = message
        super().__init__(f"line {line}: {message}" if line is not None else message)


def _number(tok: str, what: str, line: int) -> int:
    if not _NUMBER.match(tok):
        raise AsmError(line, f"{what} must be a number, not {tok!r}")
    return int(tok.replace("_", ""), 0)


def _space(tok: str, line: int) -> Space:
    try:
        space = Space[tok.upper()]
    except KeyError:
        names = ", ".join(s.name.lower() for s in Space if s is not Space.MRF)
        raise AsmError(line, f"unknown memory space {tok!r} (one of {names})") from None
    if space is Space.MRF:
        raise AsmError(line, "the MRF is not a vector memory (only mv_mul reads it)")
    return space


def _parse_line(text: str, line: int) -> Instruction | None:
    code = text.split("#", 1)[0].strip().lower()
    if not code:
        return None
    name, _, rest = code.partition(" ")
    args = [a.strip() for a in rest.split(",")] if rest.strip() else []
    if any(not a for a in args):
        raise AsmError(line, f"empty operand in {code!r}")
    inc_form = name.endswith("_inc") and name[:-4] in MNEMONICS
    base = name[:-4] if inc_form else name
    if base not in MNEMONICS:
        raise AsmError(line, f"unknown mnemonic {name!r}")
    opcode, func = MNEMONICS[base]
    if inc_form and opcode not in _HAS_INC:
        raise AsmError(line, f"{base} has no _inc form")

    def want(count, form):
        if len(args) != count:
            raise AsmError(line, f"{name} takes {count} operand{'s' * (count != 1)} "
                                 f"({form}), not {len(args)}")

    inc = 0
    if inc_form:
        if not args:
            raise AsmError(line, f"{name} needs the increment as its last operand")
        inc = _number(args.pop(), "the increment", line)
        if inc == 0:
            raise AsmError(line, f"the increment of {name} must be at least 1 (use {base})")
    try:
        if opcode in (Opcode.V_RD, Opcode.V_WR):
            if args and args[0] == "netq":
                if inc_form:
                    raise AsmError(line, f"{base} netq has no increment")
                want(1, "netq")
                return Instruction(opcode, Space.NETQ)
            want(2, "space, address" + (", increment" if inc_form else ""))
            return Instruction(opcode, _space(args[0], line), 0, inc,
                               _number(args[1], "the address", line))
        if opcode in (Opcode.MV_MUL, Opcode.VV):
            want(1, ("tile slot" if opcode is Opcode.MV_MUL else "VRF address")
                 + (", increment" if inc_form else ""))
            return Instruction(opcode, Space.NETQ, func, inc,
                               _number(args[0], "the address", line))
        if opcode is Opcode.S_WR:
            want(2, "register, value")
            try:
                reg = Reg[args[0].upper()]
            except KeyError:
                names = ", ".join(r.name.lower() for r in Reg)
                raise AsmError(line, f"unknown register {args[0]!r} (one of {names})") from None
            return Instruction.s_wr(reg, _number(args[1], "the value", line))
        want(0, "none")
        return Instruction(opcode, Space.NETQ, func)
    except IsaError as e:
        raise AsmError(line, f"{name}: {e.message}") from None


def check_structure(instructions) -> None:
    """Check the program's structure: ``s_wr`` and chains, then one final ``end``.

    Raises
    ------
    IsaError
        CHAIN_STRUCTURE or PROGRAM_RANGE with the index of the offending instruction.
    """
    instrs = list(instructions)

    def fetch(i):
        if i >= len(instrs):
            raise IsaError(ErrorCode.PROGRAM_RANGE, "the program ends inside a chain "
                                                    "(missing end_chain and end)", len(instrs))
        return instrs[i]

    i = 0
    while True:
        if i >= len(instrs):
            raise IsaError(ErrorCode.PROGRAM_RANGE, "the program does not end with end", i)
        op = instrs[i].opcode
        if op is Opcode.END:
            if i != len(instrs) - 1:
                raise IsaError(ErrorCode.CHAIN_STRUCTURE, "instructions after end", i + 1)
            return
        if op is Opcode.S_WR:
            i += 1
        elif op is Opcode.V_RD:
            i = parse_chain(fetch, i).stop
        else:
            what = ("chain without v_rd" if op in (Opcode.MV_MUL, Opcode.VV, Opcode.V_UNARY,
                                                   Opcode.V_REDUCE, Opcode.V_WR,
                                                   Opcode.END_CHAIN)
                    else "unexpected instruction")
            raise IsaError(ErrorCode.CHAIN_STRUCTURE,
                           f"{what}: {mnemonic(instrs[i])} outside a chain", i)


def assemble_instructions(text: str) -> list[Instruction]:
    """Assemble text into :class:`~host.spec.isa.Instruction` objects.

    Raises
    ------
    AsmError
        with the line number: unknown mnemonic, register or space, bad operand count or
        number, a value out of range for its field, and structure errors (a chain
        without v_rd or v_wr, an instruction outside a chain, a missing end, ...).
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, not {type(text).__name__}")
    instrs, lines = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        ins = _parse_line(line, number)
        if ins is not None:
            instrs.append(ins)
            lines.append(number)
    try:
        check_structure(instrs)
    except IsaError as e:
        line = lines[e.index] if e.index is not None and e.index < len(lines) else (
            lines[-1] if lines else None)
        msg = re.sub(r"^instruction \d+: ", "", e.message)
        raise AsmError(line, msg) from None
    return instrs


def assemble(text: str) -> np.ndarray:
    """Assemble text into a ``uint64`` array of instruction words (see
    :func:`assemble_instructions` for the errors)."""
    return encode_program(assemble_instructions(text))


def disassemble(words) -> str:
    """Canonical text of a program (``uint64`` words, ints or Instructions), one line per
    instruction.

    Raises
    ------
    IsaError
        an illegal word (with its index); structure is not checked, so any sequence of
        legal words can be listed.
    """
    words = list(words)
    if words and all(isinstance(w, Instruction) for w in words):
        instrs = words
    else:
        instrs = decode_program(np.array([int(w) for w in words], dtype=np.uint64))
    return "".join(mnemonic(i) + "\n" for i in instrs)
