"""Servers the UI tests, the stack suite and bench_ui.py start on 127.0.0.1: a free port, an ASGI app
under uvicorn in a thread, and the real ``airflow api-server`` with a signed-in admin's token."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A port nothing listens on now (also what a test uses for a server that is down)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(url: str) -> bool:
    """Whether anything answers at ``url``, an HTTP error included."""
    try:
        urllib.request.urlopen(url, timeout=2)
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def wait_until_answers(url: str, timeout_s: float, process: subprocess.Popen[bytes] | None = None, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not answers(url):
        tail = log.read_text(errors="replace")[-4000:] if log and log.exists() else ""
        if process is not None and process.poll() is not None:
            raise AssertionError(f"server exited with {process.returncode}:\n{tail}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} did not answer within {timeout_s:.0f} s:\n{tail}")
        time.sleep(0.3)


@contextlib.contextmanager
def serve_in_thread(app: Any) -> Iterator[str]:
    """``app`` under uvicorn in this process; yields its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    wait_until_answers(base, 30)
    try:
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextlib.contextmanager
def airflow_api_server(work: Path, env: dict[str, str]) -> Iterator[tuple[str, str]]:
    """``airflow api-server`` with this repository's plugins folder and ``env`` on top of ours; yields
    its base URL and an admin's token from its own ``/auth/token``."""
    password = "horus-test-password"
    passwords = work / "passwords.json"
    passwords.write_text(json.dumps({"admin": password}))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"), "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords), "AIRFLOW__API__BASE_URL": base, **env}
    log = work / "api-server.log"
    with log.open("wb") as sink:
        process = subprocess.Popen([sys.executable, "-m", "airflow", "api-server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                                   env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until_answers(f"{base}/api/v2/monitor/health", 120, process, log)
        request = urllib.request.Request(f"{base}/auth/token", json.dumps({"username": "admin", "password": password}).encode(),
                                         {"Content-Type": "application/json"})
        yield base, json.loads(urllib.request.urlopen(request, timeout=30).read())["access_token"]
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
