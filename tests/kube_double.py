"""A TEST DOUBLE of the Kubernetes API server, on 127.0.0.1: not Kubernetes.

It serves the few core/v1 paths Horus and the KubernetesPodOperator call (nodes, pods, configmaps,
pod logs, events) with the semantics they rely on: a cluster-wide ``resourceVersion`` that every write
bumps, 409 Conflict on a PUT whose ``metadata.resourceVersion`` is stale, 409 AlreadyExists, 404,
label and field selectors. Faults are injected on demand: any status (429, 500, ...) or a hang past the
client's timeout, before or after the write is applied. A toy kubelet moves pods Pending -> Running ->
Succeeded after set delays, or leaves them Pending.

The official ``kubernetes`` client talks to it through a kubeconfig it writes (:meth:`kubeconfig`).
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

_NAMESPACED = re.compile(r"^/api/v1/namespaces/([^/]+)/(pods|configmaps|events)(?:/([^/]+))?(?:/(log|status))?$")


@dataclass
class Fault:
    """Answer the next ``times`` requests matching ``method`` and ``path_part`` with ``status``, or, when
    ``hang_s`` is set, stall that long (the write is applied first when ``apply`` is True)."""

    method: str
    path_part: str
    status: int = 500
    times: int = 1
    hang_s: float = 0.0
    apply: bool = False


@dataclass
class Lifecycle:
    """Seconds after creation at which the toy kubelet reports Running and then Succeeded (None: never)."""

    running_after_s: float | None = 0.0
    succeeded_after_s: float | None = 0.2
    exit_code: int = 0


@dataclass
class _Store:
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    configmaps: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    version: int = 1000


def _now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def gpu_node(
    name: str,
    product: str = "NVIDIA-A100-SXM4-80GB",
    count: int = 8,
    memory_mib: int = 81920,
    allocatable: int | None = None,
    ready: bool = True,
    cordoned: bool = False,
    zone: str = "",
) -> dict[str, Any]:
    """A node as NVIDIA GPU feature discovery labels it."""
    labels = {
        "kubernetes.io/hostname": name,
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.memory": str(memory_mib),
    }
    if zone:
        labels["topology.kubernetes.io/zone"] = zone
    gpus = str(count if allocatable is None else allocatable)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"unschedulable": cordoned},
        "status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": gpus},
            "capacity": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": gpus},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def _matches_labels(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if term.startswith("!"):
            if term[1:] in labels:
                return False
        elif "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("==" if "==" in term else "=", 1)
            if labels.get(key) != value:
                return False
        elif term not in labels:
            return False
    return True


def _field(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part, {}) if isinstance(value, dict) else {}
    return value if isinstance(value, str) else ""


def _matches_fields(obj: dict[str, Any], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if _field(obj, key) == value:
                return False
        else:
            key, value = term.split("==" if "==" in term else "=", 1)
            if _field(obj, key) != value:
                return False
    return True


class FakeKubeApi:
    """Start with :meth:`start`, stop with :meth:`stop` (or use as a context manager)."""

    def __init__(self, token: str = "test-double-token", lifecycle: Lifecycle | None = None) -> None:
        self.token = token
        self.lifecycle = lifecycle or Lifecycle()
        self.store = _Store()
        self.faults: list[Fault] = []
        self.requests: Counter[str] = Counter()
        self.conflicts = 0
        self.created: list[dict[str, Any]] = []
        self.verbs: set[tuple[str, str, str]] = set()  # (verb, resource, namespace or "" for cluster-wide)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- test controls ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeKubeApi:
        api = self

        class Handler(_Handler):
            fake = api

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-kube-api", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeKubeApi:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kubeconfig(self, path: Path, namespace: str = "horus") -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "double", "cluster": {"server": self.url}}],
                    "users": [{"name": "tester", "user": {"token": self.token}}],
                    "contexts": [{"name": "double", "context": {"cluster": "double", "user": "tester", "namespace": namespace}}],
                    "current-context": "double",
                }
            )
        )
        return path

    def add_node(self, node: dict[str, Any]) -> None:
        with self._lock:
            self.store.nodes[node["metadata"]["name"]] = node

    def add_pod(self, namespace: str, pod: dict[str, Any], phase: str = "Running") -> dict[str, Any]:
        with self._lock:
            return self._create_pod(namespace, pod, phase)

    def set_phase(self, namespace: str, name: str, phase: str, reason: str | None = None) -> None:
        with self._lock:
            pod = self.store.pods[(namespace, name)]
            pod["status"] = {"phase": phase, **({"reason": reason} if reason else {})}
            pod["_fixed"] = True
            self._bump(pod)

    def delete_pod(self, namespace: str, name: str) -> None:
        with self._lock:
            self.store.pods.pop((namespace, name), None)

    def inject(self, fault: Fault) -> None:
        with self._lock:
            self.faults.append(fault)

    def pods(self, namespace: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [json.loads(json.dumps(self._with_status(p))) for (ns, _), p in self.store.pods.items() if namespace in (None, ns)]

    def configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            cm = self.store.configmaps.get((namespace, name))
            return json.loads(json.dumps(cm)) if cm else None

    # --- internals (called under the lock) -------------------------------------------------------
    def _bump(self, obj: dict[str, Any]) -> None:
        self.store.version += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.store.version)

    def _create_pod(self, namespace: str, pod: dict[str, Any], phase: str | None = None) -> dict[str, Any]:
        meta = pod.setdefault("metadata", {})
        meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=_now_iso())
        meta.setdefault("labels", {})
        pod["_created"] = time.monotonic()
        if phase is not None:
            pod["status"] = {"phase": phase}
            pod["_fixed"] = True
        self._bump(pod)
        self.store.pods[(namespace, meta["name"])] = pod
        return pod

    def _with_status(self, pod: dict[str, Any]) -> dict[str, Any]:
        """The pod as the toy kubelet would report it now."""
        view = {k: v for k, v in pod.items() if not k.startswith("_")}
        if pod.get("_fixed"):
            return view
        age = time.monotonic() - pod["_created"]
        life = self.lifecycle
        names = [c["name"] for c in pod.get("spec", {}).get("containers", [])]
        if life.succeeded_after_s is not None and age >= life.succeeded_after_s:
            state = {"terminated": {"exitCode": life.exit_code, "reason": "Completed" if life.exit_code == 0 else "Error"}}
            phase = "Succeeded" if life.exit_code == 0 else "Failed"
        elif life.running_after_s is not None and age >= life.running_after_s:
            state, phase = {"running": {"startedAt": _now_iso()}}, "Running"
        else:
            return {**view, "status": {"phase": "Pending"}}
        statuses = [{"name": n, "ready": phase == "Running", "restartCount": 0, "image": "x", "imageID": "x", "state": state} for n in names]
        return {**view, "status": {"phase": phase, "containerStatuses": statuses, "startTime": _now_iso()}}


def _verb(method: str, path: str, query: dict[str, str]) -> tuple[str, str, str]:
    """The RBAC verb, resource and namespace a request needs."""
    match = _NAMESPACED.match(path)
    if match:
        namespace, kind, name, sub = match.groups()
        resource = f"{kind}/{sub}" if sub else kind
    else:
        namespace, resource, name = "", path.rstrip("/").split("/")[-1], None
    if method == "GET":
        verb = "watch" if query.get("watch") in ("true", "1") else ("get" if name else "list")
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
    return verb, resource, namespace


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason, "message": message}


class _Handler(BaseHTTPRequestHandler):
    fake: FakeKubeApi
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else headers and body in two segments stall 40 ms on delayed ACKs

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        return

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def _send(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method: str) -> None:
        fake = self.fake
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        url = urlparse(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        if self.headers.get("Authorization") != f"Bearer {fake.token}":
            self._send(401, _status(401, "Unauthorized", "Unauthorized"))
            return
        with fake._lock:
            fault = next((f for f in fake.faults if f.method == method and f.path_part in url.path and f.times > 0), None)
            if fault:
                fault.times -= 1
            fake.requests[f"{method} {url.path.split('/')[-1] if method != 'GET' else url.path}"] += 1
        if fault and not fault.hang_s:
            self._send(fault.status, _status(fault.status, "Injected", f"injected {fault.status}"))
            return
        if fault and not fault.apply:
            time.sleep(fault.hang_s)
            self._send(504, _status(504, "Timeout", "injected hang"))
            return
        with fake._lock:
            code, answer = self._route(method, url.path, query, body)
        if fault:
            time.sleep(fault.hang_s)
        self._send(code, answer)

    def _route(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        fake, store = self.fake, self.fake.store
        fake.verbs.add(_verb(method, path, query))
        labels, fields = query.get("labelSelector", ""), query.get("fieldSelector", "")
        if path == "/api/v1/nodes" and method == "GET":
            items = [n for n in store.nodes.values() if _matches_labels(n["metadata"].get("labels", {}), labels)]
            return 200, {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": str(store.version)}, "items": items}
        if path == "/api/v1/pods" and method == "GET":
            return 200, self._pod_list(None, labels, fields)
        match = _NAMESPACED.match(path)
        if not match:
            return 404, _status(404, "NotFound", f"the test double does not serve {method} {path}")
        namespace, kind, name, sub = match.groups()
        if kind == "events":
            return 200, {"kind": "EventList", "apiVersion": "v1", "metadata": {}, "items": []}
        if kind == "pods":
            if name is None and method == "GET":
                return 200, self._pod_list(namespace, labels, fields)
            if name is None and method == "POST":
                if (namespace, body["metadata"]["name"]) in store.pods:
                    return 409, _status(409, "AlreadyExists", f'pods "{body["metadata"]["name"]}" already exists')
                fake.created.append(json.loads(json.dumps(body)))
                return 201, fake._with_status(fake._create_pod(namespace, body))
            pod = store.pods.get((namespace, name))
            if pod is None:
                return 404, _status(404, "NotFound", f'pods "{name}" not found')
            if sub == "log":
                return 200, ""
            if method == "GET":
                return 200, fake._with_status(pod)
            if method == "DELETE":
                del store.pods[(namespace, name)]
                return 200, fake._with_status(pod)
            if method == "PATCH":
                pod["metadata"].setdefault("labels", {}).update((body or {}).get("metadata", {}).get("labels", {}))
                fake._bump(pod)
                return 200, fake._with_status(pod)
        if kind == "configmaps":
            key = (namespace, name or (body or {}).get("metadata", {}).get("name", ""))
            current = store.configmaps.get(key)
            if method == "GET" and name:
                return (200, current) if current else (404, _status(404, "NotFound", f'configmaps "{name}" not found'))
            if method == "POST":
                if current:
                    return 409, _status(409, "AlreadyExists", f'configmaps "{key[1]}" already exists')
                created = {**body, "metadata": {**body.get("metadata", {}), "namespace": namespace}}
                fake._bump(created)
                store.configmaps[key] = created
                return 201, created
            if method == "PUT":
                if current is None:
                    return 404, _status(404, "NotFound", f'configmaps "{name}" not found')
                sent = (body.get("metadata") or {}).get("resourceVersion")
                if sent and sent != current["metadata"]["resourceVersion"]:
                    fake.conflicts += 1
                    return 409, _status(409, "Conflict", "the object has been modified; please apply your changes to the latest version and try again")
                replaced = {**body, "metadata": {**body.get("metadata", {}), "namespace": namespace}}
                fake._bump(replaced)
                store.configmaps[key] = replaced
                return 200, replaced
        return 405, _status(405, "MethodNotAllowed", f"{method} {path}")

    def _pod_list(self, namespace: str | None, labels: str, fields: str) -> dict[str, Any]:
        fake = self.fake
        items = []
        for (ns, _), pod in fake.store.pods.items():
            if namespace not in (None, ns):
                continue
            if not _matches_labels(pod["metadata"].get("labels", {}), labels):
                continue
            view = fake._with_status(pod)
            if _matches_fields(view, fields):
                items.append(view)
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(fake.store.version)}, "items": items}
