"""Retraining from profiling runs: extract -> validate -> build -> train a challenger -> compare it with
the champion on the same held-out families -> promote only when the policy's thresholds pass.

Each step is a function the retraining DAG calls as one task, passing files (not DataFrames) between
tasks. Nothing here moves the ``champion`` alias except :func:`promote_if_passed`, which runs last and
only on a passing comparison, so a run that fails anywhere before leaves the champion as it was.
Comparisons go through ``mlflow.validate_evaluation_results`` with the thresholds of
``model_registry/promotion_policy.yaml``.
"""

from __future__ import annotations

import hashlib
import logging
import math
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd
import yaml
from mlflow.entities import Run, RunStatus
from mlflow.exceptions import MlflowException
from mlflow.models import EvaluationResult, MetricThreshold

from horus_airflow.errors import HorusError
from horus_airflow.features.gpus import GPU_SPECS
from horus_airflow.features.graph import GraphFeatures
from horus_airflow.interference import signature
from horus_airflow.interference.base import SIGNATURE_FIELDS
from horus_airflow.interference.learned import LearnedInterference
from horus_airflow.interference.pairs import PAIR_COLUMNS
from horus_airflow.interference.pairs import design_matrix as pair_design
from horus_airflow.predictor.dataset import COLUMNS, TARGETS, ValidatedData, validate
from horus_airflow.predictor.evaluation import Scores
from horus_airflow.predictor.model import TrainedPredictor, UtilizationModel
from horus_airflow.registry import versions
from horus_airflow.registry.interference import (
    INTERFERENCE_MODEL,
    load_interference,
    train_interference,
)
from horus_airflow.registry.predictor import (
    PREDICTOR_MODEL,
    load_predictor,
    train_predictor,
)
from horus_airflow.registry.store import client, experiment_id, logged_run, search
from horus_airflow.settings import Settings
from horus_airflow.run_schema import Experiment, Metric, Param, Tag

log = logging.getLogger(__name__)



# The challenger's own transfer score: its largest utilization MAE over the mean predictor's on any one
# held-out source or GPU type of its training evaluation (predictor.evaluation.Evaluation.worst_ratio).
TRANSFER_METRIC = "transfer_gpu_util_worst_mae_ratio"


class PromotionPolicyError(HorusError, ValueError):
    """A promotion policy file that cannot be used."""


@dataclass(frozen=True)
class ModelPolicy:
    """What a challenger must show on held-out data before it may replace the champion."""

    min_heldout_rows: int
    heldout_fraction: float
    thresholds: dict[str, MetricThreshold]

    def describe(self) -> dict[str, Any]:
        return {"min_heldout_rows": self.min_heldout_rows, "heldout_fraction": self.heldout_fraction,
                "thresholds": {k: {a: getattr(t, a) for a in ("threshold", "min_absolute_change", "min_relative_change", "greater_is_better")}
                               for k, t in self.thresholds.items()}}


@dataclass(frozen=True)
class PromotionPolicy:
    predictor: ModelPolicy
    interference: ModelPolicy

    @classmethod
    def load(cls, path: Path) -> PromotionPolicy:
        try:
            raw = yaml.safe_load(path.read_text())
            return cls(_model_policy(raw[PREDICTOR_MODEL]), _model_policy(raw[INTERFERENCE_MODEL]))
        except FileNotFoundError:
            raise PromotionPolicyError(f"promotion policy not found: {path}") from None
        except (KeyError, TypeError, ValueError, yaml.YAMLError) as exc:
            raise PromotionPolicyError(
                f"promotion policy {path} is not usable ({type(exc).__name__}: {exc}); it needs {PREDICTOR_MODEL!r} and "
                f"{INTERFERENCE_MODEL!r}, each with min_heldout_rows, heldout_fraction and thresholds "
                "(metric: {threshold, min_absolute_change, min_relative_change, greater_is_better})"
            ) from None


def _model_policy(raw: dict[str, Any]) -> ModelPolicy:
    thresholds = {name: MetricThreshold(**spec) for name, spec in raw["thresholds"].items()}
    fraction = float(raw["heldout_fraction"])
    if not 0 < fraction < 1:
        raise ValueError(f"heldout_fraction must be between 0 and 1, got {fraction}")
    return ModelPolicy(int(raw["min_heldout_rows"]), fraction, thresholds)


# --- extract -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Extracted:
    """Profiling runs turned into training rows: the predictor's (jobs alone), co-location pairs, and the
    runs set aside with their reason. ``newest_ms`` is the start time of the newest run read."""

    predictor_rows: pd.DataFrame
    pairs: pd.DataFrame
    set_aside: pd.DataFrame
    runs_read: int
    newest_ms: int

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"profiling_rows": self.predictor_rows, "profiling_pairs": self.pairs, "set_aside": self.set_aside}


def stage_tables(settings: Settings, airflow_run_id: str, tables: dict[str, pd.DataFrame], run_id: str | None = None) -> str:
    """Keep tables one retraining task hands the next as CSV artifacts of an MLflow run (experiment
    ``horus-retraining-data``, one run per DAG run), not on a local disk: the next task may run on
    another worker. Returns the run's id; give it back to add tables to the same run."""
    mlflow_client = client(settings)
    if run_id is None:
        run_id = mlflow_client.create_run(experiment_id(mlflow_client, settings, Experiment.RETRAINING_DATA),
                                          run_name=f"data-{airflow_run_id}"[:250],
                                          tags={Tag.AIRFLOW_RUN_ID: airflow_run_id, Tag.RUN_KIND: "retraining-data"}).info.run_id
    try:
        with tempfile.TemporaryDirectory(prefix="horus-staged-") as folder:
            for name, table in tables.items():
                table.to_csv(Path(folder) / f"{name}.csv", index=False)
            mlflow_client.log_artifacts(run_id, folder, artifact_path="tables")
    finally:  # never left RUNNING: a later task adds its tables to a closed run
        mlflow_client.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED))
    return run_id


def staged_table(settings: Settings, run_id: str, name: str) -> pd.DataFrame:
    """A table :func:`stage_tables` kept."""
    with tempfile.TemporaryDirectory(prefix="horus-staged-") as folder:
        path = client(settings).download_artifacts(run_id, f"tables/{name}.csv", folder)
        return pd.read_csv(path)


def all_profiling_runs(settings: Settings) -> list[Run]:
    return search(settings, Experiment.PROFILING, order_by=["attributes.start_time ASC"])


@dataclass(frozen=True)
class _Usable:
    """A profiling run that can be learned from, with its features parsed once."""

    run: Run
    features: GraphFeatures

    @property
    def run_id(self) -> str:
        return self.run.info.run_id

    @property
    def key(self) -> tuple[str, str]:
        """The same job on the same GPU type: its workload as ``MODEL:BATCH[:amp]@DATASET``, and the GPU type."""
        f = self.features
        return f"{f.model}:{f.batch_size}{':amp' if f.precision == 'amp' else ''}@{f.dataset}", self.run.data.tags[Tag.GPU_TYPE]

    def throughput(self) -> float | None:
        value = self.run.data.metrics.get(Metric.THROUGHPUT)
        return value if value is not None and math.isfinite(value) and value > 0 else None


def extract(runs: list[Run]) -> Extracted:
    """Pure: every run becomes a predictor row, a pair side, or a set-aside row with its reason."""
    rows, aside, alone, shared = [], [], [], []
    seen_sources: dict[str, str] = {}
    for run in runs:
        run_id, tags, metrics = run.info.run_id, run.data.tags, run.data.metrics
        why = _why_not_usable(run, seen_sources)
        source = tags.get(Tag.SOURCE_ID)
        if source and source not in seen_sources:
            seen_sources[source] = run_id
        features = None
        if not why:
            try:
                features = GraphFeatures.from_mapping(
                    {k.removeprefix(Param.FEATURE_PREFIX): v for k, v in run.data.params.items() if k.startswith(Param.FEATURE_PREFIX)})
            except (KeyError, ValueError, TypeError) as exc:
                why = f"features unreadable ({type(exc).__name__}: {exc})"
        if why or features is None:
            aside.append({"run_id": run_id, "reason": why})
            continue
        usable = _Usable(run, features)
        if tags.get(Tag.CO_RESIDENTS):
            shared.append(usable)
            continue
        alone.append(usable)
        rows.append({
            "origin": "profiling", "origin_ref": run_id, "gpu_type": tags[Tag.GPU_TYPE], **asdict(features),
            "gpu_util": metrics.get(Metric.GPU_UTIL_MEAN), "gpu_util_p90": metrics.get(Metric.GPU_UTIL_P90),
            "gpu_mem_mib": metrics.get(Metric.GPU_MEM_MIB_MAX),
        })
    pairs, pair_aside = _pairs(shared, alone)
    predictor_rows = pd.DataFrame(rows, columns=list(COLUMNS))
    newest = max((r.info.start_time for r in runs), default=0)
    return Extracted(predictor_rows, pairs, pd.DataFrame(aside + pair_aside, columns=["run_id", "reason"]), len(runs), int(newest))


def _why_not_usable(run: Run, seen_sources: dict[str, str]) -> str:
    tags = run.data.tags
    source = tags.get(Tag.SOURCE_ID)
    if source and source in seen_sources:
        return f"duplicate of run {seen_sources[source]} (same source {source})"
    if run.info.status != "FINISHED":
        return f"run {run.info.status.lower()} (exit code {tags.get(Tag.EXIT_CODE, '?')})"
    if tags.get(Tag.GPU_MEASURED) != "true":
        return "no GPU measured (NVML absent or declared GPU)"
    if Param.TRAIN_FLOPS not in run.data.params:
        return "run without features (no job spec)"
    if tags.get(Tag.GPU_TYPE) not in GPU_SPECS:
        return f"unknown GPU type {tags.get(Tag.GPU_TYPE)!r}"
    return ""


def _pairs(shared: list[_Usable], alone: list[_Usable]) -> tuple[pd.DataFrame, list[dict[str, str]]]:
    """Pair rows (PAIR_COLUMNS) from runs that shared a GPU, each side's speed being its throughput
    together over the median throughput of the same job alone on the same GPU type."""
    alone_throughput: dict[tuple[str, str], list[float]] = {}
    for run in alone:
        if (value := run.throughput()) is not None:
            alone_throughput.setdefault(run.key, []).append(value)
    groups: dict[str, list[_Usable]] = {}
    aside = []
    for side in shared:
        pair_id = side.run.data.tags.get(Tag.PAIR_ID)
        if not pair_id:
            aside.append({"run_id": side.run_id, "reason": "shared its GPU outside a profiled pair (no horus.pair_id)"})
        else:
            groups.setdefault(pair_id, []).append(side)
    rows = []
    for pair_id, members in groups.items():
        if len(members) != 2:
            aside.extend({"run_id": m.run_id, "reason": f"pair {pair_id} has {len(members)} usable runs, not 2"} for m in members)
            continue
        for me, other in (members, members[::-1]):
            together = me.throughput()
            if together is None:
                aside.append({"run_id": me.run_id, "reason": "no throughput reported: the speed in the pair is unknown"})
            elif me.key not in alone_throughput:
                aside.append({"run_id": me.run_id, "reason": f"no run of {me.key[0]} alone on {me.key[1]} to compare with"})
            else:
                rows.append(_pair_row(me, other, together / float(np.median(alone_throughput[me.key]))))
    return pd.DataFrame(rows, columns=list(PAIR_COLUMNS)), aside


def _pair_row(me: _Usable, other: _Usable, speed: float) -> dict[str, Any]:
    row: dict[str, Any] = {
        "gpu_type": me.key[1], "job_a": me.key[0], "job_b": other.key[0], "family_a": me.features.family,
        "family_b": other.features.family, "speed_a": speed, "fits": True,
    }
    for side, usable in (("a", me), ("b", other)):
        params = usable.run.data.params
        row[f"util_{side}"] = float(params.get(Param.PREDICTED_UTIL, "nan"))
        row[f"util_p90_{side}"] = float(params.get(Param.PREDICTED_UTIL_P90, "nan"))
        row[f"mem_{side}"] = float(params.get(Param.PREDICTED_MEM_MIB, "nan"))
        row.update({f"{side}.{name}": value for name, value in zip(SIGNATURE_FIELDS, signature(usable.features))})
    return row


# --- build and split -----------------------------------------------------------------------------
def build_predictor_data(seed: pd.DataFrame, profiling: pd.DataFrame) -> ValidatedData:
    """The shipped seed rows plus every profiling row, validated once: rows that break the schema
    (NaN, negative, out-of-range targets, duplicates) are set aside with their reason, never dropped silently."""
    frames = [f for f in (seed, profiling) if len(f)]
    return validate(pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(COLUMNS)))


def heldout_values(values: pd.Series, fraction: float) -> set[str]:
    """A stable choice of families (or jobs) to hold out, by a hash of the name, so reruns choose the same."""
    names = sorted(set(values.astype(str)), key=lambda f: hashlib.sha1(f.encode()).hexdigest())
    count = max(1, math.ceil(len(names) * fraction)) if len(names) > 2 else 0
    return set(names[:count])


# --- compare and promote -------------------------------------------------------------------------
@dataclass(frozen=True)
class Comparison:
    """Held-out scores of the challenger and the champion on the very same rows, and the verdict."""

    model: str
    challenger_version: str | None
    champion: str
    heldout_rows: int
    heldout_families: tuple[str, ...]
    challenger_metrics: dict[str, float]
    champion_metrics: dict[str, float]
    passed: bool
    reason: str
    policy: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Comparison:
        """Back from its JSON form (what the retraining DAG passes between tasks)."""
        return cls(**{**raw, "heldout_families": tuple(raw["heldout_families"])})

    def table(self) -> str:
        lines = [f"### {self.model}: challenger v{self.challenger_version} vs champion {self.champion}", "",
                 f"Held out: {self.heldout_rows} rows of {', '.join(self.heldout_families) or 'no family'}.", "",
                 "| metric | challenger | champion |", "|---|---:|---:|"]
        for name in sorted(set(self.challenger_metrics) | set(self.champion_metrics)):
            lines.append(f"| {name} | {self.challenger_metrics.get(name, float('nan')):.4f} | {self.champion_metrics.get(name, float('nan')):.4f} |")
        lines += ["", f"**{'PROMOTED' if self.passed else 'NOT promoted'}**: {self.reason}", ""]
        return "\n".join(lines)


def predictor_metrics(model: UtilizationModel, rows: pd.DataFrame) -> dict[str, float]:
    predicted = model.predict(rows)
    out = {}
    for target, short in zip(TARGETS, ("gpu_util", "gpu_util_p90", "gpu_mem")):
        known = rows[target].notna().to_numpy()
        if known.sum():
            scores = Scores.of(rows.loc[known, target].to_numpy(dtype=float), predicted.loc[known, target].to_numpy(dtype=float))
            out[f"{short}_rmsle"], out[f"{short}_mae"] = scores.rmsle, scores.mae
    return out


def interference_metrics(model: LearnedInterference, pairs: pd.DataFrame) -> dict[str, float]:
    speed, _fits = model.predict_pairs(pair_design(pairs))
    truth = pairs["speed_a"].to_numpy(dtype=float)
    return {"speed_mae": float(np.abs(np.asarray(speed) - truth).mean())} if len(pairs) else {}


def judge(model: str, policy: ModelPolicy, challenger: dict[str, float], champion: dict[str, float], heldout_rows: int) -> tuple[bool, str]:
    """The policy's verdict through ``mlflow.validate_evaluation_results``; too little held-out data
    never promotes. A threshold without a min change is the challenger's alone (its transfer score);
    the others compare it with the champion on the same held-out rows."""
    if heldout_rows < policy.min_heldout_rows:
        return False, f"only {heldout_rows} held-out rows, the policy needs {policy.min_heldout_rows}"
    absolute = {k: t for k, t in policy.thresholds.items()
                if k in challenger and t.min_absolute_change is None and t.min_relative_change is None}
    relative = {k: t for k, t in policy.thresholds.items() if k in challenger and k in champion and k not in absolute}
    if not relative:
        return False, f"no metric of the policy ({', '.join(policy.thresholds)}) could be measured on the held-out rows"
    try:
        if absolute:
            mlflow.validate_evaluation_results(absolute, EvaluationResult(challenger, {}), None)
        mlflow.validate_evaluation_results(relative, EvaluationResult(challenger, {}), EvaluationResult(champion, {}))
    except MlflowException as exc:
        return False, str(exc.message if hasattr(exc, "message") else exc).replace("\n", " ")
    return True, f"passes {', '.join(sorted({*absolute, *relative}))} against {model}'s champion"


def compare_predictor(settings: Settings, data: ValidatedData, policy: ModelPolicy, source: str) -> Comparison:
    """Train the challenger without the held-out families, register it (alias ``challenger``), and
    score it and the champion (as it was before this training) on the profiling rows of those families."""
    rows = data.rows
    held = heldout_values(rows["family"], policy.heldout_fraction)
    is_held = rows["family"].astype(str).isin(held)
    heldout = rows[is_held & (rows["origin"] == "profiling")]
    champion = load_predictor(settings)
    champion_label = champion.name if isinstance(champion, TrainedPredictor) else "prior"
    champion_model = champion.model if isinstance(champion, TrainedPredictor) else UtilizationModel(prior=champion)
    outcome = train_predictor(settings, ValidatedData(rows[~is_held], data.rejected), source, register=True)
    challenger_scores = predictor_metrics(outcome.model, heldout) if len(heldout) else {}
    transfer = outcome.evaluation.worst_ratio()
    if not math.isnan(transfer):
        challenger_scores[TRANSFER_METRIC] = transfer
    champion_scores = predictor_metrics(champion_model, heldout) if len(heldout) else {}
    passed, reason = judge(PREDICTOR_MODEL, policy, challenger_scores, champion_scores, len(heldout))
    return Comparison(PREDICTOR_MODEL, outcome.version, champion_label, len(heldout), tuple(sorted(held)),
                      challenger_scores, champion_scores, passed, reason, policy.describe())


def compare_interference(settings: Settings, seed_pairs: pd.DataFrame, profiling_pairs: pd.DataFrame, policy: ModelPolicy,
                         source: str) -> Comparison:
    """As :func:`compare_predictor`, for the interference model, but holding out jobs (a model at one
    batch size), not families: the boosters answer only for jobs near those they were trained on, and a
    family never trained on gets the time-sharing law, which fits nothing and so has nothing to judge.
    The held-out jobs are chosen among the profiled pairs', and their pairs are scored (speed MAE) by
    the challenger and the champion."""
    held = heldout_values(pd.concat([profiling_pairs["job_a"], profiling_pairs["job_b"]]), policy.heldout_fraction) \
        if len(profiling_pairs) else set()
    def touches(frame: pd.DataFrame) -> pd.Series:
        return frame["job_a"].astype(str).isin(held) | frame["job_b"].astype(str).isin(held)
    heldout = profiling_pairs[touches(profiling_pairs)] if len(profiling_pairs) else profiling_pairs
    training = pd.concat([seed_pairs[~touches(seed_pairs)], profiling_pairs[~touches(profiling_pairs)]], ignore_index=True) \
        if len(profiling_pairs) else seed_pairs
    champion, champion_label = load_interference(settings)
    outcome = train_interference(settings, training, source, register=True)
    challenger_scores = interference_metrics(outcome.model, heldout) if len(heldout) and outcome.model else {}
    if isinstance(champion, LearnedInterference):
        champion_scores = interference_metrics(champion, heldout) if len(heldout) else {}
    else:
        speed = champion.speed_at((heldout["util_a"] + heldout["util_b"]).to_numpy(dtype=float)) if len(heldout) else []
        champion_scores = {"speed_mae": float(np.abs(np.asarray(speed) - heldout["speed_a"].to_numpy(dtype=float)).mean())} if len(heldout) else {}
    passed, reason = judge(INTERFERENCE_MODEL, policy, challenger_scores, champion_scores, len(heldout))
    return Comparison(INTERFERENCE_MODEL, outcome.version, champion_label, len(heldout), tuple(sorted(held)),
                      challenger_scores, champion_scores, passed, reason, policy.describe())


def promote_if_passed(settings: Settings, comparison: Comparison) -> bool:
    """Move ``champion`` to the challenger only on a passing comparison; the last step of a retraining."""
    if not comparison.passed or comparison.challenger_version is None:
        log.info("%s: champion kept (%s)", comparison.model, comparison.reason)
        return False
    versions.promote(settings, comparison.model, comparison.challenger_version)
    log.info("%s: version %s promoted to champion: %s", comparison.model, comparison.challenger_version, comparison.reason)
    return True


def log_report(settings: Settings, comparisons: list[Comparison], extracted: dict[str, Any], promoted: dict[str, bool]) -> str:
    """One run in ``horus-retraining``: what was read, set aside, compared and promoted."""
    lines = ["# Retraining report", "", f"Profiling runs read: {extracted.get('runs_read', 0)}; predictor rows: "
             f"{extracted.get('predictor_rows', 0)}; pairs: {extracted.get('pairs', 0)}; set aside: {extracted.get('set_aside', 0)}.", ""]
    for reason, count in sorted(extracted.get("set_aside_reasons", {}).items(), key=lambda kv: -kv[1]):
        lines.append(f"- set aside, {count} x {reason}")
    lines.append("")
    lines += [c.table() for c in comparisons]
    report = "\n".join(lines)
    tags = {Tag.RUN_KIND: "retraining", Tag.PROFILING_UNTIL_MS: str(extracted.get("newest_ms", 0))}
    with logged_run(settings, Experiment.RETRAINING, "retrain", tags):
        mlflow.log_params({"runs_read": extracted.get("runs_read", 0), "set_aside": extracted.get("set_aside", 0)})
        for c in comparisons:
            short = "predictor" if c.model == PREDICTOR_MODEL else "interference"
            mlflow.log_params({f"{short}.challenger_version": c.challenger_version, f"{short}.champion_before": c.champion,
                               f"{short}.promoted": promoted.get(c.model, False), f"{short}.heldout_rows": c.heldout_rows})
            mlflow.log_metrics({**{f"{short}.challenger.{k}": v for k, v in c.challenger_metrics.items()},
                                **{f"{short}.champion.{k}": v for k, v in c.champion_metrics.items()}})
            mlflow.log_dict(asdict(c), f"comparisons/{short}.json")
        mlflow.log_text(report, "report.md")
    return report


def last_retraining_until_ms(settings: Settings) -> int:
    """Start time of the newest profiling run the last retraining read (0 if none ran)."""
    runs = search(settings, Experiment.RETRAINING, "attributes.status = 'FINISHED'", order_by=["attributes.start_time DESC"],
                  max_results=1)
    return int(runs[0].data.tags.get(Tag.PROFILING_UNTIL_MS, 0)) if runs else 0
