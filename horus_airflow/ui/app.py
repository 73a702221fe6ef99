"""The Horus view: a FastAPI app the Airflow 3 API server mounts at ``/horus`` (plugins/horus_view.py).

Pages and the JSON API under ``/horus/api/v1`` need a signed-in Airflow user allowed to see plugins:
Airflow does not protect plugin apps itself, so every route depends on its ``requires_access_view``.
Every route is a GET: nothing here can change a placement or the registry.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from html import escape
from importlib import resources
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response

from horus_airflow.errors import HorusError
from horus_airflow.settings import Settings
from horus_airflow.ui.model import ClusterMap, MapFilter
from horus_airflow.ui.sources import (
    REGISTERED_MODELS,
    ClusterSource,
    MlflowReader,
    SourceUnavailable,
    cluster_source,
)

log = logging.getLogger(__name__)

API = "/api/v1"
PAGES = ("cluster", "queue", "decisions", "predictor", "simulations")
_STATIC = {"horus.js": "text/javascript", "horus.css": "text/css"}
_NAME = r"^[A-Za-z0-9._-]{1,100}$"


def _access() -> Callable[..., None]:
    """Airflow's check that the caller is signed in and may see plugins (401 without a token, 403 without
    the permission)."""
    from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
    from airflow.api_fastapi.core_api.security import requires_access_view

    return requires_access_view(AccessView.PLUGINS)


def _user() -> Callable[..., Any]:
    from airflow.api_fastapi.core_api.security import get_user

    return get_user


def _hidden(user: Any, dag_ids: set[str]) -> frozenset[str]:
    """The DAGs among ``dag_ids`` this user may not read (per-DAG permissions of the auth manager): their
    placements are left out, or shown without names on the map."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails

    manager = get_auth_manager()
    return frozenset(d for d in dag_ids if not manager.is_authorized_dag(method="GET", user=user, details=DagDetails(id=d)))


def create_app(
    settings: Callable[[], Settings] = Settings.from_env, cache_s: float = 2.0, stale_s: float = 30.0,
    clock: Callable[[], float] = time.monotonic,
) -> FastAPI:
    """The app; ``settings`` is read once, at the first request, so an Airflow API server started before
    HORUS_* variables were final still sees them. One cluster reading serves every viewer for ``cache_s``
    and, refreshed in the background, for up to ``stale_s`` (a big cluster should not be listed once per
    open tab, nor make each viewer wait for the listing). ``clock`` ages the reading (tests pass their own)."""
    app = FastAPI(title="Horus for Airflow", version="1", docs_url=None, redoc_url=None, openapi_url=None,
                  dependencies=[Depends(_access())])
    state = _State(settings, cache_s, stale_s, clock)

    @app.exception_handler(RequestValidationError)
    async def _bad_query(request: Request, exc: RequestValidationError) -> JSONResponse:
        reasons = [f"{'.'.join(str(p) for p in e['loc'] if p != 'query')}: {e['msg']} (got {e.get('input')!r})" for e in exc.errors()]
        return JSONResponse({"detail": "; ".join(reasons)}, status_code=400)

    @app.exception_handler(SourceUnavailable)
    async def _unavailable(request: Request, exc: SourceUnavailable) -> JSONResponse:
        log.warning("Horus view: %s", exc)
        return JSONResponse({"detail": str(exc)}, status_code=503)

    @app.exception_handler(HTTPException)
    async def _refused(request: Request, exc: HTTPException) -> Response:
        """The API answers JSON; a page says in words that the user has to sign in to Airflow."""
        if f"{API}/" not in f"{request.url.path}/" and "/static/" not in request.url.path and exc.status_code in (401, 403):
            why = "Sign in to Airflow first" if exc.status_code == 401 else "Your Airflow role may not view plugins"
            airflow = request.scope.get("root_path", "").rsplit("/", 1)[0] + "/"  # the app is mounted at <airflow>/horus
            return HTMLResponse(f"<!doctype html><title>Horus</title><p>{why}, then open Horus from the Airflow menu. "
                                f"<a href=\"{escape(airflow)}\" target=\"_top\">Airflow</a></p>", status_code=exc.status_code)
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.get("/", include_in_schema=False)
    @app.get("/{page}", include_in_schema=False)
    def page(page: str = "cluster") -> HTMLResponse:
        if page not in PAGES:
            raise HTTPException(404, f"no page {page!r}; pages: {', '.join(PAGES)}")
        return HTMLResponse(_asset("index.html").decode(), headers={"Cache-Control": "no-store"})

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str) -> Response:
        if name not in _STATIC:
            raise HTTPException(404, f"no static file {name!r}")
        return Response(_asset(name), media_type=_STATIC[name])

    @app.get(API, summary="What this API serves")
    def index() -> dict[str, Any]:
        return {"version": 1, "endpoints": {route.path: route.summary for route in app.routes
                                             if getattr(route, "summary", None) and route.path.startswith(API)}}

    @app.get(f"{API}/openapi.json", summary="OpenAPI description of this API")
    def openapi() -> dict[str, Any]:
        return app.openapi()

    @app.get(f"{API}/cluster", summary="Every node and GPU, the tasks on it, predicted and measured utilization and memory")
    def cluster(
        node: Annotated[str | None, Query(max_length=253, description="node names containing this")] = None,
        gpu_type: Annotated[str | None, Query(pattern=_NAME, description="one GPU type, e.g. a100-80gb")] = None,
        dag_id: Annotated[str | None, Query(pattern=_NAME, description="GPUs hosting a task of this DAG")] = None,
        user: Annotated[Any, Depends(_user())] = None,
    ) -> Response:
        return _json_bytes(state.cluster_json(MapFilter(node, gpu_type, dag_id), user))

    @app.get(f"{API}/queue", summary="Tasks waiting for GPUs, oldest first, with why each still waits")
    def queue(user: Annotated[Any, Depends(_user())] = None) -> Response:
        source = state.source()
        rows, note = source.queue()
        hidden = _hidden(user, {r.dag_id for r in rows if r.dag_id})
        return _json({"source": source.name, "note": note,
                      "queue": [r.to_json() for r in rows if r.dag_id not in hidden]})

    @app.get(f"{API}/decisions", summary="Recent placements, newest first, with their one-line reasons")
    def decisions(
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        before: Annotated[float | None, Query(ge=0, description="only placements made before this Unix time (paging)")] = None,
        dag_id: Annotated[str | None, Query(pattern=_NAME)] = None,
        user: Annotated[Any, Depends(_user())] = None,
    ) -> Response:
        source = state.source()
        page = source.decisions(limit, before, dag_id)
        hidden = _hidden(user, {r.dag_id for r in page if r.dag_id})
        rows = [r for r in page if r.dag_id not in hidden]  # a page may come out short; next_before still pages on
        return _json({"source": source.name, "decisions": [r.to_json() for r in rows],
                      "next_before": page[-1].created_at if len(page) == limit else None})

    @app.get(f"{API}/decisions/{{reservation_id}}", summary="One placement: candidates, filter verdicts, score terms, its MLflow runs")
    def decision(
        reservation_id: Annotated[str, Path(pattern=r"^[A-Za-z0-9-]{1,64}$")], user: Annotated[Any, Depends(_user())] = None,
    ) -> Response:
        row = state.source().decision(reservation_id)
        if row is None or (row.dag_id and _hidden(user, {row.dag_id})):
            raise HTTPException(404, f"no placement with reservation id {reservation_id!r}")
        try:
            runs, runs_error = state.mlflow().runs_of_reservation(reservation_id), None
        except SourceUnavailable as exc:  # the explanation is in the ledger; show it without the run link
            runs, runs_error = [], str(exc)
        return _json({**row.to_json(detail=True), "mlflow_runs": runs, "mlflow_error": runs_error})

    @app.get(f"{API}/predictor", summary="Registered predictor versions, their accuracy, predicted vs measured")
    def predictor(
        versions: Annotated[int, Query(ge=1, le=200)] = 50,
        points: Annotated[int, Query(ge=1, le=2000)] = 200,
    ) -> Response:
        reader = state.mlflow()
        models = [{"name": name, "versions": [asdict(v) for v in reader.model_versions(name, versions)]} for name in REGISTERED_MODELS]
        measured, unmeasured = reader.profiling_points(points)
        return _json({"models": models, "profiling": {"points": [asdict(p) | {"url": reader.run_url(p.experiment_id, p.run_id)}
                                                                 for p in measured],
                                                      "without_gpu_measurement": unmeasured}})

    @app.get(f"{API}/simulations", summary="The latest simulation reports with their plots")
    def simulations(limit: Annotated[int, Query(ge=1, le=50)] = 5) -> Response:
        reader = state.mlflow()
        return _json({"simulations": [asdict(s) | {"url": reader.run_url(s.experiment_id, s.run_id)} for s in reader.simulations(limit)]})

    @app.get(f"{API}/simulations/{{run_id}}/artifacts/{{name}}", summary="A plot, table or JSON of a simulation run")
    def simulation_artifact(
        run_id: Annotated[str, Path(pattern=r"^[a-f0-9]{32}$")], name: Annotated[str, Path(pattern=_NAME)],
    ) -> Response:
        content = state.mlflow().simulation_artifact(run_id, name)
        if content is None:
            raise HTTPException(404, f"simulation run {run_id} has no artifact {name!r}")
        media = {"png": "image/png", "json": "application/json", "txt": "text/plain"}[name.rsplit(".", 1)[-1]]
        return Response(content, media_type=media, headers={"Cache-Control": "private, max-age=300"})

    return app


class _State:
    """Settings, the cluster source and a short-lived cluster reading, made at first use."""

    def __init__(self, settings: Callable[[], Settings], cache_s: float, stale_s: float, clock: Callable[[], float]) -> None:
        self._settings_factory = settings
        self._clock = clock
        self._settings: Settings | None = None
        self._source: ClusterSource | None = None
        self._cache_s = cache_s
        self._stale_s = max(stale_s, cache_s)
        self._refreshing = threading.Lock()
        self._cached: tuple[float, ClusterMap, dict[tuple[MapFilter, frozenset[str]], bytes]] | None = None

    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = self._settings_factory()
        return self._settings

    def source(self) -> ClusterSource:
        if self._source is None:
            try:
                self._source = cluster_source(self.settings())
            except HorusError as exc:
                raise SourceUnavailable(str(exc)) from None
        return self._source

    def cluster_json(self, keep: MapFilter, user: Any) -> bytes:
        """The map as JSON. A reading younger than ``cache_s`` is served as it is; one younger than
        ``stale_s`` is served while a fresh one is read in the background (the page shows its time), so
        a viewer waits for the API server only on the first request or after a long idle spell. Each
        filter's answer (and set of DAGs the viewer may not read) is serialised once per reading: building
        an 8,192-GPU answer costs more than serving it."""
        now = self._clock()
        cached = self._cached
        if cached is None or now - cached[0] >= self._stale_s:
            cached = self._cached = (self._clock(), self.source().cluster(), {})
        elif now - cached[0] >= self._cache_s and self._refreshing.acquire(blocking=False):
            threading.Thread(target=self._refresh, name="horus-view-refresh", daemon=True).start()
        _, reading, answers = cached
        key = (keep, _hidden(user, set(reading.dag_ids)))
        if key not in answers:
            present = {g.gpu_type for g in reading.state.gpus}
            if keep.gpu_type and present and keep.gpu_type not in present:
                raise HTTPException(400, f"gpu_type {keep.gpu_type!r} is not on this cluster; present: {', '.join(sorted(present))}")
            answers[key] = _dumps(reading.to_json(*key))
        return answers[key]

    def _refresh(self) -> None:
        try:
            self._cached = (self._clock(), self.source().cluster(), {})
        except Exception:
            log.warning("Horus view: refreshing the cluster reading failed", exc_info=True)
        finally:
            self._refreshing.release()

    def mlflow(self) -> MlflowReader:
        return MlflowReader(self.settings())


def _json(payload: Any) -> Response:
    return _json_bytes(_dumps(payload))


def _dumps(payload: Any) -> bytes:
    """JSON without FastAPI's per-field encoding pass, which costs more than the data on a big map."""
    return json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()


def _json_bytes(content: bytes) -> Response:
    return Response(content, media_type="application/json", headers={"Cache-Control": "no-store"})


@functools.cache
def _asset(name: str) -> bytes:
    return resources.files("horus_airflow.ui").joinpath("static", name).read_bytes()
