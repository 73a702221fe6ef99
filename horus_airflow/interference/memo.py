"""A memo in front of any interference model: the same jobs on the same GPU type always get the same
answer, so a long-lived caller (the simulator, a scheduling loop) asks the model once per mix of jobs
instead of once per GPU per placement attempt."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from horus_airflow.features.gpus import GpuSpec
from horus_airflow.interference.base import CoRunner, Interference, InterferenceModel

_Key = tuple[str, tuple[tuple[float, float, float, tuple[float, ...]], ...]]


@dataclass
class Memoized:
    """Wraps ``model``; ``limit`` bounds the memo (it is cleared when full, so memory stays flat)."""

    model: InterferenceModel
    limit: int = 200_000
    memo: dict[_Key, Interference] = field(default_factory=dict, init=False, repr=False)

    @property
    def name(self) -> str:
        return self.model.name

    def predict(self, jobs: Sequence[CoRunner], gpu: GpuSpec) -> Interference:
        return self.predict_many([jobs], gpu)[0]

    def predict_many(self, groups: Sequence[Sequence[CoRunner]], gpu: GpuSpec) -> list[Interference]:
        # plain tuples of numbers hash and compare in C; the dataclasses would call Python per field
        keys = [(gpu.name, tuple((j.util, j.util_p90, j.mem_mib, j.signature) for j in group)) for group in groups]
        known = {key: self.memo[key] for key in keys if key in self.memo}
        missing = {key: group for key, group in zip(keys, groups) if key not in known}
        if missing:
            answers = dict(zip(missing, self.model.predict_many(list(missing.values()), gpu)))
            if len(self.memo) + len(answers) > self.limit:
                self.memo.clear()
            self.memo.update(answers)
            known.update(answers)
        return [known[key] for key in keys]
