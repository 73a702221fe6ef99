"""Backends own time and I/O: inventory, the reservation ledger, launching and waiting for jobs.

Names are imported on first use: ``backends.binding`` is read when Airflow parses a DAG file, and the
local backend brings the placer and its models."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from horus_airflow.backends.base import Acquired, Backend, acquire
    from horus_airflow.backends.ledger import Reservation, SqliteLedger
    from horus_airflow.backends.local import LocalBackend, parse_inventory

_MODULE_OF = {
    "Acquired": "base", "Backend": "base", "acquire": "base", "Reservation": "ledger", "SqliteLedger": "ledger",
    "LocalBackend": "local", "parse_inventory": "local",
}


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)


__all__ = ["Acquired", "Backend", "LocalBackend", "Reservation", "SqliteLedger", "acquire", "parse_inventory"]
