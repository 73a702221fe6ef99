"""The ledger owner of a task instance."""

from __future__ import annotations

from typing import Any


def task_owner(ti: Any) -> str:
    """``dag/task/run/map_index``: the same for every try of a task instance, which runs one try at a
    time, so a retry or a re-attaching worker recognises the bookings of the try before it."""
    return f"{ti.dag_id}/{ti.task_id}/{ti.run_id}/{ti.map_index}"
