"""Trace model names to the catalog graphs the policies predict from."""

from __future__ import annotations

import re
from dataclasses import dataclass

from horus_airflow.errors import InvalidJobError


@dataclass(frozen=True)
class Workload:
    model: str
    dataset: str
    batch_size: int
    job_type: str  # the key measured co-location data knows the job by (Gavel's job type), or the trace's name


GAVEL_MODELS = {  # Gavel's job type -> (catalog model, dataset, batch size when the name has none)
    "ResNet-18": ("resnet18_cifar", "cifar10", None),
    "ResNet-50": ("resnet50", "imagenet", None),
    "Transformer": ("transformer_base", "multi30k", None),
    "LM": ("lstm_lm_small", "wikitext2", None),
    "Recommendation": ("autoencoder_rec", "ml20m", None),
    "A3C": ("a3c", "atari", 20),
    "CycleGAN": ("cyclegan", "horse2zebra", 1),
}
# Muri's and the Tiresias/GPUSchedule traces' model names; the batch size is the trace's when it has one.
TRACE_MODELS = {
    "resnet18": ("resnet18", "imagenet", 128),
    "shufflenet_v2_x1_0": ("shufflenet_v2_x1_0", "imagenet", 128),
    "vgg16": ("vgg16", "imagenet", 16),
    "vgg19": ("vgg19", "imagenet", 16),
    "bert": ("bert_base", "squad", 4),
    "gpt2": ("gpt2_small", "wikitext103", 4),
    "a2c": ("a2c", "atari", 64),
    "dqn": ("dqn", "atari", 128),
    "alexnet": ("alexnet", "imagenet", 64),
    "resnet50": ("resnet50", "imagenet", 64),
    "resnet101": ("resnet101", "imagenet", 64),
    "mobilenet_v2": ("mobilenet_v2", "imagenet", 64),
    "inception_v3": ("inception_v3", "imagenet", 64),
}
_GAVEL_NAME = re.compile(r"^(?P<family>[^(]+?)(?: \(batch size (?P<batch>\d+)\))?$")


def gavel_workload(job_type: str) -> Workload:
    match = _GAVEL_NAME.match(job_type.strip())
    family = match["family"].strip() if match else job_type
    if family not in GAVEL_MODELS:
        raise InvalidJobError(f"unknown Gavel job type {job_type!r}; known: {', '.join(GAVEL_MODELS)}")
    model, dataset, fixed = GAVEL_MODELS[family]
    return Workload(model, dataset, int(match["batch"] or fixed), job_type.strip())  # type: ignore[index]


def trace_workload(name: str, batch_size: int | None = None) -> Workload:
    if name not in TRACE_MODELS:
        raise InvalidJobError(f"unknown trace model {name!r}; known: {', '.join(TRACE_MODELS)}")
    model, dataset, default = TRACE_MODELS[name]
    return Workload(model, dataset, batch_size or default, name)
