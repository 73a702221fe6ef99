"""Airflow triggers: what a deferred Horus task waits on in the triggerer, holding no worker slot."""

from horus_airflow.triggers.booking import BookingTrigger

__all__ = ["BookingTrigger"]
