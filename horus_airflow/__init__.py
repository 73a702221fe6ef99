"""Horus for Airflow: interference-aware GPU placement of training tasks launched from Airflow."""

__version__ = "0.1.0"
