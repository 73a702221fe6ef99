"""Profiles: named combinations of filter and score plugins, kept as YAML data rather than code paths."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from horus_airflow.errors import HorusError
from horus_airflow.placement.plugins import FILTERS, SCORES, FilterPlugin, ScorePlugin


@dataclass(frozen=True)
class WeightedScore:
    plugin: ScorePlugin
    weight: float


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    filters: tuple[FilterPlugin, ...]
    scores: tuple[WeightedScore, ...]


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
    return parse_profile(yaml.safe_load(text))


def parse_profile(raw: dict[str, Any]) -> Profile:
    try:
        filters = tuple(_build(FILTERS, "filter", item) for item in raw.get("filters", []))
        scores = tuple(
            WeightedScore(_build(SCORES, "score", item), float(item.get("weight", 1.0)))
            for item in raw.get("scores", [])
        )
        return Profile(raw["name"], raw.get("description", ""), filters, scores)
    except (KeyError, TypeError) as exc:
        raise HorusError(f"malformed profile: {exc!r}; expected keys name, filters[], scores[]") from exc


def _build(registry: dict[str, Any], kind: str, item: dict[str, Any]) -> Any:
    name = item["name"]
    if name not in registry:
        raise HorusError(f"unknown {kind} plugin {name!r}; accepted: {', '.join(registry)}")
    args = {k: tuple(v) if isinstance(v, list) else v for k, v in (item.get("args") or {}).items()}
    return registry[name](**args)
