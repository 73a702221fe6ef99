"""Built-in workloads: catalog names (or a user's own module) to PyTorch modules plus the inputs their
datasets imply."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from horus_airflow.catalog.datasets import DATASETS, Batch, Dataset, with_seq_len
from horus_airflow.catalog.models import OPTIMIZER_STATE, WORKLOADS, Loss, Workload, output_mean
from horus_airflow.catalog.user import build_user_module, load_factory
from horus_airflow.errors import InvalidJobError
from horus_airflow.names import is_onnx, is_user_module, unknown

@dataclass(frozen=True)
class ResolvedWorkload:
    """A model paired with a dataset it can train on."""

    workload: Workload
    dataset: Dataset

    def build(self) -> nn.Module:
        return self.workload.build(self.dataset)

    def batch(self, batch_size: int, device: torch.device | str) -> Batch:
        return self.dataset.batch(batch_size, device, vocab=self.workload.vocab)

    @property
    def loss(self) -> Loss:
        return self.workload.loss

    @property
    def optimizer_state_factor(self) -> int:
        return OPTIMIZER_STATE[self.workload.optimizer]


def resolve_dataset(name: str, seq_len: int | None = None) -> Dataset:
    data = DATASETS.get(name)
    if data is None:
        raise InvalidJobError(unknown("dataset", name, DATASETS))
    return with_seq_len(data, seq_len) if seq_len is not None else data


def resolve(model: str, dataset: str | None = None, seq_len: int | None = None) -> ResolvedWorkload:
    """Pair a model with a dataset, or explain which names and pairings are accepted."""
    if is_user_module(model):
        if dataset is None:
            raise InvalidJobError(
                f"user model {model!r} needs a dataset to know its input; accepted: {', '.join(sorted(DATASETS))}"
            )
        factory = load_factory(model)
        workload = Workload(
            name=model, family=f"user:{model.rpartition(':')[0]}", input_kinds=(resolve_dataset(dataset).kind,),
            default_dataset=dataset, build=lambda _data: build_user_module(factory, model), loss=output_mean,
            optimizer="adam",
        )
        return ResolvedWorkload(workload, resolve_dataset(dataset, seq_len))
    if is_onnx(model):
        raise InvalidJobError(f"{model!r} is an ONNX graph: it can be predicted for, not built as a PyTorch module")
    workload = WORKLOADS.get(model)
    if workload is None:
        raise InvalidJobError(unknown("model", model, WORKLOADS) + " Or give path/to/file.py:factory or model.onnx.")
    data = resolve_dataset(dataset or workload.default_dataset, seq_len)
    misfit = workload.misfit(data)
    if misfit:
        fitting = sorted(n for n, d in DATASETS.items() if workload.misfit(d) is None)
        raise InvalidJobError(f"model {model!r} {misfit}; datasets that fit {model!r}: {', '.join(fitting)}")
    return ResolvedWorkload(workload, data)


__all__ = ["DATASETS", "WORKLOADS", "ResolvedWorkload", "Workload", "is_onnx", "resolve", "resolve_dataset"]
