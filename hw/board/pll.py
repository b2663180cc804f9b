"""The ECP5 PLL (``EHXPLLL``): a core clock other than the board's oscillator (issue 36).

* :func:`pll_params` chooses the dividers for an input and an output frequency, as the
  ECP5 tools' ``ecppll`` (prjtrellis, ``libtrellis/tools/ecppll.cpp``) does, in exact
  arithmetic.
* :class:`EcpPll` instantiates ``EHXPLLL`` with them and drives a clock domain from its
  ``CLKOP`` output, held in reset until the PLL locks (:class:`LockReset`).

The PLL's frequencies (feedback from ``CLKOP``, which is what ``ecppll`` writes)::

    f_pfd = f_in / CLKI_DIV           phase detector
    f_out = f_pfd * CLKFB_DIV         CLKOP, fed back through the CLKFB divider
    f_vco = f_out * CLKOP_DIV         oscillator, divided by CLKOP_DIV to make CLKOP

The limits are ``ecppll``'s (:data:`LIMITS`). LiteX's ECP5 PLL has the same frequency
ranges except outputs down to 3.125 MHz, which the NPU has no use for.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from fractions import Fraction

from amaranth.hdl import ClockSignal, Instance, Module, ResetSignal, Signal
from amaranth.lib import wiring
from amaranth.lib.cdc import AsyncFFSynchronizer
from amaranth.lib.wiring import In, Out

from host.spec.formats import check_int
from hw.ecp5 import global_buffer

__all__ = ["DEFAULT_TOLERANCE", "LIMITS", "EcpPll", "LockReset", "PllParams", "pll_params",
           "reachable_range"]

#: ``EHXPLLL`` limits as ``ecppll`` has them: frequencies in Hz (inclusive ranges),
#: divider ranges inclusive. ``ecppll`` only warns about an input or output frequency out
#: of range; :func:`pll_params` refuses one.
LIMITS = {
    "f_in_hz": (8_000_000, 400_000_000),
    "f_out_hz": (10_000_000, 400_000_000),
    "f_pfd_hz": (3_125_000, 400_000_000),
    "f_vco_hz": (400_000_000, 800_000_000),
    "clki_div": (1, 128),
    "clkfb_div": (1, 80),
    "clkop_div": (1, 128),
}
#: Among dividers giving the same output frequency ``ecppll`` takes the VCO frequency
#: nearest this one (Hz), the middle of the VCO's range.
VCO_PREFERRED_HZ = 600_000_000
#: Relative error of the output frequency :func:`pll_params` accepts by default (0.5 %).
DEFAULT_TOLERANCE = 0.005


@dataclass(frozen=True)
class PllParams:
    """Dividers of an ``EHXPLLL`` with feedback from ``CLKOP``, and its frequencies.

    Frequencies are in Hz, as exact ``fractions.Fraction``\\ s (``f_in_hz`` is an ``int``):
    a 25 MHz input divided by 3 is not a whole number of hertz.

    Attributes
    ----------
    f_in_hz : int
        Input (``CLKI``) frequency.
    clki_div, clkfb_div, clkop_div : int
        The reference, feedback and ``CLKOP`` output dividers.
    clkop_cphase, clkop_fphase : int
        ``CLKOP``'s coarse phase (VCO cycles) and fine phase (eighths of one).
    f_pfd_hz, f_vco_hz, f_out_hz : fractions.Fraction
        Phase detector, VCO and output (``CLKOP``) frequencies.
    """

    f_in_hz: int
    clki_div: int
    clkfb_div: int
    clkop_div: int
    clkop_cphase: int
    clkop_fphase: int
    f_pfd_hz: Fraction
    f_vco_hz: Fraction
    f_out_hz: Fraction

    @property
    def clk_hz(self) -> int:
        """The output frequency rounded to a whole number of hertz: what a clock rate
        parameter (the UART divisor, a timeout in cycles) is computed from."""
        return round(self.f_out_hz)

    def describe(self) -> str:
        """``100 MHz (EHXPLLL 25 MHz / 1 * 4, VCO 600 MHz / 6)``: for banners and logs."""
        return (f"{_mhz(self.f_out_hz)} MHz (EHXPLLL {_mhz(self.f_in_hz)} MHz / "
                f"{self.clki_div} * {self.clkfb_div}, VCO {_mhz(self.f_vco_hz)} MHz / "
                f"{self.clkop_div})")

    def to_dict(self) -> dict:
        """JSON-ready: the dividers, and the frequencies in Hz as floats."""
        return {"f_in_hz": self.f_in_hz, "clki_div": self.clki_div,
                "clkfb_div": self.clkfb_div, "clkop_div": self.clkop_div,
                "clkop_cphase": self.clkop_cphase, "clkop_fphase": self.clkop_fphase,
                "f_pfd_hz": float(self.f_pfd_hz), "f_vco_hz": float(self.f_vco_hz),
                "f_out_hz": float(self.f_out_hz)}


def _mhz(hz) -> str:
    """A frequency in MHz as ``ecppll`` prints one (six significant digits): ``33.3333``."""
    return f"{float(hz) / 1e6:g}"


def _check_f_in(f_in_hz) -> int:
    f_in_hz = check_int("f_in_hz", f_in_hz, 1)
    lo, hi = LIMITS["f_in_hz"]
    if not lo <= f_in_hz <= hi:
        raise ValueError(f"f_in_hz {f_in_hz} is outside the EHXPLLL's input range "
                         f"{_mhz(lo)} MHz to {_mhz(hi)} MHz")
    return f_in_hz


def _candidates(f_in_hz):
    """Every ``(f_out, f_vco, f_pfd, clki_div, clkfb_div, clkop_div)`` within
    :data:`LIMITS` for ``f_in_hz``, the ``CLKOP`` divider the one ``ecppll`` keeps for
    that output (VCO nearest :data:`VCO_PREFERRED_HZ`, the smaller divider on a tie)."""
    pfd_lo, pfd_hi = LIMITS["f_pfd_hz"]
    out_lo, out_hi = LIMITS["f_out_hz"]
    vco_lo, vco_hi = LIMITS["f_vco_hz"]
    op_lo, op_hi = LIMITS["clkop_div"]
    for clki_div in range(LIMITS["clki_div"][0], LIMITS["clki_div"][1] + 1):
        f_pfd = Fraction(f_in_hz, clki_div)
        if not pfd_lo <= f_pfd <= pfd_hi:
            continue
        for clkfb_div in range(LIMITS["clkfb_div"][0], LIMITS["clkfb_div"][1] + 1):
            f_out = f_pfd * clkfb_div
            if not out_lo <= f_out <= out_hi:
                continue
            lo = max(op_lo, math.ceil(vco_lo / f_out))
            hi = min(op_hi, math.floor(vco_hi / f_out))
            if lo > hi:
                continue
            # The VCO nearest the preferred one: the divider on either side of it.
            near = math.floor(VCO_PREFERRED_HZ / f_out)
            ops = {min(max(d, lo), hi) for d in (near, near + 1)}
            clkop_div = min(ops, key=lambda d: (abs(f_out * d - VCO_PREFERRED_HZ), d))
            yield f_out, f_out * clkop_div, f_pfd, clki_div, clkfb_div, clkop_div


def reachable_range(f_in_hz: int) -> tuple[Fraction, Fraction]:
    """Lowest and highest output frequency (Hz) an ``EHXPLLL`` makes from ``f_in_hz``
    within :data:`LIMITS`.

    Raises
    ------
    TypeError, ValueError
        ``f_in_hz`` is not an integer within the input range.
    """
    outs = [c[0] for c in _candidates(_check_f_in(f_in_hz))]
    return min(outs), max(outs)


def pll_params(f_in_hz: int, f_out_hz: int, *,
               tolerance: float = DEFAULT_TOLERANCE) -> PllParams:
    """The ``EHXPLLL`` dividers making ``f_out_hz`` from ``f_in_hz``, feedback from
    ``CLKOP``, as ``ecppll`` chooses them.

    Of the divider triples within :data:`LIMITS`, the one whose output is nearest
    ``f_out_hz`` (exactly it when possible); among equally near ones the VCO nearest
    600 MHz, then the smallest ``CLKI_DIV``, ``CLKFB_DIV``, ``CLKOP_DIV`` (``ecppll``'s
    search order, in exact arithmetic rather than its single precision). ``CLKOP`` is
    shifted by half its period, ``CLKOP_DIV // 2`` VCO cycles and no fine phase, which is
    what ``ecppll`` means to write (its single-precision arithmetic writes one cycle less
    for some dividers: 2 for ``CLKOP_DIV`` 6); with the feedback from ``CLKOP`` the loop
    aligns ``CLKOP`` with the input whatever its phase setting.

    Parameters
    ----------
    f_in_hz : int
        Input frequency, Hz: 8 MHz to 400 MHz.
    f_out_hz : int
        Wanted output frequency, Hz, within :func:`reachable_range` of ``f_in_hz``.
    tolerance : float
        Largest relative error of the output frequency accepted, ``>= 0``.

    Returns
    -------
    PllParams

    Raises
    ------
    TypeError
        a frequency is not an integer, or ``tolerance`` not a real number.
    ValueError
        a frequency is out of range (the message gives the reachable range), the
        nearest output is more than ``tolerance`` off, or ``tolerance`` is negative.
    """
    f_in_hz = _check_f_in(f_in_hz)
    f_out_hz = check_int("f_out_hz", f_out_hz, 1)
    if isinstance(tolerance, bool) or not isinstance(tolerance, numbers.Real):
        raise TypeError(f"tolerance must be a real number, not {tolerance!r}")
    if not tolerance >= 0:
        raise ValueError(f"tolerance must be at least 0, not {tolerance!r}")
    candidates = list(_candidates(f_in_hz))
    lo = min(c[0] for c in candidates)
    hi = max(c[0] for c in candidates)
    if not lo <= f_out_hz <= hi:
        raise ValueError(f"f_out_hz {f_out_hz} is outside the range an EHXPLLL reaches "
                         f"from f_in_hz {f_in_hz}: {_mhz(lo)} MHz to {_mhz(hi)} MHz")
    f_out, f_vco, f_pfd, clki_div, clkfb_div, clkop_div = min(
        candidates, key=lambda c: (abs(c[0] - f_out_hz), abs(c[1] - VCO_PREFERRED_HZ),
                                   c[3], c[4], c[5]))
    error = abs(f_out - f_out_hz) / f_out_hz
    if error > tolerance:
        raise ValueError(f"f_out_hz {f_out_hz} from f_in_hz {f_in_hz}: the nearest an "
                         f"EHXPLLL reaches is {_mhz(f_out)} MHz, {float(error):.3%} off, "
                         f"more than the tolerance {tolerance:.3%}")
    return PllParams(f_in_hz=f_in_hz, clki_div=clki_div, clkfb_div=clkfb_div,
                     clkop_div=clkop_div, clkop_cphase=clkop_div // 2, clkop_fphase=0,
                     f_pfd_hz=f_pfd, f_vco_hz=f_vco, f_out_hz=f_out)


def _check_domain(domain):
    if not isinstance(domain, str):
        raise TypeError(f"domain must be a string, not {domain!r}")
    return domain


class LockReset(wiring.Component):
    """Reset of clock domain ``domain`` from a PLL's lock: asserted at once (without a
    clock edge) while ``locked`` is low, released ``stages`` edges of ``domain``'s clock
    after it goes high, on an edge (a reset synchronizer:
    ``amaranth.lib.cdc.AsyncFFSynchronizer``).

    Parameters
    ----------
    domain : str
        The domain whose clock times the release (the flip-flops themselves are not
        reset by that domain's reset, which they drive).
    stages : int
        Flip-flops in the synchronizer, at least 2.

    Attributes
    ----------
    locked : ``In(1)``
        The PLL's lock, asynchronous to every clock.
    rst : ``Out(1, init=1)``
        The reset, high from configuration until ``stages`` edges after lock.

    Raises
    ------
    TypeError, ValueError
        ``domain`` is not a string, or ``stages`` not an integer >= 2.
    """

    def __init__(self, *, domain: str = "sync", stages: int = 2):
        # A unit whose parameters were refused is no unused elaboratable worth a warning.
        self._MustUse__silence = True
        self._domain = _check_domain(domain)
        self._stages = check_int("stages", stages, 2)
        self._MustUse__silence = False
        super().__init__({"locked": In(1), "rst": Out(1, init=1)})

    @property
    def stages(self) -> int:
        return self._stages

    def elaborate(self, platform):
        m = Module()
        m.submodules.sync = AsyncFFSynchronizer(~self.locked, self.rst,
                                                o_domain=self._domain, stages=self._stages)
        return m


class EcpPll(wiring.Component):
    """An ``EHXPLLL`` with feedback from ``CLKOP``, driving clock domain ``domain``.

    The domain's clock is ``CLKOP``; its reset is :class:`LockReset`'s, so the domain's
    logic starts ``reset_stages`` cycles after the PLL locks and is reset again if the
    lock is lost. Elaborated for the ECP5, that reset reaches the domain through a ``DCCA``
    (:func:`hw.ecp5.global_buffer`), on a global line rather than the general routing
    (about 1,100 flip-flops of the board build take it). The domain itself (a
    ``ClockDomain`` with a synchronous reset) is the parent's to define: Amaranth 0.6 will
    want a domain defined above every module that uses it, not in a submodule such as this
    one. The instance carries the attributes ``ecppll`` writes: the loop filter's
    (``ICP_CURRENT`` 12, ``LPF_RESISTOR`` 8, ``MFG_ENABLE_FILTEROPAMP`` 1,
    ``MFG_GMCREF_SEL`` 2) and ``FREQUENCY_PIN_CLKI``/``FREQUENCY_PIN_CLKOP`` (MHz; nextpnr
    derives ``CLKOP``'s timing constraint from the input's and the dividers itself).

    Parameters
    ----------
    params : PllParams
        From :func:`pll_params`.
    domain : str
        Name of the clock domain driven, defined by the parent.
    reset_stages : int
        Flip-flops of the reset synchronizer, at least 2.

    Attributes
    ----------
    clk_in : ``In(1)``
        The reference clock (``params.f_in_hz``), from a clock pin's input buffer.
    locked : ``Out(1)``
        The PLL's ``LOCK`` output, asynchronous.

    Raises
    ------
    TypeError, ValueError
        ``params`` is not a :class:`PllParams`, or as :class:`LockReset`.
    """

    def __init__(self, params: PllParams, *, domain: str = "sync", reset_stages: int = 2):
        self._MustUse__silence = True                     # as LockReset's
        if not isinstance(params, PllParams):
            raise TypeError(f"params must be a PllParams (from pll_params), not {params!r}")
        self._params = params
        self._domain = _check_domain(domain)
        self._reset_stages = check_int("reset_stages", reset_stages, 2)
        self._MustUse__silence = False
        super().__init__({"clk_in": In(1), "locked": Out(1)})

    @property
    def params(self) -> PllParams:
        return self._params

    def elaborate(self, platform):
        p = self._params
        m = Module()
        clkop = Signal()
        m.submodules.pll = Instance(
            "EHXPLLL",
            a_FREQUENCY_PIN_CLKI=_mhz(p.f_in_hz),
            a_FREQUENCY_PIN_CLKOP=_mhz(p.f_out_hz),
            a_ICP_CURRENT="12", a_LPF_RESISTOR="8", a_MFG_ENABLE_FILTEROPAMP="1",
            a_MFG_GMCREF_SEL="2",
            p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
            p_DPHASE_SOURCE="DISABLED",
            p_OUTDIVIDER_MUXA="DIVA", p_OUTDIVIDER_MUXB="DIVB", p_OUTDIVIDER_MUXC="DIVC",
            p_OUTDIVIDER_MUXD="DIVD",
            p_CLKI_DIV=p.clki_div, p_CLKOP_ENABLE="ENABLED", p_CLKOP_DIV=p.clkop_div,
            p_CLKOP_CPHASE=p.clkop_cphase, p_CLKOP_FPHASE=p.clkop_fphase,
            p_FEEDBK_PATH="CLKOP", p_CLKFB_DIV=p.clkfb_div,
            i_CLKI=self.clk_in, i_CLKFB=clkop, o_CLKOP=clkop, o_LOCK=self.locked,
            i_RST=0, i_STDBY=0, i_PHASESEL0=0, i_PHASESEL1=0, i_PHASEDIR=1,
            i_PHASESTEP=1, i_PHASELOADREG=1, i_PLLWAKESYNC=0, i_ENCLKOP=0,
        )
        m.submodules.reset = reset = LockReset(domain=self._domain, stages=self._reset_stages)
        rst = global_buffer(m, platform, reset.rst, name="reset_buffer")
        m.d.comb += [ClockSignal(self._domain).eq(clkop), reset.locked.eq(self.locked),
                     ResetSignal(self._domain).eq(rst)]
        return m
