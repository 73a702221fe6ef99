"""Host work per sample of each dataset's canonical input pipeline, measured on this machine, against the
catalog's assumption (``host_us_per_sample`` in horus_airflow/catalog/datasets.py).

The prior adds a job's loading time to its step time, so a pipeline it underestimates makes a host-bound
job look busy (Lucid's PointNet: measured 6-12 % busy, predicted ~90 %). This measures, in one process
(one loader worker), what the reference training scripts do per sample:

| dataset | pipeline (the reference script it follows) |
|---|---|
| mnist | 28x28 grey array -> PIL -> ToTensor -> Normalize (pytorch/examples mnist) |
| cifar10 | 32x32 array -> PIL -> RandomCrop(32, 4) -> flip -> ToTensor -> Normalize (kuangliu/pytorch-cifar) |
| imagenet | 500x375 JPEG decoded -> RandomResizedCrop(224) -> flip -> ToTensor -> Normalize (pytorch/examples imagenet) |
| lsun | 256x256 JPEG decoded -> Resize(64) -> CenterCrop(64) -> ToTensor -> Normalize (pytorch/examples dcgan) |
| coco | 640x480 JPEG decoded -> ToTensor |
| oxford_pet | 500x375 JPEG and PNG trimap decoded -> Resize(128) both -> ToTensor (the TensorFlow segmentation tutorial Alnair ran) |
| horse2zebra | 256x256 JPEG decoded -> Resize(286) -> RandomCrop(256) -> flip -> ToTensor -> Normalize (junyanz/pytorch-CycleGAN-and-pix2pix) |
| gtsrb | 50x50 PPM decoded -> Resize(75x75) -> ToTensor |
| shapenet | 2,500 xyz points and 2,500 labels parsed from text (np.loadtxt), 2,500 resampled, centred and scaled (fxia22/pointnet.pytorch) |

Images are synthetic (smooth gradients plus noise, so JPEG sizes are near natural photos'); nothing is
downloaded. Each figure is CPU time (``time.process_time``) of one process on one thread, so another
process on a shared machine does not inflate it; a cluster's CPU and its worker count scale it.

    .venv/bin/python benchmarks/bench_input_pipeline.py [--samples 200] [--repeats 5]
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torchvision import transforms

from horus_airflow.catalog.datasets import DATASETS

_MEAN, _STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _photo(width: int, height: int, rng: np.random.Generator) -> np.ndarray:
    ramp = np.add.outer(np.linspace(0, 160, height), np.linspace(0, 80, width))
    noise = rng.normal(0, 12, (height, width, 3))
    return np.clip(ramp[..., None] + noise + rng.uniform(0, 60, 3), 0, 255).astype(np.uint8)


def _jpeg(width: int, height: int, rng: np.random.Generator) -> bytes:
    encoded = io.BytesIO()
    Image.fromarray(_photo(width, height, rng)).save(encoded, format="JPEG", quality=90)
    return encoded.getvalue()


def _pipelines(workdir: Path, rng: np.random.Generator) -> dict[str, Callable[[], object]]:
    normalize = transforms.Normalize(_MEAN, _STD)
    digit = rng.integers(0, 255, (28, 28), dtype=np.uint8)
    mnist = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    tiny = _photo(32, 32, rng)
    cifar = transforms.Compose([transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip(),
                                transforms.ToTensor(), normalize])
    imagenet_jpeg = _jpeg(500, 375, rng)
    imagenet = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                                   transforms.ToTensor(), normalize])
    lsun_jpeg = _jpeg(256, 256, rng)
    lsun = transforms.Compose([transforms.Resize(64), transforms.CenterCrop(64), transforms.ToTensor(), normalize])
    coco_jpeg = _jpeg(640, 480, rng)
    pet_jpeg = _jpeg(500, 375, rng)
    trimap = io.BytesIO()
    Image.fromarray(rng.integers(1, 4, (375, 500), dtype=np.uint8), mode="L").save(trimap, format="PNG")
    pet_resize = transforms.Resize((128, 128))
    zebra_jpeg = _jpeg(256, 256, rng)
    zebra = transforms.Compose([transforms.Resize(286), transforms.RandomCrop(256), transforms.RandomHorizontalFlip(),
                                transforms.ToTensor(), transforms.Normalize((0.5,) * 3, (0.5,) * 3)])
    sign = io.BytesIO()
    Image.fromarray(_photo(50, 50, rng)).save(sign, format="PPM")
    gtsrb = transforms.Compose([transforms.Resize((75, 75)), transforms.ToTensor()])
    points, labels = workdir / "cloud.pts", workdir / "cloud.seg"
    np.savetxt(points, rng.normal(0, 0.3, (2500, 3)), fmt="%.5f")
    np.savetxt(labels, rng.integers(1, 5, 2500), fmt="%d")

    def shapenet() -> np.ndarray:
        cloud = np.loadtxt(points).astype(np.float32)
        np.loadtxt(labels).astype(np.int64)
        cloud = cloud[rng.choice(len(cloud), 2500, replace=True)]
        cloud -= cloud.mean(axis=0)
        return cloud / np.max(np.sqrt((cloud ** 2).sum(axis=1)))

    def decoded(data: bytes) -> Image.Image:
        return Image.open(io.BytesIO(data)).convert("RGB")

    def oxford_pet() -> tuple[torch.Tensor, torch.Tensor]:
        mask = Image.open(io.BytesIO(trimap.getvalue()))
        return (transforms.functional.to_tensor(pet_resize(decoded(pet_jpeg))),
                transforms.functional.pil_to_tensor(pet_resize(mask)))

    return {
        "mnist": lambda: mnist(Image.fromarray(digit, mode="L")),
        "cifar10": lambda: cifar(Image.fromarray(tiny)),
        "imagenet": lambda: imagenet(decoded(imagenet_jpeg)),
        "lsun": lambda: lsun(decoded(lsun_jpeg)),
        "coco": lambda: transforms.functional.to_tensor(decoded(coco_jpeg)),
        "shapenet": shapenet,
        "oxford_pet": oxford_pet,
        "horse2zebra": lambda: zebra(decoded(zebra_jpeg)),
        "gtsrb": lambda: gtsrb(decoded(sign.getvalue())),
    }


def _us_per_sample(pipeline: Callable[[], object], samples: int, repeats: int) -> float:
    for _ in range(min(20, samples)):
        pipeline()
    runs = []
    for _ in range(repeats):
        started = time.process_time()
        for _ in range(samples):
            pipeline()
        runs.append((time.process_time() - started) / samples * 1e6)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as in a DataLoader worker, which PyTorch limits to one thread
    with tempfile.TemporaryDirectory() as workdir:
        pipelines = _pipelines(Path(workdir), np.random.default_rng(0))
        print(f"Host work per sample, one worker, median of {args.repeats} runs of {args.samples} samples")
        print("| dataset | measured µs/sample | catalog assumes µs/sample | measured / assumed |")
        print("|---|---:|---:|---:|")
        for name, pipeline in pipelines.items():
            measured = _us_per_sample(pipeline, args.samples, args.repeats)
            assumed = DATASETS[name].host_us_per_sample
            print(f"| {name} | {measured:.0f} | {assumed:.0f} | {measured / assumed:.1f} |")


if __name__ == "__main__":
    main()
