"""The zoo's models: one small PyTorch definition each, and how each is trained and exported.

:data:`MODELS` maps a model's name (its directory under ``zoo/``) to a :class:`ZooModel`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor, nn

from zoo.datasets import VOCABULARY


class Mlp(nn.Module):
    """Digits: 8 x 8 image -> 64 -> Linear(64, 32) -> ReLU -> Linear(32, 10)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(),
                                    nn.Linear(32, 10))

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


class Recurrent(nn.Module):
    """A one-layer recurrent network read to its last step, then a linear classifier.

    Input (batch, steps, features); output (batch, classes) from the last step's ``h``.
    """

    def __init__(self, cell: type[nn.LSTM | nn.GRU], features: int, hidden: int,
                 classes: int):
        super().__init__()
        self.rnn = cell(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: Tensor) -> Tensor:
        sequence, _ = self.rnn(x)
        return self.head(sequence[:, -1])


class Cnn(nn.Module):
    """Digits: (1, 8, 8) -> Conv 3x3 pad 1 (8) -> ReLU -> Conv 3x3 stride 2 pad 1 (16)
    -> ReLU -> MaxPool 2 -> Flatten (64) -> Linear(64, 10)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(),
            nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
            nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 2 * 2, 10))

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


@dataclass(frozen=True)
class ZooModel:
    """One model of the zoo.

    Attributes
    ----------
    name : str
        Directory name under ``zoo/``.
    task : str
        What the model predicts.
    dataset : str
        ``"digits"`` or ``"corpus"`` (see :mod:`zoo.datasets`).
    input_shape : tuple of int
        One sample's shape (the batch axis goes first).
    build : callable
        Makes the untrained ``nn.Module``.
    exporter : str
        ``"dynamo"`` (``torch.onnx.export``'s default) or ``"torchscript"``
        (``dynamo=False``).
    epochs, batch_size, lr : int, int, float
        Adam training schedule.
    """

    name: str
    task: str
    dataset: str
    input_shape: tuple[int, ...]
    build: Callable[[], nn.Module]
    exporter: str
    epochs: int
    batch_size: int
    lr: float


_DIGITS = "digit class 0-9 of an 8 x 8 image (top-1 accuracy)"
_ROWS = "; the image read row by row, 8 time steps of 8 pixels"

MODELS: dict[str, ZooModel] = {m.name: m for m in (
    ZooModel("mlp", _DIGITS, "digits", (8, 8), Mlp, "dynamo",
             epochs=40, batch_size=32, lr=3e-3),
    ZooModel("lstm", _DIGITS + _ROWS, "digits", (8, 8),
             lambda: Recurrent(nn.LSTM, 8, 32, 10), "torchscript",
             epochs=60, batch_size=32, lr=1e-2),
    ZooModel("gru", _DIGITS + _ROWS, "digits", (8, 8),
             lambda: Recurrent(nn.GRU, 8, 32, 10), "torchscript",
             epochs=60, batch_size=32, lr=1e-2),
    ZooModel("cnn", _DIGITS, "digits", (1, 8, 8), Cnn, "dynamo",
             epochs=40, batch_size=32, lr=3e-3),
    ZooModel("charlstm",
             "next character after a window of 16 one-hot characters (top-1 accuracy)",
             "corpus", (16, len(VOCABULARY)),
             lambda: Recurrent(nn.LSTM, len(VOCABULARY), 48, len(VOCABULARY)), "dynamo",
             epochs=12, batch_size=64, lr=5e-3),
)}
