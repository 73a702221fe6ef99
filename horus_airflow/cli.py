"""The ``horus`` command."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path

from horus_airflow.errors import HorusError
from horus_airflow.settings import Settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="horus", description="Interference-aware GPU placement for Airflow training tasks.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a training command under telemetry, keeping its exit code")
    run.add_argument("--out", type=Path, help="folder for samples.jsonl and summary.json (default: HORUS_HOME/runs/<time>)")
    run.add_argument("--interval", type=float, default=0.2, help="sampling interval in seconds (default 0.2)")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")

    predict = sub.add_parser("predict", help="predict a job's GPU utilization and memory")
    predict.add_argument("--model", required=True)
    predict.add_argument("--batch-size", type=int, required=True)
    predict.add_argument("--dataset")
    predict.add_argument("--amp", action="store_true")
    predict.add_argument("--gpu", default="a100-80gb", help="GPU type from the spec table (default a100-80gb)")
    predict.add_argument("--json", action="store_true", help="print one JSON object")

    sub.add_parser("inventory", help="show this machine's GPUs and their reservations")

    demo = sub.add_parser("demo", help="run the example DAG on the embedded stack and print a summary")
    demo.add_argument("--dags-folder", type=Path, default=Path("dags"))

    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return _COMMANDS[args.command](args)
    except HorusError as exc:
        print(f"horus: error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from horus_airflow.telemetry import run

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        print("horus run: error: give the command after '--', e.g. horus run -- python train.py", file=sys.stderr)
        return 2
    out = args.out or Settings.from_env().runs_dir / time.strftime("%Y%m%d-%H%M%S")
    return run(cmd, out, args.interval).exit_code


def _predict(args: argparse.Namespace) -> int:
    from horus_airflow.features.gpus import gpu_spec
    from horus_airflow.jobs import JobSpec
    from horus_airflow.pipeline import predict_demand

    spec = JobSpec(model=args.model, batch_size=args.batch_size, dataset=args.dataset, precision="amp" if args.amp else "fp32")
    gpu = gpu_spec(args.gpu).name
    features, demand = predict_demand(spec, spec.display_name, [gpu])
    need = demand.on(gpu)
    result = {
        "model": spec.model,
        "dataset": features.dataset,
        "batch_size": spec.batch_size,
        "gpu": gpu,
        "gpu_util": round(need.util, 2),
        "gpu_util_p90": round(need.util_p90, 2),
        "gpu_mem_mib": round(need.mem_mib),
        "predictor": demand.predictor,
        "features": asdict(features),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key in ("model", "dataset", "batch_size", "gpu", "gpu_util", "gpu_util_p90", "gpu_mem_mib", "predictor"):
            print(f"{key:<14}{result[key]}")
    return 0


def _inventory(_args: argparse.Namespace) -> int:
    from horus_airflow.backends import LocalBackend

    state = LocalBackend(Settings.from_env()).snapshot()
    print(f"{'GPU':<10}{'type':<12}{'memory MiB':>11}  {'source':<9}residents")
    for gpu in state.gpus:
        residents = ", ".join(f"{r.job_id} ({r.util:.0f}%, {r.mem_mib:.0f} MiB)" for r in gpu.residents) or "-"
        print(f"{gpu.gpu_id:<10}{gpu.gpu_type:<12}{gpu.memory_mib:>11.0f}  {'declared' if gpu.declared else 'NVML':<9}{residents}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from horus_airflow.demo import run_demo

    return run_demo(Settings.from_env(), args.dags_folder)


_COMMANDS = {"run": _run, "predict": _predict, "inventory": _inventory, "demo": _demo}

if __name__ == "__main__":
    raise SystemExit(main())
