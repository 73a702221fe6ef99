"""The console command, the provider entry point and the settings object."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import jsonschema
import pytest

from horus_airflow.settings import Settings
from tests.conftest import env_with_home

HORUS = str(Path(sys.executable).parent / "horus")


@pytest.mark.parametrize(
    "args", [[], ["run"], ["predict"], ["predictor"], ["predictor", "train"], ["catalog"], ["inventory"], ["demo"]]
)
def test_cli_answers_help(args: list[str]) -> None:
    done = subprocess.run([HORUS, *args, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage: horus" in done.stdout


@pytest.mark.integration
def test_predict_json_contract(tmp_path: Path) -> None:
    fresh = env_with_home(tmp_path)  # no champion registered: the prior predicts
    fresh.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run(
        [HORUS, "predict", "--model", "resnet18", "--batch-size", "32", "--json"], capture_output=True, text=True, timeout=120, env=fresh
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert 0 < result["gpu_util"] <= result["gpu_util_p90"] <= 100
    assert result["gpu_mem_mib"] > 0 and result["predictor"] == "prior"


@pytest.mark.integration
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "vgg1", "--batch-size", "8"], "unknown model 'vgg1'. Did you mean: vgg19, vgg16, vgg11?"),
        (["--model", "resnet18", "--batch-size", "0"], "batch_size must be an integer from 1 to"),
        (["--model", "resnet18", "--batch-size", "8", "--gpu", "a100"], "Did you mean: a100-40gb, a100-80gb"),
        (["--model", "lstm_lm", "--batch-size", "8", "--dataset", "imagenet"], "datasets that fit 'lstm_lm'"),
    ],
)
def test_cli_bad_input_exits_2_with_the_accepted_values(args: list[str], message: str) -> None:
    done = subprocess.run([HORUS, "predict", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert message in done.stderr


@pytest.mark.integration
def test_train_then_predict_with_the_registered_champion(tmp_path: Path) -> None:
    env = env_with_home(tmp_path / "horus")
    seed = Path(__file__).resolve().parent.parent / "data" / "predictor_seed" / "predictor_seed.csv"
    trained = subprocess.run([HORUS, "predictor", "train", "--data", str(seed)], capture_output=True, text=True,
                             timeout=300, env=env)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "| **source: all** | gpu_util | 57 |" in trained.stdout
    assert "registered horus-gpu-utilization version 1 as challenger, champion" in trained.stdout
    user_file = tmp_path / "net.py"
    user_file.write_text("from torch import nn\n\ndef make():\n    return nn.Sequential(nn.Flatten(), nn.Linear(3072, 10))\n")
    for model, extra in (("bert_base", ["--amp", "--gpu", "h200"]), (f"{user_file}:make", ["--dataset", "cifar10"])):
        done = subprocess.run([HORUS, "predict", "--model", model, "--batch-size", "16", *extra, "--json"],
                              capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout)
        assert result["predictor"] == "horus-gpu-utilization/1"
        assert 1 <= result["gpu_util"] <= result["gpu_util_p90"] <= 100 and result["gpu_mem_mib"] > 0


def test_provider_entry_point_returns_schema_valid_info() -> None:
    (entry,) = [e for e in entry_points(group="apache_airflow_provider") if e.value.startswith("horus_airflow")]
    info = entry.load()()
    import airflow

    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    jsonschema.validate(info, schema)
    assert info["package-name"] == "horus-airflow"


def test_settings_default_under_horus_home_and_follow_the_environment(tmp_path: Path) -> None:
    settings = Settings.from_env({"HORUS_HOME": str(tmp_path)})
    assert settings.mlflow_tracking_uri == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert settings.airflow_home == tmp_path / "airflow"
    assert settings.ledger_path.parent == tmp_path
    custom = Settings.from_env({"HORUS_HOME": str(tmp_path), "MLFLOW_TRACKING_URI": "http://127.0.0.1:5000"})
    assert custom.mlflow_tracking_uri == "http://127.0.0.1:5000"
    assert Settings.from_env({}).home == Path(".horus").resolve()


def test_the_demo_declares_gpus_on_a_machine_without_any_and_its_ui_commands_stay_on_loopback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from horus_airflow import demo
    from horus_airflow.settings import Settings
    from horus_airflow.telemetry import nvml

    monkeypatch.setattr(nvml, "discover_gpus", lambda: [])
    monkeypatch.delenv("HORUS_LOCAL_GPUS")
    settings = demo._with_gpus(Settings.from_env())
    assert settings.local_gpus == demo.DEMO_GPUS == os.environ["HORUS_LOCAL_GPUS"]
    assert "declaring HORUS_LOCAL_GPUS=2xa100-80gb" in capsys.readouterr().out
    commands = demo.open_ui_commands(settings, tmp_path)
    assert "0.0.0.0" not in commands and "AIRFLOW__API__HOST=127.0.0.1" in commands
    assert "HORUS_MLFLOW_UI_URL=http://127.0.0.1:5000" in commands and "--host 127.0.0.1 --port 5000" in commands
