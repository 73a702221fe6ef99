"""Airflow operators that launch training tasks onto GPUs chosen by the Horus placer."""

from horus_airflow.operators.training import HorusTrainingOperator

__all__ = ["HorusTrainingOperator"]
