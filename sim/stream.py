"""Bus models for Amaranth ``lib.stream`` interfaces, shared by the cocotb testbenches.

An Amaranth stream port ``name`` appears in the generated Verilog as ``name__valid``,
``name__ready`` and ``name__payload`` (the payload flattened to one vector, its first
field in the low bits). Use :func:`stream_signals` to fetch the three handles.

* :class:`StreamSource` drives ``valid``/``payload``, optionally with idle cycles and
  with side-band inputs that change with each item.
* :class:`StreamSink` drives ``ready``: always high, or randomly low (back-pressure).
* :class:`StreamMonitor` records every transfer and checks the stream rules (``valid``
  held and the payload stable until taken).
* :class:`UnitBench` puts the three together for a unit with one ``i_stream`` and one
  ``o_stream`` (clock, reset, source, sink, a monitor on each stream).

Timeouts are counted in clock cycles; a model stuck past one raises ``AssertionError``.

Every random choice comes from a ``random.Random(seed)`` owned by the model, so a run is
reproducible from the test's seed.
"""

from __future__ import annotations

import collections
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import Event, RisingEdge, SimTimeoutError, with_timeout
from cocotb.types import Logic

__all__ = ["StreamMonitor", "StreamSink", "StreamSource", "UnitBench", "stream_signals"]


def stream_signals(dut, name: str):
    """``(valid, ready, payload)`` handles of the stream port ``name`` of ``dut``."""
    return (getattr(dut, f"{name}__valid"), getattr(dut, f"{name}__ready"),
            getattr(dut, f"{name}__payload"))


class StreamSource:
    """Drives ``valid``/``payload`` of an Amaranth stream; optional idle cycles.

    ``valid`` is held with a stable payload until the DUT takes the item; idle cycles
    only come between items (each cycle between items is idle with ``idle_prob``).
    Whenever ``valid`` is low the payload is random bits (from the same seeded
    generator), so a DUT that uses a payload nobody offered fails its comparison.

    ``sideband``: handles of plain DUT inputs that travel with the items (settings
    sampled with the payload, outside the stream's payload). With a side band, every
    item is a tuple ``(payload, side_0, side_1, ...)``, one value per handle; each value
    is written when its item is offered (only when it changes, to save simulator calls)
    and then kept until a later item changes it.
    """

    def __init__(self, clk, valid, ready, payload, idle_prob=0.0, seed=0, sideband=()):
        self.clk, self.valid, self.ready, self.payload = clk, valid, ready, payload
        self.sideband = list(sideband)
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

    async def drained(self, timeout_cycles=200000):
        """Return once every queued item has been taken (:attr:`idle`).

        :raises AssertionError: if items are still queued after ``timeout_cycles``
            clock cycles.
        """
        edge = RisingEdge(self.clk)
        for _ in range(timeout_cycles):
            if self.idle:
                return
            await edge
        raise AssertionError(f"stream source stuck with {len(self.queue)} items queued "
                             f"after {timeout_cycles} cycles")

    async def _run(self):
        edge = RisingEdge(self.clk)
        queue, rand, idle_prob = self.queue, self.rand.random, self.idle_prob
        sideband = self.sideband
        side_now = [None] * len(sideband)
        offering = False
        width = len(self.payload)
        junk = self.rand.getrandbits

        def withdraw():
            self.valid.value = 0
            self.payload.value = junk(width)

        withdraw()
        while True:
            await edge
            self.cycle += 1
            if offering and self.ready.value:
                self.sent += 1
                self.accept_cycles.append(self.cycle)
                offering = False
            if not offering:
                if not queue:
                    withdraw()
                    return
                if idle_prob and rand() < idle_prob:
                    withdraw()
                    continue
                item = queue.popleft()
                if sideband:
                    for i, (handle, value) in enumerate(zip(sideband, item[1:])):
                        if side_now[i] != value:
                            handle.value = value
                            side_now[i] = value
                    item = item[0]
                self.payload.value = item
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

    async def wait_for(self, count, period_ns, timeout_cycles=None):
        """Return once ``count`` transfers in all have been seen.

        ``period_ns``: the clock period. ``timeout_cycles``: how long to wait, in clock
        cycles (default 10 per missing transfer plus 1000).

        :raises AssertionError: if the transfers have not all come by then.
        """
        missing = count - len(self.items)
        if missing > 0:
            self._target = count
            self._reached.clear()
            if timeout_cycles is None:
                timeout_cycles = 10 * missing + 1000
            try:
                await with_timeout(self._reached.wait(), timeout_cycles * period_ns, "ns")
            except SimTimeoutError:
                raise AssertionError(f"{self.name} stuck: {len(self.items)} of {count} "
                                     f"transfers seen in {timeout_cycles} cycles") from None

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
                    f"{held:#x} was accepted")
                continue
            value = self.payload.value
            # A 1-bit payload reads as a Logic, which has no to_unsigned().
            word = int(value) if isinstance(value, Logic) else value.to_unsigned()
            if held is not None:
                self.stall_checks += 1
                assert word == held, (
                    f"cycle {self.cycle}: {self.name}.payload changed from {held:#x} to "
                    f"{word:#x} while valid and not ready")
            if self.ready.value:
                items.append(word)
                cycles.append(self.cycle)
                held = None
                if len(items) == self._target:
                    self._reached.set()
            else:
                held = word


class UnitBench:
    """Clock, reset and bus models of a unit with one input stream ``i_stream`` and one
    output stream ``o_stream`` that gives exactly one output per input, in order.

    After :meth:`start`: ``source`` and ``sink`` drive the two streams, ``inputs`` and
    ``outputs`` are monitors on them (started on the same edge, so their cycle numbers
    compare: ``outputs.cycles[k] - inputs.cycles[k]`` is transfer ``k``'s latency).
    ``rng`` (a ``random.Random``) seeds the source and the sink.
    """

    def __init__(self, dut, rng: random.Random, *, idle_prob=0.0, backpressure_prob=0.0,
                 clock_ns=10):
        self.dut, self.rng, self.clock_ns = dut, rng, clock_ns
        self.idle_prob, self.backpressure_prob = idle_prob, backpressure_prob
        self.source = self.sink = self.inputs = self.outputs = None

    async def start(self):
        """Start the clock, hold the synchronous reset for three cycles, then start the
        bus models."""
        dut = self.dut
        Clock(dut.clk, self.clock_ns, unit="ns").start()
        dut.rst.value = 1
        dut.i_stream__valid.value = 0
        dut.o_stream__ready.value = 0
        for _ in range(3):
            await RisingEdge(dut.clk)
        dut.rst.value = 0
        self.source = StreamSource(dut.clk, *stream_signals(dut, "i_stream"),
                                   idle_prob=self.idle_prob, seed=self.rng.getrandbits(32))
        self.sink = StreamSink(dut.clk, dut.o_stream__ready,
                               backpressure_prob=self.backpressure_prob,
                               seed=self.rng.getrandbits(32))
        self.inputs = StreamMonitor(dut.clk, *stream_signals(dut, "i_stream"), "i_stream")
        self.outputs = StreamMonitor(dut.clk, *stream_signals(dut, "o_stream"), "o_stream")

    async def transfer(self, words, latency: int) -> tuple[list[int], int]:
        """Send ``words``; return their outputs and the number of back-pressured output
        cycles seen meanwhile.

        :raises AssertionError: the outputs do not all come within ``20 * len(words) +
            100`` cycles, ``o_stream`` is valid again in the ``latency + 2`` cycles after
            the last one, or a stream rule is broken.
        """
        n = len(words)
        first = len(self.outputs.items)
        stalls_before = self.outputs.stall_checks
        self.source.send(words)
        await self.outputs.wait_for(first + n, self.clock_ns, timeout_cycles=20 * n + 100)
        # Nothing more may come out. (A read just after an edge sees what the edge
        # sampled: this is o_stream.valid during the cycles after the last transfer.)
        for _ in range(latency + 2):
            await RisingEdge(self.dut.clk)
            assert not self.dut.o_stream__valid.value, (
                "o_stream produced more outputs than inputs")
        assert len(self.inputs.items) == len(self.outputs.items)
        return self.outputs.items[first:], self.outputs.stall_checks - stalls_before
