"""8N1 UART receiver and transmitter with ``lib.stream`` byte ports (``docs/link-hw.md``).

Both count ``divisor`` clock cycles per bit (``clk_hz // baud``, rounded to nearest by
:func:`divisor_for`). The receiver samples each bit in its middle, after a start bit
that is still low half a bit after its falling edge (a glitch shorter than that is not a
start bit). A byte is offered on ``o_stream`` and held until taken; a byte that completes
while the previous one is still waiting is dropped and counted in ``overruns`` (the
board puts a FIFO behind the receiver, so this only happens when it is full). A stop bit
that reads low drops the byte, counts a ``framing_errors`` and waits for the line to go
high again (a break or a wrong baud rate).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

__all__ = ["UartRx", "UartTx", "divisor_for", "MIN_DIVISOR"]

#: Fewest clock cycles per bit the units accept (the receiver samples half a bit in).
MIN_DIVISOR = 4


def divisor_for(clk_hz: int, baud: int) -> int:
    """Clock cycles per bit for ``baud`` at ``clk_hz``, rounded to nearest.

    Raises
    ------
    TypeError, ValueError
        when an argument is not a positive integer, or the result is below
        :data:`MIN_DIVISOR`, or the rounding makes the rate more than 2 % off (8N1 bytes
        stop being sampled inside their bits beyond about 4 %, and the far end has an
        error of its own).
    """
    from host.spec.formats import check_int
    clk_hz = check_int("clk_hz", clk_hz, 1)
    baud = check_int("baud", baud, 1)
    divisor = (clk_hz + baud // 2) // baud
    if divisor < MIN_DIVISOR:
        raise ValueError(f"baud {baud} is too fast for clk_hz {clk_hz}: {divisor} cycles "
                         f"per bit, at least {MIN_DIVISOR} needed")
    error = abs(clk_hz / divisor - baud) / baud
    if error > 0.02:
        raise ValueError(f"baud {baud} at clk_hz {clk_hz} is {error:.1%} off with divisor "
                         f"{divisor}; at most 2 % is accepted")
    return divisor


def _check_divisor(divisor):
    from host.spec.formats import check_int
    return check_int("divisor", divisor, MIN_DIVISOR)


class UartRx(wiring.Component):
    """8N1 receiver.

    Parameters
    ----------
    divisor : int
        Clock cycles per bit, at least :data:`MIN_DIVISOR`.

    Attributes
    ----------
    rx : ``In(1, init=1)``
        The serial line (idle high); synchronised here.
    o_stream : ``Out(stream.Signature(8))``
        Received bytes.
    overruns, framing_errors : ``Out(16)``
        Bytes lost (saturating counts).

    Raises
    ------
    TypeError, ValueError
        when ``divisor`` is not an integer >= :data:`MIN_DIVISOR`.
    """

    def __init__(self, divisor: int):
        # A unit whose parameter was refused is no unused elaboratable worth a warning.
        self._MustUse__silence = True
        self._divisor = _check_divisor(divisor)
        self._MustUse__silence = False
        super().__init__({"rx": In(1, init=1), "o_stream": Out(stream.Signature(8)),
                          "overruns": Out(16), "framing_errors": Out(16)})

    @property
    def divisor(self) -> int:
        return self._divisor

    def elaborate(self, platform):
        m = Module()
        div = self._divisor
        line = Signal(init=1)
        m.submodules.sync = FFSynchronizer(self.rx, line, init=1)
        count = Signal(range(div))
        bits = Signal(range(9))
        shift = Signal(8)
        valid = Signal()
        data = Signal(8)
        m.d.comb += [self.o_stream.valid.eq(valid), self.o_stream.payload.eq(data)]
        with m.If(self.o_stream.ready):
            m.d.sync += valid.eq(0)

        def bump(counter):
            with m.If(counter != 0xFFFF):
                m.d.sync += counter.eq(counter + 1)

        with m.If(count != 0):
            m.d.sync += count.eq(count - 1)
        with m.FSM():
            with m.State("IDLE"):
                with m.If(~line):
                    m.d.sync += count.eq(div // 2 - 1)
                    m.next = "START"
            with m.State("START"):
                with m.If(count == 0):
                    with m.If(line):
                        m.next = "IDLE"           # a glitch, not a start bit
                    with m.Else():
                        m.d.sync += [count.eq(div - 1), bits.eq(0)]
                        m.next = "DATA"
            with m.State("DATA"):
                with m.If(count == 0):
                    m.d.sync += [shift.eq(Cat(shift[1:], line)), bits.eq(bits + 1),
                                 count.eq(div - 1)]
                    with m.If(bits == 7):
                        m.next = "STOP"
            with m.State("STOP"):
                with m.If(count == 0):
                    with m.If(line):
                        with m.If(valid & ~self.o_stream.ready):
                            bump(self.overruns)
                        with m.Else():
                            m.d.sync += [valid.eq(1), data.eq(shift)]
                        m.next = "IDLE"
                    with m.Else():
                        bump(self.framing_errors)
                        m.next = "BREAK"
            with m.State("BREAK"):
                with m.If(line):
                    m.next = "IDLE"
        return m


class UartTx(wiring.Component):
    """8N1 transmitter.

    Parameters
    ----------
    divisor : int
        Clock cycles per bit, at least :data:`MIN_DIVISOR`.

    Attributes
    ----------
    i_stream : ``In(stream.Signature(8))``
        Bytes to send; one is taken when the previous stop bit ends.
    tx : ``Out(1, init=1)``
        The serial line (idle high).

    Raises
    ------
    TypeError, ValueError
        when ``divisor`` is not an integer >= :data:`MIN_DIVISOR`.
    """

    def __init__(self, divisor: int):
        # A unit whose parameter was refused is no unused elaboratable worth a warning.
        self._MustUse__silence = True
        self._divisor = _check_divisor(divisor)
        self._MustUse__silence = False
        super().__init__({"i_stream": In(stream.Signature(8)), "tx": Out(1, init=1)})

    @property
    def divisor(self) -> int:
        return self._divisor

    def elaborate(self, platform):
        m = Module()
        div = self._divisor
        count = Signal(range(div))
        bits = Signal(range(11))
        shift = Signal(10, init=0x3FF)      # stop bit, 8 data bits LSB first, start bit
        m.d.comb += [self.tx.eq(shift[0]), self.i_stream.ready.eq(bits == 0)]
        with m.If(bits == 0):
            with m.If(self.i_stream.valid):
                m.d.sync += [shift.eq(Cat(0, self.i_stream.payload, 1)), bits.eq(10),
                             count.eq(div - 1)]
        with m.Elif(count == 0):
            m.d.sync += [shift.eq(Cat(shift[1:], 1)), bits.eq(bits - 1), count.eq(div - 1)]
        with m.Else():
            m.d.sync += count.eq(count - 1)
        return m
