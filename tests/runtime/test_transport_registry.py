"""The transport registry of ``host.runtime.transport.connect``: built-in kinds, kinds
added at run time, and kinds from entry points (the simulated board registers itself from
``sim`` that way, so ``host`` never names it)."""

import importlib.metadata

import pytest

from host.runtime import transport as T


def test_the_simulated_board_comes_from_an_entry_point():
    eps = {ep.name: ep for ep in importlib.metadata.entry_points(group=T.ENTRY_POINT_GROUP)}
    assert eps["sim"].value == "sim.board:SimTransport.from_options"
    assert T.transport_kinds()[:2] == ("model", "serial") and "sim" in T.transport_kinds()
    assert "sim[:OPTIONS]" in T.device_choices()


def test_a_registered_kind_is_connected_with_its_options(monkeypatch):
    monkeypatch.setattr(T, "_REGISTERED", {})
    seen = []

    def factory(text):
        seen.append(text)
        return T.ModelTransport()

    T.register_transport("loop", factory)
    assert isinstance(T.connect("loop:a=1,b=2"), T.ModelTransport)
    assert seen == ["a=1,b=2"]
    assert "loop[:OPTIONS]" in T.device_choices()


def test_registry_refusals(monkeypatch):
    monkeypatch.setattr(T, "_REGISTERED", {})
    with pytest.raises(ValueError, match="kind 'model' is built in"):
        T.register_transport("model", lambda text: None)
    with pytest.raises(ValueError, match="kind must be an identifier"):
        T.register_transport("a b", lambda text: None)
    with pytest.raises(ValueError, match=r"unknown device 'nope:1'; choose one of: model"):
        T.connect("nope:1")


def test_an_entry_point_that_cannot_be_imported_is_named(monkeypatch):
    ep = importlib.metadata.EntryPoint("broken", "no_such_package.mod:make",
                                       T.ENTRY_POINT_GROUP)
    monkeypatch.setattr(T, "_entry_points", lambda: {"broken": ep})
    with pytest.raises(ValueError, match=r"the 'broken' device \(no_such_package.mod:make\) "
                                         r"cannot be imported"):
        T.connect("broken")
