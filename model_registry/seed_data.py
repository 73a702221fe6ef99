"""Build the predictor's seed training data (``data/predictor_seed/predictor_seed.csv``) from public
measurements whose licence lets the project ship derived data (Apache-2.0, see that folder's README).

    python model_registry/seed_data.py --shared ../shared/data --out data/predictor_seed/predictor_seed.csv

Sources and how each becomes a row of the schema in ``horus_airflow/predictor/dataset.py``:

- Alnair ``Dataset.csv`` (Tesla P100, TensorFlow, 49 runs): ``gpu_util`` is the midpoint of the
  measured maximum and minimum utilization, ``gpu_util_p90`` the measured maximum (an upper bound of
  the p90). Its memory column is TensorFlow's allocator reservation, not the job's need, so
  ``gpu_mem_mib`` stays empty. Keras models map to the nearest catalog graph (NASNet-Mobile to
  MnasNet, the segmentation model to the catalog U-Net); GTSRB images are taken at 75x75, the smallest
  size every one of its Keras models accepts.
- Muri's Philly traces (V100, single-GPU jobs): per model, the GPU stage's share of a solo iteration's
  time (``resource_time_1 / iteration_time``) as ``gpu_util``; nothing else.

Rows are written with the current feature extractor: rerun this script when features change.
"""

from __future__ import annotations

import argparse
import glob
import re
from dataclasses import asdict
from pathlib import Path

import pandas as pd
from horus_airflow.catalog import DATASETS, ResolvedWorkload, Workload, resolve
from horus_airflow.catalog.language import Bert, TransformerSize
from horus_airflow.features.graph import GraphFeatures, features_of
from horus_airflow.predictor.dataset import COLUMNS

ALNAIR_MODELS = {
    "MobileNet": ("mobilenet_v1", "gtsrb"),
    "Nasnet_Mobile": ("mnasnet", "gtsrb"),
    "EfficientNet_v2": ("efficientnet_v2_s", "gtsrb"),
    "ResNet50": ("resnet50", "gtsrb"),
    "Inception_v3": ("inception_v3", "gtsrb"),
    "DCGAN": ("dcgan", "mnist"),
    "Image Segmentation": ("unet", "oxford_pet"),
    "Reinforcement Learning": ("dqn", "cartpole"),
}
MURI_MODELS = {
    "resnet18": ("resnet18", "imagenet"),
    "shufflenet_v2_x1_0": ("shufflenet_v2_x1_0", "imagenet"),
    "vgg16": ("vgg16", "imagenet"),
    "vgg19": ("vgg19", "imagenet"),
    "bert": ("bert_base", "squad"),
    "gpt2": ("gpt2_small", "wikitext103"),
    "a2c": ("a2c", "atari"),
    "dqn": ("dqn", "atari"),
}
_SMALL_BERT = re.compile(r"L-(\d+)_H-(\d+)_A-(\d+)")


def alnair_rows(path: Path) -> list[dict[str, object]]:
    rows = []
    for _, run in pd.read_csv(path).iterrows():
        name = str(run["Model"]).strip()
        bert = _SMALL_BERT.search(name)
        batch = int(run["BS"])
        if bert:
            layers, hidden, heads = (int(g) for g in bert.groups())
            features = _small_bert_features(layers, hidden, heads, batch)
        else:
            model, dataset = ALNAIR_MODELS[name]
            features = features_of(resolve(model, dataset), batch, "fp32")
        high, low = float(run["MGUP"]), float(run["Min_GPU_Util_%"])
        rows.append(_row("alnair", f"ID={run['ID']}", "p100", features, (high + low) / 2, high, None))
    return rows


def muri_rows(folder: Path) -> list[dict[str, object]]:
    trace = pd.concat([pd.read_csv(f) for f in sorted(glob.glob(str(folder / "*.csv")))], ignore_index=True)
    solo = trace[trace["num_gpu"] == 1]
    rows = []
    for (name, batch), group in solo.groupby(["model_name", "batch_size"]):
        profile = group.iloc[0]
        model, dataset = MURI_MODELS[str(name)]
        features = features_of(resolve(model, dataset), int(batch), "fp32")
        share = 100.0 * float(profile["resource_time_1"]) / float(profile["iteration_time"])
        rows.append(_row("muri", f"{name}/b{batch}", "v100", features, min(share, 100.0), None, None))
    return rows


def _small_bert_features(layers: int, hidden: int, heads: int, batch: int) -> GraphFeatures:
    size = TransformerSize(layers, hidden, heads, 30522, 512)
    workload = Workload(f"bert_L{layers}_H{hidden}_A{heads}", "bert", ("text",), "imdb",
                        lambda data: Bert(data, size), optimizer="adam", vocab=30522)  # type: ignore[arg-type]
    return features_of(ResolvedWorkload(workload, DATASETS["imdb"]), batch, "fp32")


def _row(origin: str, ref: str, gpu: str, features: GraphFeatures, util: float, p90: float | None,
         mem: float | None) -> dict[str, object]:
    return {"origin": origin, "origin_ref": ref, "gpu_type": gpu, **asdict(features),
            "gpu_util": round(util, 3), "gpu_util_p90": p90, "gpu_mem_mib": mem}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shared", type=Path, required=True, help="folder holding alnair_gpu_util/ and muri_philly_traces/")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = alnair_rows(args.shared / "alnair_gpu_util" / "Dataset.csv") + muri_rows(args.shared / "muri_philly_traces")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(args.out, index=False)
    print(f"wrote {len(rows)} rows to {args.out}")


if __name__ == "__main__":
    main()
