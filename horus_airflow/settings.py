"""One settings object, read from environment variables.

Everything Horus writes lives under ``HORUS_HOME`` (default ``./.horus``), so nothing lands in the
user's home directory unless they point a variable there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping


@dataclass(frozen=True)
class Settings:
    """Where Horus keeps its state and which services it talks to."""

    home: Path
    mlflow_tracking_uri: str
    airflow_home: Path
    local_gpus: str | None
    profile: str
    lease_seconds: float
    kubernetes_namespace: str = "horus"
    project_root: Path = Path(".")
    ui_source: str = "local"
    kubeconfig: str | None = None
    kube_context: str | None = None
    mlflow_ui_url: str | None = None

    @property
    def ledger_path(self) -> Path:
        return self.home / "ledger.sqlite"

    @property
    def runs_dir(self) -> Path:
        """Telemetry of each launched job (samples, summary, logs)."""
        return self.home / "runs"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if environ is None else environ
        home = Path(env.get("HORUS_HOME") or ".horus").resolve()
        return cls(
            home=home,
            mlflow_tracking_uri=env.get("MLFLOW_TRACKING_URI") or f"sqlite:///{home / 'mlflow.db'}",
            airflow_home=Path(env.get("AIRFLOW_HOME") or home / "airflow").resolve(),
            local_gpus=env.get("HORUS_LOCAL_GPUS") or None,
            profile=env.get("HORUS_PROFILE") or "horus-paper",
            lease_seconds=float(env.get("HORUS_LEASE_SECONDS") or 300.0),
            kubernetes_namespace=env.get("HORUS_K8S_NAMESPACE") or "horus",
            project_root=Path(env.get("HORUS_PROJECT_ROOT") or ".").resolve(),
            ui_source=env.get("HORUS_UI_SOURCE") or "local",
            kubeconfig=env.get("HORUS_KUBECONFIG") or None,
            kube_context=env.get("HORUS_KUBE_CONTEXT") or None,
            mlflow_ui_url=env.get("HORUS_MLFLOW_UI_URL") or None,
        )

    def project_file(self, relative: str) -> Path:
        """A file the project ships (seed data, the promotion policy), from ``HORUS_PROJECT_ROOT``
        (default: the working directory); an absolute path is kept as given."""
        return self.project_root / relative

    @property
    def mlflow_artifact_root(self) -> Path:
        return self.home / "mlartifacts"
