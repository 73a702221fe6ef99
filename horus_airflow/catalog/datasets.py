"""Datasets as the input shapes they imply. Training uses synthetic tensors of these shapes:
nothing is downloaded, and GPU load depends on shapes, not on pixel values."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ImageData:
    name: str
    channels: int
    size: int
    classes: int

    kind = "image"

    def batch(self, batch_size: int, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = torch.randn(batch_size, self.channels, self.size, self.size, device=device)
        targets = torch.randint(0, self.classes, (batch_size,), device=device)
        return inputs, targets

    def sample_bytes(self) -> int:
        return self.channels * self.size * self.size * 4


@dataclass(frozen=True)
class TokenData:
    name: str
    seq_len: int
    vocab: int

    kind = "tokens"

    def batch(self, batch_size: int, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, self.vocab, (batch_size, self.seq_len + 1), device=device)
        return tokens[:, :-1], tokens[:, 1:]

    def sample_bytes(self) -> int:
        return self.seq_len * 8


Dataset = ImageData | TokenData

DATASETS: dict[str, Dataset] = {
    d.name: d
    for d in (
        ImageData("mnist", 1, 28, 10),
        ImageData("cifar10", 3, 32, 10),
        ImageData("cifar100", 3, 32, 100),
        ImageData("imagenet", 3, 224, 1000),
        TokenData("wikitext2", 35, 33278),
    )
}
