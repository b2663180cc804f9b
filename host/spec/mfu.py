"""The multifunction-unit (MFU) pipeline's contract: units, chains, allocation, encoding.

``docs/mfu.md`` is the design note; ``docs/numerics.md`` section 6 the numeric contract.
This module is the one definition of what the ISA, the scheduler, the gateware
(``hw/mfu/mfu.py``) and the testbenches share about the MFUs:

* :class:`MfuUnit` (the four units of an MFU) and :class:`VrfBank` (its two vector
  register files);
* :class:`MfuOp`, one operation of a chain, and :func:`allocate`, the rule that places a
  chain's ordered op list onto the MFUs (an op list is legal iff it succeeds);
* :func:`parse_unit_sets`, the units built in each MFU (the build parameter
  ``unit_sets``), with :func:`format_unit_sets`, :func:`units_built` and
  :func:`unit_set_mask`;
* :class:`MfuConfig`, the build parameters, from which every width is derived;
* :func:`chain_layout` / :func:`encode_chain` / :func:`decode_chain`, the chain
  configuration word the pipeline takes, and :func:`vrf_write_layout`, its VRF write
  port's payload;

The model of a chain (its VRFs, outputs and counter events) is :mod:`host.model.mfu`.

A chain passes a logical vector of ``L`` native vectors (``N`` FP16 lanes each) through
its ops in order. ``a`` is always the chain's value and ``b`` the VRF operand, so
``vv_b_sub_a`` computes ``vrf - x``. For native vector ``j`` an ADDSUB or MUL op reads its
operand at VRF address ``addr + j`` of the MFU the op is allocated to.
"""

from __future__ import annotations

import dataclasses

from amaranth.hdl import unsigned
from amaranth.lib import data, enum

from host.spec.formats import FP16_BITS, check_int
from host.spec.ops import BinaryOp
from host.spec.ops import ReduceOp
from host.spec.ops import UnaryOp, parse_ops

__all__ = [
    "MfuUnit", "VrfBank", "UNITS", "ALL_UNITS", "MfuOp", "allocate", "parse_unit_sets",
    "format_unit_sets", "units_built", "unit_set_mask", "unit_sets_from_mask", "LANES_MIN",
    "check_lanes", "MfuConfig",
    "slot_layout", "mfu_layout", "chain_layout", "encode_chain", "decode_chain",
    "vrf_write_layout",
]


class MfuUnit(enum.Enum, shape=2):
    """The four units of an MFU (the one definition; the gateware's crossbar uses it).

    ====== ==== ============================================================
    member code operations
    ====== ==== ============================================================
    ADDSUB 0    ``BinaryOp`` ADD, A_SUB_B, B_SUB_A, MAX; ``b`` from AddSubVrf
    MUL    1    ``BinaryOp.MUL``; ``b`` from MulVrf
    ACT    2    ``UnaryOp`` (relu, sigmoid, tanh, exp, recip, pass)
    REDUCE 3    ``ReduceOp`` (max, sum over the logical vector, broadcast)
    ====== ==== ============================================================
    """
    ADDSUB = 0
    MUL = 1
    ACT = 2
    REDUCE = 3


#: Number of units of one MFU (and of order slots in its chain configuration).
UNITS = len(MfuUnit)


class VrfBank(enum.Enum, shape=1):
    """The vector register files of an MFU, numbered like the units that read them."""
    ADDSUB = MfuUnit.ADDSUB.value
    MUL = MfuUnit.MUL.value

    @property
    def unit(self) -> MfuUnit:
        """The unit whose operand this VRF holds."""
        return MfuUnit(self.value)


_OP_TYPES = {MfuUnit.ADDSUB: BinaryOp, MfuUnit.MUL: BinaryOp, MfuUnit.ACT: UnaryOp,
             MfuUnit.REDUCE: ReduceOp}
_VRF_UNITS = (MfuUnit.ADDSUB, MfuUnit.MUL)


@dataclasses.dataclass(frozen=True)
class MfuOp:
    """One operation of a chain: the unit it runs on, the unit's op and its VRF address.

    Build it with :meth:`binary`, :meth:`unary` or :meth:`reduce`; direct construction is
    validated the same way.

    Attributes
    ----------
    unit : MfuUnit
    op : BinaryOp, UnaryOp or ReduceOp
        ``BinaryOp`` ADD, A_SUB_B, B_SUB_A or MAX for ADDSUB; ``BinaryOp.MUL`` for MUL;
        ``UnaryOp`` for ACT; ``ReduceOp`` for REDUCE.
    addr : int or None
        First VRF address of the operand (native vector ``j`` reads ``addr + j``) for
        ADDSUB and MUL; ``None`` for ACT and REDUCE.

    Raises
    ------
    TypeError, ValueError
        naming the field and the value: an op that is not one of its unit's, a missing or
        superfluous ``addr``, a negative ``addr``.
    """
    unit: MfuUnit
    op: BinaryOp | UnaryOp | ReduceOp
    addr: int | None = None

    def __post_init__(self):
        if not isinstance(self.unit, MfuUnit):
            raise TypeError(f"unit must be an MfuUnit, not {self.unit!r}")
        kind = _OP_TYPES[self.unit]
        if not isinstance(self.op, kind):
            raise TypeError(f"op of unit {self.unit.name} must be a {kind.__name__}, "
                            f"not {self.op!r}")
        if self.unit is MfuUnit.MUL and self.op is not BinaryOp.MUL:
            raise ValueError(f"op of unit MUL must be BinaryOp.MUL, not {self.op!r}")
        if self.unit is MfuUnit.ADDSUB and self.op is BinaryOp.MUL:
            raise ValueError("op of unit ADDSUB must not be BinaryOp.MUL (unit MUL has it)")
        if self.unit in _VRF_UNITS:
            check_int("addr", self.addr, 0)
        elif self.addr is not None:
            raise ValueError(f"addr must be None for unit {self.unit.name}, not "
                             f"{self.addr!r}")

    @classmethod
    def binary(cls, op, addr: int) -> "MfuOp":
        """An element-wise op with a VRF operand: MUL on the MUL unit, the others on ADDSUB.

        ``op`` is a :class:`BinaryOp` or its name (``"add"``, ``"b_sub_a"``, ...).
        """
        op = BinaryOp.parse(op)
        return cls(MfuUnit.MUL if op is BinaryOp.MUL else MfuUnit.ADDSUB, op, addr)

    @classmethod
    def unary(cls, op) -> "MfuOp":
        """An activation op (a :class:`UnaryOp`, its code or its name) on the ACT unit."""
        return cls(MfuUnit.ACT, UnaryOp.parse(op))

    @classmethod
    def reduce(cls, op) -> "MfuOp":
        """A reduction (a :class:`ReduceOp`, its code or its name) on the REDUCE unit."""
        return cls(MfuUnit.REDUCE, ReduceOp.parse(op))

    def __str__(self):
        name = f"{self.unit.name.lower()}.{self.op.name.lower()}"
        return name if self.addr is None else f"{name}({self.addr})"


def _check_ops(ops) -> tuple[MfuOp, ...]:
    if isinstance(ops, MfuOp):
        raise TypeError(f"ops must be a sequence of MfuOp, not a single {ops}")
    try:
        ops = tuple(ops)
    except TypeError:
        raise TypeError(f"ops must be a sequence of MfuOp, not {ops!r}") from None
    for i, op in enumerate(ops):
        if not isinstance(op, MfuOp):
            raise TypeError(f"ops[{i}] must be an MfuOp, not {op!r}")
    return ops


# --- unit sets: the units built in each MFU ---------------------------------------------------

#: Every unit, in code order: an MFU's units when the build gives no unit sets.
ALL_UNITS = tuple(MfuUnit)


def _parse_unit(value, where: str) -> MfuUnit:
    if isinstance(value, MfuUnit):
        return value
    if isinstance(value, str):
        for unit in MfuUnit:
            if value.strip().lower() == unit.name.lower():
                return unit
    names = ", ".join(repr(u.name.lower()) for u in MfuUnit)
    raise ValueError(f"{where} must be an MfuUnit or one of {names}, not {value!r}")


def parse_unit_sets(unit_sets, mfus: int):
    """The units built in each of ``mfus`` MFUs (the build parameter ``unit_sets``),
    normalized.

    ``unit_sets`` is None (every unit in every MFU), a sequence of ``mfus`` entries, one
    per MFU, each a non-empty collection of :class:`MfuUnit` or their names (``"addsub"``,
    ``"mul"``, ``"act"``, ``"reduce"``, any case) or the name ``"all"``; or the text form
    of :func:`format_unit_sets`, the entries joined by ``/`` and the units of an entry by
    ``+`` (``"addsub+mul+reduce/addsub+mul+act"``). A unit named twice counts once.

    Returns
    -------
    None or tuple of ``mfus`` tuples of MfuUnit
        None when every MFU has every unit (so that such a build equals the default
        one); else each MFU's units sorted by code.

    Raises
    ------
    TypeError, ValueError
        naming ``unit_sets`` (and the entry) and the value: not a sequence, the wrong
        number of entries, an empty entry, a name that is no unit.
    """
    mfus = check_int("mfus", mfus, 1)
    if unit_sets is None:
        return None
    given = unit_sets
    if isinstance(unit_sets, str):
        unit_sets = [ALL_UNITS if entry.strip().lower() == "all" else entry.split("+")
                     for entry in unit_sets.split("/")]
    try:
        entries = list(unit_sets)
    except TypeError:
        raise TypeError(f"unit_sets must be a sequence of {mfus} unit collections (one per "
                        f"MFU) or None, not {unit_sets!r}") from None
    if len(entries) != mfus:
        raise ValueError(f"unit_sets must have one entry per MFU ({mfus}), not "
                         f"{len(entries)}: {given!r}")
    out = []
    for m, entry in enumerate(entries):
        where = f"unit_sets[{m}]"
        if isinstance(entry, str) and entry.strip().lower() == "all":
            entry = ALL_UNITS
        if isinstance(entry, (str, MfuUnit)):
            raise TypeError(f"{where} must be a collection of units, not the single "
                            f"{entry!r}")
        try:
            units = {_parse_unit(u, where) for u in entry if not (isinstance(u, str)
                                                                   and not u.strip())}
        except TypeError:
            raise TypeError(f"{where} must be a collection of units, not {entry!r}") from None
        if not units:
            raise ValueError(f"{where} must name at least one unit, not {entry!r}")
        out.append(tuple(sorted(units, key=lambda u: u.value)))
    if all(units == ALL_UNITS for units in out):
        return None
    return tuple(out)


def units_built(unit_sets, mfu: int) -> tuple:
    """The units of MFU ``mfu`` in normalized ``unit_sets`` (None: every unit)."""
    return ALL_UNITS if unit_sets is None else unit_sets[mfu]


def format_unit_sets(unit_sets, mfus: int) -> str:
    """The text form of normalized ``unit_sets`` for ``mfus`` MFUs: each MFU's unit names
    joined by ``+``, the MFUs by ``/`` (``"addsub+mul+reduce/addsub+mul+act"``); every
    unit of every MFU when ``unit_sets`` is None. :func:`parse_unit_sets` reads it."""
    return "/".join("+".join(u.name.lower() for u in units_built(unit_sets, m))
                    for m in range(mfus))


def unit_set_mask(unit_sets, mfus: int) -> int:
    """Normalized ``unit_sets`` as one integer: bit ``UNITS * m + unit.value`` set for each
    unit built in MFU ``m`` (what INFO reports, ``host.spec.protocol``)."""
    return sum(1 << (UNITS * m + u.value) for m in range(mfus)
               for u in units_built(unit_sets, m))


def unit_sets_from_mask(mask: int, mfus: int):
    """Inverse of :func:`unit_set_mask` (normalized: None when every unit is built).

    Raises
    ------
    ValueError
        bits beyond the ``mfus`` MFUs, or an MFU without units.
    """
    mask = check_int("unit_sets mask", mask, 0)
    if mask >> (UNITS * mfus):
        raise ValueError(f"unit_sets mask {mask:#x} has bits beyond the {mfus} MFUs")
    return parse_unit_sets([[u for u in MfuUnit if mask >> (UNITS * m + u.value) & 1]
                            for m in range(mfus)], mfus)


def allocate(ops, mfus: int, unit_sets=None) -> tuple[tuple[MfuOp, ...], ...]:
    """Place a chain's ordered ops onto ``mfus`` MFUs: the one allocation rule.

    Walk the ops in order with a current MFU index starting at 0; an op moves on to the
    next MFU while its unit is already used in the current MFU or not built there
    (``unit_sets``). Within one MFU the crossbar runs the units in any order, each at most
    once. An op list is legal iff this succeeds.

    Parameters
    ----------
    ops : sequence of MfuOp
    mfus : int
    unit_sets : as :func:`parse_unit_sets`, optional
        The units built in each MFU (a build's ``unit_sets``); None: every unit in every
        MFU.

    Returns
    -------
    tuple of ``mfus`` tuples of MfuOp
        The ops of MFU ``m``, in chain order; their concatenation is ``ops``.

    Raises
    ------
    ValueError
        running past the last MFU, naming the op's index and unit and, with unit sets,
        whether the unit is missing from the MFUs that remained; ``mfus`` < 1; bad
        ``unit_sets``.
    TypeError
        ``ops`` is not a sequence of :class:`MfuOp`.
    """
    ops = _check_ops(ops)
    mfus = check_int("mfus", mfus, 1)
    unit_sets = parse_unit_sets(unit_sets, mfus)
    placed: list[list[MfuOp]] = [[] for _ in range(mfus)]
    m = 0
    for i, op in enumerate(ops):
        start = m
        while any(o.unit is op.unit for o in placed[m]) or (
                unit_sets is not None and op.unit not in unit_sets[m]):
            m += 1
            if m < mfus:
                continue
            unit = op.unit.name
            if unit_sets is None or (start == mfus - 1 and op.unit in unit_sets[start]):
                raise ValueError(f"op {i} ({op}) needs unit {unit} after MFU {mfus - 1}, "
                                 f"the last of {mfus} MFUs")
            sets = format_unit_sets(unit_sets, mfus)
            if op.unit in unit_sets[start]:
                raise ValueError(f"op {i} ({op}) needs unit {unit} after MFU {start}, which "
                                 f"already uses it; no later MFU has {unit} built (unit "
                                 f"sets {sets})")
            raise ValueError(f"op {i} ({op}) needs unit {unit}, which is not built in MFU "
                             f"{start} or any later MFU (unit sets {sets})")
        placed[m].append(op)
    return tuple(tuple(p) for p in placed)


#: The fewest lanes a build may have (``lanes``, :func:`check_lanes`). One lane would
#: divide ``n`` too, but it is refused: from two lanes to one an MFU saves one lane (about
#: 2.7k LUT4 sites, ``SPEC.md`` section 8) while its chains take twice the cycles, and
#: every beat count, the output ring (``max_length * n / lanes`` entries) and REDUCE's
#: vector tree (``max_length * n / lanes`` items) double again.
LANES_MIN = 2


def check_lanes(lanes, n: int) -> int:
    """``lanes`` as an int: None means ``n``; otherwise an integer from :data:`LANES_MIN`
    to ``n`` that divides ``n`` (so a power of two, as ``n`` is).

    Raises
    ------
    TypeError, ValueError
        naming ``lanes`` and the value (and ``n`` when it does not divide it).
    """
    if lanes is None:
        return n
    lanes = check_int("lanes", lanes, LANES_MIN, n)
    if n % lanes:
        raise ValueError(f"lanes must divide n = {n}, not {lanes}")
    return lanes


@dataclasses.dataclass(frozen=True)
class MfuConfig:
    """Build parameters of an MFU pipeline; every width of the gateware derives from them.

    Parameters
    ----------
    n : int
        Native vector size ``N`` (FP16 lanes), a power of two from 4 to 64.
    mfus : int
        MFUs in series, 2 to 4.
    vrf_depth : int
        Native vectors in each AddSubVrf and MulVrf, 1 to 4096.
    max_length : int
        Largest chain length ``L`` (native vectors per logical vector), a power of two
        from 1 to 256.
    unary_ops : tuple of UnaryOp
        Activation functions built (default all); stored sorted by code.
    counter_bits : int
        Width of every saturating event counter, 1 to 64.
    unit_sets : None or one collection of units per MFU
        The units built in each MFU (:func:`parse_unit_sets`; None, the default: every
        unit in every MFU). An MFU builds only its units, and its AddSubVrf (MulVrf) only
        with ADDSUB (MUL); :func:`allocate` moves an op past the MFUs without its unit.
        Stored normalized: None or a tuple of ``mfus`` tuples of :class:`MfuUnit`.
    lanes : int or None
        FP16 lanes ``l`` of the MFUs' datapath (None, the default: ``n``), from
        :data:`LANES_MIN` to ``n``, dividing ``n``. A native vector then passes in
        ``beats = n / l`` *beats*, one per cycle: beat ``b`` of native vector ``j``
        carries its lanes ``b*l .. b*l + l - 1``, the beats of a vector in order, the
        vectors in order (in NumPy, ``x.reshape(-1, l)`` of an ``(L, n)`` array). Only
        widths and counts depend on it, never a result: the chain encoding, ``length``
        and ``lanes_last`` stay in native vectors and lanes of ``n``. Stored as an int.

    Raises
    ------
    TypeError, ValueError
        naming the parameter and the value.
    """
    n: int = 16
    mfus: int = 2
    vrf_depth: int = 512
    max_length: int = 8
    unary_ops: tuple = tuple(UnaryOp)
    counter_bits: int = 32
    unit_sets: tuple | None = None
    lanes: int | None = None

    def __post_init__(self):
        check_int("n", self.n, 4, 64)
        if self.n & (self.n - 1):
            raise ValueError(f"n must be a power of two, not {self.n}")
        check_int("mfus", self.mfus, 2, 4)
        check_int("vrf_depth", self.vrf_depth, 1, 4096)
        check_int("max_length", self.max_length, 1, 256)
        if self.max_length & (self.max_length - 1):
            raise ValueError(f"max_length must be a power of two, not {self.max_length}")
        ops = parse_ops(self.unary_ops)
        if not ops:
            raise ValueError(f"unary_ops must name at least one unary op, not "
                             f"{self.unary_ops!r}")
        object.__setattr__(self, "unary_ops", ops)
        check_int("counter_bits", self.counter_bits, 1, 64)
        object.__setattr__(self, "unit_sets", parse_unit_sets(self.unit_sets, self.mfus))
        object.__setattr__(self, "lanes", check_lanes(self.lanes, self.n))

    def units(self, mfu: int) -> tuple:
        """The units built in MFU ``mfu`` (sorted by code)."""
        return units_built(self.unit_sets, check_int("mfu", mfu, 0, self.mfus - 1))

    def has_vrf(self, mfu: int, bank) -> bool:
        """Whether MFU ``mfu`` has VRF ``bank`` (a :class:`VrfBank` or its code): the
        AddSubVrf comes with the ADDSUB unit, the MulVrf with MUL."""
        return VrfBank(bank).unit in self.units(mfu)

    # --- derived widths ---------------------------------------------------------------------

    @property
    def addr_bits(self) -> int:
        """Width of a VRF address field (at least 1)."""
        return max(1, (self.vrf_depth - 1).bit_length())

    @property
    def length_bits(self) -> int:
        """Width of the chain's ``length`` field, which holds ``L`` (1..max_length)."""
        return self.max_length.bit_length()

    @property
    def beats(self) -> int:
        """Beats of one native vector, ``n // lanes`` (1 when ``lanes == n``)."""
        return self.n // self.lanes

    @property
    def beat_bits(self) -> int:
        """Width of a beat index, ``log2(beats)`` (0 when ``lanes == n``)."""
        return self.beats.bit_length() - 1

    @property
    def lanes_bits(self) -> int:
        """Width of the chain's ``lanes_last`` field, which holds 1..n."""
        return self.n.bit_length()

    @property
    def mfu_bits(self) -> int:
        """Width of the MFU index of a VRF write."""
        return max(1, (self.mfus - 1).bit_length())

    @property
    def counter_max(self) -> int:
        """Value at which the counters saturate, ``2**counter_bits - 1``."""
        return (1 << self.counter_bits) - 1


def _check_cfg(cfg):
    if not isinstance(cfg, MfuConfig):
        raise TypeError(f"cfg must be an MfuConfig, not {cfg!r}")
    return cfg


def _check_addrs(cfg, placed, length):
    for m, mfu_ops in enumerate(placed):
        for op in mfu_ops:
            if op.unit in _VRF_UNITS and op.addr + length > cfg.vrf_depth:
                raise ValueError(f"{op} on MFU {m}: addr + L = {op.addr} + {length} must be "
                                 f"at most vrf_depth {cfg.vrf_depth}")


# --- chain configuration encoding -------------------------------------------------------------

def slot_layout() -> data.StructLayout:
    """One order slot of an MFU: ``unit`` (2 bits) then ``used`` (1 bit)."""
    return data.StructLayout({"unit": MfuUnit, "used": unsigned(1)})


def mfu_layout(cfg: MfuConfig) -> data.StructLayout:
    """The configuration of one MFU for one chain, low bits first:

    ``order`` (4 slots of :func:`slot_layout`: the units in the order the chain visits
    them, used slots first), ``addsub_op`` (BinaryOp, 3 bits), ``addsub_addr`` and
    ``mul_addr`` (``cfg.addr_bits`` each), ``act_op`` (UnaryOp, 3 bits), ``reduce_op``
    (ReduceOp, 1 bit). Fields of units the chain does not use are 0.
    """
    _check_cfg(cfg)
    return data.StructLayout({
        "order": data.ArrayLayout(slot_layout(), UNITS),
        "addsub_op": BinaryOp,
        "addsub_addr": unsigned(cfg.addr_bits),
        "mul_addr": unsigned(cfg.addr_bits),
        "act_op": UnaryOp,
        "reduce_op": ReduceOp,
    })


def chain_layout(cfg: MfuConfig) -> data.StructLayout:
    """The chain configuration the pipeline takes (``MfuPipeline.chain``), low bits first:

    ``mfu`` (``cfg.mfus`` entries of :func:`mfu_layout`), ``length`` (``L`` itself,
    ``cfg.length_bits`` wide), ``lanes_last`` (1..n, ``cfg.lanes_bits`` wide).
    """
    return data.StructLayout({
        "mfu": data.ArrayLayout(mfu_layout(cfg), cfg.mfus),
        "length": unsigned(cfg.length_bits),
        "lanes_last": unsigned(cfg.lanes_bits),
    })


def encode_chain(cfg: MfuConfig, ops, length: int, lanes_last: int) -> int:
    """The chain configuration word (an int of ``chain_layout(cfg).size`` bits).

    Raises
    ------
    ValueError
        an illegal op list, ``length`` outside ``1..max_length``, ``lanes_last`` outside
        ``1..n``, a VRF operand window ``addr .. addr + length - 1`` beyond ``vrf_depth``.
    TypeError
        wrong argument types.
    """
    _check_cfg(cfg)
    placed = allocate(ops, cfg.mfus, cfg.unit_sets)
    length = check_int("length", length, 1, cfg.max_length)
    lanes_last = check_int("lanes_last", lanes_last, 1, cfg.n)
    _check_addrs(cfg, placed, length)
    mfus = []
    for mfu_ops in placed:
        entry = {"order": [{"unit": op.unit, "used": 1} for op in mfu_ops]
                 + [{"unit": MfuUnit.ADDSUB, "used": 0}] * (UNITS - len(mfu_ops)),
                 "addsub_op": BinaryOp.ADD, "addsub_addr": 0, "mul_addr": 0,
                 "act_op": UnaryOp.RELU, "reduce_op": ReduceOp.MAX}
        for op in mfu_ops:
            if op.unit is MfuUnit.ADDSUB:
                entry["addsub_op"], entry["addsub_addr"] = op.op, op.addr
            elif op.unit is MfuUnit.MUL:
                entry["mul_addr"] = op.addr
            elif op.unit is MfuUnit.ACT:
                entry["act_op"] = op.op
            else:
                entry["reduce_op"] = op.op
        mfus.append(entry)
    value = chain_layout(cfg).const({"mfu": mfus, "length": length,
                                     "lanes_last": lanes_last})
    return value.as_value().value


def decode_chain(cfg: MfuConfig, word: int):
    """Inverse of :func:`encode_chain`: ``(ops, length, lanes_last)``.

    The ops come back in chain order (MFU by MFU, slot by slot), which is the order they
    were encoded in.

    Raises
    ------
    ValueError
        ``word`` is not a legal configuration (a gap in the used slots, a unit in two
        slots of one MFU or in an MFU that does not build it, an undefined op code,
        ``length`` or ``lanes_last`` out of range).
    """
    layout = chain_layout(cfg)
    word = check_int("word", word, 0, (1 << layout.size) - 1)
    const = data.Const(layout, word)
    ops = []
    for m in range(cfg.mfus):
        entry = const.mfu[m]
        seen = []
        for k in range(UNITS):
            slot = entry.order[k]
            if not slot.used:
                if any(entry.order[j].used for j in range(k + 1, UNITS)):
                    raise ValueError(f"MFU {m}: used slot after unused slot {k}")
                break
            unit = MfuUnit(slot.unit)
            if unit in seen:
                raise ValueError(f"MFU {m}: unit {unit.name} in two slots")
            if unit not in cfg.units(m):
                raise ValueError(f"MFU {m}: unit {unit.name} is not built there (unit sets "
                                 f"{format_unit_sets(cfg.unit_sets, cfg.mfus)})")
            seen.append(unit)
            try:
                if unit is MfuUnit.ADDSUB:
                    ops.append(MfuOp(unit, BinaryOp(entry.addsub_op), int(entry.addsub_addr)))
                elif unit is MfuUnit.MUL:
                    ops.append(MfuOp(unit, BinaryOp.MUL, int(entry.mul_addr)))
                elif unit is MfuUnit.ACT:
                    ops.append(MfuOp(unit, UnaryOp(entry.act_op)))
                else:
                    ops.append(MfuOp(unit, ReduceOp(entry.reduce_op)))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"MFU {m}, unit {unit.name}: {exc}") from None
    length = check_int("length", int(const.length), 1, cfg.max_length)
    lanes_last = check_int("lanes_last", int(const.lanes_last), 1, cfg.n)
    return tuple(ops), length, lanes_last


def vrf_write_layout(cfg: MfuConfig) -> data.StructLayout:
    """Payload of the pipeline's ``vrf_w`` stream, low bits first: ``mfu``
    (``cfg.mfu_bits``), ``bank`` (:class:`VrfBank`, 1 bit), ``addr`` (``cfg.addr_bits +
    cfg.beat_bits``), ``values`` (``cfg.lanes`` FP16 lanes).

    One write is one beat: ``addr`` is a *beat address*, ``a * beats + b`` for beat ``b``
    of the native vector at VRF address ``a`` (``Cat(b, a)``), and ``values`` its lanes
    ``b*lanes .. b*lanes + lanes - 1``. With ``lanes == n`` that is one native vector at
    its address."""
    _check_cfg(cfg)
    return data.StructLayout({
        "mfu": unsigned(cfg.mfu_bits),
        "bank": VrfBank,
        "addr": unsigned(cfg.addr_bits + cfg.beat_bits),
        "values": data.ArrayLayout(unsigned(FP16_BITS), cfg.lanes),
    })
