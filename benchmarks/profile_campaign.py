"""Profile the whole catalog on the GPUs of this machine in one go and write the dataset it measured.

Every catalog model trains alone (``--steps`` steps of the built-in trainer, on its default dataset,
at two batch sizes by default) on a GPU nobody else uses, then a set of pairs trains two at a time on
one GPU. Each job is an MLflow profiling run in ``--home`` (its own MLflow store); at the end the runs
are extracted exactly as the retraining DAG extracts them and written to ``--out``:

- ``predictor_rows.csv``: the predictor's schema (docs/PREDICTOR.md), one row per job alone;
- ``pairs.csv``: the interference model's schema, one row per job of a pair;
- ``set_aside.csv``: runs that cannot be learned from, with the reason;
- ``campaign.json``: the GPU (NVML name, driver), the date, steps, counts and wall time.

Jobs stop being launched when ``--budget-s`` (default 540 s) is spent; what was skipped is counted.
Without an NVIDIA GPU the campaign still runs end to end on the CPU (on a declared A100) and says that
no GPU data was produced: every run is then set aside as "no GPU measured".

    .venv/bin/python benchmarks/profile_campaign.py --out data/profiling/h200-2026-12 [--models resnet18,bert_base]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

DEFAULT_BATCHES = (16, 64)
SMALL_BATCHES = (4, 16)  # transformers, detection, segmentation and GANs
_SMALL_FAMILIES = {"bert", "gpt", "transformer", "vit", "unet", "gan"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("profiling-campaign"))
    parser.add_argument("--home", type=Path, help="HORUS_HOME for the campaign (default: a fresh temporary folder)")
    parser.add_argument("--models", help="comma-separated catalog models (default: all)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--pairs", type=int, default=12, help="how many pairs of the profiled jobs to run together")
    parser.add_argument("--budget-s", type=float, default=540.0)
    args = parser.parse_args()

    os.environ["HORUS_HOME"] = str((args.home or Path(tempfile.mkdtemp(prefix="horus-campaign-"))).resolve())
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    from horus_airflow.catalog.models import WORKLOADS
    from horus_airflow.errors import HorusError
    from horus_airflow.jobs import JobSpec
    from horus_airflow.pipeline import profile_pair, run_job
    from horus_airflow.registry.retraining import all_profiling_runs, extract
    from horus_airflow.run_schema import Tag
    from horus_airflow.settings import Settings
    from horus_airflow.telemetry import nvml

    gpus = nvml.discover_gpus()
    if not gpus:
        os.environ.setdefault("HORUS_LOCAL_GPUS", "1xa100-80gb")
    settings = Settings.from_env()
    names = args.models.split(",") if args.models else sorted(WORKLOADS)
    specs = []
    for name in names:
        workload = WORKLOADS[name]
        batches = SMALL_BATCHES if workload.family in _SMALL_FAMILIES else DEFAULT_BATCHES
        specs += [JobSpec(model=name, batch_size=b, steps=args.steps) for b in batches]
    started = time.monotonic()
    failures: dict[str, str] = {}
    done, skipped = [], 0
    for spec in specs:
        if time.monotonic() - started > args.budget_s:
            skipped += 1
            continue
        try:
            outcome = run_job(spec, settings, owner="campaign", profile_name="exclusive", context_tags={Tag.CAMPAIGN: "catalog"})
            if outcome.exit_code == 0:
                done.append(spec)
            else:
                failures[spec.display_name] = f"exit {outcome.exit_code}"
        except HorusError as exc:
            failures[spec.display_name] = str(exc)
        print(f"[{time.monotonic() - started:6.0f} s] {spec.display_name}: {'ok' if spec in done else failures.get(spec.display_name)}", flush=True)
    pairs = [(done[i], done[-1 - i]) for i in range(min(args.pairs, len(done) // 2))]
    for first, second in pairs:
        if time.monotonic() - started > args.budget_s:
            skipped += 1
            continue
        try:
            profile_pair(first, second, settings, owner="campaign", context_tags={Tag.CAMPAIGN: "catalog"})
        except HorusError as exc:
            failures[f"{first.display_name}+{second.display_name}"] = str(exc)
    extracted = extract(all_profiling_runs(settings))
    extracted.predictor_rows.to_csv(_out(args.out) / "predictor_rows.csv", index=False)
    extracted.pairs.to_csv(args.out / "pairs.csv", index=False)
    extracted.set_aside.to_csv(args.out / "set_aside.csv", index=False)
    wall = time.monotonic() - started
    measured = bool(gpus) and len(extracted.predictor_rows) > 0
    report = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "gpus": [{"index": g.index, "name": g.name, "memory_mib": g.memory_mib} for g in gpus],
        "driver": _driver(),
        "steps": args.steps, "jobs_planned": len(specs), "jobs_done": len(done), "pairs_run": len(pairs),
        "skipped_for_budget": skipped, "failures": failures, "predictor_rows": len(extracted.predictor_rows),
        "pair_rows": len(extracted.pairs), "set_aside": len(extracted.set_aside), "wall_s": round(wall, 1),
        "gpu_data_produced": measured, "mlflow": settings.mlflow_tracking_uri,
    }
    (args.out / "campaign.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "failures"}, indent=2))
    if not measured:
        print("\nNO GPU DATA WAS PRODUCED: no NVIDIA GPU was measured on this machine; every run is set aside "
              "as 'no GPU measured'. Run this on a GPU machine to get a dataset.")
    return 0


def _out(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _driver() -> str | None:
    import pynvml

    from horus_airflow.telemetry import nvml

    if not nvml.init():
        return None
    version = pynvml.nvmlSystemGetDriverVersion()
    return version if isinstance(version, str) else version.decode()


if __name__ == "__main__":
    sys.exit(main())
