"""Recommendation, point-cloud and reinforcement-learning models."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from horus_airflow.catalog.datasets import EnvironmentData, InteractionData, PointData


def _mlp(sizes: list[int], last_activation: bool = False) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (cin, cout) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(cin, cout))
        if last_activation or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class NeuMf(nn.Module):
    """Neural matrix factorisation (He et al. 2017): GMF and MLP towers over user and item embeddings."""

    def __init__(self, data: InteractionData, factors: int = 64, tower: tuple[int, ...] = (256, 128, 64)) -> None:
        super().__init__()
        self.gmf_users, self.gmf_items = nn.Embedding(data.users, factors), nn.Embedding(data.items, factors)
        self.mlp_users, self.mlp_items = nn.Embedding(data.users, tower[0] // 2), nn.Embedding(data.items, tower[0] // 2)
        self.tower = _mlp(list(tower), last_activation=True)
        self.predict = nn.Linear(factors + tower[-1], 1)

    def forward(self, _dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        users, items = ids[:, 0], ids[:, 1]
        gmf = self.gmf_users(users) * self.gmf_items(items)
        mlp = self.tower(torch.cat([self.mlp_users(users), self.mlp_items(items)], dim=1))
        return self.predict(torch.cat([gmf, mlp], dim=1)).squeeze(1)


class AutoencoderRec(nn.Module):
    """Collaborative-filtering autoencoder (Kuchaiev & Ginsburg 2017, the recommendation job of Gavel's
    workload set): a user's item vector through 512-512-1024 SELU layers and back; the loss is the
    masked reconstruction error, returned by the model."""

    def __init__(self, data: InteractionData, sizes: tuple[int, ...] = (512, 512, 1024)) -> None:
        super().__init__()
        self.items = data.items
        widths = [data.items, *sizes]
        encoder: list[nn.Module] = []
        for cin, cout in zip(widths, widths[1:]):
            encoder += [nn.Linear(cin, cout), nn.SELU()]
        decoder: list[nn.Module] = []
        for cin, cout in zip(widths[::-1], widths[::-1][1:]):
            decoder += [nn.Linear(cin, cout), nn.SELU()]
        self.body = nn.Sequential(*encoder, nn.Dropout(0.8), *decoder[:-1])

    def forward(self, _dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        ratings = torch.zeros(ids.shape[0], self.items, device=ids.device).scatter(1, ids[:, 1:2], 1.0)
        rebuilt = self.body(ratings)
        return ((rebuilt - ratings) ** 2 * (ratings != 0)).sum() / ids.shape[0]


class DlrmSmall(nn.Module):
    """DLRM (Naumov et al. 2019) at a small size: bottom MLP over dense features, an embedding per
    categorical feature, pairwise dot interactions, top MLP."""

    def __init__(self, data: InteractionData, dim: int = 16) -> None:
        super().__init__()
        self.bottom = _mlp([data.dense, 64, dim], last_activation=True)
        self.embeddings = nn.ModuleList(nn.Embedding(n, dim) for n in data.cardinalities)
        features = len(data.cardinalities) + 1
        self.top = _mlp([dim + features * (features - 1) // 2, 64, 1])
        self.register_buffer("pairs", torch.triu_indices(features, features, offset=1), persistent=False)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        bottom = self.bottom(dense)
        vectors = torch.stack([bottom, *(emb(ids[:, i]) for i, emb in enumerate(self.embeddings))], dim=1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([bottom, dots], dim=1)).squeeze(1)


class PointNet(nn.Module):
    """PointNet classifier (Qi et al. 2017) with its input (3x3) and feature (64x64) transform nets."""

    def __init__(self, data: PointData) -> None:
        super().__init__()
        self.input_transform = _TransformNet(3)
        self.conv1 = _point_mlp([3, 64, 64])
        self.feature_transform = _TransformNet(64)
        self.conv2 = _point_mlp([64, 64, 128, 1024])
        self.head = nn.Sequential(
            nn.Linear(1024, 512), nn.BatchNorm1d(512), nn.ReLU(),
            nn.Linear(512, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Dropout(0.3),
            nn.Linear(256, data.classes),
        )

    def forward(self, cloud: torch.Tensor) -> torch.Tensor:
        cloud = torch.bmm(self.input_transform(cloud), cloud)
        features = self.conv1(cloud)
        features = torch.bmm(self.feature_transform(features), features)
        return self.head(self.conv2(features).amax(dim=2))


class _TransformNet(nn.Module):
    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k
        self.features = _point_mlp([k, 64, 128, 1024])
        self.regress = nn.Sequential(
            nn.Linear(1024, 512), nn.BatchNorm1d(512), nn.ReLU(),
            nn.Linear(512, 256), nn.BatchNorm1d(256), nn.ReLU(),
            nn.Linear(256, k * k),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        matrix = self.regress(self.features(x).amax(dim=2)).view(-1, self.k, self.k)
        return matrix + torch.eye(self.k, device=x.device, dtype=x.dtype)


def _point_mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for cin, cout in zip(sizes, sizes[1:]):
        layers += [nn.Conv1d(cin, cout, 1), nn.BatchNorm1d(cout), nn.ReLU()]
    return nn.Sequential(*layers)


def _body(data: EnvironmentData) -> tuple[nn.Module, int]:
    """The Nature-DQN convolution stack for frames, a 2x64 MLP for state vectors."""
    if data.kind == "frames":
        channels, height, width = data.observation
        conv = nn.Sequential(
            nn.Conv2d(channels, 32, 8, 4), nn.ReLU(), nn.Conv2d(32, 64, 4, 2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, 1), nn.ReLU(), nn.Flatten(),
        )
        flat = 64 * (((height - 8) // 4 + 1 - 4) // 2 + 1 - 2) * (((width - 8) // 4 + 1 - 4) // 2 + 1 - 2)
        return nn.Sequential(conv, nn.Linear(flat, 512), nn.ReLU()), 512
    return _mlp([data.observation[0], 64, 64], last_activation=True), 64


class QNetwork(nn.Module):
    """DQN: one Q-value per discrete action."""

    def __init__(self, data: EnvironmentData) -> None:
        super().__init__()
        self.body, width = _body(data)
        self.q = nn.Linear(width, data.actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q(self.body(obs))


class ActorCritic(nn.Module):
    """A2C / PPO: shared body, policy head (action logits or means) and value head, concatenated.
    ``recurrent`` adds the LSTM core of A3C's recurrent agent."""

    def __init__(self, data: EnvironmentData, recurrent: bool = False) -> None:
        super().__init__()
        self.body, width = _body(data)
        self.core = nn.LSTM(width, 256, batch_first=True) if recurrent else None
        width = 256 if recurrent else width
        self.policy, self.value = nn.Linear(width, data.actions), nn.Linear(width, 1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        hidden = self.body(obs)
        if self.core is not None:
            hidden = self.core(hidden.unsqueeze(1))[0].squeeze(1)
        return torch.cat([self.policy(hidden), self.value(hidden)], dim=1)


def actor_critic_loss(output: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Policy term (cross-entropy for discrete actions, squared error for continuous) plus value term."""
    policy, value = output[:, :-1], output[:, -1]
    if actions.is_floating_point():
        policy_loss = F.mse_loss(policy, actions)
    else:
        policy_loss = F.cross_entropy(policy, actions)
    return policy_loss + 0.5 * value.pow(2).mean()


class Td3(nn.Module):
    """TD3 (Fujimoto et al. 2018): a deterministic actor and twin critics of 2x256 units. One call
    returns the critics' and the actor's loss of an update."""

    def __init__(self, data: EnvironmentData) -> None:
        super().__init__()
        obs, actions = data.observation[0], data.actions
        self.actor = nn.Sequential(_mlp([obs, 256, 256, actions]), nn.Tanh())
        self.critics = nn.ModuleList(_mlp([obs + actions, 256, 256, 1]) for _ in range(2))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        action = self.actor(obs)
        pair = torch.cat([obs, action], dim=1)
        q1, q2 = (critic(pair) for critic in self.critics)
        return (q1 - q2).pow(2).mean() - q1.mean()
