"""Backends own time and I/O: inventory, the reservation ledger, launching and waiting for jobs."""

from horus_airflow.backends.base import Acquired, Backend, acquire
from horus_airflow.backends.ledger import Reservation, SqliteLedger
from horus_airflow.backends.local import LocalBackend, parse_inventory

__all__ = ["Acquired", "Backend", "LocalBackend", "Reservation", "SqliteLedger", "acquire", "parse_inventory"]
