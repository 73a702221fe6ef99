"""What Horus adds before a pod is created, over a plain KubernetesPodOperator.

Both operators build their pod request against the Kubernetes API TEST DOUBLE (tests/kube_double.py,
a Python HTTP server on 127.0.0.1, not Kubernetes) holding 100 GPU nodes x 8 GPUs and 300 running Horus
pods with their reservations. Horus's build adds: a snapshot (nodes, Horus pods, GPU pods of others, the
ledger; reconciliation), the prediction (graph features cached after the first call, champion
predictor), placement with the profile, and the compare-and-swap ledger write. Each Horus booking is
released (untimed) before the next, so every round sees the same cluster. Target: added latency under
200 ms median.

    .venv/bin/python benchmarks/bench_kubernetes.py [--rounds 40] [--profile horus-paper]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.kube_double import FakeKubeApi, gpu_node  # noqa: E402


@dataclass
class BenchTaskInstance:
    """The few task-instance fields the operators read (the benchmark runs them outside a DAG run)."""

    dag_id: str = "bench"
    task_id: str = "train"
    run_id: str = "bench-run"
    map_index: int = -1
    try_number: int = 1
    pushed: dict[str, Any] = field(default_factory=dict)

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


def populate(fake: FakeKubeApi, nodes: int, running: int) -> None:
    """GPU nodes, and ``running`` Horus pods, each on its own GPU, booked in the ledger (the backend
    adopts them from their annotations on the first snapshot)."""
    from horus_airflow.backends.kubernetes import (
        BOOKING_ANNOTATION,
        RESERVATION_LABEL,
        LedgerEntry,
    )
    from horus_airflow.backends.ledger import Booking

    for n in range(nodes):
        fake.add_node(gpu_node(f"gpu-{n:03d}", count=8))
    now = time.time()
    for i in range(running):
        node, index = f"gpu-{i % nodes:03d}", i // nodes
        entry = LedgerEntry(f"r{i:04d}", f"job-{i}", f"bench/job-{i}", now, now + 300, now + 3600,
                            (Booking(f"{node}/{index}", 45.0, 60.0, 12_000.0, ()),))
        fake.add_pod("jobs", {"metadata": {"name": f"job-{i}", "labels": {RESERVATION_LABEL: entry.reservation_id},
                                           "annotations": {BOOKING_ANNOTATION: entry.to_json()}},
                              "spec": {"nodeName": node, "containers": [{"name": "base", "image": "trainer"}]}}, phase="Running")


def timed(fn: Any, rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--running", type=int, default=300)
    parser.add_argument("--profile", default="horus-paper")
    args = parser.parse_args()
    os.environ.setdefault("HORUS_HOME", tempfile.mkdtemp(prefix="horus-bench-"))
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    from horus_airflow.backends.kubernetes import (
        KubernetesBackend,
        KubernetesOptions,
        api_from_kubeconfig,
    )
    from horus_airflow.jobs import JobSpec
    from horus_airflow.operators.kubernetes import HorusKubernetesPodOperator
    from horus_airflow.service import predict_demand
    from horus_airflow.placement import load_profile, place
    from horus_airflow.settings import Settings

    with FakeKubeApi() as fake, tempfile.TemporaryDirectory() as tmp:
        populate(fake, args.nodes, args.running)
        config = str(fake.kubeconfig(Path(tmp) / "kubeconfig.json"))
        os.environ["HORUS_K8S_NAMESPACE"] = "horus"
        common = dict(task_id="train", namespace="jobs", image="trainer:1", cmds=["python", "train.py"], config_file=config)
        ti = BenchTaskInstance()
        context: Any = {"ti": ti, "run_id": ti.run_id, "dag": None}

        plain = KubernetesPodOperator(**common)
        plain_ms = timed(lambda: plain.build_pod_request_obj(context), args.rounds)

        horus = HorusKubernetesPodOperator(model="resnet50", batch_size=64, profile=args.profile, **common)
        backend = horus._backend
        backend.snapshot()  # adopts the running pods into the ledger once, as after a restart

        def horus_round() -> None:
            horus.build_pod_request_obj(context)

        def release() -> None:
            backend.release_owner(f"{ti.dag_id}/{ti.task_id}/{ti.run_id}/{ti.map_index}")

        horus_round()  # first call: graph features and the predictor are loaded once per worker process
        release()
        horus_ms = []
        for _ in range(args.rounds):
            horus_ms += timed(horus_round, 1)
            release()

        parts = KubernetesBackend(api_from_kubeconfig(config), KubernetesOptions(namespace="horus"))
        spec, settings = JobSpec(model="resnet50", batch_size=64), Settings.from_env()
        state = parts.snapshot()
        _features, demand = predict_demand(spec, "bench-job", ["a100-80gb"], settings)
        profile = load_profile(args.profile)
        breakdown = {
            "snapshot (4 API reads + reconcile)": timed(parts.snapshot, args.rounds),
            "prediction (cached features)": timed(lambda: predict_demand(spec, "bench-job", ["a100-80gb"], settings), args.rounds),
            f"placement ({args.profile}, {len(state.gpus)} GPUs)": timed(lambda: place(demand, state, profile), args.rounds),
        }

        def reserve_and_release() -> None:
            fresh = parts.snapshot()
            reservation = parts.reserve(place(demand, fresh, profile), demand, "bench/parts")
            parts.release(reservation)

        cycle = timed(reserve_and_release, args.rounds)
        booked = len(parts.active())

    med = statistics.median
    print(f"\nPod build before creation: {args.nodes} nodes x 8 GPUs, {args.running} running Horus pods, "
          f"{args.rounds} rounds, profile {args.profile} (API server: the test double on 127.0.0.1)\n")
    print(f"| {'operator':<44} | {'median ms':>9} | {'p90 ms':>7} |")
    print(f"|{'-' * 46}|{'-' * 11}|{'-' * 9}|")
    for name, samples in (("KubernetesPodOperator (baseline)", plain_ms), ("HorusKubernetesPodOperator", horus_ms)):
        print(f"| {name:<44} | {med(samples):>9.1f} | {statistics.quantiles(samples, n=10)[-1]:>7.1f} |")
    added = med(horus_ms) - med(plain_ms)
    print(f"| {'added by Horus (difference of medians)':<44} | {added:>9.1f} | {'':>7} |")
    print(f"\nadded latency {added:.1f} ms against the 200 ms target: {'met' if added < 200 else 'NOT met'}; "
          f"ratio {med(horus_ms) / med(plain_ms):.1f}x the plain build\n")
    print(f"| {'part of the Horus build':<44} | {'median ms':>9} |")
    print(f"|{'-' * 46}|{'-' * 11}|")
    for name, samples in breakdown.items():
        print(f"| {name:<44} | {med(samples):>9.2f} |")
    print(f"| {'snapshot + ledger write + release':<44} | {med(cycle):>9.2f} |")
    print(f"\nreservations in the ledger at the end: {booked} (the {args.running} running pods)")


if __name__ == "__main__":
    main()
