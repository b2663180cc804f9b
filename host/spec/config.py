"""Build configuration of the matrix-vector unit, described once.

Every width of the gateware and every bound of the reference model is derived here from a
handful of parameters, so that the hardware, the model and the host agree by construction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

from host.spec.formats import (
    FP16_MAX_EXP, MANTISSA_BITS_MAX, MANTISSA_BITS_MIN, MVM_EXP_EXACT_MIN, block_bits,
    check_int,
)

__all__ = ["MvmConfig", "NpuConfig", "check_bool"]


def check_bool(name: str, value) -> bool:
    """Return ``value`` if it is a ``bool``; else raise ``TypeError`` naming ``name`` and
    the value (an integer 0 or 1 is refused too: a build option is said as True or False,
    and :func:`parse_config` takes its text forms)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {value!r}")
    return value


def _clog2(value: int) -> int:
    return max(0, (value - 1).bit_length())


@dataclass(frozen=True)
class MvmConfig:
    """Parameters of one matrix-vector multiplier build.

    Parameters
    ----------
    n : int
        Native dimension N, a power of two from 4 to 64: a tile is N x N, a native vector
        has N lanes, a BFP block has N mantissas.
    tiles : int
        Tile engines T, 1 to 8. Engine ``t`` holds column tiles ``c`` with ``c % T == t``.
    mantissa_bits_v, mantissa_bits_w : int
        Mantissa widths of vector and weight blocks, 2 to 16.
    mrf_depth : int
        Tile slots per tile engine (each slot is one N x N tile: N block words, one per
        dot-product engine), 1 to 65536.
    max_col_tiles : int
        Largest number of column tiles C of one product, 1 to 4096; sizes the vector
        buffer and the BFP-long accumulator.
    counter_bits : int
        Width of every saturating event counter, 1 to 64.
    narrow_check : bool
        Build the narrow-accumulator check (``docs/numerics.md`` section 5): the fit
        tests of every product, adder-tree node and cross-tile sum against the run-time
        width ``k`` and their counter ``narrow_events``. ``False`` leaves that logic out
        (31 % of the MVM's LUT4 sites at N = 16, T = 2, ``docs/mvm.md`` section 12): outputs,
        cycles, ports and the other counters are unchanged, the register ``NARROW``
        (``k``) still takes 1..64 and is checked as before, and ``narrow_events`` reads 0.
        Range scaling (``host.quant``) needs the check and refuses a build without it.

    Raises
    ------
    TypeError, ValueError
        naming the parameter and the value when it is not an integer in range (not a
        bool, for ``narrow_check``).
    """
    n: int = 16
    tiles: int = 2
    mantissa_bits_v: int = 4
    mantissa_bits_w: int = 4
    mrf_depth: int = 512
    max_col_tiles: int = 64
    counter_bits: int = 32
    narrow_check: bool = True

    def __post_init__(self):
        check_int("n", self.n, 4, 64)
        if self.n & (self.n - 1):
            raise ValueError(f"n must be a power of two, not {self.n}")
        check_int("tiles", self.tiles, 1, 8)
        check_int("mantissa_bits_v", self.mantissa_bits_v, MANTISSA_BITS_MIN, MANTISSA_BITS_MAX)
        check_int("mantissa_bits_w", self.mantissa_bits_w, MANTISSA_BITS_MIN, MANTISSA_BITS_MAX)
        check_int("mrf_depth", self.mrf_depth, 1, 65536)
        check_int("max_col_tiles", self.max_col_tiles, 1, 4096)
        check_int("counter_bits", self.counter_bits, 1, 64)
        check_bool("narrow_check", self.narrow_check)

    # --- derived widths -------------------------------------------------------------------

    @property
    def log2_n(self) -> int:
        return self.n.bit_length() - 1

    @property
    def vector_block_bits(self) -> int:
        """Bits of one quantized native vector: exponent code and N mantissas."""
        return block_bits(self.n, self.mantissa_bits_v)

    @property
    def weight_block_bits(self) -> int:
        """Bits of one MRF word (one tile row): exponent code and N mantissas."""
        return block_bits(self.n, self.mantissa_bits_w)

    @property
    def product_bits(self) -> int:
        """Signed width of one mantissa product."""
        return self.mantissa_bits_v + self.mantissa_bits_w - 1

    @property
    def dot_bits(self) -> int:
        """Signed width of a tile dot product (the adder-tree root)."""
        return self.product_bits + self.log2_n

    @property
    def acc_lsb(self) -> int:
        """Exponent of the BFP-long accumulator's LSB (``docs/numerics.md`` section 4)."""
        return 2 * MVM_EXP_EXACT_MIN - (self.mantissa_bits_v - 2) - (self.mantissa_bits_w - 2)

    @property
    def max_shift(self) -> int:
        """Largest left shift of a tile product onto the accumulator grid."""
        return (2 * FP16_MAX_EXP - (self.mantissa_bits_v - 2) - (self.mantissa_bits_w - 2)
                - self.acc_lsb)

    @property
    def acc_bits(self) -> int:
        """Signed width of the BFP-long accumulator; no sum of up to ``max_col_tiles``
        tile products can overflow it."""
        return _clog2(self.max_col_tiles * self.n) + 33 - self.acc_lsb

    @property
    def col_groups_max(self) -> int:
        """Column-tile groups (cycles per row block) of the widest product."""
        return -(-self.max_col_tiles // self.tiles)

    @property
    def macs_per_cycle(self) -> int:
        return self.tiles * self.n * self.n

    # --- placement of a logical matrix in the MRF ----------------------------------------

    def slots_needed(self, row_tiles: int, col_tiles: int) -> int:
        """Tile slots (per engine) that a product of ``row_tiles x col_tiles`` tiles uses.

        ``row_tiles * ceil(col_tiles / tiles)``: each engine holds ``G = ceil(C/T)`` slots
        per row of tiles, and the product computes one group of ``T`` tiles per cycle.

        Raises
        ------
        TypeError, ValueError
            naming the argument when it is not an integer >= 1 (``col_tiles`` at most
            ``max_col_tiles``).
        """
        row_tiles = check_int("row_tiles", row_tiles, 1)
        col_tiles = check_int("col_tiles", col_tiles, 1, self.max_col_tiles)
        return row_tiles * -(-col_tiles // self.tiles)

    def tile_slot(self, base: int, r: int, c: int, col_tiles: int) -> tuple[int, int]:
        """Where tile ``(r, c)`` of a product with ``col_tiles`` column tiles lives.

        Returns ``(engine, slot)``: engine ``c % tiles``, slot ``base + r*G + c // tiles``
        with ``G = ceil(col_tiles / tiles)``. Row ``i`` of the tile is the word at that
        slot in dot-product engine ``i`` of that engine. ``docs/mvm.md`` has the picture.

        Raises
        ------
        TypeError, ValueError
            naming the argument when it is not an integer in range (``c < col_tiles``,
            the slot inside ``mrf_depth``).
        """
        col_tiles = check_int("col_tiles", col_tiles, 1, self.max_col_tiles)
        base = check_int("base", base, 0, self.mrf_depth - 1)
        r = check_int("r", r, 0)
        c = check_int("c", c, 0, col_tiles - 1)
        groups = -(-col_tiles // self.tiles)
        slot = base + r * groups + c // self.tiles
        if slot >= self.mrf_depth:
            raise ValueError(f"tile ({r}, {c}) of a product at base {base} with {col_tiles} "
                             f"column tiles needs slot {slot}, beyond mrf_depth "
                             f"{self.mrf_depth}")
        return c % self.tiles, slot


@dataclass(frozen=True)
class NpuConfig(MvmConfig):
    """Parameters of one NPU core build: the MVM's (it extends :class:`MvmConfig`, whose
    derived widths it has) plus the MFUs, the vector memories, the queues and the
    program memory (``docs/isa.md``).

    Parameters
    ----------
    n, tiles, mantissa_bits_v, mantissa_bits_w, mrf_depth, max_col_tiles, counter_bits,
    narrow_check
        As :class:`MvmConfig` (validated by it).
    mfus : int
        Multifunction units, 2 to 4 (``mfus``, ``vrf_depth``, ``max_length`` and
        ``unary_ops`` are validated by ``host.spec.mfu.MfuConfig``).
    ivrf_depth : int
        Native vectors in the InitialVrf, 1 to 2**24.
    vrf_depth : int
        Native vectors in each MFU VRF (AddSubVrf, MulVrf), 1 to 4096.
    netq_depth : int
        Native vectors each network queue (input, output) holds, 1 to 2**24.
    program_depth : int
        Instruction words of program memory, 2 to 2**20.
    max_length : int
        Largest logical vector in native vectors (chain length), a power of two from 1
        to 256.
    unary_ops : collection of UnaryOp or names, or None
        The unary functions built (None: all; at least one); stored as a sorted tuple of
        UnaryOp.
    unit_sets : None, one collection of units per MFU, or their text form
        The units built in each MFU (``host.spec.mfu.parse_unit_sets``; None, the default:
        every unit in every MFU). Ops move past the MFUs without their unit
        (``host.spec.mfu.allocate``); the AddSubVrf (MulVrf) of an MFU without ADDSUB
        (MUL) does not exist (its space is refused as a space of an absent MFU is).
        Stored normalized: None, or a tuple of ``mfus`` tuples of ``MfuUnit``.
    lanes : int or None
        FP16 lanes ``l`` of the vector units outside the MAC array (None, the default:
        ``n``), from 2 to ``n``, dividing ``n`` (``host.spec.mfu.MfuConfig.lanes``, which
        says how a native vector passes in ``beats = n / l`` beats). Results do not depend
        on it: an image runs on any ``lanes`` (``host.spec.image.RESULT_NEUTRAL``). Stored
        as an int, so ``NpuConfig(n=8) == NpuConfig(n=8, lanes=8)``.

    Raises
    ------
    TypeError, ValueError
        naming the parameter and the value when it is not an integer in range.
    """
    mfus: int = 2
    ivrf_depth: int = 1024
    vrf_depth: int = 512
    netq_depth: int = 512
    program_depth: int = 4096
    max_length: int = 64
    unary_ops: tuple = None
    unit_sets: tuple | None = None
    lanes: int | None = None

    def __post_init__(self):
        from host.spec.mfu import check_lanes
        from host.spec.ops import parse_ops
        super().__post_init__()
        object.__setattr__(self, "lanes", check_lanes(self.lanes, self.n))
        for name in ("ivrf_depth", "netq_depth"):
            check_int(name, getattr(self, name), 1, 1 << 24)
        check_int("program_depth", self.program_depth, 2, 1 << 20)
        object.__setattr__(self, "unary_ops", parse_ops(self.unary_ops))
        # validates mfus, vrf_depth, max_length and the unit sets, which it normalizes
        object.__setattr__(self, "unit_sets", self.mfu.unit_sets)

    def units(self, mfu: int) -> tuple:
        """The ``MfuUnit``s built in MFU ``mfu`` (sorted by code)."""
        from host.spec.mfu import units_built
        return units_built(self.unit_sets, check_int("mfu", mfu, 0, self.mfus - 1))

    @property
    def mvm(self) -> MvmConfig:
        """The MVM part of the build, as a plain :class:`MvmConfig`."""
        return MvmConfig(**{f.name: getattr(self, f.name) for f in fields(MvmConfig)})

    @property
    def mfu(self):
        """The MFU chain's ``host.spec.mfu.MfuConfig``."""
        from host.spec.mfu import MfuConfig
        return MfuConfig(n=self.n, mfus=self.mfus, vrf_depth=self.vrf_depth,
                         max_length=self.max_length, unary_ops=self.unary_ops,
                         counter_bits=self.counter_bits, unit_sets=self.unit_sets,
                         lanes=self.lanes)

    @property
    def beats(self) -> int:
        """Beats of one native vector in the vector units, ``n // lanes``."""
        return self.n // self.lanes

    @property
    def beat_bits(self) -> int:
        """Width of a beat index, ``log2(beats)``."""
        return self.beats.bit_length() - 1

    @property
    def vector_addr_bits(self) -> int:
        """Width of an address into the core's vector memories: the deeper of the IVRF
        and a VRF, at least 1."""
        return max(1, (max(self.ivrf_depth, self.vrf_depth) - 1).bit_length())

    @property
    def direct_depth(self) -> int:
        """Native vectors the core's reader buffers for chains without a product:
        ``max(4, 2 * max_length)``, two whole instances, so that the reader can go on to
        the next product's input while they wait for the MFU pipeline (``docs/npu.md``
        section 3)."""
        return max(4, 2 * self.max_length)

    @property
    def mrf_words(self) -> int:
        """MRF words in the flat host address space (``host.spec.isa.mrf_address``)."""
        return self.tiles * self.n * self.mrf_depth

    def to_dict(self) -> dict:
        """The build's fields by name, in field order, unary ops as a list of their
        lower-case names, ``narrow_check`` as a bool, ``unit_sets`` as one list of unit
        names per MFU and left out when None (every unit in every MFU, so that the
        default build's dict and JSON are what they were before unit sets existed),
        ``lanes`` left out when it is ``n`` (likewise): what network images and JSON carry
        (INFO carries the same fields as integers, ``host.spec.protocol``)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["unary_ops"] = [op.name.lower() for op in self.unary_ops]
        if self.lanes == self.n:
            del values["lanes"]
        if self.unit_sets is None:
            del values["unit_sets"]
        else:
            values["unit_sets"] = [[u.name.lower() for u in units]
                                   for units in self.unit_sets]
        return values

    def to_json(self) -> str:
        """The build as JSON (:meth:`to_dict`, keys sorted): how benches hand a build to a
        simulation and how builds are named."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "NpuConfig":
        """Inverse of :meth:`to_json` (validated as the constructor validates)."""
        return cls(**json.loads(text))

    @property
    def max_elements(self) -> int:
        """Largest ROWS value: ``max_length * n``."""
        return self.max_length * self.n


#: Named build configurations (:func:`parse_config` takes their names):
#:
#: * ``default``: ``NpuConfig()``.
#: * ``ulx3s``: what ``make bitstream`` builds for the ULX3S-85F by default, N = 16, T = 1
#:   (256 MACs a cycle), its MFU side 2 lanes wide, the narrow-accumulator check off, the
#:   MFUs' units ADDSUB, MUL and ACT then all four (REDUCE only in the last), and memory
#:   depths that fit the LFE5U-85F's 208 block RAMs (206 used) while holding an LSTM with
#:   input and hidden size 256 (the MRF's 2048 tiles, AddSubVrf 0's 176 vectors of
#:   constants and scratch for the compiled layer, 192 for ``lstm_sequence``, whose 10 steps
#:   take 563 program words). Why each value: ``docs/link-hw.md`` section 5.
#: * ``ulx3s_n4``: the board build before it, N = 4, T = 1, every other field the default
#:   (its studies and the link's simulations use it: ``bench/core_fpga.py``,
#:   ``bench/link_fpga.py``).
PRESETS = {
    "default": {},
    "ulx3s": {"n": 16, "tiles": 1, "lanes": 2, "narrow_check": False, "mrf_depth": 2048,
              "vrf_depth": 192, "ivrf_depth": 512, "program_depth": 1024,
              "unit_sets": "addsub+mul+act/all"},
    "ulx3s_n4": {"n": 4, "tiles": 1},
}


def preset(name: str) -> NpuConfig:
    """The build of preset ``name`` (a key of :data:`PRESETS`).

    Raises
    ------
    ValueError
        for an unknown name (the message lists the presets).
    """
    if name not in PRESETS:
        raise ValueError(f"unknown build preset {name!r}; choose one of: "
                         f"{', '.join(PRESETS)}")
    return NpuConfig(**PRESETS[name])


#: The build options (bool fields) and the text forms :func:`parse_config` takes for them.
_BOOL_FIELDS = ("narrow_check",)
_BOOL_TEXT = {"1": True, "0": False, "true": True, "false": False, "on": True,
              "off": False, "yes": True, "no": False}


def parse_config(text: str, base: str = "default") -> NpuConfig:
    """A build from its text form, the one parser of every command that takes a build.

    ``text`` is a comma-separated list: optionally first a preset name (a key of
    :data:`PRESETS`, default ``base``), then ``KEY=VALUE`` items that replace fields of
    that preset. Integer fields take decimal or ``0x`` values; ``unary_ops`` takes op names
    joined by ``+`` (``unary_ops=relu+sigmoid``); ``unit_sets`` takes one entry per MFU
    joined by ``/``, each unit names joined by ``+`` or ``all``
    (``unit_sets=addsub+mul+reduce/addsub+mul+act``; ``host.spec.mfu.parse_unit_sets``);
    the option ``narrow_check`` takes ``1``/``0``, ``true``/``false``, ``on``/``off`` or
    ``yes``/``no`` (any case). Examples: ``""`` (the ``base`` preset), ``"ulx3s"``,
    ``"n=8,tiles=1"``, ``"ulx3s,mrf_depth=1024"``, ``"ulx3s,narrow_check=off"``,
    ``"mfus=3,unit_sets=all/addsub+mul/act"``, ``"n=8,lanes=4"``.

    Raises
    ------
    ValueError
        naming the item: an unknown preset or field, a malformed item or value, or a build
        that :class:`NpuConfig` refuses (its message names the field).
    """
    from host.spec.ops import parse_ops
    items = [item.strip() for item in text.split(",") if item.strip()]
    name = base
    if items and "=" not in items[0]:
        name = items.pop(0)
    fields_ = dict(PRESETS[name]) if name in PRESETS else None
    if fields_ is None:
        raise ValueError(f"unknown build preset {name!r}; choose one of: {', '.join(PRESETS)}")
    known = {f.name for f in fields(NpuConfig)}
    for item in items:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise ValueError(f"build item {item!r} is not KEY=VALUE (a preset name may only "
                             f"come first)")
        if key not in known:
            raise ValueError(f"{key!r} is not a build field; the fields are: "
                             f"{', '.join(sorted(known))}")
        if key == "unary_ops":
            try:
                fields_[key] = parse_ops([op for op in value.split("+") if op])
            except (TypeError, ValueError) as exc:
                raise ValueError(f"unary_ops={value!r}: {exc}") from None
            continue
        if key == "unit_sets":
            fields_[key] = value            # its text form, checked with the mfus it needs
            continue
        if key in _BOOL_FIELDS:
            flag = _BOOL_TEXT.get(value.lower())
            if flag is None:
                raise ValueError(f"{key} must be one of {', '.join(_BOOL_TEXT)}, not "
                                 f"{value!r}")
            fields_[key] = flag
            continue
        try:
            fields_[key] = int(value, 0)
        except ValueError:
            raise ValueError(f"{key} must be an integer, not {value!r}") from None
    try:
        return NpuConfig(**fields_)
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    except ValueError as exc:
        if "unit_sets" in fields_ and "unit_sets" in str(exc):
            raise ValueError(f"unit_sets={fields_['unit_sets']!r}: {exc}") from None
        raise
