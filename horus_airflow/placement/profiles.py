"""Profiles: named combinations of filter and score plugins and a queue policy, kept as YAML data
rather than code paths. Users can write their own file in the same shape (docs/PLACEMENT.md)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from horus_airflow.errors import ProfileError
from horus_airflow.names import builtin_profiles, require_profile
from horus_airflow.placement.plugins import (
    FILTERS,
    SCORES,
    FilterPlugin,
    InterferenceScore,
    Locality,
    NodeHealthy,
    ScorePlugin,
)
from horus_airflow.placement.queue import POLICIES, Fifo, QueuePolicy
from horus_airflow.validation import in_range, whole


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


def load_profile(name_or_path: str) -> Profile:
    """A built-in profile by name, or a YAML file of the same shape by path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        text = path.read_text()
    else:
        if path.suffix in (".yaml", ".yml"):
            raise ProfileError(f"profile file {name_or_path!r} does not exist; give a built-in profile "
                               f"({', '.join(builtin_profiles())}) or a path to a .yaml profile")
        require_profile(name_or_path)
        text = resources.files("horus_airflow.placement").joinpath("profiles", f"{name_or_path}.yaml").read_text()
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        raise ProfileError(f"profile {name_or_path!r} is not valid YAML{at}: {getattr(exc, 'problem', None) or type(exc).__name__}") from None
    return parse_profile(raw)


_PROFILE_KEYS = ("name", "description", "filters", "scores", "queue", "score_top")
_ITEM_KEYS = ("name", "args", "weight")


def parse_profile(raw: Any) -> Profile:
    """A profile from its YAML form. Every profile filters out unhealthy GPUs (``node-healthy`` is added
    first where a profile does not list it): health is not a preference a profile may leave out."""
    if not isinstance(raw, dict):
        raise ProfileError("malformed profile: expected a mapping with name, filters[], scores[], queue{}")
    unknown = sorted(set(map(str, raw)) - set(_PROFILE_KEYS))
    if unknown:
        raise ProfileError(f"malformed profile: unknown key(s) {', '.join(unknown)}; accepted: {', '.join(_PROFILE_KEYS)}")
    try:
        filters = [_build(FILTERS, "filter", item) for item in _items(raw, "filters")]
        if not any(isinstance(f, NodeHealthy) for f in filters):
            filters.insert(0, NodeHealthy())
        scores, late, locality = [], None, None
        for item in _items(raw, "scores"):
            plugin = _build(SCORES, "score", item)
            weight = in_range(item.get("weight", 1.0), f"score {item['name']!r}: weight", 0.0)
            if isinstance(plugin, InterferenceScore):
                late = (plugin, weight)
            elif isinstance(plugin, Locality):
                locality = (plugin, weight)
            else:
                scores.append(WeightedScore(plugin, weight))
        queue_raw = raw.get("queue") or {"policy": "fifo"}
        if not isinstance(queue_raw, dict) or "policy" not in queue_raw:
            raise ValueError(f"queue must be a mapping with a policy ({', '.join(POLICIES)}), got {queue_raw!r}")
        queue_args = {k: v for k, v in queue_raw.items() if k != "policy"}
        queue = _build(POLICIES, "queue policy", {"name": queue_raw["policy"], "args": queue_args})
        name = raw["name"]
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        return Profile(name, str(raw.get("description", "")), tuple(filters), tuple(scores), late, locality, queue,
                       whole(raw.get("score_top", 64), "score_top", 1))
    except KeyError as exc:
        raise ProfileError(f"malformed profile: missing key {exc}; expected keys name, filters[], scores[], queue{{policy}}") from None
    except (TypeError, ValueError) as exc:
        raise ProfileError(f"malformed profile: {exc}") from None


def _items(raw: dict[str, Any], key: str) -> list[dict[str, Any]]:
    items = raw.get(key) or []
    if not isinstance(items, list):
        raise ValueError(f"{key} must be a list of {{name, args}} entries, got {items!r}")
    for item in items:
        if not isinstance(item, dict) or "name" not in item:
            raise ValueError(f"each of {key} must be a mapping with a name, got {item!r}")
        unknown = sorted(set(map(str, item)) - set(_ITEM_KEYS))
        if unknown:
            raise ValueError(f"{key} entry {item['name']!r}: unknown key(s) {', '.join(unknown)}; accepted: {', '.join(_ITEM_KEYS)}")
    return items


def _build(registry: dict[str, Any], kind: str, item: dict[str, Any]) -> Any:
    name = item["name"]
    if name not in registry:
        raise ProfileError(f"unknown {kind} {name!r}; accepted: {', '.join(registry)}")
    raw_args = item.get("args") or {}
    if not isinstance(raw_args, dict):
        raise ProfileError(f"{kind} {name!r}: args must be a mapping, got {raw_args!r}")
    args = {k: tuple(v) if isinstance(v, list) else v for k, v in raw_args.items()}
    accepted = [f.name for f in fields(registry[name])] if is_dataclass(registry[name]) else []
    unknown = sorted(set(map(str, args)) - set(accepted))
    if unknown:
        raise ProfileError(f"{kind} {name!r}: unknown argument(s) {', '.join(unknown)}; accepted: {', '.join(accepted) or 'none'}")
    try:
        return registry[name](**args)
    except (TypeError, ValueError) as exc:
        raise ProfileError(f"{kind} {name!r}: {exc}") from None
