"""The predictor's speed and accuracy, each against a baseline measured in the same run.

    .venv/bin/python benchmarks/bench_predictor.py [--gpumemnet PATH/TO/mlp_data_step2.csv] [--rows N]
        [--lucid PATH/TO/Lucid-checkout] [--lucid-gpus v100-32gb rtx3090 a100-40gb]

Tables:
1. Feature extraction plus one prediction on the CPU (meta device), per catalog model at batch 32 (the
   slowest and the median), resnet50 at batch 64 and bert_large at batch 32, against 1 s per model.
2. One prediction with features cached: the trained model against the analytic prior alone, and the
   1 ms target.
3. Transfer on the shipped seed data (data/predictor_seed): every row predicted by models fitted without
   its source, its GPU type, or its family, beside the mean predictor and the prior alone (same
   training rows), with the targets (model MAE <= 0.6 x the mean's on every held-out source; the prior
   below the mean on every one).
4. With --gpumemnet: GPUMemNet's measured MLP runs (A100 40 GB, per that repository's plots), held out
   by architecture pattern, and the prior alone on all of them. That dataset has no licence, so it is
   read from where you keep it and never copied into the project; no shipped model is fitted on it.
5. With --lucid: Lucid's 60 mapped jobs (a source and workloads the seed has not got, non-commercial
   licence, read in place: see benchmarks/lucid.py), predicted by the champion `make demo` trains (every
   seed row), the prior alone and the seed's mean, on each GPU type the artifact might have used (it
   does not say which).
"""

from __future__ import annotations

import argparse
import ast
import re
import statistics
import time
from pathlib import Path

import numpy as np
import pandas as pd
from torch import nn

from horus_airflow.catalog import WORKLOADS, ResolvedWorkload, Workload, resolve
from horus_airflow.catalog.datasets import EnvironmentData
from horus_airflow.features import extract_features
from horus_airflow.features.gpus import GPU_SPECS, gpu_spec
from horus_airflow.features.graph import GraphFeatures, features_of
from horus_airflow.predictor import AnalyticPrior
from horus_airflow.predictor.dataset import COLUMNS, read_training_data, validate
from horus_airflow.predictor.evaluation import SCHEMES, Evaluation, Scores, evaluate, evaluate_source
from horus_airflow.predictor.model import TrainedPredictor, UtilizationModel

from lucid import lucid_jobs  # benchmarks/ is on the path when this file runs

SEED = Path(__file__).resolve().parent.parent / "data" / "predictor_seed" / "predictor_seed.csv"


def timed(call: object) -> float:
    started = time.perf_counter()
    call()  # type: ignore[operator]
    return time.perf_counter() - started


def feature_speed() -> None:
    extract_features("resnet18", 2)  # imports and first-call set-up stay out of the timings
    prior, spec = AnalyticPrior(), [GPU_SPECS["v100"]]

    def features_and_prediction(model: str, batch: int) -> float:
        started = time.perf_counter()
        prior.predict("j", features_of(resolve(model, None), batch, "fp32"), 1, spec)
        return time.perf_counter() - started

    catalog = sorted((features_and_prediction(m, 32), m) for m in WORKLOADS)
    rows = [
        ("resnet50, batch 64", features_and_prediction("resnet50", 64)),
        ("bert_large, batch 32", features_and_prediction("bert_large", 32)),
        (f"catalog median ({len(catalog)} models), batch 32", statistics.median(t for t, _ in catalog)),
        (f"catalog slowest ({catalog[-1][1]}), batch 32", catalog[-1][0]),
    ]
    print("Features plus one prediction, CPU, meta device (nothing cached)")
    print(f"{'what':<44}{'seconds':>9}{'target s':>10}{'target/measured':>17}")
    for what, seconds in rows:
        print(f"{what:<44}{seconds:>9.2f}{1.0:>10.1f}{1.0 / seconds:>16.1f}x")


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
    print(f"{'predictor':<28}{'median ms':>10}{'p99 ms':>9}{'vs prior':>10}{'1 ms target/median':>20}")
    for name, median, p99 in rows:
        print(f"{name:<28}{median:>10.3f}{p99:>9.3f}{median / rows[0][1]:>9.1f}x{1.0 / median:>19.1f}x")


def accuracy(title: str, rows: pd.DataFrame, schemes: tuple[str, ...]) -> Evaluation:
    evaluation = evaluate(rows, schemes=schemes)
    print(f"\n{title}")
    print(evaluation.table(), end="")
    return evaluation


def transfer_targets(evaluation: Evaluation) -> None:
    print("\nTargets on every held-out source and GPU type (utilization)")
    print(f"{'held out':<22}{'model/mean MAE':>16}{'<= 0.6':>8}{'prior/mean MAE':>16}{'< 1':>5}")
    for split in evaluation.scores:
        if split.target != "gpu_util" or split.scheme not in ("source", "gpu") or split.held_out == "all":
            continue
        prior = split.prior.mae / split.mean.mae
        print(f"{split.scheme + ': ' + split.held_out:<22}{split.ratio():>16.2f}{'yes' if split.ratio() <= 0.6 else 'NO':>8}"
              f"{prior:>16.2f}{'yes' if prior < 1 else 'NO':>5}")


def prior_alone(title: str, rows: pd.DataFrame) -> None:
    prior = AnalyticPrior()
    predicted = [prior.predict_one(GraphFeatures.from_mapping(r), gpu_spec(r["gpu_type"])) for _, r in rows.iterrows()]
    print(f"\n{title}")
    print(f"{'target':<14}{'rows':>6}{'prior MAE':>11}{'mean MAE':>10}{'prior MAPE':>12}{'mean MAPE':>11}")
    for target, values in (("gpu_util", [p.util for p in predicted]), ("gpu_mem_mib", [p.mem_mib for p in predicted])):
        truth = rows[target].to_numpy(dtype=float)
        scores, mean = Scores.of(truth, np.array(values)), Scores.of(truth, np.full(len(truth), truth.mean()))
        print(f"{target:<14}{scores.n:>6}{scores.mae:>11.1f}{mean.mae:>10.1f}{scores.mape:>11.1f}%{mean.mape:>10.1f}%")
    print("(the mean predictor here knows the very rows it is scored on: a lower bound of a constant's error)")


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


def lucid_transfer(checkout: Path, gpus: list[str], seed: pd.DataFrame) -> None:
    for gpu in gpus:
        evaluation = evaluate_source(seed, lucid_jobs(checkout, gpu), f"lucid on {gpu}")
        print(f"\nLucid's jobs, held out, taken to have run on {gpu}: the champion fitted on every seed row")
        print(evaluation.table(), end="")
        split = evaluation.split("source", f"lucid on {gpu}", "gpu_util")
        prior = split.prior.mae / split.mean.mae
        print(f"targets: model/mean MAE {split.ratio():.2f} (<= 0.6: {'yes' if split.ratio() <= 0.6 else 'NO'}), "
              f"prior/mean {prior:.2f} (< 1: {'yes' if prior < 1 else 'NO'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpumemnet", type=Path, help="GPUMemNet's mlp_data_step2.csv (read in place, never copied)")
    parser.add_argument("--rows", type=int, default=1000, help="GPUMemNet rows to sample (0 = all 3,000)")
    parser.add_argument("--lucid", type=Path, help="a checkout of S-Lab-System-Group/Lucid (read in place, never copied)")
    parser.add_argument("--lucid-gpus", nargs="+", default=["v100-32gb", "rtx3090", "a100-40gb"],
                        help="GPU types to score Lucid's rows on (its artifact does not name one)")
    args = parser.parse_args()
    feature_speed()
    seed = read_training_data(SEED).rows
    prediction_speed(UtilizationModel().fit(seed))
    evaluation = accuracy(f"Transfer on the seed data ({len(seed)} measured jobs, P100 and V100)", seed, tuple(SCHEMES))
    transfer_targets(evaluation)
    if args.gpumemnet:
        started = time.perf_counter()
        rows = gpumemnet_rows(args.gpumemnet, args.rows)
        print(f"\n(GPUMemNet: features of {len(rows)} MLPs in {time.perf_counter() - started:.1f} s)")
        prior_alone(f"GPUMemNet ({len(rows)} MLP runs, A100 40 GB): the prior alone, fitted on nothing", rows)
        accuracy(f"GPUMemNet ({len(rows)} MLP runs), one held-out architecture pattern per fold", rows, ("family",))
    if args.lucid:
        lucid_transfer(args.lucid, args.lucid_gpus, seed)


if __name__ == "__main__":
    main()
