"""Build the interference models' training pairs (``data/interference_seed/gavel_pairs.csv``) from
Gavel's measured co-location throughputs (MIT licence, see that folder's README).

    python model_registry/interference_data.py --shared ../shared/data --out data/interference_seed/gavel_pairs.csv

Also writes ``gavel_isolated.csv``: each job type's measured steps per second alone, per GPU type and
GPU count (the simulator turns a trace's step counts into runtimes with it).

One row per ordered single-GPU pair on K80, P100 and V100 (consolidated placement; multi-GPU pairs were
never measured). ``speed_a`` = A's throughput next to B / A alone; ``fits`` is False where the measured
throughput is zero (the pair could not run together), and ``speed_a`` is then empty. Each Gavel job
type maps to the catalog graph Gavel trained; the predicted demand columns are the analytic prior's on
that GPU, so the training data does not depend on which predictor version is champion.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from horus_airflow.features import extract_features
from horus_airflow.features.graph import GraphFeatures
from horus_airflow.interference.pairs import PAIR_COLUMNS, pair_row
from horus_airflow.predictor import AnalyticPrior
from horus_airflow.simulator.workloads import gavel_workload


def job_side(job_type: str) -> tuple[str, str, GraphFeatures]:
    workload = gavel_workload(job_type)
    return job_type, job_type.split(" (")[0].strip(), extract_features(workload.model, workload.batch_size, workload.dataset)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shared", type=Path, required=True, help="folder holding gavel_colocation/")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    raw = pd.read_csv(args.shared / "gavel_colocation" / "gavel_pair_throughputs.csv")
    pairs = raw[(raw["placement"] == "consolidated") & (raw["scale_factor"] == 1) & (raw["colocated_scale_factor"] == 1)]
    prior, sides = AnalyticPrior(), {}
    rows = []
    for _, pair in pairs.iterrows():
        for job in (pair["job_type"], pair["colocated_job_type"]):
            if job not in sides:
                sides[job] = job_side(job)
        ran = pair["throughput"] > 0
        rows.append(pair_row(pair["gpu_type"], (sides[pair["job_type"]], sides[pair["colocated_job_type"]]),
                             pair["throughput"] / pair["isolated_throughput"] if ran else None, prior))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=list(PAIR_COLUMNS)).to_csv(args.out, index=False)
    print(f"wrote {len(rows)} pairs ({sum(r['fits'] for r in rows)} ran together) to {args.out}")
    alone = raw[(raw["placement"] == "consolidated") & raw["colocated_job_type"].isna()]
    isolated = alone[["gpu_type", "job_type", "scale_factor", "throughput"]].rename(columns={"throughput": "steps_per_s"})
    target = args.out.parent / "gavel_isolated.csv"
    isolated.to_csv(target, index=False)
    print(f"wrote {len(isolated)} isolated throughputs to {target}")


if __name__ == "__main__":
    main()
