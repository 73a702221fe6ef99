"""Registered models under the alias scheme every Horus model follows, and their local cache.

A new version becomes ``challenger``, and ``champion`` too when there is none. Consumers fetch the
champion into ``HORUS_HOME/models/<name>/v<N>/`` once per version (staged, then renamed, so a half
download is never used) and keep using that copy, with a note, when the tracking server cannot be
reached.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.protos.databricks_pb2 import (
    INVALID_PARAMETER_VALUE,
    RESOURCE_DOES_NOT_EXIST,
    ErrorCode,
)

from horus_airflow.errors import RegistryError
from horus_airflow.registry.store import QUICK, client, http_policy
from horus_airflow.settings import Settings

log = logging.getLogger(__name__)

Model = TypeVar("Model")

CHAMPION, CHALLENGER = "champion", "challenger"
_COMPLETE_MARKER = "MLmodel"


@dataclass(frozen=True)
class ChampionCopy:
    """A local copy of a registered version; ``notes`` say when it is a fallback."""

    name: str
    version: str
    folder: Path
    notes: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.name}/{self.version}"

    def load(self, loader: Callable[[dict[str, Path]], Model]) -> Model:
        """The model built from this copy's artifacts, once per process and version folder."""
        if self.folder not in _LOADED:
            with warnings.catch_warnings():
                # skops finds a function's module by reading its name from every imported module; in an Airflow
                # task each of Airflow's deprecated aliases then warns, over a thousand lines in the task's log
                warnings.filterwarnings("ignore", category=FutureWarning, module="skops")
                _LOADED[self.folder] = loader({p.name: p for p in (self.folder / "artifacts").iterdir()})
        return _LOADED[self.folder]  # type: ignore[return-value]


_LOADED: dict[Path, object] = {}


@dataclass(frozen=True)
class NoChampion:
    """Why there is no copy to use."""

    reason: str


def register_version(
    settings: Settings, name: str, model_uri: str, run_id: str, description: str, model_id: str | None = None
) -> tuple[str, tuple[str, ...]]:
    """Register a logged model. ``model_id`` names an MLflow 3 logged model (``models:/m-...``): a tracking
    server refuses that source without it, though a local store does not."""
    mlflow_client = client(settings)
    with contextlib.suppress(MlflowException):
        mlflow_client.create_registered_model(name, description=description)
    version = str(mlflow_client.create_model_version(name, model_uri, run_id=run_id, model_id=model_id).version)
    aliases = [CHALLENGER]
    if champion_version(settings, name) is None:
        aliases.append(CHAMPION)
    for alias in aliases:
        mlflow_client.set_registered_model_alias(name, alias, version)
    log.info("registered %s version %s as %s", name, version, ", ".join(aliases))
    return version, tuple(aliases)


def promote(settings: Settings, name: str, version: str, alias: str = CHAMPION) -> None:
    """Point ``alias`` at a registered version; a version or model that does not exist is a
    :class:`RegistryError` that lists the versions there are."""
    mlflow_client = client(settings)
    if not version.isdigit():
        raise RegistryError(f"version {version!r} of {name} is not a version number; {_registered(mlflow_client, name)}")
    try:
        mlflow_client.get_model_version(name, version)
    except MlflowException as exc:
        if _absent(exc):
            raise RegistryError(f"{name} has no version {version}; {_registered(mlflow_client, name)}") from None
        raise
    mlflow_client.set_registered_model_alias(name, alias, version)
    log.info("%s version %s is now %s", name, version, alias)


def _registered(mlflow_client: MlflowClient, name: str) -> str:
    numbers = sorted(int(v.version) for v in mlflow_client.search_model_versions(f"name = '{name}'"))
    return f"registered versions: {', '.join(map(str, numbers))}" if numbers else f"no version of {name} is registered yet"


def champion_version(settings: Settings, name: str) -> str | None:
    """The champion's version number, or None when none is registered."""
    try:
        return str(client(settings).get_model_version_by_alias(name, CHAMPION).version)
    except MlflowException as exc:
        if _absent(exc):
            return None
        raise


def fetch_champion(settings: Settings, name: str) -> ChampionCopy | NoChampion:
    """The champion's local copy, downloading it the first time; the cached copy when the registry
    cannot be reached; otherwise why there is none."""
    cache = settings.home / "models" / name
    try:
        with http_policy(QUICK):
            version = client(settings).get_model_version_by_alias(name, CHAMPION)
    except MlflowException as exc:
        if _absent(exc):
            return NoChampion(f"no {CHAMPION} of {name} registered")
        return _cached(cache, name, f"{type(exc).__name__}: {exc.message[:200]}")
    except Exception as exc:  # connection errors surface as requests/urllib3 types
        return _cached(cache, name, f"{type(exc).__name__}: {str(exc)[:200]}")
    number = str(version.version)  # an int on SQL stores, a string over REST
    folder = cache / f"v{number}"
    if not (folder / _COMPLETE_MARKER).is_file():
        _download(settings, name, number, folder)
    _write_atomically(cache / "champion.json", json.dumps({"version": number, "run_id": version.run_id}))
    return ChampionCopy(name, number, folder)


def _absent(exc: MlflowException) -> bool:
    """No such registered model, or no such alias on it (the SQL store says INVALID_PARAMETER_VALUE)."""
    return exc.error_code in (ErrorCode.Name(RESOURCE_DOES_NOT_EXIST), ErrorCode.Name(INVALID_PARAMETER_VALUE))


def _cached(cache: Path, name: str, error: str) -> ChampionCopy | NoChampion:
    pointer = cache / "champion.json"
    if pointer.is_file():
        version = json.loads(pointer.read_text())["version"]
        folder = cache / f"v{version}"
        if (folder / _COMPLETE_MARKER).is_file():
            log.warning("MLflow registry unreachable (%s); using cached %s version %s", error, name, version)
            return ChampionCopy(name, version, folder, (f"registry unreachable, cached {CHAMPION} v{version}",))
    log.warning("MLflow registry unreachable (%s) and no cached %s of %s", error, CHAMPION, name)
    return NoChampion(f"registry unreachable ({error}) and no cached {CHAMPION}")


def _download(settings: Settings, name: str, version: str, folder: Path) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        with http_policy(QUICK):
            source = client(settings).get_model_version_download_uri(name, version)
            downloaded = mlflow.artifacts.download_artifacts(
                artifact_uri=source, dst_path=str(staging), tracking_uri=settings.mlflow_tracking_uri
            )
        if (folder / _COMPLETE_MARKER).is_file():  # another worker finished the same download first
            return
        shutil.rmtree(folder, ignore_errors=True)  # an incomplete copy (never made by this code, but kept safe)
        try:
            os.replace(downloaded, folder)
        except OSError:
            if not (folder / _COMPLETE_MARKER).is_file():  # not a race lost to another worker's copy
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _write_atomically(path: Path, text: str) -> None:
    """Many workers may write the same file at once: each stages its own copy, the last rename wins."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, staging = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "w") as out:
        out.write(text)
    os.replace(staging, path)
