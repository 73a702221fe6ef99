"""A fresh registry's first state: both registered models, described by their model cards, each with a
first champion trained on the data the project ships. Idempotent: what exists is left as it is."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from horus_airflow.interference.pairs import read_pairs
from horus_airflow.predictor.dataset import read_training_data
from horus_airflow.registry import versions
from horus_airflow.registry.interference import INTERFERENCE_MODEL, train_interference
from horus_airflow.registry.predictor import PREDICTOR_MODEL, train_predictor
from horus_airflow.registry.store import client
from horus_airflow.settings import Settings

log = logging.getLogger(__name__)

SEED_DATA = "data/predictor_seed/predictor_seed.csv"
SEED_PAIRS = "data/interference_seed/gavel_pairs.csv"
CARDS = "model_registry/cards"


@dataclass(frozen=True)
class BootstrapStep:
    model: str
    champion: str | None
    trained: bool
    message: str


def bootstrap(settings: Settings, seed_data: Path | None = None, seed_pairs: Path | None = None,
              cards: Path | None = None) -> list[BootstrapStep]:
    seed_data = seed_data or settings.project_file(SEED_DATA)
    seed_pairs = seed_pairs or settings.project_file(SEED_PAIRS)
    cards = cards or settings.project_file(CARDS)
    steps = [_predictor(settings, seed_data), _interference(settings, seed_pairs)]
    for step in steps:
        card = cards / f"{step.model}.md"
        if step.champion is not None and card.is_file():
            client(settings).update_registered_model(step.model, description=card.read_text())
    return steps


def _predictor(settings: Settings, seed_data: Path) -> BootstrapStep:
    existing = versions.champion_version(settings, PREDICTOR_MODEL)
    if existing is not None:
        return BootstrapStep(PREDICTOR_MODEL, existing, False, f"{PREDICTOR_MODEL} version {existing} is champion")
    outcome = train_predictor(settings, read_training_data(seed_data), str(seed_data))
    util = outcome.evaluation.pooled("source", "gpu_util")
    message = (f"trained on {seed_data.name} and registered {PREDICTOR_MODEL} version {outcome.version} as "
               f"{', '.join(outcome.aliases)}; held-out-source utilization MAE {util.model.mae:.1f} points "
               f"(analytic prior {util.prior.mae:.1f}, mean {util.mean.mae:.1f}), MLflow run {outcome.run_id}")
    _describe_version(settings, PREDICTOR_MODEL, outcome.version, f"Seed version: {message}.")
    return BootstrapStep(PREDICTOR_MODEL, outcome.version, True, message)


def _interference(settings: Settings, seed_pairs: Path) -> BootstrapStep:
    existing = versions.champion_version(settings, INTERFERENCE_MODEL)
    if existing is not None:
        return BootstrapStep(INTERFERENCE_MODEL, existing, False, f"{INTERFERENCE_MODEL} version {existing} is champion")
    outcome = train_interference(settings, read_pairs(seed_pairs), str(seed_pairs))
    pooled = {s.scheme: s for s in outcome.scores if s.held_out == "all"}
    message = (f"trained on {seed_pairs.name} and registered {INTERFERENCE_MODEL} version {outcome.version} as "
               f"{', '.join(outcome.aliases)}; unseen job types speed MAE {pooled['job type'].learned_mae:.3f} "
               f"(proxy {pooled['job type'].proxy_mae:.3f}), unseen GPU types {pooled['GPU type'].learned_mae:.3f} "
               f"(proxy {pooled['GPU type'].proxy_mae:.3f})")
    _describe_version(settings, INTERFERENCE_MODEL, outcome.version, f"Seed version: {message}.")
    return BootstrapStep(INTERFERENCE_MODEL, outcome.version, True, message)


def _describe_version(settings: Settings, name: str, version: str | None, text: str) -> None:
    if version is not None:
        client(settings).update_model_version(name, version, description=text)
