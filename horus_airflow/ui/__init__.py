"""The "Horus" view of the Airflow UI: cluster map, placement decisions, predictor versions and
simulations, over a read-only JSON API (docs/UI.md). The Airflow plugin is plugins/horus_view.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI


def create_app(*args: Any, **kwargs: Any) -> FastAPI:
    """The view's FastAPI app; see :func:`horus_airflow.ui.app.create_app`."""
    from horus_airflow.ui.app import create_app as create

    return create(*args, **kwargs)


class LazyApp:
    """The view as an ASGI app built at its first request. Airflow imports plugins in its components
    that never serve a page, and importing the view pulls in the placer, MLflow and PyTorch (4.6 s
    measured with ``python -c 'import horus_airflow.ui.app'`` on top of Airflow's own import)."""

    def __init__(self) -> None:
        self._app: FastAPI | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            self._app = create_app()
        await self._app(scope, receive, send)


__all__ = ["LazyApp", "create_app"]
