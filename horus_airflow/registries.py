"""Registries of named extensions (trace readers, telemetry formats): a dict that refuses a second
entry under a name it holds, so that two packages cannot silently replace each other's reader."""

from __future__ import annotations

from typing import Protocol, TypeVar


class Named(Protocol):
    @property
    def name(self) -> str: ...


T = TypeVar("T", bound=Named)


class Registry(dict[str, T]):
    """Entries by name, in registration order (the order a format is guessed in)."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what

    def register(self, entry: T) -> T:
        if entry.name in self:
            raise ValueError(f"{self.what} {entry.name!r} is already registered")
        self[entry.name] = entry
        return entry
