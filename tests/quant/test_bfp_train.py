"""host.quant.bfp_train: seed 003's BFP training on PyTorch."""

import numpy as np
import pytest
import torch  # the torch extra, which make venv installs

from host.quant import fakequant as fq
from host.quant.bfp_train import BfpTrainLinear, LazyUpdate, train_dense

DIGITS = "zoo/data/digits.npz"
# Small matrices: one thread is faster than several, and make test runs two workers.
torch.set_num_threads(1)


def _layer_grads(gradient_bits):
    torch.manual_seed(0)
    layer = BfpTrainLinear(20, 6, block_size=8, gradient_bits=gradient_bits)
    x = torch.randn(5, 20, requires_grad=True)
    g = torch.randn(5, 6)
    layer(x).backward(g)
    return layer, x, g


def test_backward_uses_the_formats_the_seed_names():
    layer, x, g = _layer_grads(16)
    xq = fq.bfp(x.detach(), 8, 8)
    wq = fq.bfp(layer.weight.detach(), 8, 8)
    # Weight gradient from the unquantized output gradient and the BFP activations.
    torch.testing.assert_close(layer.weight.grad, g.T @ xq, rtol=0, atol=0)
    # Activation gradient from the output gradient quantized to 16-bit BFP.
    torch.testing.assert_close(x.grad, fq.bfp(g, 8, 16) @ wq, rtol=0, atol=0)
    # The gradient format is wired in: 4-bit gradients change the activation gradient
    # and leave the weight gradient alone.
    layer4, x4, _ = _layer_grads(4)
    assert not torch.equal(x4.grad, x.grad)
    torch.testing.assert_close(layer4.weight.grad, layer.weight.grad, rtol=0, atol=0)


def test_lazy_update_keeps_bfp_weights_and_moves_small_steps():
    torch.manual_seed(1)
    p = torch.nn.Parameter(torch.randn(3, 16))
    opt = LazyUpdate(torch.optim.SGD([p], lr=1.0), block_size=16)
    start = p.detach().clone()
    np.testing.assert_array_equal(start.numpy(), fq.bfp(start.double(), 16, 8).float().numpy())
    step = opt.state[p].weight_step[:, 0] / 50           # a fiftieth of a weight step
    for _ in range(100):
        p.grad = -torch.from_numpy(np.repeat(step[:, None], 16, axis=1)).float()
        opt.step()
    moved = (p.detach() - start).double().numpy() / step[:, None] / 50
    np.testing.assert_array_equal(moved, np.full((3, 16), 2.0))
    assert opt.memory_bits() == 3 * 16 * 24 + 3 * 8


@pytest.fixture(scope="module")
def digits():
    d = np.load(DIGITS)
    x = d["images"].reshape(len(d["images"]), -1).astype(np.float32) / 16
    order = np.random.default_rng(0).permutation(len(x))
    tr, te = order[:1200], order[1200:]
    return x[tr], d["labels"][tr], x[te], d["labels"][te]


def test_lazy_update_trains_like_fp32_master_and_naive_does_not(digits):
    """Seed 003 at a small learning rate (0.002): the naive 8-bit update loses the steps,
    the lazy one keeps them (the bench runs five seeds and two rates)."""
    runs = {p: train_dense(*digits, policy=p, lr=0.002, epochs=12, seed=0)["final"]
            for p in ("fp32-master", "lazy", "naive")}
    assert abs(runs["lazy"] - runs["fp32-master"]) <= 2.0, runs
    assert runs["lazy"] >= runs["naive"] + 10, runs


def test_unknown_policy_is_named(digits):
    with pytest.raises(ValueError, match="policy must be one of"):
        train_dense(*digits, policy="sloppy")
