"""Native vectors, the beats of the MFU side (``config.lanes`` lanes, ``B = n / lanes``
beats a native vector) and the counts of a chain instance: the layouts, widths and
helpers shared by the core's parts (:mod:`hw.core.npu`, :mod:`hw.core.reader`,
:mod:`hw.core.feeder`, :mod:`hw.core.writer`). With ``lanes == n`` a beat is a native
vector and every beat helper is the identity of before lanes (no logic is built for
beats)."""

from amaranth.hdl import Cat, Const, unsigned
from amaranth.lib import data
from amaranth.utils import bits_for

from host.spec.config import NpuConfig
from host.spec.formats import FP16_BITS
from host.spec.isa import Reg, register_limits

__all__ = [
    "beat_layout", "beat_select", "checked_config", "count_bits", "last_beat", "last_beat_index",
    "pitch_bits", "vector_layout",
]


def checked_config(component, config) -> NpuConfig:
    """``config`` for the constructor of the core's part ``component``.

    Raises
    ------
    TypeError
        ``config`` is not an :class:`host.spec.config.NpuConfig`; ``component``, refused,
        is then not reported as an unused elaboratable.
    """
    if not isinstance(config, NpuConfig):
        component._MustUse__silence = True
        raise TypeError(f"config must be an NpuConfig, not {config!r}")
    return config


def vector_layout(config: NpuConfig) -> data.ArrayLayout:
    """A native vector: ``n`` FP16 lanes, lane ``i`` at bits ``[16i, 16i + 16)``."""
    return data.ArrayLayout(unsigned(FP16_BITS), config.n)


def beat_layout(config: NpuConfig) -> data.ArrayLayout:
    """A beat of the MFU side: ``lanes`` FP16 lanes (``16 * lanes`` bits); beat ``b`` of a
    native vector is its lanes ``b*lanes .. b*lanes + lanes - 1`` (``hw.mfu.mfu.vector_layout``).
    With ``lanes == n`` a native vector."""
    return data.ArrayLayout(unsigned(FP16_BITS), config.lanes)


def beat_select(config, vector, index):
    """Beat ``index % beats`` of ``vector`` (a native vector's value, ``16 n`` bits):
    ``16 lanes`` bits, lanes ``b*lanes .. b*lanes + lanes - 1`` for ``b`` the low
    ``beat_bits`` of ``index`` (a count of beats). ``vector`` itself with lanes == n."""
    if config.beats == 1:
        return vector
    return vector.word_select(index[:config.beat_bits], FP16_BITS * config.lanes)


def last_beat(config, index):
    """1 where ``index`` (a count of beats, ``beats > 1``) is the last beat of a vector."""
    return index[:config.beat_bits].all()


def last_beat_index(config, vectors):
    """The index of the last beat of ``vectors`` native vectors (``vectors >= 1``), that
    is ``vectors * beats - 1``; ``vectors - 1`` with lanes == n, as before lanes."""
    if config.beats == 1:
        return vectors - 1
    return Cat(Const(config.beats - 1, config.beat_bits), vectors - 1)


def count_bits(config: NpuConfig) -> int:
    """Width of a count of native vectors of one instance (C or L) and of the window's
    sides."""
    return bits_for(max(config.max_col_tiles, config.max_length, config.n))


def pitch_bits(config: NpuConfig) -> int:
    """Width of a window row pitch: WIN_PITCH's range."""
    return bits_for(register_limits(config)[Reg.WIN_PITCH][1])
