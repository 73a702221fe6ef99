"""Adds "Horus" to the Airflow 3 navigation: the cluster map, placement decisions, predictor versions
and simulations (docs/UI.md). Airflow loads this file from its plugins folder
(``AIRFLOW__CORE__PLUGINS_FOLDER``); the app itself lives in :mod:`horus_airflow.ui` and is built at
its first request, so Airflow components that only import plugins do not pay for it."""

from airflow.plugins_manager import AirflowPlugin

from horus_airflow.ui import LazyApp


class HorusViewPlugin(AirflowPlugin):
    name = "horus"
    fastapi_apps = [{"app": LazyApp(), "url_prefix": "/horus", "name": "Horus"}]  # noqa: RUF012 - the form Airflow reads
    external_views = [{"name": "Horus", "href": "horus/", "destination": "nav", "url_route": "horus", "nav_top_level": True}]  # noqa: RUF012
