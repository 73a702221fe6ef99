"""The predictor's speed and accuracy, each against a baseline measured in the same run.

    .venv/bin/python benchmarks/bench_predictor.py [--gpumemnet PATH/TO/mlp_data_step2.csv] [--rows N]

Tables:
1. Feature extraction on the CPU (meta device): resnet50 at batch 64, bert_large at batch 32 and the
   whole catalog at batch 32, against the issue's targets (2 s, 5 s, 60 s).
2. One prediction with features cached: the trained model against the analytic prior alone, and the
   5 ms target.
3. Accuracy on the shipped seed data (data/predictor_seed), held out by model family: the analytic prior
   and the trained model, per target and family, next to the paper's utilization RMSLE (0.154).
4. With --gpumemnet: the same evaluation on GPUMemNet's 3,000 measured MLP runs, held out by
   architecture pattern. That dataset has no licence, so it is read from where you keep it and never
   copied into the project; its GPU model is not stated, so every row gets one spec (a100-40gb) and
   the spec features cannot help the model there.
"""

from __future__ import annotations

import argparse
import ast
import re
import statistics
import time
from pathlib import Path

import pandas as pd
from torch import nn

from horus_airflow.catalog import WORKLOADS, ResolvedWorkload, Workload
from horus_airflow.catalog.datasets import EnvironmentData
from horus_airflow.features import extract_features
from horus_airflow.features.gpus import GPU_SPECS
from horus_airflow.features.graph import features_of
from horus_airflow.predictor import AnalyticPrior
from horus_airflow.predictor.dataset import COLUMNS, read_training_data, validate
from horus_airflow.predictor.evaluation import PAPER_UTIL_RMSLE, evaluate
from horus_airflow.predictor.model import TrainedPredictor, UtilizationModel

SEED = Path(__file__).resolve().parent.parent / "data" / "predictor_seed" / "predictor_seed.csv"


def timed(call: object) -> float:
    started = time.perf_counter()
    call()  # type: ignore[operator]
    return time.perf_counter() - started


def feature_speed() -> None:
    extract_features("resnet18", 2)  # imports and first-call set-up stay out of the timings
    rows = [
        ("resnet50, batch 64", timed(lambda: extract_features("resnet50", 64)), 2.0),
        ("bert_large, batch 32", timed(lambda: extract_features("bert_large", 32)), 5.0),
        (f"whole catalog ({len(WORKLOADS)} models), batch 32",
         timed(lambda: [extract_features(m, 32) for m in WORKLOADS]), 60.0),
    ]
    print("Feature extraction, CPU, meta device (first call per key: nothing cached)")
    print(f"{'what':<40}{'seconds':>9}{'target s':>10}{'target/measured':>17}")
    for what, seconds, target in rows:
        print(f"{what:<40}{seconds:>9.2f}{target:>10.1f}{target / seconds:>16.1f}x")


def prediction_speed(model: UtilizationModel) -> None:
    features = extract_features("resnet50", 64)
    specs = [GPU_SPECS["v100"]]
    trained, prior = TrainedPredictor(model, "bench"), AnalyticPrior()
    rows = []
    for name, predictor in (("analytic prior (baseline)", prior), ("trained LightGBM model", trained)):
        for _ in range(50):
            predictor.predict("j", features, 1, specs)
        samples = []
        for _ in range(1000):
            started = time.perf_counter()
            predictor.predict("j", features, 1, specs)
            samples.append((time.perf_counter() - started) * 1000)
        samples.sort()
        rows.append((name, statistics.median(samples), samples[int(0.99 * len(samples))]))
    print("\nOne prediction, features cached, one GPU type (1,000 calls)")
    print(f"{'predictor':<28}{'median ms':>10}{'p99 ms':>9}{'vs prior':>10}{'5 ms target/median':>20}")
    for name, median, p99 in rows:
        print(f"{name:<28}{median:>10.3f}{p99:>9.3f}{median / rows[0][1]:>9.1f}x{5.0 / median:>19.1f}x")


def accuracy(title: str, rows: pd.DataFrame, folds: int = 0) -> None:
    evaluation = evaluate(rows, folds=folds)
    print(f"\n{title}")
    print(evaluation.table(), end="")
    util = evaluation.overall("gpu_util")
    print(f"utilization RMSLE: model {util.model.rmsle:.3f}, prior {util.prior.rmsle:.3f}, paper {PAPER_UTIL_RMSLE} "
          f"(model/prior {util.model.rmsle / util.prior.rmsle:.2f}x)")


_ARCH = re.compile(r"arch:([a-z]+)")


def gpumemnet_rows(path: Path, limit: int) -> pd.DataFrame:
    raw = pd.read_csv(path)
    raw = raw.sample(n=min(limit, len(raw)), random_state=7) if limit else raw
    rows = []
    for _, run in raw.iterrows():
        layers = ast.literal_eval(run["Activations-Params"])
        _, inputs, outputs = _mlp(layers)
        data = EnvironmentData("gpumemnet-vector", (inputs,), outputs, host_us_per_sample=4.0)
        arch = _ARCH.search(run["Filename"]).group(1)
        workload = Workload(f"mlp-{arch}", arch, ("state",), data.name, lambda _d, layers=layers: _mlp(layers)[0],
                            optimizer="adam")
        features = features_of(ResolvedWorkload(workload, data), int(run["Batch Size"]), "fp32")
        rows.append({"origin": "gpumemnet", "origin_ref": run["Filename"], "gpu_type": "a100-40gb",
                     **features.__dict__, "gpu_util": run["Avg GPUTL"], "gpu_util_p90": None,
                     "gpu_mem_mib": run["Max GPU Memory (MiB)"]})
    return validate(pd.DataFrame(rows, columns=list(COLUMNS))).rows


def _mlp(layers: list[tuple[str, int, int]]) -> tuple[nn.Module, int, int]:
    """Rebuild a GPUMemNet MLP from its (layer, activations, parameters) list on the meta device."""
    modules: list[nn.Module] = []
    inputs = width = None
    for kind, activations, params in layers:
        if kind == "linear":
            fan_in = (params - activations) // activations
            inputs = inputs or fan_in
            modules.append(nn.Linear(fan_in, activations))
            width = activations
        elif kind == "batch_normalization":
            modules.append(nn.BatchNorm1d(activations))
        elif kind == "dropout":
            modules.append(nn.Dropout(0.2))
        elif kind == "Softmax":
            modules.append(nn.Softmax(dim=1))
        else:
            modules.append(getattr(nn, kind)())
    return nn.Sequential(*modules), int(inputs or 1), int(width or 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpumemnet", type=Path, help="GPUMemNet's mlp_data_step2.csv (read in place, never copied)")
    parser.add_argument("--rows", type=int, default=1000, help="GPUMemNet rows to sample (0 = all 3,000)")
    args = parser.parse_args()
    feature_speed()
    seed = read_training_data(SEED).rows
    prediction_speed(UtilizationModel().fit(seed))
    accuracy(f"Accuracy on the seed data ({len(seed)} measured jobs, P100 and V100), one held-out family per fold", seed)
    if args.gpumemnet:
        started = time.perf_counter()
        rows = gpumemnet_rows(args.gpumemnet, args.rows)
        print(f"\n(GPUMemNet: features of {len(rows)} MLPs in {time.perf_counter() - started:.1f} s)")
        accuracy(f"Accuracy on GPUMemNet ({len(rows)} MLP runs), one held-out architecture pattern per fold", rows)


if __name__ == "__main__":
    main()
