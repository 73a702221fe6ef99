"""Datasets as the input shapes they imply. Training uses synthetic tensors of these shapes:
nothing is downloaded, and GPU load depends on shapes, not on values.

``host_us_per_sample`` is the host-side work per sample (decoding, augmenting, stepping an environment)
of a real job, in microseconds of CPU time of one loader pipeline. For the image and point-cloud sets it
is measured: ``benchmarks/bench_input_pipeline.py`` runs each one's reference pipeline (JPEG decode,
crops, flips, normalization; ShapeNet's text parsing) on one core, and the figures here are its median
over two runs, rounded. The rest are orders of magnitude, not measurements: Atari from the CPU share of
iteration time Muri's profiles report (dqn/a2c: 3-8 ms per sample), the small environments and token and
interaction sets from what one step of them or one tokenized row costs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from horus_airflow.errors import InvalidJobError

Batch = tuple[tuple[torch.Tensor, ...], torch.Tensor]


@dataclass(frozen=True)
class ImageData:
    """Images ``channels x size x size`` with a class label each."""

    name: str
    channels: int
    size: int
    classes: int
    host_us_per_sample: float = 20.0
    description: str = ""

    kind = "image"

    def batch(self, batch_size: int, device: torch.device | str, vocab: int | None = None) -> Batch:
        inputs = torch.randn(batch_size, self.channels, self.size, self.size, device=device)
        return (inputs,), torch.randint(0, self.classes, (batch_size,), device=device)

    @property
    def sample_elements(self) -> int:
        return self.channels * self.size * self.size


@dataclass(frozen=True)
class TokenData:
    """Token sequences. ``task`` is ``lm`` (next/masked token), ``span`` (start and end position, as
    SQuAD) or ``classify`` (one label per sequence). ``vocab`` is the dataset's word-level vocabulary,
    used by models without a tokenizer of their own."""

    name: str
    seq_len: int
    vocab: int
    task: str = "lm"
    classes: int = 2
    host_us_per_sample: float = 5.0
    description: str = ""

    kind = "text"

    def batch(self, batch_size: int, device: torch.device | str, vocab: int | None = None) -> Batch:
        tokens = torch.randint(0, vocab or self.vocab, (batch_size, self.seq_len + 1), device=device)
        if self.task == "span":
            return (tokens[:, :-1],), torch.randint(0, self.seq_len, (batch_size, 2), device=device)
        if self.task == "classify":
            return (tokens[:, :-1],), torch.randint(0, self.classes, (batch_size,), device=device)
        return (tokens[:, :-1],), tokens[:, 1:]

    @property
    def sample_elements(self) -> int:
        return self.seq_len


@dataclass(frozen=True)
class TranslationData:
    """Source and target token sequences of a translation corpus (shared BPE vocabulary)."""

    name: str
    seq_len: int
    vocab: int
    host_us_per_sample: float = 5.0
    description: str = ""

    kind = "translation"

    def batch(self, batch_size: int, device: torch.device | str, vocab: int | None = None) -> Batch:
        source = torch.randint(0, vocab or self.vocab, (batch_size, self.seq_len), device=device)
        target = torch.randint(0, vocab or self.vocab, (batch_size, self.seq_len + 1), device=device)
        return (source, target[:, :-1]), target[:, 1:]

    @property
    def sample_elements(self) -> int:
        return 2 * self.seq_len


@dataclass(frozen=True)
class InteractionData:
    """User-item interactions: ``dense`` numeric features and categorical ids (users, items, then
    ``extra_sparse`` cardinalities), with an implicit-feedback label."""

    name: str
    users: int
    items: int
    dense: int
    extra_sparse: tuple[int, ...] = ()
    host_us_per_sample: float = 1.0
    description: str = ""

    kind = "interactions"

    @property
    def cardinalities(self) -> tuple[int, ...]:
        return (self.users, self.items, *self.extra_sparse)

    def batch(self, batch_size: int, device: torch.device | str, vocab: int | None = None) -> Batch:
        dense = torch.randn(batch_size, self.dense, device=device)
        sparse = torch.stack([torch.randint(0, n, (batch_size,), device=device) for n in self.cardinalities], dim=1)
        return (dense, sparse), torch.randint(0, 2, (batch_size,), device=device).float()

    @property
    def sample_elements(self) -> int:
        return self.dense + len(self.cardinalities)


@dataclass(frozen=True)
class PointData:
    """Point clouds of ``points`` xyz points with a shape category each."""

    name: str
    points: int
    classes: int
    host_us_per_sample: float = 50.0
    description: str = ""

    kind = "points"

    def batch(self, batch_size: int, device: torch.device | str, vocab: int | None = None) -> Batch:
        cloud = torch.randn(batch_size, 3, self.points, device=device)
        return (cloud,), torch.randint(0, self.classes, (batch_size,), device=device)

    @property
    def sample_elements(self) -> int:
        return 3 * self.points


@dataclass(frozen=True)
class EnvironmentData:
    """Observations of a reinforcement-learning environment: stacked frames (``frames`` > 0, Atari) or
    a state vector, with discrete actions or ``continuous`` ones."""

    name: str
    observation: tuple[int, ...]
    actions: int
    continuous: bool = False
    host_us_per_sample: float = 50.0
    description: str = ""

    @property
    def kind(self) -> str:
        return "frames" if len(self.observation) == 3 else "state"

    def batch(self, batch_size: int, device: torch.device | str, vocab: int | None = None) -> Batch:
        obs = torch.randn(batch_size, *self.observation, device=device)
        if self.continuous:
            return (obs,), torch.randn(batch_size, self.actions, device=device)
        return (obs,), torch.randint(0, self.actions, (batch_size,), device=device)

    @property
    def sample_elements(self) -> int:
        return int(torch.Size(self.observation).numel())


Dataset = ImageData | TokenData | TranslationData | InteractionData | PointData | EnvironmentData

SEQUENCE_KINDS = ("text", "translation")


def with_seq_len(data: Dataset, seq_len: int) -> Dataset:
    """The same corpus cut into sequences of another length."""
    if data.kind not in SEQUENCE_KINDS:
        sequence_sets = ", ".join(n for n, d in DATASETS.items() if d.kind in SEQUENCE_KINDS)
        raise InvalidJobError(
            f"dataset {data.name!r} has no sequence length to set; seq_len applies to: {sequence_sets}"
        )
    return dataclasses.replace(data, seq_len=seq_len)


DATASETS: dict[str, Dataset] = {
    d.name: d
    for d in (
        ImageData("mnist", 1, 28, 10, host_us_per_sample=65.0, description="handwritten digits, 28x28 grey"),
        ImageData("cifar10", 3, 32, 10, host_us_per_sample=140.0, description="32x32 colour, 10 classes"),
        ImageData("cifar100", 3, 32, 100, host_us_per_sample=140.0, description="32x32 colour, 100 classes"),
        ImageData("imagenet", 3, 224, 1000, host_us_per_sample=2700.0, description="ILSVRC-2012 at 224x224"),
        ImageData("lsun", 3, 64, 10, host_us_per_sample=950.0, description="LSUN scenes at 64x64 (GAN training)"),
        ImageData("coco", 3, 640, 80, host_us_per_sample=3700.0, description="COCO at detection size 640x640"),
        ImageData("oxford_pet", 3, 128, 3, host_us_per_sample=4600.0, description="Oxford-IIIT Pet trimaps, 128x128"),
        ImageData("horse2zebra", 3, 256, 2, host_us_per_sample=2200.0, description="unpaired 256x256 (CycleGAN)"),
        ImageData("gtsrb", 3, 75, 43, host_us_per_sample=160.0, description="German traffic signs resized to 75x75"),
        TokenData("wikitext2", 35, 33278, description="word-level LM, default 35 tokens (set seq_len)"),
        TokenData("wikitext103", 512, 267735, description="word-level LM, default 512 tokens (set seq_len)"),
        TokenData("squad", 384, 30522, task="span", description="question answering, 384 tokens, answer span"),
        TokenData("imdb", 128, 30522, task="classify", description="review sentiment, 128 tokens, 2 classes"),
        TranslationData("multi30k", 32, 10000, description="En-De captions, 32 tokens each side"),
        TranslationData("wmt", 64, 37000, description="WMT14 En-De, 64 tokens each side, shared BPE"),
        InteractionData("movielens", 943, 1682, dense=2, extra_sparse=(21, 19), description="MovieLens-100K"),
        InteractionData("ml20m", 138493, 26744, dense=1, extra_sparse=(20,), description="MovieLens-20M"),
        PointData("shapenet", 2048, 16, host_us_per_sample=930.0, description="ShapeNet point clouds, 2048 points, 16 categories"),
        EnvironmentData("atari", (4, 84, 84), 18, host_us_per_sample=3000.0, description="4 stacked 84x84 frames"),
        EnvironmentData("cartpole", (4,), 2, host_us_per_sample=20.0, description="CartPole-v1"),
        EnvironmentData("lunarlander", (8,), 4, host_us_per_sample=100.0, description="LunarLander-v3"),
        EnvironmentData("bipedalwalker", (24,), 4, continuous=True, host_us_per_sample=200.0,
                        description="BipedalWalker-v3, continuous actions"),
    )
}
