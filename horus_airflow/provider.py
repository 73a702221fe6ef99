"""Airflow provider metadata, found through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any

from horus_airflow import __version__


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "horus-airflow",
        "name": "Horus",
        "description": "Interference-aware GPU placement of deep-learning training tasks (after Horus, IEEE TPDS 2022).",
        "versions": [__version__],
        "integrations": [{"integration-name": "Horus", "tags": ["software"]}],
        "operators": [
            {
                "integration-name": "Horus",
                "python-modules": ["horus_airflow.operators.training", "horus_airflow.operators.kubernetes"],
            }
        ],
        "triggers": [{"integration-name": "Horus", "python-modules": ["horus_airflow.triggers.booking"]}],
        "task-decorators": [
            {"name": "horus_kubernetes", "class-name": "horus_airflow.decorators.kubernetes.horus_kubernetes_task"}
        ],
    }
