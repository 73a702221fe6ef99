"""The Horus view on a 1,024-node x 8-GPU cluster: API latency and time to draw the map in headless Chromium.

The cluster is the Kubernetes API TEST DOUBLE (tests/kube_double.py, a Python HTTP server on 127.0.0.1,
not Kubernetes) with 1,024 GPU nodes and ``--pods`` running Horus pods, each booked on its own GPU with
a placement explanation annotation the size of a real one. The app is served by uvicorn in this process
behind Airflow's own authentication (a token from Airflow's auth manager; its DB is migrated into a
temporary AIRFLOW_HOME first). Targets: ``/api/v1/cluster`` under 100 ms median, the map drawn in
under 2 s.

Rows:
- ``GET /api/v1`` is the floor: authentication plus a tiny JSON answer.
- "read the cluster" is what any viewer must pay: nodes, pods and ledger read from the API server
  (``KubernetesBackend.view``), timed directly.
- ``/api/v1/cluster`` uncached reads the cluster on every request. With the app's defaults one
  reading serves every open tab for 2 s and is then refreshed in the background while the last one is
  served (up to 30 s old); the requests are 250 ms apart, so several background refreshes fall
  inside the measurement and compete with it.
- "through airflow api-server" is the plugin as deployed: the real ``airflow api-server`` (its JWT
  middleware and gzip included) with the app's defaults, asked with ``Accept-Encoding: gzip``.
- "map drawn" is Chromium's time from navigation to the drawn map (the page records it), through the
  uncached server.

    .venv/bin/python benchmarks/bench_ui.py [--rounds 30] [--pods 1500] [--browser-rounds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
_WORK = Path(tempfile.mkdtemp(prefix="horus-bench-ui-"))
os.environ.update({"AIRFLOW_HOME": str(_WORK / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                   "HORUS_HOME": str(_WORK / "horus"), "MLFLOW_DISABLE_TELEMETRY": "true"})

from tests.kube_double import FakeKubeApi, gpu_node
from tests.servers import airflow_api_server, serve_in_thread

NODES, PER_NODE = 1024, 8


def populate(fake: FakeKubeApi, pods: int) -> None:
    from horus_airflow.backends.kubernetes import (
        BOOKING_ANNOTATION,
        RESERVATION_LABEL,
        LedgerEntry,
    )
    from horus_airflow.backends.ledger import Booking
    from horus_airflow.placement import ClusterState, GpuState, load_profile, place
    from horus_airflow.predictor.demand import Demand, GpuDemand

    for n in range(NODES):
        fake.add_node(gpu_node(f"gpu-{n:04d}", count=PER_NODE))
    sample_state = ClusterState(tuple(GpuState(f"gpu-{n:04d}/{i}", f"gpu-{n:04d}", i, "a100-80gb", 81920.0)
                                      for n in range(64) for i in range(PER_NODE)))
    demand = Demand("sample", 1, {"a100-80gb": GpuDemand(45.0, 60.0, 12_000.0)})
    annotations = place(demand, sample_state, load_profile("horus-paper")).annotations()  # a real explanation's size
    now = time.time()
    for i in range(pods):
        node, index = f"gpu-{i % NODES:04d}", (i // NODES) % PER_NODE
        entry = LedgerEntry(f"r{i:05d}", f"job-{i}", f"bench_dag/train/run-{i // 100}/{i % 100}", now, now + 300, now + 3600,
                            (Booking(f"{node}/{index}", 20.0 + i % 70, 30.0 + i % 70, 4_000.0 + 37 * (i % 1000), ()),))
        fake.add_pod("jobs", {"metadata": {"name": f"job-{i}", "labels": {RESERVATION_LABEL: entry.reservation_id},
                                           "annotations": {**annotations, BOOKING_ANNOTATION: entry.to_json()}},
                              "spec": {"nodeName": node, "containers": [{"name": "base", "image": "trainer"}]}}, phase="Running")


def timed(fn: Callable[[], object], rounds: int, pause_s: float = 0.0) -> list[float]:
    fn()  # warm-up
    samples = []
    for _ in range(rounds):
        time.sleep(pause_s)
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def getter(address: str, path: str, token: str, gzip: bool = False) -> Callable[[], bytes]:
    connection = http.client.HTTPConnection(address, timeout=60)
    headers = {"Cookie": f"_token={token}", **({"Accept-Encoding": "gzip"} if gzip else {})}

    def get() -> bytes:
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        body = response.read()
        assert response.status == 200, (response.status, body[:300])
        return body

    return get


def browser_draws(address: str, token: str, rounds: int) -> list[float]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        driver.get(f"http://{address}/static/horus.css")
        driver.add_cookie({"name": "_token", "value": token, "path": "/"})
        samples = []
        for _ in range(rounds + 1):
            driver.get(f"http://{address}/")
            drawn = WebDriverWait(driver, 60).until(lambda d: d.execute_script("return document.documentElement.dataset.drawnAt"))
            assert len(driver.find_elements("css selector", ".gpu")) == NODES * PER_NODE
            samples.append(float(drawn))
        return samples[1:]  # the first load also fills the browser's cache of the script
    finally:
        driver.quit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--pods", type=int, default=1500)
    parser.add_argument("--browser-rounds", type=int, default=5)
    args = parser.parse_args()

    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, capture_output=True)
    from airflow.api_fastapi.app import init_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    from horus_airflow.backends.kubernetes import KubernetesBackend, api_from_kubeconfig
    from horus_airflow.settings import Settings
    from horus_airflow.ui import create_app

    token = init_auth_manager().generate_jwt(SimpleAuthManagerUser(username="bench", role="viewer"))
    with FakeKubeApi() as fake:
        populate(fake, args.pods)
        kubeconfig = fake.kubeconfig(_WORK / "kubeconfig.json")
        settings = Settings.from_env({**os.environ, "HORUS_UI_SOURCE": "kubernetes", "HORUS_KUBECONFIG": str(kubeconfig)})
        backend = KubernetesBackend(api_from_kubeconfig(str(kubeconfig)))
        with contextlib.ExitStack() as running:
            uncached = running.enter_context(serve_in_thread(create_app(lambda: settings, cache_s=0.0, stale_s=0.0))).removeprefix("http://")
            cached = running.enter_context(serve_in_thread(create_app(lambda: settings))).removeprefix("http://")
            env = {"HORUS_UI_SOURCE": "kubernetes", "HORUS_KUBECONFIG": str(kubeconfig)}
            airflow, airflow_token = running.enter_context(airflow_api_server(_WORK, env))
            airflow = airflow.removeprefix("http://")
            body = getter(uncached, "/api/v1/cluster", token)()
            rows = [
                ("GET /api/v1 (floor: auth + tiny JSON)", timed(getter(uncached, "/api/v1", token), args.rounds)),
                ("read the cluster (KubernetesBackend.view)", timed(backend.view, args.rounds)),
                ("GET /api/v1/cluster, uncached", timed(getter(uncached, "/api/v1/cluster", token), args.rounds)),
                ("GET /api/v1/cluster, app defaults", timed(getter(cached, "/api/v1/cluster", token), args.rounds, pause_s=0.25)),
                ("same, through airflow api-server (gzip)", timed(getter(airflow, "/horus/api/v1/cluster", airflow_token, gzip=True), args.rounds, pause_s=0.25)),
                ("map drawn in Chromium (navigation to drawn)", browser_draws(uncached, token, args.browser_rounds)),
            ]
    floor = statistics.median(rows[0][1])
    print(f"\n{NODES} nodes x {PER_NODE} GPUs, {args.pods} Horus pods on the Kubernetes API test double; "
          f"/api/v1/cluster answers {len(body) / 1e6:.2f} MB; {args.rounds} rounds ({args.browser_rounds} in the browser)\n")
    print(f"{'':46} {'median ms':>10} {'p90 ms':>9} {'x floor':>8}")
    for name, samples in rows:
        ordered = sorted(samples)
        p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
        print(f"{name:46} {statistics.median(samples):10.1f} {p90:9.1f} {statistics.median(samples) / floor:8.1f}")
    print("\ntargets: /api/v1/cluster under 100 ms median; the map drawn under 2,000 ms")


if __name__ == "__main__":
    main()
