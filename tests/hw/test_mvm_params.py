# amaranth: UnusedElaboratable=no
"""Build parameters of the MVM: ``MvmConfig`` validation, the MRF placement
(``tile_slot``, ``slots_needed``), and the gateware constructors' checks.

Error messages must name the parameter and the bad value.
"""

import itertools
import re
import warnings

import pytest
from amaranth.hdl import Shape

from host.spec.config import MvmConfig
from hw.mvm.mvm import (
    Mvm, command_layout, compute_latency, latency, mrf_address_layout, mrf_word_layout,
    output_fifo_depth, weight_row_layout,
)
from hw.mvm.accumulator import BfpAccumulator
from hw.mvm.tile_engine import DotProductEngine, TileEngine, shift_offset, shift_range


def _quiet(component):
    """Constructed and dropped: silence Amaranth's 'created but never used' warning."""
    component._MustUse__silence = True
    return component


# --- MvmConfig -----------------------------------------------------------------------------

@pytest.mark.parametrize("name,value,message", [
    ("n", 3, "n must be from 4 to 64, not 3"),
    ("n", 24, "n must be a power of two, not 24"),
    ("n", 12, "n must be a power of two, not 12"),
    ("n", 2, "n must be from 4 to 64, not 2"),
    ("n", 128, "n must be from 4 to 64, not 128"),
    ("tiles", 0, "tiles must be from 1 to 8, not 0"),
    ("tiles", 9, "tiles must be from 1 to 8, not 9"),
    ("mantissa_bits_v", 1, "mantissa_bits_v must be from 2 to 16, not 1"),
    ("mantissa_bits_v", 17, "mantissa_bits_v must be from 2 to 16, not 17"),
    ("mantissa_bits_w", 1, "mantissa_bits_w must be from 2 to 16, not 1"),
    ("mantissa_bits_w", 17, "mantissa_bits_w must be from 2 to 16, not 17"),
    ("mrf_depth", 0, "mrf_depth must be from 1 to 65536, not 0"),
    ("mrf_depth", 65537, "mrf_depth must be from 1 to 65536, not 65537"),
    ("max_col_tiles", 0, "max_col_tiles must be from 1 to 4096, not 0"),
    ("max_col_tiles", 4097, "max_col_tiles must be from 1 to 4096, not 4097"),
    ("counter_bits", 0, "counter_bits must be from 1 to 64, not 0"),
    ("counter_bits", 65, "counter_bits must be from 1 to 64, not 65"),
])
def test_config_range(name, value, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        MvmConfig(**{name: value})


@pytest.mark.parametrize("name", ["n", "tiles", "mantissa_bits_v", "mantissa_bits_w",
                                  "mrf_depth", "max_col_tiles", "counter_bits"])
@pytest.mark.parametrize("value", [8.0, "8", True, None])
def test_config_type(name, value):
    with pytest.raises(TypeError, match=f"^{name} must be an integer, not {value!r}$"):
        MvmConfig(**{name: value})


def test_config_derived_widths():
    c = MvmConfig(n=16, tiles=4, mantissa_bits_v=4, mantissa_bits_w=4, max_col_tiles=64)
    assert (c.product_bits, c.dot_bits, c.acc_lsb, c.max_shift) == (7, 11, -52, 78)
    assert c.acc_bits == 95                     # docs/numerics.md section 4
    assert c.col_groups_max == 16 and c.macs_per_cycle == 1024
    # The term shift K = 206 whatever the widths (the LSB moves with them).
    for mv, mw in ((2, 2), (4, 8), (16, 16)):
        cfg = MvmConfig(mantissa_bits_v=mv, mantissa_bits_w=mw)
        assert shift_offset(cfg) == 206
        lo, hi = shift_range(cfg)
        assert (lo, hi) == (-206, 304)
        # Codes of FP16-origin exponents (103..142) give shifts 0..max_shift.
        assert 103 + 103 - 206 == 0 and 142 + 142 - 206 == cfg.max_shift


# --- placement -----------------------------------------------------------------------------

@pytest.mark.parametrize("tiles", [1, 2, 3, 4, 8])
def test_tile_slot_placement(tiles):
    """Every tile of a product gets its own (engine, slot), engine c % T, inside
    base .. base + slots_needed - 1; compute order (r, g) reads slot base + r*G + g."""
    c = MvmConfig(n=4, tiles=tiles, mrf_depth=200, max_col_tiles=13)
    for big_r, big_c, base in itertools.product((1, 2, 5), (1, 2, 3, 7, 13), (0, 17)):
        need = c.slots_needed(big_r, big_c)
        groups = -(-big_c // tiles)
        assert need == big_r * groups
        seen = set()
        for r in range(big_r):
            for col in range(big_c):
                engine, slot = c.tile_slot(base, r, col, big_c)
                assert engine == col % tiles
                assert slot == base + r * groups + col // tiles
                assert base <= slot < base + need
                assert (engine, slot) not in seen
                seen.add((engine, slot))
        assert len(seen) == big_r * big_c


def test_tile_slot_errors():
    c = MvmConfig(n=4, tiles=2, mrf_depth=10, max_col_tiles=5)
    assert c.tile_slot(9, 0, 1, 2) == (1, 9)
    with pytest.raises(ValueError, match="^tile \\(1, 0\\) of a product at base 9 with 2 "
                                         "column tiles needs slot 10, beyond mrf_depth 10$"):
        c.tile_slot(9, 1, 0, 2)
    with pytest.raises(ValueError, match="^c must be from 0 to 1, not 2$"):
        c.tile_slot(0, 0, 2, 2)
    with pytest.raises(ValueError, match="^col_tiles must be from 1 to 5, not 6$"):
        c.tile_slot(0, 0, 0, 6)
    with pytest.raises(ValueError, match="^base must be from 0 to 9, not 10$"):
        c.tile_slot(10, 0, 0, 1)
    with pytest.raises(ValueError, match="^r must be at least 0, not -1$"):
        c.tile_slot(0, -1, 0, 1)
    with pytest.raises(TypeError, match="^r must be an integer, not 1.0$"):
        c.tile_slot(0, 1.0, 0, 1)
    with pytest.raises(ValueError, match="^row_tiles must be at least 1, not 0$"):
        c.slots_needed(0, 1)
    with pytest.raises(ValueError, match="^col_tiles must be from 1 to 5, not 0$"):
        c.slots_needed(1, 0)


# --- gateware constructors ----------------------------------------------------------------

@pytest.mark.parametrize("cls", [Mvm, TileEngine, DotProductEngine, BfpAccumulator])
@pytest.mark.parametrize("bad", [None, 16, {"n": 16}, "MvmConfig(n=16)"])
def test_components_reject_non_config(cls, bad):
    with pytest.raises(TypeError,
                       match=f"^{re.escape(f'config must be an MvmConfig, not {bad!r}')}$"):
        cls(bad)


def test_mvm_ports_follow_config():
    c = MvmConfig(n=8, tiles=3, mantissa_bits_v=5, mantissa_bits_w=3, mrf_depth=20,
                  max_col_tiles=7, counter_bits=10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mvm = _quiet(Mvm(c))
    assert mvm.config is c
    sig = mvm.signature.members
    assert sig["x_stream"].signature.members["payload"].shape.size == 8 * 16
    assert sig["y_stream"].signature.members["payload"].shape.size == 8 * 16
    assert sig["mrf_r_resp"].signature.members["payload"].shape.size == c.weight_block_bits
    for name in ("vector_saturations", "vector_nonfinite", "weight_saturations",
                 "weight_nonfinite", "narrow_events", "output_saturations"):
        assert Shape.cast(sig[name].shape).width == 10
    cmd = dict(command_layout(c))
    assert cmd["base"].width == 5                  # slots 0..19
    assert cmd["row_tiles"].width == 5             # up to mrf_depth = 20
    assert cmd["col_tiles"].width == 3             # up to max_col_tiles = 7
    assert cmd["narrow_width"].width == 7          # k = 1..64
    for layout in (mrf_address_layout(c), mrf_word_layout(c), weight_row_layout(c)):
        fields = dict(layout)
        assert fields["engine"].width == 2 and fields["row"].width == 3
        assert fields["slot"].width == 5
    assert dict(mrf_word_layout(c))["block"].width == c.weight_block_bits
    # Cycle-formula pieces are consistent.
    assert mvm.latency == latency(c) > compute_latency(c)
    assert output_fifo_depth(c) >= compute_latency(c) + 4
    # m_v != m_w: a quantizer each. Equal widths share one (docs/mvm.md section 5).
    assert not mvm.shared_quantizer
    assert _quiet(Mvm(MvmConfig(n=8, mantissa_bits_v=5, mantissa_bits_w=5))).shared_quantizer
