"""CPU the `horus run` sampler costs (target: under 1 % of one core at the default 200 ms interval).

The wrapped job is `sleep`: it uses no CPU, so everything the wrapping process spends is the sampler
(psutil over the job's process tree, plus NVML where a GPU exists; this machine may have none, which
the table says). Baseline, in the same run: the same job waited on with `subprocess.run`, no sampling.

    .venv/bin/python benchmarks/bench_telemetry.py [--seconds 20]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import tempfile
import time
from pathlib import Path

from horus_airflow.telemetry import nvml, run


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(fn, seconds: float) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    cpu, wall = cpu_seconds(), time.perf_counter()
    fn(seconds)
    return cpu_seconds() - cpu, time.perf_counter() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    gpu = "NVML, " + ", ".join(g.name for g in nvml.discover_gpus()) if nvml.init() else "no NVML here: CPU and host memory only"
    rows = [("subprocess.run, no sampling (baseline)", *measure(lambda s: subprocess.run(["sleep", str(s)], check=True), args.seconds))]
    for interval in (1.0, 0.2, 0.1):
        with tempfile.TemporaryDirectory() as tmp:
            rows.append((f"horus run, every {interval * 1000:.0f} ms", *measure(lambda s, i=interval, d=tmp: run(["sleep", str(s)], Path(d), i), args.seconds)))
    base_share = rows[0][1] / rows[0][2]
    print(f"\nSampler CPU over a {args.seconds:.0f} s job ({gpu})\n")
    print(f"| {'wrapper':<40} | {'CPU s':>6} | {'% of one core':>13} | {'over baseline':>13} |")
    print(f"|{'-' * 42}|{'-' * 8}|{'-' * 15}|{'-' * 15}|")
    for name, cpu, wall in rows:
        share = cpu / wall
        print(f"| {name:<40} | {cpu:>6.3f} | {share * 100:>12.3f}% | {(share - base_share) * 100:>12.3f}% |")
    default = rows[2][1] / rows[2][2] - base_share
    print(f"\nat 200 ms the sampler costs {default * 100:.3f} % of one core: target 1 % {'met' if default < 0.01 else 'NOT met'}")


if __name__ == "__main__":
    main()
