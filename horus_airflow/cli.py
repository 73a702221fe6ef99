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
    predict.add_argument("--model", required=True, help="catalog name, path/to/file.py:factory or model.onnx")
    predict.add_argument("--batch-size", type=int, required=True)
    predict.add_argument("--dataset", help="dataset whose input the job trains on (default: the model's own)")
    predict.add_argument("--seq-len", type=int, help="sequence length for text and translation datasets")
    predict.add_argument("--amp", action="store_true", help="mixed precision (default fp32)")
    predict.add_argument("--gpu", default="a100-80gb", help="GPU type from the spec table (default a100-80gb)")
    predict.add_argument("--json", action="store_true", help="print one JSON object")

    predictor = sub.add_parser("predictor", help="train, evaluate and promote the utilization predictor")
    actions = predictor.add_subparsers(dest="action", required=True)
    for name, text in (("train", "evaluate, fit, log to MLflow and register as challenger"),
                       ("evaluate", "held-out-family evaluation only; nothing is logged")):
        action = actions.add_parser(name, help=text)
        action.add_argument("--data", type=Path, required=True, help="training CSV (schema: docs/PREDICTOR.md)")
        action.add_argument("--folds", type=int, default=0, help="group k-fold by family; 0 = one family per fold")
        if name == "train":
            action.add_argument("--no-register", action="store_true", help="log the run without registering")
    promote = actions.add_parser("promote", help="point an alias (default champion) at a registered version")
    promote.add_argument("version")
    promote.add_argument("--alias", default="champion")

    sub.add_parser("catalog", help="list the catalog's models and datasets")

    sub.add_parser("inventory", help="show this machine's GPUs and their reservations")

    demo = sub.add_parser("demo", help="run the example DAG on the embedded stack and print a summary")
    demo.add_argument("--dags-folder", type=Path, default=Path("dags"))
    demo.add_argument("--seed-data", type=Path, help="train and register a first predictor from this CSV if none is champion")

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

    spec = JobSpec(
        model=args.model, batch_size=args.batch_size, dataset=args.dataset, seq_len=args.seq_len,
        precision="amp" if args.amp else "fp32",
    )
    gpu = gpu_spec(args.gpu).name
    features, demand = predict_demand(spec, spec.display_name, [gpu], Settings.from_env())
    need = demand.on(gpu)
    result = {
        "model": spec.model,
        "dataset": features.dataset,
        "batch_size": spec.batch_size,
        "precision": spec.precision,
        "gpu": gpu,
        "gpu_util": round(need.util, 2),
        "gpu_util_p90": round(need.util_p90, 2),
        "gpu_mem_mib": round(need.mem_mib),
        "predictor": demand.predictor,
        "confidence": demand.confidence,
        "notes": list(demand.notes),
        "features": asdict(features),
    }
    if args.json:
        print(json.dumps(result))
        return 0
    for key in ("model", "dataset", "batch_size", "precision", "gpu", "gpu_util", "gpu_util_p90", "gpu_mem_mib",
                "predictor", "confidence"):
        print(f"{key:<14}{result[key]}")
    for note in demand.notes:
        print(f"{'note':<14}{note}")
    return 0


def _predictor(args: argparse.Namespace) -> int:
    from horus_airflow.predictor.dataset import read_training_data
    from horus_airflow.predictor.evaluation import evaluate
    from horus_airflow.registry import promote, train_predictor

    settings = Settings.from_env()
    if args.action == "promote":
        promote(settings, args.version, args.alias)
        print(f"{args.alias} -> version {args.version}")
        return 0
    data = read_training_data(args.data)
    for _, row in data.rejected.iterrows():
        print(f"set aside {row['origin']}/{row['origin_ref']}: {row['reason']}", file=sys.stderr)
    if args.action == "evaluate":
        print(evaluate(data.rows, folds=args.folds).table(), end="")
        return 0
    outcome = train_predictor(settings, data, str(args.data), folds=args.folds, register=not args.no_register)
    print(outcome.evaluation.table(), end="")
    print(f"\nMLflow run {outcome.run_id}; trained rows per target: {outcome.trained_rows}")
    if outcome.version:
        print(f"registered horus-gpu-utilization version {outcome.version} as {', '.join(outcome.aliases)}")
    return 0


def _catalog(_args: argparse.Namespace) -> int:
    from horus_airflow.catalog import DATASETS, WORKLOADS

    print(f"{'model':<20}{'family':<14}{'default dataset':<16}datasets that fit")
    for name, workload in WORKLOADS.items():
        fitting = ", ".join(n for n, d in DATASETS.items() if workload.misfit(d) is None)
        print(f"{name:<20}{workload.family:<14}{workload.default_dataset:<16}{fitting}")
    print(f"\n{'dataset':<16}{'kind':<14}description")
    for name, data in DATASETS.items():
        print(f"{name:<16}{data.kind:<14}{data.description}")
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

    return run_demo(Settings.from_env(), args.dags_folder, args.seed_data)


_COMMANDS = {
    "run": _run, "predict": _predict, "predictor": _predictor, "catalog": _catalog, "inventory": _inventory,
    "demo": _demo,
}

if __name__ == "__main__":
    raise SystemExit(main())
