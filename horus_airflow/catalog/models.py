"""Model builders: a catalog name to a freshly initialised ``torch.nn.Module`` (no weights fetched)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torchvision import models as tv

from horus_airflow.catalog.datasets import Dataset, ImageData, TokenData


@dataclass(frozen=True)
class Workload:
    """A model family member, the dataset kind it consumes and the dataset it trains on by default."""

    name: str
    family: str
    input_kind: str
    default_dataset: str
    build: Callable[[Dataset], nn.Module]


class _Mlp(nn.Module):
    def __init__(self, data: ImageData, hidden: int = 512) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Flatten(),
            nn.Linear(data.channels * data.size * data.size, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, data.classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class _RecurrentLm(nn.Module):
    """Word-level language model in the shape of PyTorch's word_language_model example."""

    def __init__(self, data: TokenData, cell: type[nn.RNNBase], dim: int = 650, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(data.vocab, dim)
        self.rnn = cell(dim, dim, num_layers=layers, batch_first=True)
        self.decoder = nn.Linear(dim, data.vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(self.embed(tokens))
        return self.decoder(hidden)


def _torchvision(builder: Callable[..., nn.Module]) -> Callable[[Dataset], nn.Module]:
    def build(data: Dataset) -> nn.Module:
        assert isinstance(data, ImageData)
        return builder(weights=None, num_classes=data.classes)

    return build


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("mlp", "mlp", "image", "mnist", lambda d: _Mlp(d)),  # type: ignore[arg-type]
        Workload("resnet18", "resnet", "image", "cifar10", _torchvision(tv.resnet18)),
        Workload("resnet50", "resnet", "image", "imagenet", _torchvision(tv.resnet50)),
        Workload("mobilenet_v2", "mobilenet", "image", "imagenet", _torchvision(tv.mobilenet_v2)),
        Workload("lstm_lm", "rnn_lm", "tokens", "wikitext2", lambda d: _RecurrentLm(d, nn.LSTM)),  # type: ignore[arg-type]
    )
}
