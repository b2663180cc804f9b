"""The ISA definition (``host/spec/isa.py``): word layout, encode/decode of every instruction,
illegal words, MRF addressing, ``NpuConfig`` validation, and the encoding tables of
``docs/isa.md`` (generated here, so the page cannot drift from the code)."""

import re
from pathlib import Path

import numpy as np
import pytest

from host.spec.config import NpuConfig
from host.spec.ops import BinaryOp
from host.spec.isa import (
    FIELDS, INSTRUCTION_LAYOUT, MAX_WRITES, MNEMONICS, REG_DEFAULTS, ErrorCode, Instruction,
    IsaError, Opcode, Reg, Space, decode, decode_program, encode_program, mnemonic,
    mrf_address, mrf_location, parse_chain, register_limits,
)
from host.spec.ops import ReduceOp
from host.spec.ops import UnaryOp

DOC = Path(__file__).resolve().parents[2] / "docs" / "isa.md"


def all_instructions():
    out = [Instruction.end(), Instruction.end_chain()]
    for space in Space:
        if space is not Space.MRF:
            for make in (Instruction.v_rd, Instruction.v_wr):
                out.append(make(space) if space is Space.NETQ else make(space, 7, 3))
    out += [Instruction.mv_mul(5), Instruction.mv_mul(0xFFFFFFFF, 0xFFFF)]
    out += [Instruction.vv(op, 9, 1) for op in BinaryOp]
    out += [Instruction.unary(op) for op in UnaryOp]
    out += [Instruction.reduce(op) for op in ReduceOp]
    out += [Instruction.s_wr(r, 12) for r in Reg]
    return out


def test_layout_is_64_bits_and_fields_tile_it():
    assert INSTRUCTION_LAYOUT.size == 64
    covered = sorted(FIELDS.values())
    assert covered[0][0] == 0
    for (a, w), (b, _) in zip(covered, covered[1:]):
        assert a + w == b
    assert FIELDS["opcode"] == (0, 5) and FIELDS["operand"] == (32, 32)


def test_encode_decode_every_instruction():
    instrs = all_instructions()
    words = encode_program(instrs)
    assert words.dtype == np.uint64
    assert decode_program(words) == instrs
    for ins in instrs:
        w = ins.encode()
        assert w & 0x1F == ins.opcode.value
        assert (w >> 32) == ins.operand
        assert decode(w) == ins


def test_encoding_agrees_with_the_amaranth_layout():
    """The plain-Python packing is the layout's own ``const``."""
    for ins in all_instructions():
        func = ins.func.value if not isinstance(ins.func, int) else ins.func
        const = INSTRUCTION_LAYOUT.const({
            "opcode": ins.opcode, "space": ins.space, "func": {"reg": Reg(func)}
            if ins.opcode is Opcode.S_WR else {"binary": BinaryOp(0)} if func == 0
            else {"binary": BinaryOp(func)} if ins.opcode is Opcode.VV
            else {"unary": UnaryOp(func)} if ins.opcode is Opcode.V_UNARY
            else {"reduce": ReduceOp(func)},
            "inc": ins.inc, "operand": ins.operand})
        assert const.as_value().value == ins.encode(), mnemonic(ins)


@pytest.mark.parametrize("word, code", [
    (0, ErrorCode.ILLEGAL_OPCODE),                                 # erased
    (10, ErrorCode.ILLEGAL_OPCODE),                                # opcode 10
    (31, ErrorCode.ILLEGAL_OPCODE),
    (Opcode.VV.value | (5 << 9), ErrorCode.ILLEGAL_OPCODE),        # BinaryOp 5
    (Opcode.V_UNARY.value | (6 << 9), ErrorCode.ILLEGAL_OPCODE),   # UnaryOp 6
    (Opcode.V_REDUCE.value | (2 << 9), ErrorCode.ILLEGAL_OPCODE),  # ReduceOp 2 (bit 10)
    (Opcode.S_WR.value | (10 << 9), ErrorCode.ILLEGAL_OPCODE),     # register 10
    (Opcode.END.value | (1 << 14), ErrorCode.ILLEGAL_FIELD),       # reserved
    (Opcode.END.value | (1 << 32), ErrorCode.ILLEGAL_FIELD),       # end has no operand
    (Opcode.END_CHAIN.value | (1 << 16), ErrorCode.ILLEGAL_FIELD),  # no inc
    (Opcode.MV_MUL.value | (1 << 5), ErrorCode.ILLEGAL_FIELD),     # no space
    (Opcode.V_RD.value | (15 << 5), ErrorCode.ILLEGAL_FIELD),      # MRF
    (Opcode.V_RD.value | (12 << 5), ErrorCode.ILLEGAL_FIELD),      # space 12
    (Opcode.V_WR.value | (3 << 32), ErrorCode.ILLEGAL_FIELD),      # netq with an address
    (Opcode.V_UNARY.value | (1 << 32), ErrorCode.ILLEGAL_FIELD),
    (Opcode.S_WR.value | (1 << 16), ErrorCode.ILLEGAL_FIELD),
])
def test_illegal_words(word, code):
    with pytest.raises(IsaError) as e:
        decode(word, 4)
    assert e.value.code is code and e.value.index == 4
    assert "instruction 4" in e.value.message


def test_instruction_fields_are_validated():
    with pytest.raises(IsaError, match="inc must be"):
        Instruction.v_rd(Space.IVRF, 0, 1 << 16)
    with pytest.raises(IsaError, match="operand must be"):
        Instruction.mv_mul(1 << 32)
    with pytest.raises(IsaError, match="netq takes no address"):
        Instruction.v_wr(Space.NETQ, 4)
    with pytest.raises(ValueError):
        Instruction.vv("div", 0)


def test_spaces():
    assert [Space.asvrf(m) for m in range(4)] == [Space.ASVRF0, Space.ASVRF1, Space.ASVRF2,
                                                 Space.ASVRF3]
    assert [Space.mulvrf(m).value for m in range(4)] == [3, 5, 7, 9]
    assert Space.MULVRF2.mfu == 2 and Space.IVRF.mfu is None and Space.MRF.value == 15
    assert Space.IVRF.is_vector and not Space.NETQ.is_vector and not Space.MRF.is_vector


def test_mnemonics_reuse_the_operation_codes():
    assert MNEMONICS["vv_a_sub_b"] == (Opcode.VV, BinaryOp.A_SUB_B)
    assert MNEMONICS["v_sigm"] == (Opcode.V_UNARY, UnaryOp.SIGMOID)
    assert MNEMONICS["v_sum_reduce"] == (Opcode.V_REDUCE, ReduceOp.SUM)
    assert len(MNEMONICS) == 6 + len(BinaryOp) + len(UnaryOp) + len(ReduceOp)


@pytest.mark.parametrize("n, tiles, depth", [(8, 2, 32), (4, 3, 5), (16, 1, 7)])
def test_mrf_address(n, tiles, depth):
    cfg = NpuConfig(n=n, tiles=tiles, mrf_depth=depth)
    seen = []
    for slot in range(depth):
        for engine in range(tiles):
            for row in range(n):
                a = mrf_address(cfg, engine, row, slot)
                assert mrf_location(cfg, a) == (engine, row, slot)
                seen.append(a)
    assert seen == list(range(cfg.mrf_words))      # tiles contiguous, slot by slot
    with pytest.raises(ValueError, match="engine"):
        mrf_address(cfg, tiles, 0, 0)
    with pytest.raises(ValueError, match="address"):
        mrf_location(cfg, cfg.mrf_words)


@pytest.mark.parametrize("kw, message", [
    (dict(mfus=1), "mfus must be from 2 to 4, not 1"),
    (dict(mfus=5), "mfus must be from 2 to 4, not 5"),
    (dict(ivrf_depth=0), "ivrf_depth must be from 1"),
    (dict(vrf_depth=5000), "vrf_depth must be from 1 to 4096, not 5000"),
    (dict(netq_depth=1 << 25), "netq_depth must be from 1"),
    (dict(program_depth=1), "program_depth must be from 2"),
    (dict(max_length=12), "max_length must be a power of two, not 12"),
    (dict(max_length=512), "max_length must be from 1 to 256, not 512"),
    (dict(unary_ops=("relu", "cube")), "'cube'"),
    (dict(unary_ops=()), "unary_ops must name at least one"),
    (dict(n=12), "n must be a power of two, not 12"),
    (dict(tiles=9), "tiles must be from 1 to 8, not 9"),
])
def test_npu_config_validation(kw, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        NpuConfig(**kw)


def test_npu_config_derives_mvm_and_mfu():
    cfg = NpuConfig(n=8, tiles=3, mantissa_bits_v=5, mfus=3, vrf_depth=64, max_length=8,
                    unary_ops=["exp", "relu"])
    assert cfg.unary_ops == (UnaryOp.RELU, UnaryOp.EXP)
    assert cfg.mvm.tiles == 3 and cfg.mvm.mantissa_bits_v == 5 and cfg.mvm.n == 8
    assert cfg.mfu.mfus == 3 and cfg.mfu.vrf_depth == 64 and cfg.mfu.unary_ops == cfg.unary_ops
    assert cfg.mrf_words == 3 * 8 * cfg.mrf_depth and cfg.max_elements == 64


# --- docs/isa.md tables ---------------------------------------------------------------------

def _table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def doc_tables() -> dict[str, str]:
    """The generated tables of docs/isa.md, by marker name."""
    fields = _table(["field", "bits", "width"],
                    [(name, f"{off}..{off + w - 1}", w) for name, (off, w) in FIELDS.items()])
    ops = []
    for name, (opcode, func) in MNEMONICS.items():
        f = f"{type(func).__name__}.{func.name} = {func.value}" if not isinstance(func, int) \
            else "-"
        ops.append((f"`{name}`", f"{opcode.name} = {opcode.value}", f))
    opcodes = _table(["mnemonic", "opcode", "func"], ops)
    spaces = _table(["space", "code"], [(s.name, s.value) for s in Space])
    regs = _table(["register", "code", "power-on value"],
                  [(r.name.lower(), r.value, "N" if REG_DEFAULTS[r] is None else REG_DEFAULTS[r])
                   for r in Reg])
    errors = _table(["error", "code"], [(e.name, e.value) for e in ErrorCode])
    return {"fields": fields, "opcodes": opcodes, "spaces": spaces, "registers": regs,
            "errors": errors}


def test_doc_tables_are_current():
    text = DOC.read_text()
    for name, table in doc_tables().items():
        m = re.search(rf"<!-- table:{name} -->\n(.*?)\n<!-- end -->", text, re.S)
        assert m, f"docs/isa.md has no table:{name} marker"
        assert m.group(1) == table, (
            f"docs/isa.md table {name} is stale; regenerate it with "
            f"`python tests/spec/test_isa.py`")


if __name__ == "__main__":            # rewrite the generated tables of docs/isa.md
    text = DOC.read_text()
    for name, table in doc_tables().items():
        text = re.sub(rf"(<!-- table:{name} -->\n).*?(\n<!-- end -->)",
                      lambda m: m.group(1) + table + m.group(2), text, flags=re.S)
    DOC.write_text(text)


@pytest.mark.parametrize("writes", [1, MAX_WRITES, MAX_WRITES + 1])
def test_writes_per_chain(writes):
    program = [Instruction.v_rd(Space.IVRF, 0)] + [
        Instruction.v_wr(Space.IVRF, 8 * k) for k in range(1, writes + 1)
    ] + [Instruction.end_chain()]
    if writes <= MAX_WRITES:
        chain = parse_chain(program.__getitem__, 0)
        assert len(chain.writes) == writes and chain.stop == len(program)
    else:
        with pytest.raises(IsaError, match=f"instruction {writes}: more than {MAX_WRITES} "
                                           f"v_wr in one chain") as e:
            parse_chain(program.__getitem__, 0)
        assert e.value.code is ErrorCode.CHAIN_STRUCTURE and e.value.index == writes


def test_register_limits():
    cfg = NpuConfig(n=8, tiles=1, max_col_tiles=16, max_length=4)
    limits = register_limits(cfg)
    assert set(limits) == set(Reg)
    assert limits[Reg.ROWS] == (1, 32) and limits[Reg.COLS] == (1, 128)
    assert limits[Reg.WIN_W] == (1, 16) and limits[Reg.NARROW] == (1, 64)
