"""Multipliers between registers, mapped onto the ECP5's MULT18X18D with its own registers.

A product that sits between an operand register and a product register takes a whole
cycle for the routing from the fabric to a DSP column, the multiplier (3.9 ns, speed 6)
and the routing back, and the placer does not put plain registers beside the DSP
(``docs/mfu.md`` section 10). The MULT18X18D has input and output registers of its own;
with both on, each of the three paths has a cycle of its own. Yosys maps ``*`` to a
combinational MULT18X18D only, so the registered form is an instance, chosen when the
design is elaborated for an ECP5 (:func:`has_ecp5_dsp`):

* the Amaranth vendor platform of a real board (``platform.family == "ecp5"``, e.g.
  ``amaranth_boards.ulx3s``), or
* :data:`ECP5_TARGET`, which ``bench.fpga`` passes for its place-and-route runs.

Any other platform (``None`` in the simulators and the Python simulator) keeps the units'
registers in the fabric: the simulated designs are the same with or without this module.
The instance is simulated by the behavioural model in ``sim/models/MULT18X18D.v`` (of the
configuration used here only); ``tests/hw/test_dsp_hw.py`` runs the units on it
(``docs/dsp.md``).
"""

from amaranth.hdl import Cat, ClockSignal, Const, Instance, Shape, Signal, signed

__all__ = ["ECP5_TARGET", "Ecp5Target", "has_ecp5_dsp", "registered_product",
           "registered_product_pair", "pair_fits", "DSP_WIDTH"]

#: Operand width of the MULT18X18D (each of A and B), bits.
DSP_WIDTH = 18


class Ecp5Target:
    """An elaboration platform that only says "ECP5" (``family = "ecp5"``).

    For flows that drive Yosys and nextpnr themselves (``bench.fpga``) and have no
    Amaranth vendor platform. It has no ``request``, ``get_memory`` and so on: a design
    that needs pins needs the real platform.
    """

    family = "ecp5"

    def __repr__(self):
        return "Ecp5Target()"


#: The one :class:`Ecp5Target` (it has no state).
ECP5_TARGET = Ecp5Target()


def has_ecp5_dsp(platform) -> bool:
    """Whether ``platform`` is an ECP5, whose MULT18X18D :func:`registered_product` uses."""
    return getattr(platform, "family", None) == "ecp5"


def registered_product(m, a, b, *, enable, name):
    """``a * b`` between registers on one MULT18X18D: its input registers take the
    operands, its output register their product.

    Both registers load on edges of the ``sync`` clock where ``enable`` is high and have
    no reset (undefined until first loaded), as the fabric registers they stand for: the
    value returned is ``a * b`` of the operands presented two enabled edges earlier.
    The caller decides with :func:`has_ecp5_dsp` whether to use it; elsewhere the units
    keep their fabric registers, so the simulated designs do not change.

    Parameters
    ----------
    m : Module
        The module the instance is added to.
    a, b : Value
        The operands, signed or unsigned; each at most 18 bits if both are unsigned,
        else at most 18 bits if signed and 17 bits if unsigned.
    enable : Value
        One bit: the registers load when it is high (the DSP's CE0).
    name : str
        Prefix of the instance and its signals.

    Returns
    -------
    Signal
        Of the shape of ``a * b`` in Amaranth (the exact product).

    Raises
    ------
    ValueError
        An operand does not fit the DSP (the message names it and its shape).
    """
    a_shape, b_shape = a.shape(), b.shape()
    product_shape = Shape.cast((a * b).shape())
    p = Signal(product_shape, name=f"{name}_p")
    signed_mode = a_shape.signed or b_shape.signed
    for label, shape in (("a", a_shape), ("b", b_shape)):
        limit = DSP_WIDTH - (1 if signed_mode and not shape.signed else 0)
        if shape.width > limit:
            raise ValueError(
                f"registered_product {name!r}: operand {label} of shape {shape!r} does not "
                f"fit the {DSP_WIDTH}-bit MULT18X18D operand (at most {limit} bits here)")
    a18 = Signal(DSP_WIDTH, name=f"{name}_dsp_a")
    b18 = Signal(DSP_WIDTH, name=f"{name}_dsp_b")
    p36 = Signal(2 * DSP_WIDTH, name=f"{name}_dsp_p")
    m.d.comb += [
        # Assignment extends by the operand's own signedness: sign bits for a signed
        # operand, zeros for an unsigned one (its top bit is then 0 in signed mode).
        a18.eq(a),
        b18.eq(b),
        p.eq(p36[:product_shape.width]),
    ]
    sign = Const(int(signed_mode), 1)
    ports = {}
    for i in range(DSP_WIDTH):
        ports[f"i_A{i}"] = a18[i]
        ports[f"i_B{i}"] = b18[i]
        ports[f"i_C{i}"] = Const(0, 1)
    for i in range(2 * DSP_WIDTH):
        ports[f"o_P{i}"] = p36[i]
    # Input registers A and B, and the output register, on CLK0/CE0; no pipeline
    # register (it would be a third stage); no reset (RST0 low), like the fabric form.
    # SIGNEDA/SIGNEDB are constants, so it does not matter that they are registered too.
    m.submodules[f"{name}_dsp"] = Instance(
        "MULT18X18D",
        p_REG_INPUTA_CLK="CLK0", p_REG_INPUTA_CE="CE0", p_REG_INPUTA_RST="RST0",
        p_REG_INPUTB_CLK="CLK0", p_REG_INPUTB_CE="CE0", p_REG_INPUTB_RST="RST0",
        p_REG_PIPELINE_CLK="NONE",
        p_REG_OUTPUT_CLK="CLK0", p_REG_OUTPUT_CE="CE0", p_REG_OUTPUT_RST="RST0",
        p_GSR="DISABLED", p_RESETMODE="SYNC",
        i_SIGNEDA=sign, i_SIGNEDB=sign, i_SOURCEA=Const(0, 1), i_SOURCEB=Const(0, 1),
        i_CLK0=ClockSignal("sync"), i_CE0=enable, i_RST0=Const(0, 1),
        **ports)
    return p


def pair_fits(a_shape, b_shape) -> bool:
    """Whether :func:`registered_product_pair` takes signed operands of these shapes.

    The packed operand ``b1 + 2**k * (b2 - sign(b1))`` is ``k + width(b) + 1`` signed
    bits with ``k = width(a) + width(b)``, the exact product's width; it and ``a`` must
    each fit the 18-bit operand.
    """
    a_shape, b_shape = Shape.cast(a_shape), Shape.cast(b_shape)
    return (a_shape.width <= DSP_WIDTH
            and a_shape.width + 2 * b_shape.width + 1 <= DSP_WIDTH)


def registered_product_pair(m, a, b1, b2, *, enable, name):
    """``a * b1`` and ``a * b2`` between registers on **one** MULT18X18D.

    The DSP multiplies ``a`` by ``B = b1 + 2**k * b2`` (``k`` the width of the exact
    product ``a * b1``), so ``P = a*b1 + 2**k * a*b2`` and each product is a field of
    ``P``. Signed operands make the low product borrow from the high one, which is undone
    on both sides: ``B``'s upper field is ``b2 - sign(b1)`` (``b1`` sign-extended to
    ``k`` bits is ``b1 + 2**k`` when negative), and ``a*b2 = (P >> k) + P[k-1]`` (the low
    field is ``a*b1 + 2**k`` when ``a*b1`` is negative). Both are exact for every pair of
    operand values. Registers as :func:`registered_product`: the DSP's input registers
    take the operands (the decrement is in front of them), its output register the
    packed product; the increment follows that register.

    Parameters
    ----------
    m : Module
    a, b1, b2 : Value
        Signed operands; ``b1`` and ``b2`` of one shape; :func:`pair_fits` of the shapes.
    enable : Value
        One bit: the registers load when it is high.
    name : str
        Prefix of the instance and its signals.

    Returns
    -------
    (Signal, Value)
        ``a * b1`` and ``a * b2``, each of the shape of the exact product, of the operands
        presented two enabled edges earlier.

    Raises
    ------
    ValueError
        An operand is unsigned, ``b1`` and ``b2`` differ in shape, or the shapes do not
        fit one DSP (the message names the shapes).
    """
    a_shape, b_shape = a.shape(), b1.shape()
    if not (a_shape.signed and b_shape.signed) or b2.shape() != b_shape:
        raise ValueError(
            f"registered_product_pair {name!r}: operands must be signed and b1, b2 of one "
            f"shape, not a {a_shape!r}, b1 {b_shape!r}, b2 {b2.shape()!r}")
    if not pair_fits(a_shape, b_shape):
        raise ValueError(
            f"registered_product_pair {name!r}: a {a_shape!r} and b {b_shape!r} do not fit "
            f"one {DSP_WIDTH}-bit MULT18X18D operand pair (width(a) + 2 width(b) + 1 = "
            f"{a_shape.width + 2 * b_shape.width + 1} > {DSP_WIDTH})")
    k = a_shape.width + b_shape.width
    high = Signal(signed(b_shape.width + 1), name=f"{name}_b2_dec")
    m.d.comb += high.eq(b2 - b1[-1])
    packed = Cat(b1, b1[-1].replicate(k - b_shape.width), high).as_signed()
    full = registered_product(m, a, packed, enable=enable, name=name)
    low = full[:k].as_signed()
    p2 = Signal(signed(k), name=f"{name}_p2")
    m.d.comb += p2.eq(full[k:2 * k] + full[k - 1])
    return low, p2
