# amaranth: UnusedElaboratable=no
"""The build parameter ``lanes`` (issue 36 item 1): its checks, forms (constructor, dict
and JSON, ``parse_config`` text, INFO entry), images that ignore it, and the hardware that
refuses what it does not build yet."""

import re

import numpy as np
import pytest

from host.spec import protocol as p
from host.spec.config import NpuConfig, parse_config
from host.spec.image import RESULT_NEUTRAL, NetworkImage
from host.spec.mfu import LANES_MIN, MfuConfig

#: The INFO entries of every build, in order, after the build fields (docs/protocol.md).
DERIVED = ["mrf_words", "weight_block_bits", "macs_per_cycle", "word_bits"]


def test_lanes_default_to_n_and_are_stored_as_an_int():
    for n in (4, 8, 16, 64):
        assert NpuConfig(n=n).lanes == n and MfuConfig(n=n).lanes == n
        assert NpuConfig(n=n) == NpuConfig(n=n, lanes=n)
        assert hash(NpuConfig(n=n)) == hash(NpuConfig(n=n, lanes=n))
    cfg = NpuConfig(n=16, lanes=np.int64(4))
    assert type(cfg.lanes) is int and cfg.lanes == 4
    assert NpuConfig(n=8, lanes=4) != NpuConfig(n=8)


@pytest.mark.parametrize("n, lanes, beats, beat_bits", [
    (16, 16, 1, 0), (16, 8, 2, 1), (16, 4, 4, 2), (16, 2, 8, 3), (4, 2, 2, 1),
    (64, 2, 32, 5),
])
def test_beats(n, lanes, beats, beat_bits):
    for cfg in (NpuConfig(n=n, lanes=lanes), MfuConfig(n=n, lanes=lanes)):
        assert (cfg.lanes, cfg.beats, cfg.beat_bits) == (lanes, beats, beat_bits)
    assert NpuConfig(n=n, lanes=lanes).mfu == MfuConfig(
        n=n, max_length=64, vrf_depth=512, lanes=lanes)


@pytest.mark.parametrize("n, lanes, error, says", [
    (16, 3, ValueError, "lanes must divide n = 16, not 3"),
    (16, 12, ValueError, "lanes must divide n = 16, not 12"),
    (8, 6, ValueError, "lanes must divide n = 8, not 6"),
    (16, 1, ValueError, "lanes must be from 2 to 16, not 1"),
    (16, 0, ValueError, "lanes must be from 2 to 16, not 0"),
    (8, 16, ValueError, "lanes must be from 2 to 8, not 16"),
    (8, "4", TypeError, "lanes must be an integer, not '4'"),
    (8, True, TypeError, "lanes must be an integer, not True"),
    (8, 4.0, TypeError, "lanes must be an integer, not 4.0"),
])
def test_bad_lanes_are_refused_naming_the_parameter_and_value(n, lanes, error, says):
    assert LANES_MIN == 2
    for make in (NpuConfig, MfuConfig):
        with pytest.raises(error, match=re.escape(says)):
            make(n=n, lanes=lanes)


def test_lanes_round_trip_through_dict_json_and_text():
    cfg = NpuConfig(n=8, tiles=1, lanes=4)
    d = cfg.to_dict()
    assert d["lanes"] == 4 and list(d)[-1] == "lanes"
    assert NpuConfig(**d) == cfg and NpuConfig.from_json(cfg.to_json()) == cfg
    assert '"lanes": 4' in cfg.to_json()
    assert parse_config("n=8,tiles=1,lanes=4") == cfg
    assert parse_config("n=8,tiles=1,lanes=0x4") == cfg
    assert parse_config("ulx3s_n4,lanes=2") == NpuConfig(n=4, tiles=1, lanes=2)
    from host.compiler.network import config_text
    assert parse_config(config_text(cfg)) == cfg
    # lanes = n is left out, so the default build's dict and JSON (and with them image
    # configs and build names) are what they were before lanes existed.
    for full in (NpuConfig(), NpuConfig(n=8, lanes=8)):
        assert "lanes" not in full.to_dict() and "lanes" not in full.to_json()
        assert NpuConfig(**full.to_dict()) == full
    with pytest.raises(ValueError, match=re.escape("lanes must divide n = 8, not 3")):
        parse_config("n=8,lanes=3")
    with pytest.raises(ValueError, match=re.escape("lanes must be an integer, not 'four'")):
        parse_config("n=8,lanes=four")


def test_info_sends_lanes_only_below_n():
    # lanes = n: no entry, and the INFO bytes (also the link's INFO ROM, made from
    # info_entries) are those of the build fields and derived sizes alone.
    for cfg in (NpuConfig(), NpuConfig(n=8, tiles=1), NpuConfig(n=8, tiles=1, lanes=8)):
        entries = p.info_entries(cfg)
        assert list(entries) == [*p.CONFIG_FIELDS, *DERIVED]
        assert "lanes" not in p.config_entries(cfg)
        by_hand = {name: int(getattr(cfg, name)) for name in p.CONFIG_FIELDS
                   if name != "unary_ops"}
        by_hand["unary_ops"] = (1 << 6) - 1                     # every unary op built
        by_hand = {name: by_hand[name] for name in p.CONFIG_FIELDS}
        by_hand.update(mrf_words=cfg.tiles * cfg.n * cfg.mrf_depth,
                       weight_block_bits=8 + 4 * cfg.n, macs_per_cycle=cfg.tiles * cfg.n ** 2,
                       word_bits=64)
        assert p.pack_info(entries) == p.pack_info(by_hand)
        assert p.config_from_entries(p.unpack_info(p.pack_info(entries))) == cfg
    # lanes < n: the entry, after the build fields (and after unit_sets when there are).
    cfg = NpuConfig(n=8, tiles=1, lanes=4)
    entries = p.info_entries(cfg)
    assert list(entries) == [*p.CONFIG_FIELDS, "lanes", *DERIVED]
    assert entries["lanes"] == 4
    decoded = p.unpack_info(p.pack_info(entries))
    assert decoded["lanes"] == 4 and p.config_from_entries(decoded) == cfg
    split = NpuConfig(n=8, tiles=1, lanes=2, unit_sets="addsub+mul+reduce/addsub+mul+act")
    assert list(p.info_entries(split))[len(p.CONFIG_FIELDS):][:2] == ["unit_sets", "lanes"]
    assert p.config_from_entries(p.info_entries(split)) == split
    # A reply without the entry (lanes = n, or a device from before) means lanes = n.
    old = {k: v for k, v in entries.items() if k != "lanes"}
    assert p.config_from_entries(old).lanes == 8
    with pytest.raises(ValueError, match=re.escape("lanes must divide n = 8, not 3")):
        p.config_from_entries({**entries, "lanes": 3})


def test_build_info_carries_lanes_always():
    info = p.build_info(NpuConfig(n=8, lanes=4))
    assert info["lanes"] == 4
    assert p.build_info(NpuConfig(n=8))["lanes"] == 8
    assert p.build_info(NpuConfig())["lanes"] == 16
    keys = list(p.build_info(NpuConfig()))
    assert keys.index("lanes") == keys.index("unit_sets") + 1


def test_images_do_not_compare_lanes():
    assert "lanes" in RESULT_NEUTRAL

    def image(cfg):
        return NetworkImage(program=np.zeros(1, np.uint64), config=cfg.to_dict())

    l4, l8 = NpuConfig(n=8, tiles=1, lanes=4), NpuConfig(n=8, tiles=1)
    for built, device in [(l4, l8), (l8, l4), (l4, NpuConfig(n=8, tiles=1, lanes=2))]:
        image(built).check_config(device)
    assert image(l4).config["lanes"] == 4 and image(l4).build() == l4
    # The other fields are still compared, whatever the lanes.
    with pytest.raises(ValueError, match=re.escape("the image was built for tiles=1, the "
                                                   "device has tiles=2")):
        image(l4).check_config(NpuConfig(n=8, tiles=2, lanes=4))


def test_device_info_and_npu_info_report_lanes(capsys):
    import json

    from host.cli import main
    from host.runtime.device import Device
    for text, lanes in [("n=8,tiles=1,lanes=4", 4), ("n=8,tiles=1", 8)]:
        with Device.open(f"model:{text}") as dev:
            assert dev.info()["lanes"] == lanes
            assert dev.config == parse_config(text)
        assert main(["info", "--device", f"model:{text}"]) == 0
        lines = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
        assert lines["lanes"] == str(lanes)
        assert main(["info", "--json", "--device", f"model:{text}"]) == 0
        assert json.loads(capsys.readouterr().out)["lanes"] == lanes


def test_the_core_builds_lanes_below_n_with_host_ports_n_lanes_wide():
    """``NpuCore`` takes ``lanes < n`` (step 5 of the lanes plan): its host ports keep
    their N-lane layouts (so ``hw/link`` and ``SimBoard`` do not change), and it
    elaborates. ``tests/hw/test_npu_hw.py`` runs it against the model."""
    from amaranth.hdl import Fragment
    from hw.core.npu import NpuCore
    small = {"n": 4, "tiles": 1, "mrf_depth": 8, "max_col_tiles": 2, "ivrf_depth": 8,
             "vrf_depth": 8, "netq_depth": 8, "program_depth": 16, "max_length": 2}
    narrow = NpuCore(NpuConfig(**small, lanes=2))
    wide = NpuCore(NpuConfig(**small))                 # lanes = n: the core as it was
    assert narrow.signature == wide.signature
    for core in (narrow, wide):
        Fragment.get(core, None)
