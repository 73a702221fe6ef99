"""The run schema (every MLflow name in one module) and the MLflow client's HTTP policy."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from mlflow.environment_variables import MLFLOW_HTTP_REQUEST_MAX_RETRIES, MLFLOW_HTTP_REQUEST_TIMEOUT

from horus_airflow import run_schema as schema
from horus_airflow.registry.store import QUICK, client, experiment_id, http_policy, search
from horus_airflow.settings import Settings


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("HORUS_HOME", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return Settings.from_env()


def test_a_policy_holds_in_its_own_thread_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MLFLOW_HTTP_REQUEST_MAX_RETRIES.name, raising=False)
    monkeypatch.delenv(MLFLOW_HTTP_REQUEST_TIMEOUT.name, raising=False)
    inside, entered, leave = {}, threading.Event(), threading.Event()

    def quick_caller() -> None:
        with http_policy(QUICK):
            inside["retries"], inside["timeout"] = MLFLOW_HTTP_REQUEST_MAX_RETRIES.get(), MLFLOW_HTTP_REQUEST_TIMEOUT.get()
            entered.set()
            leave.wait(5)

    worker = threading.Thread(target=quick_caller)
    worker.start()
    assert entered.wait(5)
    meanwhile = MLFLOW_HTTP_REQUEST_MAX_RETRIES.get(), MLFLOW_HTTP_REQUEST_TIMEOUT.get()
    leave.set()
    worker.join()
    assert inside == {"retries": 1, "timeout": 10}
    assert meanwhile == (MLFLOW_HTTP_REQUEST_MAX_RETRIES.default, MLFLOW_HTTP_REQUEST_TIMEOUT.default)


def test_what_the_user_set_wins_over_a_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MLFLOW_HTTP_REQUEST_MAX_RETRIES.name, "3")
    with http_policy(QUICK):
        assert MLFLOW_HTTP_REQUEST_MAX_RETRIES.get() == 3


def test_a_policy_client_applies_its_policy_to_each_call(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MLFLOW_HTTP_REQUEST_MAX_RETRIES.name, raising=False)
    seen = []
    quick = client(settings, QUICK)
    monkeypatch.setattr(type(quick).__mro__[1], "get_experiment_by_name",
                        lambda self, name: seen.append(MLFLOW_HTTP_REQUEST_MAX_RETRIES.get()))
    quick.get_experiment_by_name("x")
    client(settings).get_experiment_by_name("x")
    assert seen == [1, MLFLOW_HTTP_REQUEST_MAX_RETRIES.default]


@pytest.mark.integration
def test_search_reads_every_page_and_nothing_of_a_missing_experiment(settings: Settings) -> None:
    assert search(settings, "no-such-experiment") == []
    mlflow = client(settings)
    experiment = experiment_id(mlflow, settings, schema.Experiment.PROFILING)
    for i in range(5):
        mlflow.create_run(experiment, tags={schema.Tag.AIRFLOW_RUN_ID: "r1" if i < 3 else "r2"})
    assert len(search(settings, schema.Experiment.PROFILING)) == 5
    assert len(search(settings, schema.Experiment.PROFILING, schema.tag_equals(schema.Tag.AIRFLOW_RUN_ID, "r1"))) == 3
    assert len(search(settings, schema.Experiment.PROFILING, max_results=2)) == 2


def test_a_filter_value_with_a_quote_is_refused_not_injected() -> None:
    with pytest.raises(ValueError, match="quote"):
        schema.tag_equals(schema.Tag.OWNER, "x' or tags.`a` = 'b")


def test_names_are_unique() -> None:
    for group in (schema.Tag, schema.Param, schema.Metric, schema.Experiment):
        values = [v for k, v in vars(group).items() if k.isupper()]
        assert len(values) == len(set(values)), group.__name__
