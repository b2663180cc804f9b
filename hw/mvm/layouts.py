"""Payload layouts of the MVM: its ports (``docs/mvm.md`` section 3) and the hand-offs
between its control components (check, loader, writer, sequencer; section 5).

Every width derives from the :class:`~host.spec.config.MvmConfig`; nothing is recomputed
elsewhere. :mod:`hw.mvm.mvm` re-exports the port layouts.
"""

from amaranth.hdl import unsigned
from amaranth.lib import data
from amaranth.utils import bits_for, ceil_log2

from host.spec.config import MvmConfig
from host.spec.formats import FP16_BITS, Rounding, block_layout

from hw.mvm.tile_engine import NARROW_WIDTH_BITS, TileEngine

__all__ = [
    "command_layout", "weight_row_layout", "mrf_word_layout", "mrf_address_layout",
    "engine_bits", "params_layout", "checked_command_layout", "tag_layout",
]


def engine_bits(config: MvmConfig) -> int:
    """Bits of an engine index: ``max(1, ceil(log2 T))``."""
    return max(1, ceil_log2(config.tiles))


def mrf_address_layout(config: MvmConfig) -> data.StructLayout:
    """``{engine, row, slot}``: one MRF word, that is row ``row`` (dot-product engine) of
    tile slot ``slot`` in tile engine ``engine``."""
    return data.StructLayout({
        "engine": unsigned(engine_bits(config)),
        "row": unsigned(config.log2_n),
        "slot": unsigned(TileEngine.slot_bits(config)),
    })


def mrf_word_layout(config: MvmConfig) -> data.StructLayout:
    """``mrf_w`` payload: an MRF address and the packed block to store there."""
    return data.StructLayout({
        "engine": unsigned(engine_bits(config)),
        "row": unsigned(config.log2_n),
        "slot": unsigned(TileEngine.slot_bits(config)),
        "block": block_layout(config.n, config.mantissa_bits_w),
    })


def weight_row_layout(config: MvmConfig) -> data.StructLayout:
    """``w_stream`` payload: an MRF address, one FP16 tile row and how to quantize it."""
    return data.StructLayout({
        "engine": unsigned(engine_bits(config)),
        "row": unsigned(config.log2_n),
        "slot": unsigned(TileEngine.slot_bits(config)),
        "values": data.ArrayLayout(unsigned(FP16_BITS), config.n),
        "rounding": Rounding,
        "static": unsigned(1),
        "static_exponent": unsigned(8),
    })


def command_layout(config: MvmConfig) -> data.StructLayout:
    """``cmd`` payload: one matrix-vector product.

    ``base``: first tile slot; ``row_tiles`` R and ``col_tiles`` C: the matrix is R x C
    native tiles, placed as :meth:`host.spec.config.MvmConfig.tile_slot` says; ``rounding``,
    ``static``, ``static_exponent``: how the C input vectors are quantized;
    ``narrow_width``: ``k`` of the narrow-accumulator check, 1..64.
    """
    return data.StructLayout({
        "base": unsigned(TileEngine.slot_bits(config)),
        "row_tiles": unsigned(bits_for(config.mrf_depth)),
        "col_tiles": unsigned(bits_for(config.max_col_tiles)),
        "rounding": Rounding,
        "static": unsigned(1),
        "static_exponent": unsigned(8),
        "narrow_width": unsigned(NARROW_WIDTH_BITS),
    })


def params_layout(config: MvmConfig) -> data.StructLayout:
    """What the sequencer needs of a command, from the check through the params FIFO.

    ``base``: first slot; ``last_step``: ``R*G - 1``; ``last_group``: ``G - 1``;
    ``lastmask``: bit ``t`` set iff engine ``t`` has a column tile in the last group.
    With the narrow check also ``k`` (7 bits) and its fit thermometer
    (``config.dot_bits - 1`` bits, :func:`hw.mvm.tile_engine.fit_thermometer`).
    """
    fields = {
        "base": unsigned(TileEngine.slot_bits(config)),
        "last_step": range(max(2, config.mrf_depth)),
        "last_group": range(max(2, config.col_groups_max)),
        "lastmask": unsigned(config.tiles),
    }
    if config.narrow_check:
        fields.update(k=unsigned(NARROW_WIDTH_BITS), therm=unsigned(config.dot_bits - 1))
    return data.StructLayout(fields)


def checked_command_layout(config: MvmConfig) -> data.StructLayout:
    """A command that passed the check (:class:`hw.mvm.command.CommandChecker` to the
    :class:`hw.mvm.loader.Loader`): the command as received and its sequencer
    parameters."""
    return data.StructLayout({
        "command": command_layout(config),
        "params": params_layout(config),
    })


def tag_layout(config: MvmConfig) -> data.StructLayout:
    """Where a vector's block goes in the vector buffer (loader to writer, through the
    tag FIFO): ``half`` (0/1, alternating per command), ``bank`` ``c % T``, ``group``
    ``c // T``, ``last`` (the command's last block)."""
    return data.StructLayout({
        "half": unsigned(1),
        "bank": range(config.tiles),
        "group": range(max(2, config.col_groups_max)),
        "last": unsigned(1),
    })
