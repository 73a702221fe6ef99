"""Malformed input to every parser: a typed error with one line naming the problem and what is accepted,
or a clean parse; never a traceback, a hang, a GPU booked or a run left RUNNING.

Each parser gets hand-picked cases and a few hundred seeded mutations of a valid input (a value swapped
for one of the usual suspects, a key dropped, bytes garbled). The seed is fixed, so a failure repeats."""

from __future__ import annotations

import copy
import io
import json
import random
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from horus_airflow.backends.ledger import SqliteLedger
from horus_airflow.backends.local import parse_inventory
from horus_airflow.cli import main
from horus_airflow.errors import HorusError, InvalidJobError, InventoryError, ProfileError
from horus_airflow.jobs import JobSpec
from horus_airflow.placement import ClusterState
from horus_airflow.placement.profiles import parse_profile
from horus_airflow.simulator.traces import TraceError, read_trace
from horus_airflow.telemetry import dcgm

REPO = Path(__file__).resolve().parent.parent
MUTATIONS = 300
NASTY: tuple[Any, ...] = (None, -1, 0, -0.5, 1e308, float("nan"), float("inf"), "", "x", "1e400", [], {}, True, 2**70, [1, "a"])


def mutations(valid: Any, count: int, seed: int) -> Iterator[Any]:
    """``valid`` with one value replaced by a nasty one, or one key dropped, ``count`` times."""
    rng = random.Random(seed)
    for _ in range(count):
        broken = copy.deepcopy(valid)
        paths = list(_paths(broken))
        container, key = rng.choice(paths)
        if isinstance(container, dict) and rng.random() < 0.25:
            del container[key]
        else:
            container[key] = rng.choice(NASTY)
        yield broken


def _paths(node: Any) -> Iterator[tuple[Any, Any]]:
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        yield node, key
        yield from _paths(value)


def refused_in_one_line(parse: Callable[[], Any], error: type[Exception]) -> None:
    """``parse`` succeeds, or raises ``error`` with one line of text; anything else fails the test."""
    try:
        parse()
    except error as exc:
        message = str(exc)
        assert message and "\n" not in message and "Traceback" not in message, message


VALID_STATE = {"version": 3, "gpus": [
    {"gpu_id": "n0/0", "node": "n0", "rack": "r0", "index": 0, "gpu_type": "v100", "memory_mib": 16160, "healthy": True,
     "residents": [{"job_id": "lm", "util": 60, "util_p90": 70, "mem_mib": 3000, "signature": [0.1, 0.2]}]},
    {"gpu_id": "n0/1", "node": "n0", "index": 1, "gpu_type": "v100", "memory_mib": 16160},
]}


def test_cluster_states_mutated_parse_or_are_refused_in_one_line() -> None:
    for broken in mutations(VALID_STATE, MUTATIONS, seed=1):
        refused_in_one_line(lambda: ClusterState.from_dict(broken), InventoryError)


VALID_PROFILE = yaml.safe_load((REPO / "horus_airflow/placement/profiles/horus-ml.yaml").read_text())


@pytest.mark.integration
def test_profiles_mutated_parse_or_are_refused_in_one_line() -> None:
    for broken in mutations(VALID_PROFILE, MUTATIONS, seed=2):
        refused_in_one_line(lambda: parse_profile(broken), ProfileError)


def test_every_built_in_profile_still_parses() -> None:
    for path in (REPO / "horus_airflow/placement/profiles").glob("*.yaml"):
        assert parse_profile(yaml.safe_load(path.read_text())).filters[0].name == "node-healthy"


@pytest.mark.parametrize("text", [
    "", "resnet18", "resnet18:", "resnet18:x", "resnet18:0", "resnet18:-4", "resnet18:32:fp16", "resnet18:32:amp:amp",
    ":32", "resnet18:32@", "resnet18:32@imagenett", "lstm_lm:8@imagenet", "resnet18:99999999999", "resnet18:3.5",
    "resnet18:32@cifar10@x", "\x00:1", "r" * 5000 + ":1",
])
def test_job_specs_are_refused_in_one_line(text: str) -> None:
    def parse_and_resolve() -> None:
        JobSpec.parse(text).features()

    refused_in_one_line(parse_and_resolve, InvalidJobError)


@pytest.mark.parametrize("text", [
    "", ",", "2x", "x", "0xa100-80gb", "-1xa100", "99999xa100-80gb", "2xa100", "2xa100-80gb,", "2 x a100-80gb x 3",
    "1e3xt4", "2xA100-80GB;1xt4", "\x00", "65xt4", "33xt4,32xt4",
])
def test_local_gpu_declarations_are_refused_in_one_line(text: str) -> None:
    with pytest.raises(InventoryError) as refused:
        parse_inventory(text)
    assert "\n" not in str(refused.value) and "accepted: " in str(refused.value).lower()


def test_a_declaration_within_bounds_and_in_upper_case_is_read() -> None:
    assert [g.gpu_type for g in parse_inventory("2xA100-80GB, 1*t4")] == ["a100-80gb", "a100-80gb", "t4"]


TRACE_TEXT = {
    "native": "job_id,arrival_s,gpus,duration_s,model,batch_size,dataset\na,0,1,100,resnet18,32,cifar10\nb,5,2,50,bert_base,8,squad\n",
    "muri": "job_id,num_gpu,submit_time,iterations,model_name,batch_size,duration,interval\n0,1,2000,10,vgg16,16,3000000,0\n",
    "tiresias": "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n0,1,20,10,vgg16,3000,0\n",
    "gavel": "ResNet-18 (batch size 32)\tcmd\t-n\t0\t3000.0\t0\t1\nLM (batch size 20)\tcmd\t-n\t0\t6000.0\t10\t1\n",
}


def _garble(text: str, rng: random.Random) -> str:
    chars = list(text)
    for _ in range(rng.randint(1, 6)):
        position = rng.randrange(len(chars))
        chars[position] = rng.choice([",", "\t", "\n", "-", "x", "", "9" * 30, "nan", "\"", "\x00", "é"])
    return "".join(chars)


@pytest.mark.parametrize("trace_format", sorted(TRACE_TEXT))
def test_traces_garbled_are_read_or_refused_in_one_line(trace_format: str, tmp_path: Path) -> None:
    isolated = pd.read_csv(REPO / "data/interference_seed/gavel_isolated.csv")
    rng = random.Random(trace_format)
    path = tmp_path / "trace"
    cases = [b"", b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4, TRACE_TEXT["muri" if trace_format != "muri" else "gavel"].encode()]
    cases += [_garble(TRACE_TEXT[trace_format], rng).encode() for _ in range(60)]
    for content in cases:
        path.write_bytes(content)
        refused_in_one_line(lambda: read_trace(path, trace_format, "v100", isolated), TraceError)


VALID_EXPORT = {"status": "success", "data": {"resultType": "matrix", "result": [
    {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "pod": "train-a", "gpu": "0", "modelName": "NVIDIA A100-SXM4-80GB"},
     "values": [[1700000000, "55"], [1700000001, "60"]]},
    {"metric": {"__name__": "DCGM_FI_DEV_FB_USED", "pod": "train-a", "gpu": "0"}, "values": [[1700000000, "12000"]]},
]}}


def test_telemetry_exports_mutated_import_or_are_refused_in_one_line() -> None:
    def read(text: str) -> None:
        jobs, _left_out = dcgm.group_jobs(dcgm.parse(text, dcgm.guess_format(text)))
        for job in jobs:  # what is read is sane: impossible values are counted as problems, not kept
            for sample in job.samples:
                for gpu in sample.gpus:
                    assert gpu.util is None or 0 <= gpu.util <= 100

    for broken in mutations(VALID_EXPORT, MUTATIONS, seed=3):
        refused_in_one_line(lambda: read(json.dumps(broken)), dcgm.TelemetryImportError)
    rng = random.Random(4)
    for _ in range(60):
        refused_in_one_line(lambda: read(_garble('DCGM_FI_DEV_GPU_UTIL{pod="a",gpu="0"} 55 1700000000000\n', rng)),
                            dcgm.TelemetryImportError)


# --- the CLI: one line on stderr, a non-zero exit, nothing booked, no run left RUNNING ----------------
def run_cli(args: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(args)
        except SystemExit as exit_:  # argparse refuses
            code = int(exit_.code or 0)
    return code, err.getvalue()


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    binary = tmp_path / "binary.dat"
    binary.write_bytes(bytes(range(256)) * 16)
    empty = tmp_path / "empty.csv"
    empty.write_text("job_id,arrival_s,gpus,duration_s,model,batch_size\n")
    negative = tmp_path / "negative.csv"
    negative.write_text("job_id,arrival_s,gpus,duration_s,model,batch_size\na,0,1,10,resnet18,-4\n")
    muri = tmp_path / "muri.csv"
    muri.write_text(TRACE_TEXT["muri"])
    state = tmp_path / "state.json"
    state.write_text(json.dumps(VALID_STATE))
    twice = tmp_path / "twice.json"
    twice.write_text(json.dumps({"gpus": [VALID_STATE["gpus"][1], VALID_STATE["gpus"][1]]}))
    export = tmp_path / "export.json"
    export.write_text(json.dumps({**VALID_EXPORT, "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "pod": "p"}, "values": [["yesterday", "5"]]}]}}))
    existing = tmp_path / "existing"
    existing.write_text("keep me")
    return {"dir": tmp_path, "binary": binary, "empty": empty, "negative": negative, "muri": muri, "state": state,
            "export": export, "existing": existing, "twice": twice}


CLI_CASES = {  # name -> (arguments, what stderr says)
    "state is a folder": (["place", "--state", "{dir}", "--job", "resnet18:32"], "is a directory; expected a cluster-state JSON"),
    "state is binary": (["place", "--state", "{binary}", "--job", "resnet18:32"], "is not a text file"),
    "state with duplicate GPUs": (["place", "--state", "{twice}", "--job", "resnet18:32"], "appears more than once"),
    "state missing": (["place", "--state", "{dir}/nope.json", "--job", "resnet18:32"], "does not exist"),
    "profile unknown": (["place", "--state", "{state}", "--job", "resnet18:32", "--profile", "nope"], "unknown placement profile"),
    "job malformed": (["place", "--state", "{state}", "--job", "resnet18"], "is not MODEL:BATCH"),
    "gang of zero": (["place", "--state", "{state}", "--job", "resnet18:32", "--gpus", "0"], "--gpus: '0': must be at least 1"),
    "trace is binary": (["simulate", "--trace", "{binary}", "--nodes", "1", "--no-mlflow"], "is not a CSV text file"),
    "trace is empty": (["simulate", "--trace", "{empty}", "--nodes", "1", "--no-mlflow"], "it has no rows"),
    "batch of -4": (["simulate", "--trace", "{negative}", "--nodes", "1", "--no-mlflow"], "1 batch size below 1"),
    "muri read as gavel": (["simulate", "--trace", "{muri}", "--trace-format", "gavel", "--nodes", "1", "--no-mlflow"],
                           "check --trace-format"),
    "limit -5": (["simulate", "--trace", "{muri}", "--nodes", "1", "--limit", "-5"], "--limit: '-5': must be at least 1"),
    "no nodes": (["simulate", "--trace", "{muri}", "--nodes", "0"], "--nodes: '0': must be at least 1"),
    "arrival scale nan": (["simulate", "--trace", "{muri}", "--nodes", "1", "--arrival-scale", "nan"], "must be at least"),
    "mixed nodes and types": (["simulate", "--trace", "{muri}", "--nodes", "2,2", "--gpu", "v100", "--no-mlflow"],
                              "give one node count per GPU type"),
    "mixed with one runtime": (["simulate", "--trace", "{muri}", "--trace-format", "muri", "--nodes", "1,1", "--gpu", "v100,k80",
                                "--no-mlflow"], "Accepted for mixed clusters: gavel"),
    "mixed node count 0": (["simulate", "--trace", "{muri}", "--nodes", "2,0", "--gpu", "v100,k80"], "--nodes: '0': must be at least 1"),
    "export is binary": (["telemetry", "import", "{binary}"], "is not a text file"),
    "timestamp not a time": (["telemetry", "import", "{export}"], "timestamp 'yesterday' is not a time"),
    "export job spec": (["telemetry", "import", "{export}", "--job", "pod"], "expected KEY=MODEL:BATCH"),
    "run onto a file": (["run", "--out", "{existing}", "--", "true"], "is a file"),
    "run interval 0": (["run", "--interval", "0", "--", "true"], "--interval: '0': must be at least 0.05"),
    "run without command": (["run"], "give the command after '--'"),
    "predict unknown GPU": (["predict", "--model", "resnet18", "--batch-size", "8", "--gpu", "x100"], "unknown GPU type"),
    "promote missing version": (["predictor", "promote", "99"], "has no version 99"),
    "promote not a number": (["interference-model", "promote", "latest"], "is not a version number"),
    "train on binary data": (["predictor", "evaluate", "--data", "{binary}"], ""),
}


@pytest.mark.integration
@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_the_cli_refuses_bad_input_in_one_line_and_leaves_nothing_behind(case: str, files: dict[str, Path], horus_home: Path) -> None:
    from mlflow.tracking import MlflowClient

    from horus_airflow.settings import Settings

    args, message = CLI_CASES[case]
    code, stderr = run_cli([a.format(**files) for a in args])
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert code != 0 and "Traceback" not in stderr, stderr[-3000:]
    assert len(errors) == 1 and message in errors[0], stderr[-3000:]
    assert files["existing"].read_text() == "keep me"
    settings = Settings.from_env()
    if settings.ledger_path.exists():
        assert SqliteLedger(settings.ledger_path).active(now=0.0)[1] == {}  # nothing booked
    if (settings.home / "mlflow.db").exists():
        mlflow = MlflowClient(settings.mlflow_tracking_uri)
        experiments = [e.experiment_id for e in mlflow.search_experiments()]
        assert not mlflow.search_runs(experiments, "attributes.status = 'RUNNING'")  # no run left half-written


def test_every_registered_error_is_a_horus_error() -> None:
    """The CLI prints HorusError subclasses in one line; these are the ones the parsers raise."""
    for error in (InvalidJobError, InventoryError, ProfileError, TraceError, dcgm.TelemetryImportError):
        assert issubclass(error, HorusError)
