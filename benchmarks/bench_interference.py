"""Interference models on Gavel's measured co-location pairs (data/interference_seed, MIT): accuracy on
job types and GPU types neither model saw, for the summed-utilization proxy (the baseline, same run)
and the learned model, and what one prediction costs.

    .venv/bin/python benchmarks/bench_interference.py
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from horus_airflow.features import extract_features
from horus_airflow.features.gpus import GPU_SPECS
from horus_airflow.interference import CoRunner, LearnedInterference, signature
from horus_airflow.interference.evaluation import evaluate_interference, scores_table
from horus_airflow.interference.pairs import read_pairs

PAIRS = Path(__file__).resolve().parent.parent / "data" / "interference_seed" / "gavel_pairs.csv"


def main() -> None:
    pairs = read_pairs(PAIRS)
    print(f"Held-out accuracy on {len(pairs)} measured pairs ({int(pairs['fits'].sum())} ran together)")
    print(scores_table(evaluate_interference(pairs)))
    learned = LearnedInterference().fit(pairs)
    jobs = [CoRunner(60, 66, 4000, signature(extract_features(m, b))) for m, b in (("resnet50", 32), ("lstm_lm", 20), ("resnet18", 64))]
    print("One prediction on a V100 (median of 500 calls)")
    print(f"{'jobs':>5} {'proxy ms':>9} {'learned ms':>11} {'learned/proxy':>14}")
    for count in (2, 3):
        timings = []
        for model in (learned.fallback, learned):
            samples = []
            for _ in range(500):
                started = time.perf_counter()
                model.predict(jobs[:count], GPU_SPECS["v100"])
                samples.append((time.perf_counter() - started) * 1000)
            timings.append(statistics.median(samples))
        print(f"{count:>5} {timings[0]:>9.3f} {timings[1]:>11.3f} {timings[1] / timings[0]:>13.0f}x")


if __name__ == "__main__":
    main()
