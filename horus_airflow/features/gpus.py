"""GPU spec table: what the predictor needs to reason about a GPU type it has never measured.

Figures are the vendors' datasheet peaks (dense, no sparsity) for the variant named. K80 is listed per
GPU die, as CUDA and NVML see it. Memory is what ``nvidia-smi`` reports in MiB. ``max_threads_per_sm``
is the architecture's limit of resident threads (CUDA C++ Programming Guide, "Compute Capabilities"):
the driver reserves local memory for that many threads on every SM when it creates a context.
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
    max_threads_per_sm: int


GPU_SPECS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        GpuSpec("k80", 4.37, 4.37, 240.0, 11441, 13, 2048),
        GpuSpec("p100", 9.3, 18.7, 732.0, 16280, 56, 2048),
        GpuSpec("p100-12gb", 9.3, 18.7, 549.0, 12198, 56, 2048),
        GpuSpec("v100", 15.7, 125.0, 900.0, 16160, 80, 2048),
        GpuSpec("v100-32gb", 15.7, 125.0, 900.0, 32510, 80, 2048),
        GpuSpec("t4", 8.1, 65.0, 320.0, 15360, 40, 1024),
        GpuSpec("a10", 31.2, 125.0, 600.0, 23028, 72, 1536),
        GpuSpec("a100-40gb", 19.5, 312.0, 1555.0, 40960, 108, 2048),
        GpuSpec("a100-80gb", 19.5, 312.0, 2039.0, 81920, 108, 2048),
        GpuSpec("h100", 67.0, 989.0, 3350.0, 81559, 132, 2048),
        GpuSpec("h100-pcie", 51.0, 756.0, 2000.0, 81559, 114, 2048),
        GpuSpec("h100-nvl", 60.0, 835.0, 3900.0, 95830, 132, 2048),
        GpuSpec("h200", 67.0, 989.0, 4800.0, 143771, 132, 2048),
        GpuSpec("l4", 30.3, 121.0, 300.0, 23034, 58, 1536),
        GpuSpec("l40", 90.5, 181.0, 864.0, 46068, 142, 1536),
        GpuSpec("l40s", 91.6, 362.0, 864.0, 46068, 142, 1536),
        GpuSpec("rtx2080ti", 13.4, 53.8, 616.0, 11264, 68, 1024),
        GpuSpec("rtx3090", 35.6, 71.0, 936.0, 24576, 82, 1536),
        GpuSpec("rtx4090", 82.6, 165.2, 1008.0, 24564, 128, 1536),
    )
}

# NVML product names (and GPU feature discovery's labels, the same names with dashes for spaces), reduced
# by _product_key, to the table keys they may be. Several keys: the variants share the name, and the
# GPU's memory decides. A name not listed is not guessed at: a wrong spec is worse than none.
_NVML_PRODUCTS: dict[str, tuple[str, ...]] = {
    "k80": ("k80",),
    "p100 pcie 16gb": ("p100",), "p100 sxm2 16gb": ("p100",), "p100 pcie 12gb": ("p100-12gb",),
    "p100 pcie": ("p100", "p100-12gb"), "p100": ("p100", "p100-12gb"),
    "v100 sxm2 16gb": ("v100",), "v100 pcie 16gb": ("v100",), "v100 fhhl 16gb": ("v100",),
    "v100 sxm2 32gb": ("v100-32gb",), "v100 sxm3 32gb": ("v100-32gb",), "v100 pcie 32gb": ("v100-32gb",),
    "v100s pcie 32gb": ("v100-32gb",), "v100": ("v100", "v100-32gb"), "v100 sxm2": ("v100", "v100-32gb"),
    "v100 pcie": ("v100", "v100-32gb"),
    "t4": ("t4",),
    "a10": ("a10",),
    "a100 sxm4 40gb": ("a100-40gb",), "a100 pcie 40gb": ("a100-40gb",),
    "a100 sxm4 80gb": ("a100-80gb",), "a100 80gb pcie": ("a100-80gb",), "a100 pcie 80gb": ("a100-80gb",),
    "a100": ("a100-40gb", "a100-80gb"), "a100 sxm4": ("a100-40gb", "a100-80gb"), "a100 pcie": ("a100-40gb", "a100-80gb"),
    "h100 80gb hbm3": ("h100",), "h100 sxm5 80gb": ("h100",), "h100": ("h100", "h100-nvl"),
    "h100 pcie": ("h100-pcie",), "h100 nvl": ("h100-nvl",),
    "h200": ("h200",), "h200 nvl": ("h200",),
    "l4": ("l4",), "l40": ("l40",), "l40s": ("l40s",),
    "rtx 2080 ti": ("rtx2080ti",), "rtx 3090": ("rtx3090",), "rtx 4090": ("rtx4090",),
}
_VENDOR_WORDS = ("nvidia", "tesla", "geforce")


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


def gpu_type_from_nvml(product_name: str, memory_mib: int | float) -> str | None:
    """The table key of an NVML product name (``'NVIDIA A100-SXM4-80GB'``, ``'Tesla V100-SXM2-32GB'``) or a
    GPU feature discovery label (``'NVIDIA-H100-NVL'``); None for a product not in the table. The name is
    matched whole, not by substring (an L40 is not an L4); where variants share a name, the memory NVML
    reports (MiB; 0 when unknown) picks the variant whose memory is closest."""
    candidates = _NVML_PRODUCTS.get(_product_key(product_name))
    if not candidates:
        return None
    if len(candidates) == 1 or memory_mib <= 0:
        return candidates[0]
    return min(candidates, key=lambda key: abs(GPU_SPECS[key].memory_mib - memory_mib))


def _product_key(product_name: str) -> str:
    """Lower case, dashes and underscores as spaces, vendor words and feature discovery's ``SHARED``
    suffix (time-sliced GPUs) dropped: ``'NVIDIA-GeForce-RTX-4090-SHARED'`` -> ``'rtx 4090'``."""
    words = product_name.lower().replace("-", " ").replace("_", " ").split()
    while words and words[0] in _VENDOR_WORDS:
        words.pop(0)
    if words and words[-1] == "shared":
        words.pop()
    return " ".join(words)
