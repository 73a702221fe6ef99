"""The evaluation behind docs/EVALUATION.md: every profile on several Philly traces and cluster sizes,
on the same jobs, with measured ground truth. Run it with ``make evaluate``.

Writes ``evaluation/results.json`` and one PNG per scenario under ``evaluation/``, and prints, per
scenario, the comparison table and the headline ratios: horus-paper against exclusive (the paper's
claims) and horus-ml against horus-paper (the project's target: at least 10 % lower mean JCT at no worse
p95 slowdown and no more OOM crashes).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from horus_airflow.simulator.engine import Cluster
from horus_airflow.simulator.metrics import comparison_table
from horus_airflow.simulator.report import plot
from horus_airflow.simulator.runner import run_simulation

TRACES = Path(__file__).resolve().parent.parent / "data" / "traces"
PROFILES = ["exclusive", "gandiva-pack", "horus-paper", "horus-ml"]
# (trace, format, nodes of 8 V100s, arrival scale): Philly VCs with Gavel job types (measured truth) and
# Muri's model mix (truth from a model fitted on V100 pairs only); arrivals compressed to load the cluster.
SCENARIOS = [
    ("gavel/7f04ca.trace", "gavel", 4, 2.0),
    ("gavel/0e4a51.trace", "gavel", 4, 4.0),
    ("gavel/2869ce.trace", "gavel", 2, 4.0),
    ("muri/trace1.csv", "muri", 8, 1.0),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("evaluation"))
    args = parser.parse_args()
    results = {}
    for trace, fmt, nodes, scale in SCENARIOS:
        started = time.perf_counter()
        report = run_simulation(TRACES / trace, fmt, Cluster(nodes, 8, "v100"), PROFILES, arrival_scale=scale)
        name = f"{Path(trace).stem}-{nodes}x8-v100-x{scale:g}"
        by_profile = {m.profile: m for m in report.results}
        paper, exclusive, ml = by_profile["horus-paper"], by_profile["exclusive"], by_profile["horus-ml"]
        print(f"\n=== {name}: {report.results[0].finished} jobs, {sum(report.results[0].skipped_reasons.values())} skipped "
              f"({report.results[0].skipped_reasons}); {time.perf_counter() - started:.0f} s")
        print(comparison_table(report.results))
        print(f"horus-paper vs exclusive: GPU busy {paper.gpu_util / exclusive.gpu_util - 1:+.1%}, work rate "
              f"{paper.work_rate / exclusive.work_rate - 1:+.1%}, makespan {paper.makespan_s / exclusive.makespan_s - 1:+.1%}, "
              f"mean wait {paper.avg_wait_s / exclusive.avg_wait_s - 1:+.1%}")
        print(f"horus-ml vs horus-paper: mean JCT {ml.avg_jct_s / paper.avg_jct_s - 1:+.1%}, mean slowdown "
              f"{ml.avg_slowdown:.2f} vs {paper.avg_slowdown:.2f}, p95 slowdown {ml.p95_slowdown:.2f} vs {paper.p95_slowdown:.2f}, "
              f"OOM {ml.oom_events} vs {paper.oom_events}")
        results[name] = {**report.as_json(), "trace": f"data/traces/{trace}"}  # no path of this machine
        plot(report, args.out / f"{name}.png")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    print(f"\nwrote {args.out / 'results.json'} and the plots")


if __name__ == "__main__":
    main()
