"""Training in block floating point with a lazy update (seed 003), on PyTorch.

Three pieces, placed as the seed places them (``docs/training.md`` section 3):

* :class:`BfpTrainLinear`: a dense layer whose forward pass multiplies ``forward_bits``
  BFP activations by ``forward_bits`` BFP weights (8 in the seed), with a float32 result;
  whose backward pass passes down the activation gradient computed from the output
  gradient quantized to ``gradient_bits`` BFP (16 in the seed), and computes the weight
  gradient from the unquantized (float32) output gradient and the stored BFP activations.
* :class:`LazyUpdate`: wraps any ``torch.optim`` optimizer; after the optimizer's step it
  hands each parameter's step to a :class:`host.quant.lazy.LazyBfp` (BFP weight + BFP
  accumulator, no float copy of the weights kept between steps) and writes the BFP weight
  back into the parameter, which the next forward pass uses as is.
* :class:`NaiveUpdate`: the comparison the seed argues against: the parameter after the
  optimizer's step is rounded straight back to ``weight_bits`` BFP (small steps vanish).

Blocks are ``block_size`` values along the last axis (a weight row's input features; an
activation's or gradient's features), the device's native vector.
"""

from __future__ import annotations

import torch

from host.quant.fakequant import bfp
from host.quant.lazy import LazyBfp
from host.spec.formats import MANTISSA_BITS_MAX, MANTISSA_BITS_MIN, check_int

__all__ = ["POLICIES", "BfpTrainLinear", "LazyUpdate", "NaiveUpdate", "train_dense"]


class _BfpLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, n, m_fwd, m_grad):
        xq = bfp(x.detach(), n, m_fwd)
        wq = bfp(w.detach(), n, m_fwd)
        ctx.save_for_backward(xq, wq)
        ctx.n, ctx.m_grad = n, m_grad
        y = xq @ wq.T
        return y + b if b is not None else y

    @staticmethod
    def backward(ctx, grad_y):
        xq, wq = ctx.saved_tensors
        grad_w = grad_y.T @ xq                       # unquantized gradient, BFP activations
        grad_b = grad_y.sum(dim=0)
        grad_x = bfp(grad_y, ctx.n, ctx.m_grad) @ wq  # the activation gradient passed down
        return grad_x, grad_w, grad_b, None, None, None


class BfpTrainLinear(torch.nn.Linear):
    """``nn.Linear`` with seed 003's BFP forward and backward (module docstring).

    Parameters
    ----------
    in_features, out_features, bias : as ``nn.Linear``
    block_size : int >= 1, the BFP block (the device's N)
    forward_bits : int, mantissa bits of activations and weights in the forward pass
    gradient_bits : int, mantissa bits of the activation gradient

    Raises
    ------
    TypeError, ValueError
        naming the parameter and value.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 block_size: int, forward_bits: int = 8, gradient_bits: int = 16):
        super().__init__(in_features, out_features, bias)
        self.block_size = check_int("block_size", block_size, 1)
        self.forward_bits = check_int("forward_bits", forward_bits, MANTISSA_BITS_MIN,
                                      MANTISSA_BITS_MAX)
        self.gradient_bits = check_int("gradient_bits", gradient_bits, MANTISSA_BITS_MIN,
                                       MANTISSA_BITS_MAX)

    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1])
        y = _BfpLinearFn.apply(x2, self.weight, self.bias, self.block_size,
                               self.forward_bits, self.gradient_bits)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", block_size={self.block_size}, "
                f"forward_bits={self.forward_bits}, gradient_bits={self.gradient_bits}")


class LazyUpdate:
    """Seed 003's delayed update around ``optimizer`` (any ``torch.optim.Optimizer``).

    Each parameter of ``optimizer`` becomes a :class:`~host.quant.lazy.LazyBfp` of
    ``weight_bits`` weights and an ``accumulator_bits`` accumulator, blocked by
    ``block_size`` along its last axis, and the parameter tensor is set to the BFP weight.
    :meth:`step` runs the optimizer, takes the difference it made as the step, updates
    the lazy state and writes the BFP weight back. The optimizer's own state (momentum)
    is kept as it keeps it.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, block_size: int,
                 weight_bits: int = 8, accumulator_bits: int = 16, headroom: int = 3):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, not "
                            f"{type(optimizer).__name__}")
        self.optimizer = optimizer
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.state = {}
        with torch.no_grad():
            for p in self.params:
                values = p.detach().cpu().double().numpy()
                lazy = LazyBfp(values.reshape(values.shape or (1,)), block_size,
                               weight_bits, accumulator_bits, headroom)
                self.state[p] = lazy
                p.copy_(torch.from_numpy(lazy.weight().reshape(p.shape)).to(p.dtype))

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self) -> None:
        before = [p.detach().clone() for p in self.params]
        self.optimizer.step()
        for p, old in zip(self.params, before):
            lazy = self.state[p]
            delta = (p.detach() - old).double().cpu().numpy()
            lazy.update(delta.reshape(lazy.shape))
            p.copy_(torch.from_numpy(lazy.weight().reshape(p.shape)).to(p.dtype))

    def memory_bits(self) -> int:
        """Bits of weight state over all parameters (weights, accumulators, exponents)."""
        return sum(lazy.memory_bits() for lazy in self.state.values())


class NaiveUpdate:
    """The low-precision update without an accumulator: after ``optimizer``'s step each
    parameter is rounded back to ``weight_bits`` BFP in blocks of ``block_size``."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, block_size: int,
                 weight_bits: int = 8):
        self.optimizer = optimizer
        self.block_size = check_int("block_size", block_size, 1)
        self.weight_bits = check_int("weight_bits", weight_bits, MANTISSA_BITS_MIN,
                                     MANTISSA_BITS_MAX)
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self._round()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def _round(self) -> None:
        for p in self.params:
            flat = p.reshape(-1, p.shape[-1]) if p.dim() else p.reshape(1, 1)
            p.copy_(bfp(flat.double(), self.block_size, self.weight_bits)
                    .to(p.dtype).reshape(p.shape))

    def step(self) -> None:
        self.optimizer.step()
        self._round()


#: The update policies :func:`train_dense` compares.
POLICIES = ("fp32-master", "lazy", "naive")


def train_dense(x_train, y_train, x_test, y_test, *, hidden: int = 32,
                policy: str = "lazy", lr: float = 0.01, momentum: float = 0.9,
                epochs: int = 20, batch: int = 32, seed: int = 0, block_size: int = 16,
                forward_bits: int = 8, gradient_bits: int = 16, progress=None) -> dict:
    """Train a two-layer classifier (``BfpTrainLinear`` - ReLU - ``BfpTrainLinear``) with
    momentum SGD and one of :data:`POLICIES` for the weights: ``"fp32-master"`` (float32
    weights, BFP forward: the usual fake-quantized training), ``"lazy"`` (seed 003:
    :class:`LazyUpdate`, 8-bit weights + 16-bit accumulators) or ``"naive"``
    (:class:`NaiveUpdate`). ``x_*`` float ``(samples, features)``, ``y_*`` int labels.

    Returns ``{"accuracy": test accuracy in percent after each epoch (list),
    "final": the last one, "memory_bits_per_parameter": weight state per parameter}``.
    ``progress``: None, or a callable given one line per epoch.

    Raises
    ------
    ValueError
        an unknown ``policy`` (naming the known ones), mismatched array lengths.
    """
    import numpy as np
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {policy!r}")
    x_train, x_test = (torch.as_tensor(np.asarray(a, np.float32)) for a in (x_train, x_test))
    y_train, y_test = (torch.as_tensor(np.asarray(a, np.int64)) for a in (y_train, y_test))
    if len(x_train) != len(y_train) or len(x_test) != len(y_test):
        raise ValueError(f"x and y lengths differ: train {len(x_train)} vs {len(y_train)}, "
                         f"test {len(x_test)} vs {len(y_test)}")
    torch.manual_seed(seed)
    classes = int(max(y_train.max(), y_test.max())) + 1
    layers = {"block_size": block_size, "forward_bits": forward_bits,
                  "gradient_bits": gradient_bits}
    net = torch.nn.Sequential(BfpTrainLinear(x_train.shape[1], hidden, **layers),
                              torch.nn.ReLU(), BfpTrainLinear(hidden, classes, **layers))
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    if policy == "lazy":
        opt = LazyUpdate(opt, block_size=block_size, weight_bits=forward_bits)
        bits = opt.memory_bits() / sum(p.numel() for p in net.parameters())
    else:
        if policy == "naive":
            opt = NaiveUpdate(opt, block_size=block_size, weight_bits=forward_bits)
        bits = 32.0 if policy == "fp32-master" else float(forward_bits)
    gen = torch.Generator().manual_seed(seed)
    curve = []
    for epoch in range(epochs):
        order = torch.randperm(len(x_train), generator=gen)
        for i in range(0, len(order), batch):
            rows = order[i:i + batch]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x_train[rows]), y_train[rows]).backward()
            opt.step()
        with torch.no_grad():
            acc = float((net(x_test).argmax(1) == y_test).float().mean()) * 100
        curve.append(acc)
        if progress is not None:
            progress(f"{policy} lr {lr}: epoch {epoch + 1}/{epochs}, test accuracy "
                     f"{acc:.1f} %")
    return {"accuracy": curve, "final": curve[-1], "memory_bits_per_parameter": bits}
