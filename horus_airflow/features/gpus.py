"""GPU spec table: what the predictor needs to reason about a GPU type it has never measured.

Figures are the vendors' datasheet peaks (dense, no sparsity) for the variant named. K80 is listed per
GPU die, as CUDA and NVML see it. Memory is what ``nvidia-smi`` reports in MiB.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from horus_airflow.errors import InventoryError


@dataclass(frozen=True)
class GpuSpec:
    name: str
    fp32_tflops: float
    fp16_tensor_tflops: float
    memory_bandwidth_gbs: float
    memory_mib: int
    sm_count: int


GPU_SPECS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        GpuSpec("k80", 4.37, 4.37, 240.0, 11441, 13),
        GpuSpec("p100", 9.3, 18.7, 732.0, 16280, 56),
        GpuSpec("v100", 15.7, 125.0, 900.0, 16160, 80),
        GpuSpec("t4", 8.1, 65.0, 320.0, 15360, 40),
        GpuSpec("a10", 31.2, 125.0, 600.0, 23028, 72),
        GpuSpec("a100-40gb", 19.5, 312.0, 1555.0, 40960, 108),
        GpuSpec("a100-80gb", 19.5, 312.0, 2039.0, 81920, 108),
        GpuSpec("h100", 67.0, 989.0, 3350.0, 81559, 132),
        GpuSpec("h200", 67.0, 989.0, 4800.0, 143771, 132),
        GpuSpec("l4", 30.3, 121.0, 300.0, 23034, 58),
        GpuSpec("l40s", 91.6, 362.0, 864.0, 46068, 142),
        GpuSpec("rtx2080ti", 13.4, 53.8, 616.0, 11264, 68),
        GpuSpec("rtx3090", 35.6, 71.0, 936.0, 24576, 82),
        GpuSpec("rtx4090", 82.6, 165.2, 1008.0, 24564, 128),
    )
}

# NVML product names, lower-cased, to table keys. Order matters: the first substring that matches wins.
_NVML_NAME_HINTS: tuple[tuple[str, str], ...] = (
    ("h200", "h200"),
    ("h100", "h100"),
    ("a100", "a100"),
    ("l40s", "l40s"),
    ("a10", "a10"),
    ("l4", "l4"),
    ("v100", "v100"),
    ("p100", "p100"),
    ("k80", "k80"),
    ("t4", "t4"),
    ("2080 ti", "rtx2080ti"),
    ("3090", "rtx3090"),
    ("4090", "rtx4090"),
)


def gpu_spec(name: str) -> GpuSpec:
    """Look a GPU type up by its table name; a wrong name lists the closest accepted ones."""
    key = name.strip().lower()
    if key in GPU_SPECS:
        return GPU_SPECS[key]
    close = [n for n in GPU_SPECS if n.startswith(key)] or difflib.get_close_matches(key, GPU_SPECS, n=3, cutoff=0.4)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise InventoryError(
        f"unknown GPU type {name!r}.{hint} Accepted: {', '.join(GPU_SPECS)}."
    )


def gpu_type_from_nvml(product_name: str, memory_mib: int) -> str | None:
    """Map an NVML product name (e.g. 'NVIDIA A100-SXM4-80GB') to a table key, None if unknown."""
    lowered = product_name.lower()
    for hint, family in _NVML_NAME_HINTS:
        if hint in lowered:
            if family == "a100":
                if "80gb" in lowered or "40gb" in lowered:  # the product name says it; memory may be unknown (0)
                    return "a100-80gb" if "80gb" in lowered else "a100-40gb"
                return "a100-80gb" if memory_mib > 50_000 else "a100-40gb"
            return family
    return None
