"""Lucid's measured jobs and pairs (ASPLOS '23 artifact, github.com/S-Lab-System-Group/Lucid), read in
place from a checkout you keep, as rows the benchmarks score. Its S-Lab License 1.0 allows non-commercial
use only, so nothing of it is copied into the project and no shipped model is fitted on it: it is a
source the models never saw.

Files read: ``simulation/analyzer/single_data.csv`` (66 jobs alone: model, dataset, batch size, AMP,
mean GPU utilization, GPU memory in MiB) and ``simulation/data/colocate_info.csv`` (1,388 single-GPU
pairs: each job's speed next to the other, as a fraction of its speed alone).

Each Lucid workload maps to the catalog graph its profiling script (``workloads/*/profile_*.py``) builds:

| Lucid | catalog | why |
|---|---|---|
| BERT / SQuAD | bert_base / squad | ``bert-base-uncased``, 384 tokens |
| DCGAN / LSUN | dcgan / lsun | 64 px (``FakeData`` through a loader) |
| LSTM / Wikitext2 | lstm_lm_small / wikitext2 | 200 wide, 2 layers, 35 tokens |
| MobileNetV2 / CIFAR-10 | mobilenet_v2_cifar / cifar10 | pytorch-cifar's model |
| MobileNetV3 / ImageNet | mobilenet_v3_small / imagenet, no input pipeline | ``torchvision.models``; one random batch kept on the GPU |
| NeuMF / MovieLens | ncf / movielens | |
| PPO / LunarLander | ppo / lunarlander | |
| PointNet / ShapeNet | pointnet / shapenet | |
| ResNet18 / CIFAR-10 | resnet18_cifar / cifar10 | pytorch-cifar's model |
| ResNet50 / ImageNet | resnet50 / imagenet, no input pipeline | as MobileNetV3 |
| TD3 / BipedalWalker | td3 / bipedalwalker | |
| Transformer / Multi30k | transformer_base / multi30k | d_model 512, 6 layers |
| VGG / CIFAR-10 | vgg11_cifar / cifar10 | ``VGG('VGG11')`` |

EfficientNet / CIFAR-10 (6 jobs, 210 pairs) is left out: pytorch-cifar's EfficientNetB0 is its own
simplified network (3x3 depthwise everywhere, no 1280 head), which the catalog does not have.

The artifact does not say which GPU ran the profiles, so every row is scored on a GPU type the caller
names; the benchmarks report each candidate they are given.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pandas as pd

from horus_airflow.catalog import resolve
from horus_airflow.features.graph import GraphFeatures, features_of
from horus_airflow.interference.pairs import PAIR_COLUMNS, pair_row
from horus_airflow.predictor import AnalyticPrior
from horus_airflow.predictor.dataset import COLUMNS, validate

JOBS_FILE = Path("simulation/analyzer/single_data.csv")
PAIRS_FILE = Path("simulation/data/colocate_info.csv")
# Lucid's (model, dataset) -> (catalog model, catalog dataset, whether the job read its input from a pipeline)
LUCID_WORKLOADS = {
    ("BERT", "SQuAD"): ("bert_base", "squad", True),
    ("DCGAN", "LSUN"): ("dcgan", "lsun", True),
    ("LSTM", "Wikitext2"): ("lstm_lm_small", "wikitext2", True),
    ("MobileNetV2", "CIFAR-10"): ("mobilenet_v2_cifar", "cifar10", True),
    ("MobileNetV3", "ImageNet"): ("mobilenet_v3_small", "imagenet", False),
    ("NeuMF", "MovieLens"): ("ncf", "movielens", True),
    ("PPO", "LunarLander"): ("ppo", "lunarlander", True),
    ("PointNet", "ShapeNet"): ("pointnet", "shapenet", True),
    ("ResNet18", "CIFAR-10"): ("resnet18_cifar", "cifar10", True),
    ("ResNet50", "ImageNet"): ("resnet50", "imagenet", False),
    ("TD3", "BipedalWalker"): ("td3", "bipedalwalker", True),
    ("Transformer", "Multi30k"): ("transformer_base", "multi30k", True),
    ("VGG", "CIFAR-10"): ("vgg11_cifar", "cifar10", True),
}


@functools.cache
def _features(model: str, dataset: str, batch_size: int, amp: int) -> GraphFeatures | None:
    """Counted once per (workload, batch, AMP) in a run: the pairs repeat a few dozen jobs, on every GPU."""
    if (model, dataset) not in LUCID_WORKLOADS:
        return None
    name, data, has_pipeline = LUCID_WORKLOADS[(model, dataset)]
    features = features_of(resolve(name, data), batch_size, "amp" if amp else "fp32")
    return features if has_pipeline else dataclasses.replace(features, host_us_per_sample=0.0)


def lucid_jobs(checkout: Path, gpu: str) -> pd.DataFrame:
    """Lucid's jobs alone as predictor rows on ``gpu`` (``origin`` lucid); unmapped workloads are left out."""
    raw = pd.read_csv(checkout / JOBS_FILE)
    rows = []
    for _, job in raw.iterrows():
        features = _features(job["model"], job["dataset"], int(job["batchsize"]), int(job["amp"]))
        if features is None:
            continue
        rows.append({"origin": "lucid", "origin_ref": f"{job['model']}/{job['dataset']}/b{job['batchsize']}/amp{job['amp']}",
                     "gpu_type": gpu, **dataclasses.asdict(features), "gpu_util": job["gpu_util"], "gpu_util_p90": None,
                     "gpu_mem_mib": job["gmem"]})
    return validate(pd.DataFrame(rows, columns=list(COLUMNS))).rows


def lucid_pairs(checkout: Path, gpu: str) -> pd.DataFrame:
    """Lucid's co-located pairs as interference pairs on ``gpu``, both orders of each measured pair."""
    raw = pd.read_csv(checkout / PAIRS_FILE)
    prior, rows = AnalyticPrior(), []
    for _, pair in raw.iterrows():
        sides = []
        for n in ("1", "2"):
            features = _features(pair[f"model{n}"], pair[f"dataset{n}"], int(pair[f"batchsize{n}"]), int(pair[f"amp{n}"]))
            name = f"{pair[f'model{n}']} (batch size {pair[f'batchsize{n}']}, amp {pair[f'amp{n}']})"
            sides.append((name, str(pair[f"model{n}"]), features, float(pair[f"speed{n}"])))
        if any(features is None for _, _, features, _ in sides):
            continue
        for a, b in ((0, 1), (1, 0)):
            rows.append(pair_row(gpu, (sides[a][:3], sides[b][:3]), sides[a][3], prior))  # type: ignore[arg-type]
    return pd.DataFrame(rows, columns=list(PAIR_COLUMNS))
