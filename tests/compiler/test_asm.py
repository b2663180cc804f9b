"""The assembler and disassembler (``host/compiler/asm.py``): canonical round trip (directed and
hypothesis), and line-numbered errors for bad programs."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from host.compiler.asm import AsmError, assemble, assemble_instructions, disassemble
from host.spec.ops import BinaryOp
from host.spec.isa import Instruction, Opcode, Reg, Space, decode_program
from host.spec.ops import ReduceOp
from host.spec.ops import UnaryOp

EXAMPLE = """
# an MLP layer
S_WR rows, 100            # upper case is accepted
s_wr cols, 0x28
s_wr iterations, 0b11
v_rd netq
mv_mul 0
vv_add 12
v_sigm
v_wr ivrf, 8
v_wr_inc asvrf1, 0, 7
end_chain

v_rd_inc mulvrf3, 4, 65535
mv_mul_inc 4294967295, 1
vv_b_sub_a_inc 3, 2
v_max_reduce
v_recip
v_wr netq
end_chain
end
"""

CANONICAL = """s_wr rows, 100
s_wr cols, 40
s_wr iterations, 3
v_rd netq
mv_mul 0
vv_add 12
v_sigm
v_wr ivrf, 8
v_wr_inc asvrf1, 0, 7
end_chain
v_rd_inc mulvrf3, 4, 65535
mv_mul_inc 4294967295, 1
vv_b_sub_a_inc 3, 2
v_max_reduce
v_recip
v_wr netq
end_chain
end
"""


def test_example_round_trip():
    words = assemble(EXAMPLE)
    assert words.dtype == np.uint64 and len(words) == 18
    assert disassemble(words) == CANONICAL
    assert np.array_equal(assemble(CANONICAL), words)
    ins = assemble_instructions(EXAMPLE)
    assert ins[0] == Instruction.s_wr(Reg.ROWS, 100)
    assert ins[8] == Instruction.v_wr(Space.ASVRF1, 0, 7)
    assert ins[12] == Instruction.vv(BinaryOp.B_SUB_A, 3, 2)
    assert disassemble(ins) == CANONICAL


BAD = [
    ("foo\nend", 1, "unknown mnemonic 'foo'"),
    ("s_wr rows, 3\nv_rd ivrf\nend", 2, "v_rd takes 2 operands"),
    ("v_rd ivrf, 0\nv_wr ivrf, 1, 2\nend_chain\nend", 2, "v_wr takes 2 operands"),
    ("\n\nmv_mul 0\nend", 3, "chain without v_rd"),
    ("v_rd ivrf, 0\nend_chain\nend", 2, "chain without v_wr"),
    ("v_rd ivrf, 0\nv_wr ivrf, 1\nend", 3, "inside a chain"),
    ("v_rd ivrf, 0\nv_wr ivrf, 1\nv_relu\nend_chain\nend", 3, "after a v_wr"),
    ("v_rd ivrf, 0\nv_relu\nmv_mul 2\nv_wr ivrf, 1\nend_chain\nend", 3, "mv_mul must come"),
    ("s_wr rows, 5", 1, "does not end with end"),
    ("end\nend", 2, "instructions after end"),
    ("v_rd ivrf, 0\nv_wr ivrf, 1", 2, "ends inside a chain"),
    ("v_rd_inc ivrf, 0, 0\nend", 1, "must be at least 1"),
    ("v_rd_inc ivrf, 0, 65536\nend", 1, "inc must be an integer from 0 to 65535"),
    ("vv_add 4294967296\nend", 1, "operand must be an integer from 0 to 4294967295"),
    ("s_wr bogus, 1\nend", 1, "unknown register 'bogus'"),
    ("s_wr rows, -1\nend", 1, "must be a number"),
    ("s_wr rows, 1.5\nend", 1, "must be a number"),
    ("v_rd mrf, 0\nend", 1, "the MRF is not a vector memory"),
    ("v_rd vrf7, 0\nend", 1, "unknown memory space 'vrf7'"),
    ("v_relu_inc 3\nend", 1, "v_relu has no _inc form"),
    ("v_rd_inc netq, 2\nend", 1, "v_rd netq has no increment"),
    ("v_rd ivrf,\nend", 1, "empty operand"),
    ("v_relu 3\nend", 1, "v_relu takes 0 operands"),
]


@pytest.mark.parametrize("text, line, message", BAD)
def test_errors_name_the_line(text, line, message):
    with pytest.raises(AsmError) as e:
        assemble(text)
    assert e.value.line == line
    assert message in e.value.message
    assert str(e.value).startswith(f"line {line}: ")


def test_disassemble_lists_any_legal_word_sequence():
    words = [Instruction.v_wr(Space.IVRF, 1).encode(), Instruction.end().encode()]
    assert disassemble(words) == "v_wr ivrf, 1\nend\n"


# --- hypothesis: random legal programs round-trip -----------------------------------------

addresses = st.integers(0, (1 << 32) - 1)
incs = st.one_of(st.just(0), st.integers(1, (1 << 16) - 1))
vector_spaces = st.sampled_from([s for s in Space if s not in (Space.NETQ, Space.MRF)])


@st.composite
def access(draw, make):
    if draw(st.booleans()):
        return make(Space.NETQ)
    return make(draw(vector_spaces), draw(addresses), draw(incs))


@st.composite
def chains(draw):
    out = [draw(access(Instruction.v_rd))]
    if draw(st.booleans()):
        out.append(Instruction.mv_mul(draw(addresses), draw(incs)))
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["vv", "unary", "reduce"]))
        if kind == "vv":
            out.append(Instruction.vv(draw(st.sampled_from(list(BinaryOp))), draw(addresses),
                                      draw(incs)))
        elif kind == "unary":
            out.append(Instruction.unary(draw(st.sampled_from(list(UnaryOp)))))
        else:
            out.append(Instruction.reduce(draw(st.sampled_from(list(ReduceOp)))))
    out += [draw(access(Instruction.v_wr)) for _ in range(draw(st.integers(1, 3)))]
    return out + [Instruction.end_chain()]


@st.composite
def programs(draw):
    out = []
    for _ in range(draw(st.integers(0, 8))):
        if draw(st.booleans()):
            out.append(Instruction.s_wr(draw(st.sampled_from(list(Reg))), draw(addresses)))
        else:
            out += draw(chains())
    return out + [Instruction.end()]


@settings(max_examples=300, deadline=None)
@given(programs())
def test_round_trip_of_random_programs(prog):
    text = disassemble(prog)
    words = assemble(text)
    assert decode_program(words) == prog
    assert disassemble(words) == text
    assert np.array_equal(assemble(text.upper()), words)
    assert all(ins.opcode in Opcode for ins in prog)
