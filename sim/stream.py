"""Bus models for Amaranth ``lib.stream`` interfaces, shared by the cocotb testbenches.

An Amaranth stream port ``name`` appears in the generated Verilog as ``name__valid``,
``name__ready`` and ``name__payload`` (the payload flattened to one vector, its first
field in the low bits). Use :func:`stream_signals` to fetch the three handles.

* :class:`StreamSource` drives ``valid``/``payload``, optionally with idle cycles.
* :class:`StreamSink` drives ``ready``: always high, or randomly low (back-pressure).
* :class:`StreamMonitor` records every transfer and checks the stream rules (``valid``
  held and the payload stable until taken).

Every random choice comes from a ``random.Random(seed)`` owned by the model, so a run is
reproducible from the test's seed.
"""

from __future__ import annotations

import collections
import random

import cocotb
from cocotb.triggers import Event, RisingEdge, SimTimeoutError, with_timeout

__all__ = ["StreamMonitor", "StreamSink", "StreamSource", "stream_signals"]


def stream_signals(dut, name: str):
    """``(valid, ready, payload)`` handles of the stream port ``name`` of ``dut``."""
    return (getattr(dut, f"{name}__valid"), getattr(dut, f"{name}__ready"),
            getattr(dut, f"{name}__payload"))


class StreamSource:
    """Drives ``valid``/``payload`` of an Amaranth stream; optional idle cycles.

    ``valid`` is held with a stable payload until the DUT takes the item; idle cycles
    only come between items.
    """

    def __init__(self, clk, valid, ready, payload, idle_prob=0.0, seed=0):
        self.clk, self.valid, self.ready, self.payload = clk, valid, ready, payload
        self.idle_prob = idle_prob
        self.rand = random.Random(seed)
        self.queue = collections.deque()
        self.sent = 0
        self.accept_cycles: list[int] = []
        self.cycle = 0
        self._task = None

    def send(self, items):
        self.queue.extend(items)
        if self._task is None or self._task.done():
            self._task = cocotb.start_soon(self._run())

    @property
    def idle(self):
        return not self.queue and (self._task is None or self._task.done())

    async def _run(self):
        edge = RisingEdge(self.clk)
        queue, rand, idle_prob = self.queue, self.rand.random, self.idle_prob
        offering = False
        self.valid.value = 0
        while True:
            await edge
            self.cycle += 1
            if offering and self.ready.value:
                self.sent += 1
                self.accept_cycles.append(self.cycle)
                offering = False
            if not offering:
                if not queue:
                    self.valid.value = 0
                    return
                if idle_prob and rand() < idle_prob:
                    self.valid.value = 0
                    continue
                self.payload.value = queue.popleft()
                self.valid.value = 1
                offering = True


class StreamSink:
    """Drives ``ready``: always 1, or randomly low (back-pressure)."""

    def __init__(self, clk, ready, backpressure_prob=0.0, seed=0):
        self.clk, self.ready = clk, ready
        self.prob = backpressure_prob
        self.rand = random.Random(seed)
        self.held = False
        self.ready.value = 1
        if backpressure_prob:
            cocotb.start_soon(self._run())

    def hold(self, held: bool) -> None:
        """Hold ``ready`` low (``True``) until released (``False``)."""
        self.held = held
        self.ready.value = int(not held and not self.prob)

    async def _run(self):
        edge = RisingEdge(self.clk)
        rand, prob, ready = self.rand.random, self.prob, self.ready
        while True:
            ready.value = int(not self.held and rand() >= prob)
            await edge


class StreamMonitor:
    """Records every transfer as one integer and the cycle it happened in; checks that
    ``valid`` stays high and the payload holds while ``valid & ~ready``."""

    def __init__(self, clk, valid, ready, payload, name="o_stream"):
        self.clk, self.valid, self.ready, self.payload = clk, valid, ready, payload
        self.name = name
        self.items: list[int] = []
        self.cycles: list[int] = []
        self.cycle = 0
        self.stall_checks = 0
        self._target = None
        self._reached = Event()
        cocotb.start_soon(self._run())

    async def wait_for(self, count, period_ns):
        missing = count - len(self.items)
        if missing > 0:
            self._target = count
            self._reached.clear()
            try:
                await with_timeout(self._reached.wait(), (10 * missing + 1000) * period_ns,
                                   "ns")
            except SimTimeoutError:
                raise AssertionError(f"stream stuck: {len(self.items)} of {count} "
                                     f"transfers seen") from None

    async def _run(self):
        edge = RisingEdge(self.clk)
        items, cycles = self.items, self.cycles
        held = None
        while True:
            await edge
            self.cycle += 1
            if not self.valid.value:
                assert held is None, (
                    f"cycle {self.cycle}: {self.name}.valid dropped before its payload "
                    f"was accepted")
                continue
            word = self.payload.value.to_unsigned()
            if held is not None:
                self.stall_checks += 1
                assert word == held, (
                    f"cycle {self.cycle}: {self.name}.payload changed while valid and not "
                    f"ready")
            if self.ready.value:
                items.append(word)
                cycles.append(self.cycle)
                held = None
                if len(items) == self._target:
                    self._reached.set()
            else:
                held = word
