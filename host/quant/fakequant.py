"""Device-faithful fake quantization for PyTorch (the training issue, item 1).

The device rounds every vector to FP16 at its boundary and quantizes the inputs of a
matrix product, and the weights in the MRF, to BFP blocks of ``N`` values
(``docs/numerics.md`` sections 1 and 2). The functions here compute exactly those values
in PyTorch, as differentiable operations with straight-through gradients, so that a model
trained with them sees what the device computes:

* :func:`fp16` rounds to FP16 (nearest even) and back to the input's dtype.
* :func:`unary` is the device's activation unit (sigmoid, tanh, exp, relu, pass) on FP16
  values, bit for bit (a table of :func:`host.numerics.unary.unary_bits` over all 65536
  FP16 inputs), its gradient that of the exact function.
* :func:`bfp` quantizes to BFP blocks along the last axis: the dynamic exponent
  ``floor(log2(max |x|))`` of each block (clamped below at -127, all-zero blocks -127) or
  static exponents, rounding to nearest with ties to even or away from zero, and the
  symmetric clamp ``|q| <= 2**(m-1) - 1``. Its values equal
  :func:`host.numerics.bfp.quantize`'s dequantized values bit for bit
  (``tests/quant/test_fakequant.py`` checks it on random and edge-case tensors).

Gradients (straight-through estimator): the gradient of :func:`fp16` is the identity; that
of :func:`bfp` is the identity for values inside the block's range and zero for values
that a static exponent clamps (their output does not move with them). A dynamic exponent
never clamps beyond rounding, so its gradient is the identity everywhere. Exponents are
not differentiated here; learned saturation (seed 002) is the QAT module's business.

The arithmetic runs in float64, where scaling by a power of two and rounding an at most
17-bit integer are exact, and returns the input's dtype.

PyTorch is an optional dependency (the ``train`` extra); importing this module without it
raises ``ImportError`` naming the extra.
"""

from __future__ import annotations

import functools

import numpy as np

try:
    import torch
except ImportError as exc:                       # pragma: no cover (exercised by hand)
    raise ImportError("host.quant.fakequant needs PyTorch: pip install -e '.[train]' "
                      "(torch==2.13.0, the CPU build)") from exc

from host.spec.formats import (
    EXP_MAX,
    EXP_MIN,
    MANTISSA_BITS_MAX,
    MANTISSA_BITS_MIN,
    ZERO_BLOCK_EXP,
    Rounding,
    check_int,
    mantissa_max,
)

__all__ = ["BfpLinear", "BfpQuantizer", "bfp", "block_exponents", "fp16", "unary"]


def _blocks(x: torch.Tensor, n: int) -> torch.Tensor:
    """``x`` as ``(..., nblocks, n)`` float64, the last axis zero padded to whole blocks."""
    length = x.shape[-1]
    nblocks = -(-length // n)
    x = x.to(torch.float64)
    if nblocks * n != length:
        x = torch.nn.functional.pad(x, (0, nblocks * n - length))
    return x.reshape(*x.shape[:-1], nblocks, n)


def block_exponents(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """The device's dynamic exponents of ``x`` blocked along its last axis: per block
    ``floor(log2(max |x|))``, clamped below at -127, and -127 for an all-zero block.
    Returns int32 ``(..., nblocks)``.

    Raises
    ------
    ValueError
        ``x`` has inf or NaN, or a block maximum of ``2**128`` or more.
    """
    n = check_int("block_size", block_size, 1)
    blocks = _blocks(x.detach(), n)
    if not torch.isfinite(blocks).all():
        raise ValueError("x has inf or NaN values; the device's FP16 rule saturates them "
                         "before quantizing (round with fp16() first)")
    amax = blocks.abs().amax(dim=-1)
    # frexp is exact: amax = f * 2**p with f in [0.5, 1), so floor(log2(amax)) = p - 1.
    exps = torch.frexp(amax).exponent.to(torch.int32) - 1
    exps = torch.where(amax == 0, torch.full_like(exps, ZERO_BLOCK_EXP),
                       torch.clamp(exps, min=EXP_MIN))
    if (exps > EXP_MAX).any():
        raise ValueError(f"x has values of magnitude >= 2**{EXP_MAX + 1}, beyond the "
                         f"largest E8M0 scale")
    return exps


class _Fp16(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        if x.dtype == torch.float64:
            # torch rounds float64 to float16 through float32 (twice, which can land on
            # the wrong side of a tie); NumPy rounds once, as the device's host does.
            with np.errstate(over="ignore"):        # beyond 65504 is inf, as the device
                half = torch.from_numpy(x.detach().cpu().numpy().astype(np.float16))
            return half.to(device=x.device, dtype=x.dtype)
        return x.to(torch.float16).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad


def fp16(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to FP16 once (nearest even; beyond 65504 to infinity) in ``x``'s
    dtype, with the identity as its gradient."""
    return _Fp16.apply(x)


#: The unary ops :func:`unary` takes, with the derivative of the exact function (of the
#: FP16 input ``x`` and the exact value ``y``) used as the gradient.
_DERIVATIVES = {
    "sigmoid": lambda x: torch.sigmoid(x) * (1 - torch.sigmoid(x)),
    "tanh": lambda x: 1 - torch.tanh(x) ** 2,
    "exp": lambda x: torch.exp(torch.clamp(x, max=11.1)),
    "relu": lambda x: (x > 0).to(x.dtype),
    "pass": lambda x: torch.ones_like(x),
}


@functools.cache
def _unary_table(name: str) -> torch.Tensor:
    """The device's ``name`` on every FP16 bit pattern, as float64 values (65536,)."""
    from host.numerics.unary import unary_bits
    bits = np.arange(1 << 16, dtype=np.int64).astype(np.uint16)
    return torch.from_numpy(unary_bits(name, bits).view(np.float16).astype(np.float64))


class _Unary(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, name):
        with np.errstate(over="ignore"):
            half = x.detach().cpu().numpy().astype(np.float16)
        idx = torch.from_numpy(half.view(np.uint16).astype(np.int64))
        ctx.save_for_backward(torch.from_numpy(half.astype(np.float64)))
        ctx.name = name
        return _unary_table(name)[idx].to(device=x.device, dtype=x.dtype)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        d = torch.nan_to_num(_DERIVATIVES[ctx.name](x), nan=0.0, posinf=0.0)
        return grad * d.to(grad.dtype), None


def unary(name: str, x: torch.Tensor) -> torch.Tensor:
    """The device's activation unit: ``x`` rounded to FP16, then the MFU's ``name``
    (``"sigmoid"``, ``"tanh"``, ``"exp"``, ``"relu"``, ``"pass"``) bit for bit as
    :func:`host.numerics.unary.unary_bits` computes it (a table lookup), in ``x``'s dtype.
    The gradient is the exact function's derivative at the FP16 input (straight through
    the table's approximation and the rounding).

    Raises
    ------
    ValueError
        ``name`` is not one of those ops.
    """
    name = str(name).lower()
    if name not in _DERIVATIVES:
        raise ValueError(f"unary op must be one of {sorted(_DERIVATIVES)}, not {name!r}")
    return _Unary.apply(x, name)


class _Bfp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, n, m, away, exponent):
        length = x.shape[-1]
        blocks = _blocks(x, n)
        if exponent is None:
            exps = block_exponents(x, n)
        else:
            exps = torch.broadcast_to(exponent, blocks.shape[:-1])
        step_exp = (exps - (m - 2)).to(torch.int32)
        scaled = torch.ldexp(blocks, -step_exp[..., None].to(torch.float64))
        top = float(mantissa_max(m))
        # Clipping to 2**m first changes no result (anything above top clamps anyway) and
        # keeps the rounding below exact for huge static-exponent overshoots.
        scaled = torch.clamp(scaled, -2.0 ** m, 2.0 ** m)
        if away:
            q = torch.sign(scaled) * torch.floor(scaled.abs() + 0.5)
        else:
            q = torch.round(scaled)                      # ties to even
        inside = q.abs() <= top
        q = torch.clamp(q, -top, top)
        out = torch.ldexp(q, step_exp[..., None].to(torch.float64))
        out = out.reshape(*out.shape[:-2], -1)[..., :length]
        inside = inside.reshape(*inside.shape[:-2], -1)[..., :length]
        ctx.save_for_backward(inside)
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        (inside,) = ctx.saved_tensors
        return grad * inside.to(grad.dtype), None, None, None, None


def bfp(x: torch.Tensor, block_size: int, mantissa_bits: int, rounding="nearest-even",
        exponent=None) -> torch.Tensor:
    """Fake-quantize ``x`` to BFP blocks of ``block_size`` along its last axis (zero
    padded at its end), as the device does: returns the dequantized values in ``x``'s
    dtype. ``exponent``: None (dynamic, per block) or static exponents, an int or an
    integer tensor broadcastable to ``(..., nblocks)``, each in -127..127.

    Raises
    ------
    TypeError
        ``x`` is not a floating-point tensor; a width is not an integer.
    ValueError
        a width or ``rounding`` is out of range; a static exponent outside -127..127;
        ``x`` has inf or NaN (dynamic exponents).
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"x must be a floating-point torch.Tensor, not "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() == 0:
        raise ValueError("x must have at least one axis")
    n = check_int("block_size", block_size, 1)
    m = check_int("mantissa_bits", mantissa_bits, MANTISSA_BITS_MIN, MANTISSA_BITS_MAX)
    away = Rounding.parse(rounding) is Rounding.NEAREST_AWAY
    if exponent is not None:
        exponent = torch.as_tensor(exponent)
        if exponent.is_floating_point() or exponent.dtype == torch.bool:
            raise TypeError(f"exponent must be integers, not {exponent.dtype}")
        if exponent.numel() and (exponent.min() < EXP_MIN or exponent.max() > EXP_MAX):
            raise ValueError(f"exponent must lie in {EXP_MIN}..{EXP_MAX}, not "
                             f"{int(exponent.min())}..{int(exponent.max())}")
        exponent = exponent.to(torch.int32)
    return _Bfp.apply(x, n, m, away, exponent)


class BfpQuantizer(torch.nn.Module):
    """The device's vector path into a matrix product as a module: FP16, then BFP blocks
    of ``block_size`` along the last axis with ``mantissa_bits``; ``exponent`` None
    (dynamic) or a static exponent (a buffer, so it is saved with the model)."""

    def __init__(self, block_size: int, mantissa_bits: int, rounding="nearest-even",
                 exponent: int | None = None):
        super().__init__()
        self.block_size = check_int("block_size", block_size, 1)
        self.mantissa_bits = check_int("mantissa_bits", mantissa_bits, MANTISSA_BITS_MIN,
                                       MANTISSA_BITS_MAX)
        self.rounding = Rounding.parse(rounding)
        if exponent is not None:
            exponent = check_int("exponent", exponent, EXP_MIN, EXP_MAX)
        self.register_buffer("exponent", None if exponent is None
                             else torch.tensor(exponent, dtype=torch.int32))

    def forward(self, x):
        return bfp(fp16(x), self.block_size, self.mantissa_bits, self.rounding,
                   self.exponent)

    def extra_repr(self) -> str:
        exp = "dynamic" if self.exponent is None else f"static {int(self.exponent)}"
        return (f"block_size={self.block_size}, mantissa_bits={self.mantissa_bits}, "
                f"rounding={self.rounding.name.lower()}, exponent={exp}")


class BfpLinear(torch.nn.Linear):
    """``nn.Linear`` computed as the device computes a dense layer: the input through
    :class:`BfpQuantizer` (``mantissa_bits_v``), the weights rounded to FP16 and quantized
    in blocks of ``block_size`` along each row (one MRF word per block, ``mantissa_bits_w``;
    ``weight_exponents`` None for the max-based rule or a static ``(out, nblocks)``
    tensor), the product accumulated in float64 and rounded to FP16, then the FP16 bias
    added in FP16.

    The device's product is exact before its one rounding to FP16; float64 equals it
    whenever the products of one row span less than 53 bits, which holds for the
    calibrated layers this is used on; ``docs/training.md`` states the bound.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 block_size: int, mantissa_bits_v: int, mantissa_bits_w: int,
                 rounding="nearest-even", input_exponent: int | None = None,
                 weight_exponents=None):
        super().__init__(in_features, out_features, bias)
        self.input_quant = BfpQuantizer(block_size, mantissa_bits_v, rounding,
                                        input_exponent)
        self.mantissa_bits_w = check_int("mantissa_bits_w", mantissa_bits_w,
                                         MANTISSA_BITS_MIN, MANTISSA_BITS_MAX)
        self.register_buffer("weight_exponents", None if weight_exponents is None else
                             torch.as_tensor(weight_exponents, dtype=torch.int32))

    def quantized_weight(self) -> torch.Tensor:
        """The weights as the MRF holds them (dequantized), with straight-through
        gradients."""
        q = self.input_quant
        return bfp(fp16(self.weight), q.block_size, self.mantissa_bits_w, q.rounding,
                   self.weight_exponents)

    def forward(self, x):
        xq = self.input_quant(x).to(torch.float64)
        y = fp16(xq @ self.quantized_weight().to(torch.float64).T)
        if self.bias is not None:
            y = fp16(y + fp16(self.bias.to(torch.float64)))
        return y.to(x.dtype)
