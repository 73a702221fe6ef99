"""Retraining from profiling runs: extraction with its reasons, pairs, the promotion policy, and the DAGs.

The "measured" profiling runs here are the shipped seed rows (measured by Alnair and Muri) logged as
profiling runs, so the models are judged against real measurements, never against themselves.
"""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

import pandas as pd
import pytest

from horus_airflow.features.gpus import gpu_spec
from horus_airflow.features.graph import GraphFeatures
from horus_airflow.placement import GpuState
from horus_airflow.predictor.dataset import ValidatedData, read_training_data
from horus_airflow.registry import retraining as R
from horus_airflow.run_schema import Experiment, Tag, tag_equals
from horus_airflow.registry.store import search
from horus_airflow.registry.predictor import champion_version, train_predictor
from horus_airflow.registry.profiling import ProfilingRecord, log_profiling_run
from horus_airflow.settings import Settings
from horus_airflow.telemetry import RunSummary
from tests.conftest import DAGS_FOLDER, REPO, load_dag_file

SEED = REPO / "data" / "predictor_seed" / "predictor_seed.csv"
POLICY = REPO / "model_registry" / "promotion_policy.yaml"
FEATURES = [f.name for f in fields(GraphFeatures)]


def seed_rows() -> pd.DataFrame:
    return read_training_data(SEED).rows


def scramble(rows: pd.DataFrame) -> pd.DataFrame:
    """The same rows as a broken export wrote them: every utilization a quarter of the truth (a units
    slip). Shuffled labels would not do: a correction that transfers between nothing is weighted to 0,
    and the champion would be the prior, no worse than a good challenger."""
    return rows.assign(gpu_util=rows["gpu_util"] / 4, gpu_util_p90=rows["gpu_util_p90"] / 4)


def _optional(value: object) -> float | None:
    return None if pd.isna(value) else float(value)  # type: ignore[arg-type]


def log_measured(settings: Settings, rows: pd.DataFrame, tmp: Path, **changes: object) -> list[str]:
    """Each row becomes a profiling run with its features and its measured targets."""
    ids = []
    for i, row in rows.reset_index(drop=True).iterrows():
        features = GraphFeatures.from_mapping(row[FEATURES].to_dict())
        summary = RunSummary(0, 10.0, 50, True, 100.0, 1000.0, gpu_util_mean=_optional(row.gpu_util),
                             gpu_util_p90=_optional(row.gpu_util_p90), gpu_mem_mib_max=_optional(row.gpu_mem_mib))
        gpu = GpuState("n/0", "n", 0, row.gpu_type, gpu_spec(row.gpu_type).memory_mib)
        record = ProfilingRecord(None, features, None, "prior", None, (gpu,), summary, tmp / f"{i}-{len(ids)}", {}, co_residents=())
        record = replace(record, **changes)  # type: ignore[arg-type]
        record.run_dir.mkdir(parents=True, exist_ok=True)
        ids.append(log_profiling_run(settings, record))
    return ids


@pytest.mark.integration
def test_extraction_sets_aside_what_it_cannot_learn_from_and_keeps_every_good_row(horus_home: Path, tmp_path: Path) -> None:
    settings = Settings.from_env()
    rows = seed_rows()
    good = log_measured(settings, rows.head(6), tmp_path)
    row = rows.head(1)
    no_gpu = log_measured(settings, row, tmp_path, summary=RunSummary(0, 1.0, 5, False, 50.0, 10.0))
    no_features = log_measured(settings, row, tmp_path, features=None)
    failed = log_measured(settings, row, tmp_path, summary=RunSummary(1, 1.0, 5, True, 50.0, 10.0, gpu_util_mean=40.0))
    dup = log_measured(settings, row, tmp_path, context_tags={"horus.source_id": "export-1/pod-a"})
    dup += log_measured(settings, row, tmp_path, context_tags={"horus.source_id": "export-1/pod-a"})
    negative = log_measured(settings, row, tmp_path, summary=RunSummary(0, 1.0, 5, True, 50.0, 10.0, gpu_util_mean=-3.0))
    extracted = R.extract(R.all_profiling_runs(settings))
    reasons = dict(zip(extracted.set_aside["run_id"], extracted.set_aside["reason"]))
    assert reasons[no_gpu[0]].startswith("no GPU measured")
    assert reasons[no_features[0]].startswith("run without features")
    assert reasons[failed[0]].startswith("run failed")
    assert reasons[dup[1]].startswith(f"duplicate of run {dup[0]}") and dup[0] not in reasons
    assert extracted.runs_read == 12 and len(extracted.predictor_rows) == 8  # 6 good, the first duplicate, the negative
    data = R.build_predictor_data(rows.iloc[:0], extracted.predictor_rows)
    assert set(good) | {dup[0]} <= set(data.rows["origin_ref"])
    assert data.rejected.set_index("origin_ref").loc[negative[0], "reason"] == "gpu_util outside 0-100"


@pytest.mark.integration
def test_pairs_compare_throughput_together_with_the_same_job_alone(horus_home: Path, tmp_path: Path) -> None:
    settings = Settings.from_env()
    two = seed_rows().drop_duplicates("family").head(2)
    throughput = {0: (100.0, 60.0), 1: (50.0, 40.0)}  # (alone, together) samples/s: test inputs for the arithmetic
    for i, (_, row) in enumerate(two.iterrows()):
        alone, together = throughput[i]
        for tags, value, residents in (({}, alone, ()), ({"horus.pair_id": "p1"}, together, (f"partner-{i}",))):
            summary = RunSummary(0, 10.0, 50, True, 100.0, 1.0, gpu_util_mean=50.0, job_metrics={"throughput_samples_per_s": value})
            log_measured(settings, two.iloc[[i]], tmp_path, summary=summary, context_tags=tags, co_residents=residents)
    extracted = R.extract(R.all_profiling_runs(settings))
    assert len(extracted.predictor_rows) == 2 and len(extracted.pairs) == 2
    speeds = sorted(extracted.pairs["speed_a"].round(3))
    assert speeds == [0.6, 0.8]
    assert set(extracted.pairs["family_a"]) == set(two["family"].astype(str))


@pytest.mark.integration
def test_a_worse_challenger_is_not_promoted(horus_home: Path, tmp_path: Path) -> None:
    settings = Settings.from_env()
    rows = seed_rows()
    train_predictor(settings, ValidatedData(rows, rows.iloc[:0]), "seed")  # v1 champion, has seen every row
    log_measured(settings, rows, tmp_path)
    policy = R.PromotionPolicy.load(POLICY)
    data = R.build_predictor_data(rows.iloc[:0], R.extract(R.all_profiling_runs(settings)).predictor_rows)
    comparison = R.compare_predictor(settings, data, policy.predictor, "test")
    assert comparison.challenger_version == "2" and not comparison.passed, comparison.table()
    assert R.promote_if_passed(settings, comparison) is False
    assert champion_version(settings) == "1"


@pytest.mark.integration
def test_a_better_challenger_is_promoted(horus_home: Path, tmp_path: Path) -> None:
    settings = Settings.from_env()
    rows = seed_rows()
    scrambled = scramble(rows)
    train_predictor(settings, ValidatedData(scrambled, rows.iloc[:0]), "a champion trained on scrambled labels")
    log_measured(settings, rows, tmp_path)
    policy = R.PromotionPolicy.load(POLICY)
    data = R.build_predictor_data(rows.iloc[:0], R.extract(R.all_profiling_runs(settings)).predictor_rows)
    comparison = R.compare_predictor(settings, data, policy.predictor, "test")
    assert comparison.passed, comparison.table()
    assert comparison.challenger_metrics["gpu_util_rmsle"] < comparison.champion_metrics["gpu_util_rmsle"]
    assert R.promote_if_passed(settings, comparison) is True
    assert champion_version(settings) == "2"


@pytest.mark.integration
def test_a_registry_that_goes_away_before_promotion_leaves_the_champion(horus_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.exceptions import MlflowException

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # fail in seconds, not after MLflow's minutes of retries
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3")
    settings = Settings.from_env()
    rows = seed_rows()
    train_predictor(settings, ValidatedData(rows, rows.iloc[:0]), "seed")
    passing = R.Comparison("horus-gpu-utilization", "1", "prior", 20, ("x",), {}, {}, True, "test")
    gone = replace(settings, mlflow_tracking_uri="http://127.0.0.1:9")
    with pytest.raises((MlflowException, OSError)):
        R.promote_if_passed(gone, replace(passing, challenger_version="5"))
    assert champion_version(settings) == "1"


def test_a_policy_file_that_does_not_work_says_what_it_needs(tmp_path: Path) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text("horus-gpu-utilization: {min_heldout_rows: 3}\n")
    with pytest.raises(R.PromotionPolicyError, match="needs 'horus-gpu-utilization' and 'horus-interference'"):
        R.PromotionPolicy.load(bad)


def test_a_challenger_that_transfers_worse_than_the_mean_is_not_promoted() -> None:
    """The transfer gate is the challenger's alone: better than the champion on the held-out rows is
    not enough when, on some source or GPU type it was not fitted on, it knows less than the mean."""
    policy = R.PromotionPolicy.load(POLICY).predictor
    better = {"gpu_util_rmsle": 0.3, "gpu_util_p90_rmsle": 0.3}
    champion = {"gpu_util_rmsle": 0.6, "gpu_util_p90_rmsle": 0.6}
    passed, _ = R.judge("m", policy, {**better, R.TRANSFER_METRIC: 0.7}, champion, 20)
    assert passed
    passed, reason = R.judge("m", policy, {**better, R.TRANSFER_METRIC: 1.3}, champion, 20)
    assert not passed and R.TRANSFER_METRIC in reason


@pytest.mark.airflow
def test_the_retraining_dag_promotes_skips_when_nothing_is_new_and_fails_safely(
    airflow_db: Path, horus_home: Path, tmp_path: Path
) -> None:
    settings = Settings.from_env()
    rows = seed_rows()
    scrambled = scramble(rows)
    train_predictor(settings, ValidatedData(scrambled, rows.iloc[:0]), "scrambled champion")
    log_measured(settings, rows, tmp_path)
    def fresh_dag():  # type: ignore[no-untyped-def]  # dag.test(run_conf=...) leaves the conf on the DAG object
        return load_dag_file(DAGS_FOLDER / "horus_retrain_predictor.py").dag

    broken = fresh_dag().test(run_conf={"policy": "model_registry/no-such-policy.yaml"})
    assert str(broken.state) == "failed"
    states = {ti.task_id: str(ti.state) for ti in broken.get_task_instances()}
    assert states["retrain_predictor"] == "failed" and states["promote"] == "upstream_failed"
    assert champion_version(settings) == "1"  # a run that failed half-way changed nothing

    run = fresh_dag().test()
    assert str(run.state) == "success"
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    assert states["retrain_interference"] == "skipped"  # no co-located profiling run
    assert champion_version(settings) == "2"  # the failed run stopped before registering anything
    # tasks handed their tables on through MLflow, not through a folder of this machine
    assert not (horus_home / "retraining").exists()
    [data_run] = search(settings, Experiment.RETRAINING_DATA, tag_equals(Tag.AIRFLOW_RUN_ID, run.run_id))
    assert data_run.info.status == "FINISHED"
    staged = R.staged_table(settings, data_run.info.run_id, "rows")
    assert len(staged) >= len(rows) and set(staged.columns) >= {"model", "gpu_type", "gpu_util"}

    again = fresh_dag().test()
    states = {ti.task_id: str(ti.state) for ti in again.get_task_instances()}
    assert states["extract"] == "skipped" and champion_version(settings) == "2"


@pytest.mark.airflow
def test_the_profiling_dag_profiles_alone_and_in_pairs(airflow_db: Path, horus_home: Path) -> None:
    dag = load_dag_file(DAGS_FOLDER / "horus_profile_models.py").dag
    run = dag.test(run_conf={"workloads": ["mlp:16@mnist"], "pairs": ["mlp:16@mnist+mlp:32@mnist"], "steps": 3})
    assert str(run.state) == "success", [(ti.task_id, ti.state) for ti in run.get_task_instances()]
    runs = R.all_profiling_runs(Settings.from_env())
    assert len(runs) == 3
    paired = [r for r in runs if r.data.tags.get("horus.pair_id")]
    assert len(paired) == 2 and len({r.data.tags["horus.pair_id"] for r in paired}) == 1
    assert all(r.data.tags["horus.co_residents"] for r in paired)
    extracted = R.extract(runs)  # no GPU here: every run is kept in MLflow and set aside for training, with why
    assert set(extracted.set_aside["reason"]) == {"no GPU measured (NVML absent or declared GPU)"}


@pytest.mark.integration
def test_bootstrap_seeds_both_models_once_with_their_cards(horus_home: Path) -> None:
    from horus_airflow.registry.bootstrap import bootstrap
    from horus_airflow.registry.store import client

    settings = Settings.from_env()
    first = bootstrap(settings)
    assert [(s.model, s.champion, s.trained) for s in first] == [("horus-gpu-utilization", "1", True), ("horus-interference", "1", True)]
    again = bootstrap(settings)
    assert [s.trained for s in again] == [False, False]
    registered = client(settings).get_registered_model("horus-gpu-utilization")
    assert registered.description.startswith("# horus-gpu-utilization — model card")
    assert "held-out-source utilization MAE" in client(settings).get_model_version("horus-gpu-utilization", "1").description


@pytest.mark.integration
def test_the_campaign_runs_end_to_end_without_a_gpu_and_says_so(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "profile_campaign.py"), "--out", str(tmp_path / "out"), "--home", str(tmp_path / "home"),
         "--models", "mlp", "--steps", "2", "--pairs", "1"],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "NO GPU DATA WAS PRODUCED" in done.stdout
    report = json.loads((tmp_path / "out" / "campaign.json").read_text())
    assert report["jobs_done"] == 2 and report["pairs_run"] == 1 and report["gpu_data_produced"] is False
    assert report["set_aside"] == 4 and report["predictor_rows"] == 0


@pytest.mark.integration
def test_the_interference_model_is_compared_and_promoted_by_the_same_rules(horus_home: Path) -> None:
    """Gavel's measured pairs stand in for profiled pairs: the challenger must beat a champion trained
    on scrambled speeds, and is judged by speed MAE on held-out jobs."""
    from horus_airflow.interference.pairs import read_pairs
    from horus_airflow.registry.interference import train_interference
    from horus_airflow.registry.versions import champion_version as version_of

    settings = Settings.from_env()
    pairs = read_pairs(REPO / "data" / "interference_seed" / "gavel_pairs.csv")
    ran = pairs[pairs["fits"]]
    scrambled = pairs.copy()
    scrambled.loc[ran.index, "speed_a"] = ran["speed_a"].sample(frac=1.0, random_state=5).to_numpy()
    train_interference(settings, scrambled, "a champion trained on scrambled speeds")
    policy = R.PromotionPolicy.load(POLICY)
    profiled = ran.sample(n=600, random_state=1)
    comparison = R.compare_interference(settings, pairs.drop(profiled.index), profiled, policy.interference, "test")
    assert comparison.heldout_rows >= policy.interference.min_heldout_rows and comparison.heldout_families
    assert comparison.passed, comparison.table()
    assert comparison.challenger_metrics["speed_mae"] < comparison.champion_metrics["speed_mae"]
    assert R.promote_if_passed(settings, comparison) and version_of(settings, "horus-interference") == "2"
