"""The ``horus`` command."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path

from typing import TYPE_CHECKING, Any, Callable

from horus_airflow import __version__
from horus_airflow.errors import HorusError
from horus_airflow.settings import Settings

# The predictor's held-out split schemes (horus_airflow.predictor.evaluation.SCHEMES, which imports
# LightGBM and pandas: too heavy for parsing arguments); a test checks that the two agree.
SPLIT_SCHEMES = ("source", "gpu", "family")

if TYPE_CHECKING:
    from horus_airflow.jobs import JobSpec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="horus", description="Interference-aware GPU placement for Airflow training tasks.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    parser.add_argument("--version", action="version", version=f"horus {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a training command under telemetry, keeping its exit code")
    run.add_argument("--out", type=Path, help="new or empty folder for samples.jsonl and summary.json (default: HORUS_HOME/runs/<time>)")
    run.add_argument("--interval", type=_at_least(0.05, float), default=0.2, help="sampling interval in seconds, at least 0.05 (default 0.2)")
    run.add_argument("--launcher-pid", type=int, metavar="PID",
                     help="stop the command when process PID (which holds its GPU reservation) is gone")
    run.add_argument("--job", type=_job_spec, metavar="SPEC",
                     help="MODEL:BATCH[:amp][@DATASET] the command trains: log a profiling run with its graph features")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")

    telemetry = sub.add_parser("telemetry", help="import telemetry a cluster already collects (DCGM exporter via Prometheus)")
    telemetry_actions = telemetry.add_subparsers(dest="action", required=True)
    imports = telemetry_actions.add_parser("import", help="log one profiling run per job found in an export")
    imports.add_argument("export", type=Path, help="Prometheus API answer (JSON) or /metrics scrapes (text)")
    imports.add_argument("--format", type=_registered("telemetry format", "horus_airflow.telemetry.dcgm", "TELEMETRY_FORMATS"),
                         help="a registered telemetry format (prometheus-json, prometheus-text, ...); default: guessed from the file")
    imports.add_argument("--group-by", default="pod", help="label that names a job (default pod)")
    imports.add_argument("--job", action="append", default=[], metavar="KEY=SPEC",
                         help="the workload of a job, e.g. train-resnet-abc=resnet50:64@imagenet (repeat)")
    imports.add_argument("--interval", type=_at_least(0.001, float), default=1.0, help="seconds between scrapes without timestamps (default 1)")
    imports.add_argument("--json", action="store_true", help="print one JSON object")

    predict = sub.add_parser("predict", help="predict a job's GPU utilization and memory")
    predict.add_argument("--model", required=True, help="catalog name, path/to/file.py:factory or model.onnx")
    predict.add_argument("--batch-size", type=int, required=True, help="samples per training step")
    predict.add_argument("--dataset", help="dataset whose input the job trains on (default: the model's own)")
    predict.add_argument("--seq-len", type=int, help="sequence length for text and translation datasets")
    predict.add_argument("--amp", action="store_true", help="mixed precision (default fp32)")
    predict.add_argument("--gpu", default="a100-80gb", help="GPU type from the spec table (default a100-80gb)")
    predict.add_argument("--json", action="store_true", help="print one JSON object")

    train, evaluate = _model_commands(sub, "predictor", "the utilization predictor",
                                      "held-out evaluation only (by source, GPU type and family)",
                                      "training CSV (schema: docs/PREDICTOR.md)")
    for action in (train, evaluate):
        action.add_argument("--split", action="append", choices=list(SPLIT_SCHEMES), dest="splits",
                            help="hold out each value of this column in turn (repeatable; default: all of them)")
    train.add_argument("--no-register", action="store_true", help="log the run without registering")

    sub.add_parser("catalog", help="list the catalog's models and datasets")

    interference = sub.add_parser("interference", help="predict each job's speed when the jobs share one GPU")
    interference.add_argument("--job", action="append", required=True, metavar="SPEC", type=_job_spec,
                              help="MODEL:BATCH[:amp][@DATASET], once per job (catalog names)")
    interference.add_argument("--gpu", default="v100", help="GPU type from the spec table (default v100)")
    interference.add_argument("--model", choices=("summed-utilization", "learned"), default="learned")
    interference.add_argument("--json", action="store_true", help="print one JSON object")

    place = sub.add_parser("place", help="place one job on a cluster state and explain the decision")
    place.add_argument("--state", type=Path, required=True, help="cluster-state JSON (docs/PLACEMENT.md)")
    place.add_argument("--job", required=True, metavar="SPEC", type=_job_spec, help="MODEL:BATCH[:amp][@DATASET]")
    place.add_argument("--gpus", type=_at_least(1, int), default=1, help="GPUs the job needs (a gang, default 1)")
    place.add_argument("--profile", default="horus-paper", help="built-in profile name or a .yaml path")
    place.add_argument("--json", action="store_true", help="print the decision with every candidate as JSON")

    simulate = sub.add_parser("simulate", help="replay a cluster trace through several placement profiles")
    simulate.add_argument("--trace", type=Path, required=True, help="trace file (formats: docs/EVALUATION.md)")
    simulate.add_argument("--trace-format", type=_registered("trace format", "horus_airflow.simulator.traces", "TRACE_READERS"), default="native",
                          help="a registered trace format: muri, gavel, tiresias, native (default) or one a package registers")
    simulate.add_argument("--nodes", type=_comma_list(_at_least(1, int)), required=True,
                          help="nodes in the simulated cluster; for a mixed cluster one count per --gpu type, e.g. 8,8")
    simulate.add_argument("--gpus-per-node", type=_at_least(1, int), default=8, help="GPUs per node (default 8)")
    simulate.add_argument("--gpu", type=_comma_list(str), default=("v100",),
                          help="GPU type with measured co-location data: k80, p100, v100 (default v100); "
                               "several, e.g. v100,k80, mix them (gavel traces only)")
    simulate.add_argument("--profiles", default="exclusive,gandiva-pack,horus-paper,horus-ml,horus-throughput",
                          help="comma-separated profile names or .yaml paths (default: the five compared in docs/EVALUATION.md)")
    simulate.add_argument("--json", type=Path, help="write the results here")
    simulate.add_argument("--plot", type=Path, help="write the PNG plot here")
    simulate.add_argument("--arrival-scale", type=_at_least(1e-6, float), default=1.0,
                          help="divide arrival times by this: 2 is twice the load on the same cluster (default 1)")
    simulate.add_argument("--limit", type=_at_least(1, int), help="only the first N usable jobs by arrival")
    simulate.add_argument("--pairs", type=Path, default=Path("data/interference_seed/gavel_pairs.csv"),
                          help="measured co-location pairs, the simulation's ground truth (default: Gavel's)")
    simulate.add_argument("--isolated", type=Path, default=Path("data/interference_seed/gavel_isolated.csv"),
                          help="measured isolated throughputs, for Gavel traces (default: Gavel's)")
    simulate.add_argument("--predictor", choices=("prior", "champion"), default="prior",
                          help="what the policies predict demands with: the analytic prior (default) or the registered "
                               "champion predictor, as the operators do")
    simulate.add_argument("--no-mlflow", action="store_true", help="do not log an MLflow run")

    _model_commands(sub, "interference-model", "the interference model", "job types and GPU types held out",
                    "co-location pairs CSV (docs/PLACEMENT.md)")

    sub.add_parser("inventory", help="show this machine's GPUs and their reservations")

    demo = sub.add_parser("demo", help="run the example DAG on the embedded stack and print a summary")
    demo.add_argument("--dags-folder", type=Path, default=Path("dags"), help="folder holding horus_training_example.py (default dags)")
    demo.add_argument("--seed-data", type=Path, help="first predictor's data if none is champion (default: the shipped seed)")
    demo.add_argument("--interference-data", type=Path, help="likewise for the interference model (default: the shipped pairs)")

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


def _model_commands(
    sub: argparse._SubParsersAction, command: str, what: str, evaluation: str, data_help: str  # type: ignore[type-arg]
) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """``COMMAND train|evaluate --data FILE`` and ``COMMAND promote VERSION [--alias]`` for a registered model."""
    actions = sub.add_parser(command, help=f"train, evaluate and promote {what}").add_subparsers(dest="action", required=True)
    train = actions.add_parser("train", help="evaluate, fit, log to MLflow and register as challenger")
    evaluate = actions.add_parser("evaluate", help=f"{evaluation}; nothing is logged")
    for action in (train, evaluate):
        action.add_argument("--data", type=Path, required=True, help=data_help)
    promote = actions.add_parser("promote", help="point an alias (default champion) at a registered version")
    promote.add_argument("version")
    promote.add_argument("--alias", default="champion")
    return train, evaluate


def _run(args: argparse.Namespace) -> int:
    from horus_airflow.telemetry import run
    from horus_airflow.telemetry.wrapper import SAMPLES_FILE, SUMMARY_FILE

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        print("horus run: error: give the command after '--', e.g. horus run -- python train.py", file=sys.stderr)
        return 2
    settings = Settings.from_env()
    out = args.out or settings.runs_dir / time.strftime("%Y%m%d-%H%M%S")
    if out.exists() and not out.is_dir():
        print(f"horus run: error: --out {str(out)!r} is a file; give a folder (new, or without a run's telemetry)", file=sys.stderr)
        return 2
    earlier = [name for name in (SAMPLES_FILE, SUMMARY_FILE) if (out / name).exists()]
    if earlier:
        print(f"horus run: error: --out {str(out)!r} already holds a run's telemetry ({', '.join(earlier)}); give a new "
              "folder, so that it is not overwritten", file=sys.stderr)
        return 2
    features = args.job.features() if args.job else None  # bad input fails before anything runs
    summary = run(cmd, out, args.interval, launcher_pid=args.launcher_pid)
    print(f"horus run: telemetry in {out} (exit code {summary.exit_code})", file=sys.stderr)
    if args.job is not None:
        from horus_airflow.registry.profiling import log_wrapped_run

        run_id = log_wrapped_run(settings, args.job, features, summary, out)
        print(f"horus run: profiling run {run_id} in {settings.mlflow_tracking_uri}", file=sys.stderr)
    return summary.exit_code


def _telemetry(args: argparse.Namespace) -> int:
    import hashlib
    import tempfile

    from horus_airflow.jobs import JobSpec
    from horus_airflow.registry.telemetry_import import import_jobs
    from horus_airflow.telemetry import dcgm

    text = _read_text(args.export, "telemetry export", "a Prometheus API answer (JSON) or /metrics scrapes (text)")
    specs = {}
    for item in args.job:
        key, sep, spec = item.partition("=")
        if not sep:
            raise dcgm.TelemetryImportError(f"--job {item!r}: expected KEY=MODEL:BATCH[:amp][@DATASET]")
        specs[key] = JobSpec.parse(spec)
        specs[key].features()  # an unknown model is refused before anything is imported
    series = dcgm.parse(text, args.format or dcgm.guess_format(text), args.interval)
    jobs, left_out = dcgm.group_jobs(series, args.group_by)
    settings = Settings.from_env()
    with tempfile.TemporaryDirectory(dir=settings.home if settings.home.is_dir() else None) as work:
        report = import_jobs(settings, jobs, specs, hashlib.sha256(text.encode()).hexdigest(), Path(work), left_out)
    if args.json:
        print(json.dumps(asdict(report), indent=2))
    else:
        for key, run_id in report.logged.items():
            print(f"{key}: profiling run {run_id}{'' if key in specs else ' (no --job: kept, but not used for training)'}")
        for key, run_id in report.already_imported.items():
            print(f"{key}: already imported as {run_id}")
        for why, count in report.left_out.items():
            print(f"left out: {count} x {why}")
    return 0


def _predict(args: argparse.Namespace) -> int:
    from horus_airflow.features.gpus import gpu_spec
    from horus_airflow.jobs import JobSpec
    from horus_airflow.service import predict_demand

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
    splits = tuple(args.splits or SPLIT_SCHEMES)
    if args.action == "evaluate":
        print(evaluate(data.rows, schemes=splits).table(), end="")
        return 0
    outcome = train_predictor(settings, data, str(args.data), schemes=splits, register=not args.no_register)
    print(outcome.evaluation.table(), end="")
    print(f"\nMLflow run {outcome.run_id}; trained rows per target: {outcome.trained_rows}")
    if outcome.version:
        print(f"registered horus-gpu-utilization version {outcome.version} as {', '.join(outcome.aliases)}")
    return 0


def _registered(what: str, module: str, registry: str) -> Callable[[str], str]:
    """An argparse type: a name in one of the registries (trace readers, telemetry formats), imported
    only when the option is given, so ``horus --help`` stays fast."""
    def parse(text: str) -> str:
        import importlib

        known = getattr(importlib.import_module(module), registry)
        if text not in known:
            raise argparse.ArgumentTypeError(f"unknown {what} {text!r}; accepted: {', '.join(known)}")
        return text
    return parse


def _comma_list(item: Callable[[str], Any]) -> Callable[[str], tuple[Any, ...]]:
    """An argparse type: one value or several separated by commas, each parsed by ``item``."""
    def parse(text: str) -> tuple[Any, ...]:
        return tuple(item(part.strip()) for part in text.split(","))
    return parse


def _at_least(minimum: float, kind: type) -> Callable[[str], Any]:
    """An argparse type: a number of ``kind`` no smaller than ``minimum`` (argparse names the option)."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'a whole number' if kind is int else 'a number'}") from None
        if not value >= minimum:  # NaN too
            raise argparse.ArgumentTypeError(f"{text!r}: must be at least {minimum:g}")
        return value
    return parse


def _read_text(path: Path, what: str, expected: str) -> str:
    """A user's input file as text, or one line saying why it cannot be read and what is expected."""
    try:
        return path.read_text()
    except IsADirectoryError:
        problem = "is a directory"
    except FileNotFoundError:
        problem = "does not exist"
    except UnicodeDecodeError:
        problem = "is not a text file"
    except OSError as exc:
        problem = f"cannot be read ({exc.strerror})"
    raise HorusError(f"{what} {str(path)!r} {problem}; expected {expected}")


def _job_spec(text: str) -> JobSpec:
    """MODEL:BATCH[:amp][@DATASET]."""
    from horus_airflow.errors import InvalidJobError
    from horus_airflow.jobs import JobSpec

    try:
        return JobSpec.parse(text)
    except InvalidJobError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _interference(args: argparse.Namespace) -> int:
    from horus_airflow.features.gpus import gpu_spec
    from horus_airflow.interference import CoRunner, LearnedInterference, signature
    from horus_airflow.service import predict_demand
    from horus_airflow.registry import load_interference

    settings = Settings.from_env()
    gpu = gpu_spec(args.gpu)
    model, label = load_interference(settings)
    if args.model == "learned" and not isinstance(model, LearnedInterference):
        raise HorusError(f"no learned interference model: {label}; train one with "
                         "`horus interference-model train --data data/interference_seed/gavel_pairs.csv`")
    if args.model == "summed-utilization" and isinstance(model, LearnedInterference):
        model, label = model.fallback, f"summed-utilization curve of {label}"
    jobs = []
    for spec in args.job:
        features, demand = predict_demand(spec, spec.display_name, [gpu.name], settings)
        need = demand.on(gpu.name)
        jobs.append((spec, need, CoRunner(need.util, need.util_p90, need.mem_mib, signature(features)), demand.predictor))
    result = model.predict([j[2] for j in jobs], gpu)
    out = {
        "gpu": gpu.name, "model": label, "speeds": [round(s, 4) for s in result.speeds], "fits": result.fits, "note": result.note,
        "jobs": [{"model": spec.model, "batch_size": spec.batch_size, "dataset": spec.dataset, "precision": spec.precision,
                  "predicted_util": round(need.util, 2), "predicted_mem_mib": round(need.mem_mib), "predictor": predictor,
                  "speed": round(speed, 4)}
                 for (spec, need, _, predictor), speed in zip(jobs, result.speeds)],
    }
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"GPU {gpu.name}, model {label}: {'fits' if result.fits else 'does NOT fit'}")
    if result.note:
        print(f"  ({result.note})")
    for job in out["jobs"]:
        print(f"  {job['model']:<20} b{job['batch_size']:<6} util {job['predicted_util']:>6.1f}%  "
              f"mem {job['predicted_mem_mib']:>7} MiB  speed {job['speed']:.3f}")
    return 0


def _place(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from horus_airflow.errors import InventoryError
    from horus_airflow.placement import ClusterState
    from horus_airflow.service import PlacementService

    text = _read_text(args.state, "cluster state", "a cluster-state JSON file (docs/PLACEMENT.md)")
    try:
        state = ClusterState.from_dict(json.loads(text))
    except json.JSONDecodeError as exc:
        raise InventoryError(f"{str(args.state)!r} is not JSON ({exc}); expected a cluster-state JSON file (docs/PLACEMENT.md)") from None
    service = PlacementService(Settings.from_env(), args.profile)
    spec = replace(args.job, gpus=args.gpus)
    decision = service.decide(service.plan(spec, spec.display_name, [g.gpu_type for g in state.gpus]).demand, state)
    if args.json:
        print(json.dumps({**decision.to_dict(), "interference_model": service.interference_label}))
    else:
        print(decision.reason if decision.placed else f"not placed: {decision.reason}")
    return 0 if decision.placed else 1


def _interference_model(args: argparse.Namespace) -> int:
    from horus_airflow.interference.evaluation import evaluate_interference, scores_table
    from horus_airflow.interference.pairs import read_pairs
    from horus_airflow.registry import INTERFERENCE_MODEL, train_interference
    from horus_airflow.registry.versions import promote

    settings = Settings.from_env()
    if args.action == "promote":
        promote(settings, INTERFERENCE_MODEL, args.version, args.alias)
        print(f"{args.alias} -> version {args.version}")
        return 0
    pairs = read_pairs(args.data)
    if args.action == "evaluate":
        print(scores_table(evaluate_interference(pairs)), end="")
        return 0
    outcome = train_interference(settings, pairs, str(args.data))
    print(scores_table(outcome.scores), end="")
    print(f"\nMLflow run {outcome.run_id}; registered {INTERFERENCE_MODEL} version {outcome.version} as {', '.join(outcome.aliases)}")
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from horus_airflow.simulator.engine import Cluster, NodeGroup
    from horus_airflow.simulator.metrics import comparison_table
    from horus_airflow.simulator.report import log_simulation, plot, write_json
    from horus_airflow.registry.store import QUICK, http_policy
    from horus_airflow.simulator.runner import run_simulation

    if len(args.nodes) != len(args.gpu):
        print(f"horus simulate: error: --nodes gives {len(args.nodes)} count(s) and --gpu {len(args.gpu)} type(s); "
              "give one node count per GPU type, e.g. --nodes 8,8 --gpu v100,k80", file=sys.stderr)
        return 2
    groups = [NodeGroup(nodes, args.gpus_per_node, gpu) for nodes, gpu in zip(args.nodes, args.gpu)]
    cluster = Cluster(groups[0].nodes, groups[0].gpus_per_node, groups[0].gpu_type, others=tuple(groups[1:]))
    predictor = None
    if args.predictor == "champion":
        from horus_airflow.registry import load_predictor

        predictor = load_predictor(Settings.from_env())
    report = run_simulation(
        args.trace, args.trace_format, cluster,
        [p.strip() for p in args.profiles.split(",") if p.strip()], args.pairs, args.isolated, args.arrival_scale,
        args.limit, _progress_bar if sys.stderr.isatty() else None, predictor,
    )
    print(comparison_table(report.results))
    skipped = report.results[0].skipped_reasons if report.results else {}
    if skipped:
        whole_file = " (counted over the whole trace file, before --limit)" if args.limit else ""
        print(f"\njobs left out{whole_file}: " + ", ".join(f"{count} {reason}" for reason, count in sorted(skipped.items())))
    print(f"\nground truth: {report.truth}; {report.wall_s:.1f} s")
    if args.json:
        write_json(report, args.json)
    if args.plot:
        plot(report, args.plot)
    if args.no_mlflow:
        return 0
    settings = Settings.from_env()
    try:
        with http_policy(QUICK):  # an unreachable server must not hold the results for minutes of retries
            run_id = log_simulation(settings, report)
    except Exception as exc:  # noqa: BLE001 (connection errors surface as requests/urllib3 types)
        print(f"horus simulate: error: the results above were NOT logged to MLflow at {settings.mlflow_tracking_uri} "
              f"({type(exc).__name__}: {str(exc)[:200]}); rerun with --json to keep them, or --no-mlflow", file=sys.stderr)
        return 1
    print(f"MLflow run {run_id} (experiment horus-simulations)")
    return 0


def _progress_bar(profile: str, done: int, total: int) -> None:
    if done == total or done % max(1, total // 50) == 0:
        filled = int(30 * done / max(total, 1))
        sys.stderr.write(f"\r{profile:<14} [{'#' * filled}{'.' * (30 - filled)}] {done}/{total}")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()


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

    return run_demo(Settings.from_env(), args.dags_folder, args.seed_data, args.interference_data)


_COMMANDS = {
    "run": _run, "predict": _predict, "predictor": _predictor, "catalog": _catalog, "inventory": _inventory,
    "demo": _demo, "interference": _interference, "place": _place, "interference-model": _interference_model,
    "simulate": _simulate, "telemetry": _telemetry,
}

if __name__ == "__main__":
    raise SystemExit(main())
