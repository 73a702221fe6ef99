"""Profiles: named combinations of filter and score plugins and a queue policy, kept as YAML data
rather than code paths. Users can write their own file in the same shape (docs/PLACEMENT.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from horus_airflow.errors import HorusError
from horus_airflow.placement.plugins import FILTERS, SCORES, FilterPlugin, InterferenceScore, Locality, ScorePlugin
from horus_airflow.placement.queue import POLICIES, QueuePolicy, Fifo


@dataclass(frozen=True)
class WeightedScore:
    plugin: ScorePlugin
    weight: float


@dataclass(frozen=True)
class Profile:
    """``late`` is the interference score, run on the ``score_top`` best candidates by the other
    scores; ``locality`` prices the nodes a gang spans (None: one node only)."""

    name: str
    description: str
    filters: tuple[FilterPlugin, ...]
    scores: tuple[WeightedScore, ...]
    late: tuple[InterferenceScore, float] | None = None
    locality: tuple[Locality, float] | None = None
    queue: QueuePolicy = field(default_factory=Fifo)
    score_top: int = 64


def builtin_profiles() -> list[str]:
    folder = resources.files("horus_airflow.placement").joinpath("profiles")
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_profile(name_or_path: str) -> Profile:
    """A built-in profile by name, or a YAML file of the same shape by path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        text = path.read_text()
    else:
        entry = resources.files("horus_airflow.placement").joinpath("profiles", f"{name_or_path}.yaml")
        if not entry.is_file():
            raise HorusError(
                f"unknown placement profile {name_or_path!r}; built-in profiles: "
                f"{', '.join(builtin_profiles())}, or a path to a .yaml profile"
            )
        text = entry.read_text()
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise HorusError(f"profile {name_or_path!r} is not valid YAML: {exc}") from exc
    return parse_profile(raw)


def parse_profile(raw: Any) -> Profile:
    if not isinstance(raw, dict):
        raise HorusError("malformed profile: expected a mapping with name, filters[], scores[], queue{}")
    try:
        filters = tuple(_build(FILTERS, "filter", item) for item in raw.get("filters", []))
        scores, late, locality = [], None, None
        for item in raw.get("scores", []):
            plugin, weight = _build(SCORES, "score", item), float(item.get("weight", 1.0))
            if isinstance(plugin, InterferenceScore):
                late = (plugin, weight)
            elif isinstance(plugin, Locality):
                locality = (plugin, weight)
            else:
                scores.append(WeightedScore(plugin, weight))
        queue_raw = dict(raw.get("queue") or {"policy": "fifo"})
        queue = _build(POLICIES, "queue policy", {"name": queue_raw.pop("policy"), "args": queue_raw})
        return Profile(raw["name"], raw.get("description", ""), filters, tuple(scores), late, locality, queue,
                       int(raw.get("score_top", 64)))
    except (KeyError, TypeError, ValueError) as exc:
        raise HorusError(f"malformed profile: {exc!r}; expected keys name, filters[], scores[], queue{{policy}}") from exc


def _build(registry: dict[str, Any], kind: str, item: dict[str, Any]) -> Any:
    name = item["name"]
    if name not in registry:
        raise HorusError(f"unknown {kind} {name!r}; accepted: {', '.join(registry)}")
    args = {k: tuple(v) if isinstance(v, list) else v for k, v in (item.get("args") or {}).items()}
    try:
        return registry[name](**args)
    except TypeError as exc:
        raise HorusError(f"{kind} {name!r}: {exc}") from exc
