"""Profiles: named combinations of filter and score plugins and a queue policy, kept as YAML data
rather than code paths. Users can write their own file in the same shape (docs/PLACEMENT.md)."""

from __future__ import annotations

import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any, Generic, TypeVar

import yaml

from horus_airflow.errors import ProfileError
from horus_airflow.names import builtin_profiles, require_profile
from horus_airflow.placement.plugins import (
    FilterPlugin,
    GangPlugin,
    NodeHealthy,
    ScorePlugin,
    ShortlistPlugin,
    installed_plugins,
    plugin_class,
)
from horus_airflow.placement.queue import POLICIES, Fifo, QueuePolicy
from horus_airflow.validation import in_range, whole


Plugin = TypeVar("Plugin")


@dataclass(frozen=True)
class Weighted(Generic[Plugin]):
    """A score, shortlist or gang plugin with its weight in the profile."""

    plugin: Plugin
    weight: float


@dataclass(frozen=True)
class Profile:
    """Plugins by the extension point they declare (``kind``): ``shortlist`` plugins run on the
    ``score_top`` best candidates by the ``scores``; ``gang`` prices the nodes a multi-GPU job spans
    (None: one node only)."""

    name: str
    description: str
    filters: tuple[FilterPlugin, ...]
    scores: tuple[Weighted[ScorePlugin], ...]
    shortlist: tuple[Weighted[ShortlistPlugin], ...] = ()
    gang: Weighted[GangPlugin] | None = None
    queue: QueuePolicy = field(default_factory=Fifo)
    score_top: int = 64
    source: str = ""  # set by load_profile: a built-in name, or a YAML file's absolute path

    @property
    def reference(self) -> str:
        """How another process loads this profile again: a queued entry keeps it, so that a round run in
        the triggerer or another worker places the entry with the profile the task asked for."""
        return self.source or self.name


def load_profile(name_or_path: str) -> Profile:
    """A built-in profile by name, or a YAML file of the same shape by path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        text, source = path.read_text(), str(path.resolve())
    else:
        if path.suffix in (".yaml", ".yml"):
            raise ProfileError(f"profile file {name_or_path!r} does not exist; give a built-in profile "
                               f"({', '.join(builtin_profiles())}) or a path to a .yaml profile")
        require_profile(name_or_path)
        text, source = resources.files("horus_airflow.placement").joinpath("profiles", f"{name_or_path}.yaml").read_text(), name_or_path
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        raise ProfileError(f"profile {name_or_path!r} is not valid YAML{at}: {getattr(exc, 'problem', None) or type(exc).__name__}") from None
    return replace(parse_profile(raw), source=source)


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
        installed = installed_plugins()  # entry points are read once per profile, not once per plugin
        filters = [_plugin(installed, item, ("filter",)) for item in _items(raw, "filters")]
        if not any(isinstance(f, NodeHealthy) for f in filters):
            filters.insert(0, NodeHealthy())
        scores, shortlist, gang = [], [], None
        for item in _items(raw, "scores"):
            plugin = _plugin(installed, item, ("score", "shortlist", "gang"))
            weight = in_range(item.get("weight", 1.0), f"score {item['name']!r}: weight", 0.0)
            if plugin.kind == "shortlist":
                shortlist.append(Weighted(plugin, weight))
            elif plugin.kind == "gang":
                if gang is not None:
                    raise ValueError(f"one gang plugin per profile: {gang.plugin.name!r} and {plugin.name!r} both price gangs")
                gang = Weighted(plugin, weight)
            else:
                scores.append(Weighted(plugin, weight))
        queue_raw = raw.get("queue") or {"policy": "fifo"}
        if not isinstance(queue_raw, dict) or "policy" not in queue_raw:
            raise ValueError(f"queue must be a mapping with a policy ({', '.join(POLICIES)}), got {queue_raw!r}")
        queue_args = {k: v for k, v in queue_raw.items() if k != "policy"}
        policy = queue_raw["policy"]
        if policy not in POLICIES:
            raise ProfileError(f"unknown queue policy {policy!r}; accepted: {', '.join(POLICIES)}")
        queue = _construct(POLICIES[policy], f"queue policy {policy!r}", queue_args)
        name = raw["name"]
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        return Profile(name, str(raw.get("description", "")), tuple(filters), tuple(scores), tuple(shortlist), gang, queue,
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


def _plugin(installed: dict[str, Any], item: dict[str, Any], kinds: tuple[str, ...]) -> Any:
    try:
        cls = plugin_class(str(item["name"]), kinds, installed)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ProfileError(str(exc)) from None
    return _construct(cls, f"{cls.kind} {item['name']!r}", item.get("args") or {})


def _construct(cls: type, what: str, raw_args: Any) -> Any:
    """``cls(**args)`` once every argument is known to ``cls`` and of its field's type."""
    if not isinstance(raw_args, dict):
        raise ProfileError(f"{what}: args must be a mapping, got {raw_args!r}")
    accepted = {f.name: f for f in fields(cls) if f.init} if is_dataclass(cls) else {}
    unknown = sorted(set(map(str, raw_args)) - set(accepted))
    if unknown:
        raise ProfileError(f"{what}: unknown argument(s) {', '.join(unknown)}; accepted: {', '.join(accepted) or 'none'}")
    hints = typing.get_type_hints(cls) if accepted else {}
    args = {}
    for key, value in raw_args.items():
        expected = hints.get(key)
        args[key] = _typed(value, expected, f"{what}: {key}", accepted[key].default)
    try:
        return cls(**args)
    except (TypeError, ValueError) as exc:
        raise ProfileError(f"{what}: {exc}") from None


def _typed(value: Any, expected: Any, where: str, default: Any) -> Any:
    """``value`` as a field of type ``expected`` takes it (a YAML list becomes a tuple), or a ProfileError
    naming the type; a type this check does not know is passed through for ``__post_init__`` to judge."""
    example = "" if default is MISSING else f" (default {default!r})"
    if expected is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ProfileError(f"{where} must be a number{example}, got {value!r}")
    if expected is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ProfileError(f"{where} must be a whole number{example}, got {value!r}")
    if expected is bool:
        if isinstance(value, bool):
            return value
        raise ProfileError(f"{where} must be true or false{example}, got {value!r}")
    if expected is str:
        if isinstance(value, str):
            return value
        raise ProfileError(f"{where} must be a string{example}, got {value!r}")
    if typing.get_origin(expected) is tuple:
        item_type = (typing.get_args(expected) or (Any,))[0]
        if not isinstance(value, (list, tuple)):
            raise ProfileError(f"{where} must be a list{example}, got {value!r}")
        return tuple(value if item_type is Any else _typed(v, item_type, f"{where} entry", MISSING) for v in value)
    return value
