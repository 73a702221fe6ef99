"""The services of docker-compose.yaml without Docker: a real PostgreSQL (Debian's package), an
``mlflow server`` on it with an artifact directory, and ``airflow standalone`` on it (LocalExecutor),
every one on 127.0.0.1, started by this harness and stopped by the process-group id it recorded.

With ``executor="CeleryExecutor"`` it is compose's ``--profile celery`` instead: Debian's Redis as the
broker, Airflow's api-server, scheduler, DAG processor and triggerer as separate processes, and
``workers`` Celery workers, each with its own ``HORUS_HOME`` and temp dir, as if on machines of their own.

``SERVICES`` and ``POSTGRES_MAJOR`` are what test_compose_matches_the_local_stack compares with
docker-compose.yaml, so the two cannot drift apart.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.servers import REPO, free_port

POSTGRES_MAJOR = 15
SERVICES = ("postgres", "mlflow", "airflow-init", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")
EXECUTOR = "LocalExecutor"
CELERY = "CeleryExecutor"
DATABASES = ("airflow", "mlflow")


def postgres_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return found[-1].parent if found else None


def _postgres_user() -> str | None:
    """Who runs the server: it refuses to run as root."""
    return "postgres" if os.geteuid() == 0 else None


@dataclass
class LocalStack:
    """Start with :meth:`start`, stop with :meth:`stop`; every process is in its own group."""

    root: Path
    dags_folder: Path = REPO / "dags"
    password: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    pids: dict[str, int] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    admin_password: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    jwt_secret: str = field(default_factory=lambda: secrets.token_urlsafe(48))
    pg_dir: Path | None = None
    artifacts_mounted: bool = False
    executor: str = EXECUTOR
    workers: int = 2
    _processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)

    @property
    def pg_url(self) -> str:
        return f"postgresql+psycopg2://horus:{self.password}@127.0.0.1:{self.ports['postgres']}"

    @property
    def mlflow_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['mlflow']}"

    @property
    def airflow_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['airflow']}"

    @property
    def horus_home(self) -> Path:
        return self.root / "horus"

    def worker_root(self, index: int) -> Path:
        """A Celery worker's own folder: its HORUS_HOME (``horus``) and temp dir (``tmp``)."""
        return self.root / f"worker-{index}"

    def env(self) -> dict[str, str]:
        """What every Airflow process and task sees: the same names docker-compose.yaml sets."""
        celery = {
            "AIRFLOW__CELERY__BROKER_URL": f"redis://127.0.0.1:{self.ports.get('redis', 0)}/0",
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{self.pg_url}/airflow",
        } if self.executor == CELERY else {}
        return {**celery,
            **{k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__", "HORUS_", "MLFLOW_TRACKING"))},
            "AIRFLOW_HOME": str(self.root / "airflow"),
            "AIRFLOW__CORE__EXECUTOR": self.executor,
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"{self.pg_url}/airflow",
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
            "AIRFLOW__API__PORT": str(self.ports["airflow"]),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__BASE_URL": self.airflow_url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.airflow_url}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.root / "passwords.json"),
            "AIRFLOW__API_AUTH__JWT_SECRET": self.jwt_secret,
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "true",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT": str(self.ports["scheduler-health"]),
            # Airflow's default of 32 task processes starting at once on a 2-core CI machine outlasted the 30 s
            # DAG import timeout once, and the api-server's database pool (5 + 10 connections, 30 s wait) once
            "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "300",
            "AIRFLOW__CORE__PARALLELISM": "16",
            # a parse that outlasts the processor's timeout (50 s) marks the file's DAGs stale, and a stale
            # DAG cannot be triggered (404): one CI run lost horus_stack_fault so, right after the load test
            "AIRFLOW__DAG_PROCESSOR__DAG_FILE_PROCESSOR_TIMEOUT": "120",
            "AIRFLOW__DAG_PROCESSOR__STALE_DAG_THRESHOLD": "300",
            # a worker killed outright is found by its missing heartbeats: after 30 s here, 300 s by default
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "5",
            "MLFLOW_TRACKING_URI": self.mlflow_url,
            # the client gives up on a failing MLflow call after about a minute, not the default four
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "5",
            "MLFLOW_DISABLE_TELEMETRY": "true",
            "HORUS_HOME": str(self.horus_home),
            "HORUS_LOCAL_GPUS": "8xa100-80gb",
            "HORUS_PROJECT_ROOT": str(REPO),
        }

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> LocalStack:
        self.root.mkdir(parents=True, exist_ok=True)
        self.ports = {name: free_port() for name in ("postgres", "mlflow", "airflow", "scheduler-health", "redis")}
        self._postgres()
        self._artifact_disk()
        self._mlflow()
        if self.executor == CELERY:
            self._redis()
            self._airflow_services()
        else:
            self._airflow()
        return self

    def stop(self) -> None:
        for name in reversed(list(self.pids)):
            self.kill(name, signal.SIGTERM)
        for name in list(self.pids):
            self._reap(name)
        if self.artifacts_mounted:
            subprocess.run(["umount", "--lazy", str(self.artifacts)], check=True)
        if self.pg_dir is not None:
            shutil.rmtree(self.pg_dir, ignore_errors=True)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """``sig`` to a service's process group, as a signal from its operator would go."""
        if name in self.pids:
            try:
                os.killpg(self.pids[name], sig)
            except ProcessLookupError:
                pass

    @staticmethod
    def kill_session(sid: int) -> None:
        """SIGKILL every process of a service's session, as a container or systemd unit restart does: Airflow's
        task processes run in process groups of their own, so killing the service's group would leave them
        running, orphaned, as no deployment's restart does."""
        for pid in alive_in_session(sid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def is_up(self, name: str) -> bool:
        if name == "postgres":
            binaries = postgres_bin()
            assert binaries is not None
            return subprocess.run([str(binaries / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.ports["postgres"])],
                                  check=False, capture_output=True).returncode == 0
        return http_ok({"mlflow": f"{self.mlflow_url}/health", "airflow": f"{self.airflow_url}/api/v2/monitor/health"}[name])

    def restart(self, name: str) -> None:
        """Start a service again on its port, with its data (Postgres) or store (MLflow); one still running
        is killed first (a hung Airflow scheduler does not exit by itself)."""
        self.kill(name)
        self._reap(name)
        {"mlflow": self._mlflow, "postgres": self._start_postgres, "airflow": self._airflow}[name]()

    def _reap(self, name: str, timeout_s: float = 30.0) -> None:
        """Wait for a service's process to end (reaping it), killing its whole session if it lingers."""
        self.pids.pop(name)
        process = self._processes.pop(name)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill_session(process.pid)
            process.wait(timeout=timeout_s)
        self.kill_session(process.pid)  # children it left behind
        wait_for(lambda: not alive_in_session(process.pid), 30)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None, user: str | None = None) -> None:
        log = (self.root / f"{name}.log").open("ab")
        if user:
            argv = ["runuser", "-u", user, "--", *argv]
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.root)
        self.pids[name] = process.pid
        self._processes[name] = process

    def log_tail(self, name: str, chars: int = 3000) -> str:
        if name == "airflow" and self.executor == CELERY:  # no standalone: the scheduler's and the workers' logs
            return "\n".join(self.log_tail(part, chars // 3) for part in ("airflow-scheduler", *(f"worker-{i}" for i in range(self.workers))))
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    # --- services --------------------------------------------------------------------------------
    def _postgres(self) -> None:
        binaries = postgres_bin()
        if binaries is None:
            raise RuntimeError("PostgreSQL is not installed: apt-get install postgresql (make test does this)")
        as_user = _postgres_user()
        self.pg_dir = Path(tempfile.mkdtemp(prefix="horus-pg-"))  # under /tmp, so that user can reach it
        data = self.pg_dir / "data"
        pwfile = self.pg_dir / "pgpass"
        pwfile.write_text(self.password)
        pwfile.chmod(0o600)
        if as_user:
            shutil.chown(self.pg_dir, as_user)
            shutil.chown(pwfile, as_user)
        subprocess.run(([ "runuser", "-u", as_user, "--"] if as_user else []) + [
            str(binaries / "initdb"), "-D", str(data), "-U", "horus", "--pwfile", str(pwfile), "-A", "scram-sha-256"],
            check=True, capture_output=True)
        self._start_postgres()
        for database in DATABASES:
            subprocess.run([str(binaries / "createdb"), "-h", "127.0.0.1", "-p", str(self.ports["postgres"]), "-U", "horus", database],
                           env={**os.environ, "PGPASSWORD": self.password}, check=True, capture_output=True)

    def _start_postgres(self) -> None:
        binaries = postgres_bin()
        assert binaries is not None and self.pg_dir is not None
        self._spawn("postgres", [str(binaries / "postgres"), "-D", str(self.pg_dir / "data"), "-h", "127.0.0.1",
                                 "-p", str(self.ports["postgres"]), "-k", str(self.pg_dir)], user=_postgres_user())
        wait_for(lambda: self.is_up("postgres"), 60, lambda: self.log_tail("postgres"))

    @property
    def artifacts(self) -> Path:
        return self.root / "mlartifacts"

    def _artifact_disk(self) -> None:
        """The MLflow artifact store on a filesystem of its own (a 1 GiB tmpfs), so that a test can fill it;
        where mounting is not allowed (not root), a plain folder."""
        self.artifacts.mkdir(exist_ok=True)
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1g", "tmpfs", str(self.artifacts)], check=False, capture_output=True)
        self.artifacts_mounted = mounted.returncode == 0

    def _mlflow(self) -> None:
        artifacts = self.artifacts
        self._spawn("mlflow", [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.ports["mlflow"]),
                               "--backend-store-uri", f"{self.pg_url}/mlflow", "--artifacts-destination", str(artifacts),
                               "--workers", "2"],
                    env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"})
        wait_for(lambda: self.is_up("mlflow"), 120, lambda: self.log_tail("mlflow"))

    def _airflow(self) -> None:
        (self.root / "passwords.json").write_text(json.dumps({"admin": self.admin_password}))
        self._spawn("airflow", [str(Path(sys.executable).parent / "airflow"), "standalone"], env=self._airflow_env())
        wait_for(lambda: self.is_up("airflow"), 240, lambda: self.log_tail("airflow"))

    def _airflow_env(self) -> dict[str, str]:
        """:meth:`env` with this venv first on PATH: Airflow's commands start `airflow ...` from there."""
        env = self.env()
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
        return env

    def kill_triggerer(self) -> None:
        """SIGKILL ``airflow standalone``'s triggerer and the process that runs its triggers, leaving the
        rest of standalone running (it does not restart a triggerer that died)."""
        [triggerer] = [pid for pid in processes_running("triggerer") if parent_of(pid) == self.pids["airflow"]]
        for pid in process_tree(triggerer):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def start_triggerer(self, health_check_threshold_s: int = 10) -> None:
        """A triggerer of its own, as a deployment restarts a dead one; it takes over the triggers of one
        silent for ``health_check_threshold_s`` (Airflow's default: 30 s)."""
        env = {**self._airflow_env(), "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": str(health_check_threshold_s)}
        self._spawn("triggerer", [str(Path(sys.executable).parent / "airflow"), "triggerer"], env=env)

    def _redis(self) -> None:
        redis = shutil.which("redis-server")
        if redis is None:
            raise RuntimeError("Redis is not installed: apt-get install redis-server (make test does this)")
        self._spawn("redis", [redis, "--bind", "127.0.0.1", "--port", str(self.ports["redis"]), "--save", "", "--appendonly", "no"])
        wait_for(lambda: _port_open(self.ports["redis"]), 30, lambda: self.log_tail("redis"))

    def _airflow_services(self) -> None:
        """Compose's Airflow services, one process each (``airflow standalone`` runs only LocalExecutor),
        and the Celery workers."""
        (self.root / "passwords.json").write_text(json.dumps({"admin": self.admin_password}))
        env = self._airflow_env()
        # the cluster policy that sends consecutive tasks to different workers (celery_settings/)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent / "celery_settings"), env.get("PYTHONPATH")]))
        airflow = str(Path(sys.executable).parent / "airflow")
        subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, cwd=self.root, timeout=600)
        for service in ("api-server", "scheduler", "dag-processor", "triggerer"):
            self._spawn(f"airflow-{service}", [airflow, service], env=env)
        for index in range(self.workers):
            home = self.worker_root(index)
            (home / "tmp").mkdir(parents=True, exist_ok=True)
            worker_env = {**env, "HORUS_HOME": str(home / "horus"), "TMPDIR": str(home / "tmp"),
                          "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port())}
            self._spawn(f"worker-{index}", [airflow, "celery", "worker", "--celery-hostname", f"worker{index}@%h",
                                            "--queues", f"default,worker-{index}", "--concurrency", "4"], env=worker_env)
        wait_for(lambda: self.is_up("airflow"), 240, lambda: self.log_tail("airflow-api-server"))
        for index in range(self.workers):  # a worker that cannot start says so now, not as tasks queued forever
            name = f"worker-{index}"
            wait_for(lambda: " ready." in self.log_tail(name, 20_000) or self._processes[name].poll() is not None, 120,
                     lambda: self.log_tail(name))
            if self._processes[name].poll() is not None:
                raise RuntimeError(f"{name} exited at start:\n{self.log_tail(name)}")

    # --- Airflow REST API ------------------------------------------------------------------------
    def token(self) -> str:
        answer = self.request("POST", "/auth/token", {"username": "admin", "password": self.admin_password}, auth=False)
        return answer["access_token"]

    def request(self, method: str, path: str, body: Any = None, auth: bool = True) -> Any:
        headers = {"Content-Type": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token()}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.airflow_url}{path}", data, headers, method=method)
        with urllib.request.urlopen(request, timeout=60) as answer:
            return json.loads(answer.read() or b"null")

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None, timeout_s: float = 600) -> dict[str, Any]:
        """Unpause, trigger and wait for a DAG run to end; returns the run."""
        return self.trigger_wait(dag_id, self.start_run(dag_id, conf), timeout_s)

    def start_run(self, dag_id: str, conf: dict[str, Any] | None = None) -> str:
        """Unpause and trigger a DAG once the DAG processor has parsed it; returns the run id."""
        wait_for(lambda: _triggerable(self, dag_id), 180, lambda: self.log_tail("airflow"))
        self.request("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
        return self.request("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf or {}})["dag_run_id"]

    def trigger_wait(self, dag_id: str, dag_run_id: str, timeout_s: float = 600) -> dict[str, Any]:
        """Wait for a DAG run to end; returns it."""
        run_id = urllib.request.quote(dag_run_id, safe="")
        final: dict[str, Any] = {}

        def ended() -> bool:
            final.update(self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}"))
            return final["state"] in ("success", "failed")

        wait_for(ended, timeout_s, lambda: self.log_tail("airflow"), poll_s=2.0)
        return final

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        quoted = urllib.request.quote(run_id, safe="")
        answer = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quoted}/taskInstances?limit=500")
        return {f"{ti['task_id']}[{ti['map_index']}]": ti["state"] for ti in answer["task_instances"]}


def _triggerable(stack: LocalStack, dag_id: str) -> bool:
    """Parsed, current (not stale) and without import errors: what POST dagRuns requires."""
    try:
        dag = stack.request("GET", f"/api/v2/dags/{dag_id}")
    except urllib.error.HTTPError:
        return False
    return not dag["is_stale"] and not dag["has_import_errors"]


def _stat(process: Path) -> list[str]:
    """``/proc/PID/stat`` after the command name: state, parent pid, process group, ..."""
    return (process / "stat").read_text().rsplit(")", 1)[1].split()


def processes_running(*argv_parts: str) -> dict[int, list[str]]:
    """Live processes whose command line holds every one of ``argv_parts``, by pid."""
    found = {}
    for process in Path("/proc").glob("[0-9]*"):
        try:
            argv = (process / "cmdline").read_bytes().decode(errors="replace").split("\0")
            state = _stat(process)[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and all(part in argv for part in argv_parts):
            found[int(process.name)] = argv
    return found


def parent_of(pid: int) -> int:
    return int(_stat(Path("/proc") / str(pid))[1])


def process_tree(pid: int) -> list[int]:
    """A process and every descendant of it."""
    children: dict[int, list[int]] = {}
    for process in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            children.setdefault(parent_of(int(process.name)), []).append(int(process.name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found


def alive_in_session(sid: int) -> list[int]:
    """Processes of a session that still run (zombies waiting for a parent to reap them do not)."""
    alive = []
    for process in Path("/proc").glob("[0-9]*"):
        try:
            fields = _stat(process)
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            alive.append(int(process.name))
    return alive


def _port_open(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status == 200
    except OSError:
        return False


def wait_for(check, timeout_s: float, explain=lambda: "", poll_s: float = 0.5) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not ready within {timeout_s:.0f} s:\n{explain()}")
        time.sleep(poll_s)
