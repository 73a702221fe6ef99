"""Interference models on Gavel's measured co-location pairs (data/interference_seed, MIT): accuracy on
job types and GPU types neither model saw, for the summed-utilization proxy (the baseline, same run)
and the learned model, and what one prediction costs. With --lucid, also on Lucid's measured pairs (a
source and GPU neither model saw; non-commercial licence, read in place: see benchmarks/lucid.py), both
models fitted on every Gavel pair, on each GPU type the artifact might have used.

    .venv/bin/python benchmarks/bench_interference.py [--lucid PATH/TO/Lucid-checkout] [--lucid-gpus ...]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from horus_airflow.features import extract_features
from horus_airflow.features.gpus import GPU_SPECS
from horus_airflow.interference import CoRunner, LearnedInterference, signature
from horus_airflow.interference.evaluation import evaluate_interference, evaluate_source, scores_table
from horus_airflow.interference.pairs import read_pairs
from lucid import lucid_pairs  # benchmarks/ is on the path when this file runs

PAIRS = Path(__file__).resolve().parent.parent / "data" / "interference_seed" / "gavel_pairs.csv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lucid", type=Path, help="a checkout of S-Lab-System-Group/Lucid (read in place, never copied)")
    parser.add_argument("--lucid-gpus", nargs="+", default=["v100-32gb", "rtx3090", "a100-40gb"],
                        help="GPU types to score Lucid's pairs on (its artifact does not name one)")
    args = parser.parse_args()
    pairs = read_pairs(PAIRS)
    print(f"Held-out accuracy on {len(pairs)} measured pairs ({int(pairs['fits'].sum())} ran together)")
    print(scores_table(evaluate_interference(pairs)))
    if args.lucid:
        lucid = [evaluate_source(pairs, lucid_pairs(args.lucid, gpu), f"lucid on {gpu}") for gpu in args.lucid_gpus]
        print("Lucid's pairs, held out (both models fitted on every Gavel pair)")
        print(scores_table(lucid))
    learned = LearnedInterference().fit(pairs)
    # Gavel's own jobs, so the boosters answer (a job unlike them gets the time-sharing law, which costs less)
    jobs = [CoRunner(60, 66, 4000, signature(extract_features(m, b, d)))
            for m, b, d in (("resnet50", 32, "imagenet"), ("lstm_lm_small", 20, "wikitext2"), ("resnet18_cifar", 64, "cifar10"))]
    assert not learned.predict(jobs, GPU_SPECS["v100"]).note, "the timed jobs must be ones the boosters answer for"
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
