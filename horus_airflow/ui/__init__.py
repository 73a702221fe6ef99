"""The "Horus" view of the Airflow UI: cluster map, placement decisions, predictor versions and
simulations, over a read-only JSON API (docs/UI.md). The Airflow plugin is plugins/horus_view.py."""

from horus_airflow.ui.app import create_app

__all__ = ["create_app"]
