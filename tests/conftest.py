"""Test environment: every test session gets its own HORUS_HOME, Airflow home and MLflow store.

The variables are set before anything imports Airflow, which reads AIRFLOW_HOME at import time.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent
_SESSION_HOME = Path(tempfile.mkdtemp(prefix="horus-tests-"))
DAGS_FOLDER = _SESSION_HOME / "dags"
DAGS_FOLDER.mkdir()
for source in [*(REPO / "dags").glob("*.py"), *(REPO / "tests" / "dags").glob("*.py")]:
    shutil.copy(source, DAGS_FOLDER / source.name)

os.environ.update(
    {
        "HORUS_HOME": str(_SESSION_HOME / "horus"),
        "AIRFLOW_HOME": str(_SESSION_HOME / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "HORUS_LOCAL_GPUS": "2xa100-80gb",
        "HORUS_PROJECT_ROOT": str(REPO),
    }
)
os.environ.pop("MLFLOW_TRACKING_URI", None)


def env_with_home(home: Path) -> dict[str, str]:
    """This process's environment for a subprocess with its own Horus home. MLflow's set_tracking_uri
    writes MLFLOW_TRACKING_URI into os.environ, which would point the subprocess at an earlier test's
    store whatever its home, so it is left out."""
    return {**{k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}, "HORUS_HOME": str(home)}


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """A migrated SQLite Airflow metadata DB, once per session."""
    done = subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return Path(os.environ["AIRFLOW_HOME"])


@pytest.fixture(scope="session")
def token(airflow_db: Path) -> str:
    """A viewer's JWT from Airflow's own auth manager (its validation looks up revoked tokens in the DB)."""
    from airflow.api_fastapi.app import init_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return init_auth_manager().generate_jwt(SimpleAuthManagerUser(username="viewer", role="viewer"))


@pytest.fixture
def horus_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh HORUS_HOME (ledger + MLflow store) for one test."""
    home = tmp_path / "horus"
    monkeypatch.setenv("HORUS_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return home


def load_dag_file(path: Path) -> ModuleType:
    """Import a DAG file the way the DAG processor would: as a module of its own."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
