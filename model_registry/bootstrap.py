"""Seed an MLflow registry: both registered models with their model cards as descriptions, and a first
champion of each trained on the data the project ships. Safe to run again (nothing is retrained when a
champion exists). `make demo` runs it.

    .venv/bin/python model_registry/bootstrap.py        # MLFLOW_TRACKING_URI / HORUS_HOME as usual
"""

from __future__ import annotations

import sys
from pathlib import Path

from horus_airflow.registry.bootstrap import bootstrap
from horus_airflow.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    settings = Settings.from_env()
    steps = bootstrap(settings, ROOT / "data" / "predictor_seed" / "predictor_seed.csv",
                      ROOT / "data" / "interference_seed" / "gavel_pairs.csv", ROOT / "model_registry" / "cards")
    for step in steps:
        print(f"{step.model}: {step.message}")
    print(f"registry: {settings.mlflow_tracking_uri}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
