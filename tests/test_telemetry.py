"""The `horus run` wrapper: exit codes, signal forwarding, and no GPU metric without a GPU."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from horus_airflow.telemetry import GpuReading, RunSummary, Sample, read_samples, run


def test_exit_code_samples_and_job_metrics_are_kept(tmp_path: Path) -> None:
    script = (
        "import json, os, time\n"
        "x = [0] * 3_000_000\n"
        "time.sleep(0.8)\n"
        "json.dump({'throughput_samples_per_s': 123.5}, open(os.environ['HORUS_METRICS_FILE'], 'w'))\n"
        "raise SystemExit(7)\n"
    )
    summary = run([sys.executable, "-c", script], tmp_path, interval_s=0.1)
    assert summary.exit_code == 7
    assert summary.samples >= 3
    assert summary.host_rss_mib_max and summary.host_rss_mib_max > 10
    assert summary.job_metrics == {"throughput_samples_per_s": 123.5}
    assert RunSummary.read(tmp_path) == summary
    lines = (tmp_path / "samples.jsonl").read_text().splitlines()
    assert len(lines) == summary.samples and "cpu_percent" in json.loads(lines[0])


def test_without_nvml_gpu_metrics_are_absent_never_zero(tmp_path: Path) -> None:
    summary = run([sys.executable, "-c", "import time; time.sleep(0.5)"], tmp_path, interval_s=0.1)
    assert summary.gpu_measured is False
    assert summary.gpu_util_mean is None and summary.gpu_mem_mib_max is None
    assert not [name for name in summary.measured_metrics() if name.startswith("gpu")]


def test_sigterm_is_forwarded_to_the_job_and_its_code_kept(tmp_path: Path) -> None:
    child = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(42))\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "horus_airflow.cli", "run", "--out", str(tmp_path), "--", sys.executable, "-c", child],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert wrapper.stdout is not None and wrapper.stdout.readline().strip() == "ready"
    started = time.monotonic()
    wrapper.send_signal(signal.SIGTERM)
    assert wrapper.wait(timeout=20) == 42
    assert time.monotonic() - started < 10
    assert RunSummary.read(tmp_path).exit_code == 42


def test_a_command_that_cannot_start_is_reported_not_crashed(tmp_path: Path) -> None:
    summary = run(["/nonexistent/train-binary", "--epochs", "1"], tmp_path)
    assert summary.exit_code == 127
    assert "nonexistent" in str(summary.job_metrics["error"])
    assert RunSummary.read(tmp_path).exit_code == 127


# --- samples, sources and files cut short ---------------------------------------------------------
class ScriptedGpus:
    """A TEST DOUBLE of a GPU source: readings scripted per call, the watched pids recorded."""

    def __init__(self, readings: list[list[GpuReading]]) -> None:
        self.readings, self.calls, self.closed = readings, 0, False
        self.pids: list[set[int]] = []

    def read(self, pids: set[int]) -> list[GpuReading]:
        self.pids.append(pids)
        self.calls += 1
        return self.readings[min(self.calls - 1, len(self.readings) - 1)]

    def close(self) -> None:
        self.closed = True


def test_gpu_readings_summarise_and_land_in_parquet(tmp_path: Path) -> None:
    source = ScriptedGpus([
        [GpuReading(0, 40.0, 1000.0, 900.0, 150.0, 20.0, 35.0, 30.0, 10.0, (4242,))],
        [GpuReading(0, 80.0, 2000.0, 1900.0, 250.0, 30.0, None, None, None, ())],
    ])
    summary = run([sys.executable, "-c", "import time; time.sleep(0.6)"], tmp_path, interval_s=0.1, source=source)
    assert source.closed and source.pids and all(source.pids)
    assert summary.gpu_measured and summary.gpu_util_max == 80.0 and summary.gpu_mem_mib_max == 1900.0
    assert summary.gpu_sm_active_mean == 35.0  # absent readings are left out of the mean, not read as zero
    assert summary.co_resident_pids == [4242]
    frame = pd.read_parquet(tmp_path / "samples.parquet")
    assert len(frame) == summary.samples and frame["sm_active"].isna().sum() == summary.samples - 1


def test_a_file_cut_short_or_with_bad_values_keeps_every_good_sample(tmp_path: Path) -> None:
    good = Sample(0.2, 10.0, 100.0, (GpuReading(0, 50.0, 1000.0),)).to_json()
    nan = json.dumps({"t_s": 0.4, "cpu_percent": 10.0, "host_rss_mib": 100.0, "gpus": [{"index": 0, "util": float("nan"), "mem_used_mib": -5}]})
    (tmp_path / "samples.jsonl").write_text("\n".join([good, nan, good, good[: len(good) // 2]]))
    read = read_samples(tmp_path / "samples.jsonl")
    assert len(read.samples) == 3
    assert read.problems == {"util NaN, infinite or negative": 1, "mem_used_mib NaN, infinite or negative": 1,
                             "unreadable line (cut short or garbled)": 1}
    assert read.samples[1].gpus[0].util is None and read.samples[1].gpus[0].mem_used_mib is None
    rebuilt = RunSummary.read(tmp_path)  # the wrapper died before writing summary.json
    assert rebuilt is not None and rebuilt.exit_code == -1 and rebuilt.samples == 3 and rebuilt.gpu_util_mean == 50.0
    assert rebuilt.sample_problems["unreadable line (cut short or garbled)"] == 1


def test_nvml_source_records_what_the_gpu_offers_and_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML itself is replaced by a TEST DOUBLE (no GPU here): GPM unsupported, no per-process history."""
    import pynvml

    from horus_airflow.telemetry import nvml

    proc = lambda pid, mib: SimpleNamespace(pid=pid, usedGpuMemory=mib * 1024 * 1024)  # noqa: E731
    fake = {
        "nvmlDeviceGetHandleByIndex": lambda i: f"gpu{i}",
        "nvmlGpmQueryDeviceSupport": lambda h: SimpleNamespace(isSupportedDevice=0),
        "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=77, memory=31),
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(used=3000 * 1024 * 1024, total=81920 * 1024 * 1024),
        "nvmlDeviceGetComputeRunningProcesses": lambda h: [proc(10, 1000), proc(11, 500), proc(99, 1200)],
        "nvmlDeviceGetPowerUsage": lambda h: 210_500,
        "nvmlDeviceGetProcessUtilization": lambda h, ts: (_ for _ in ()).throw(pynvml.NVMLError_NotFound()),
    }
    for name, fn in fake.items():
        monkeypatch.setattr(pynvml, name, fn)
    [reading] = nvml.NvmlSource([0]).read({10, 11})
    assert reading.util == 77.0 and reading.mem_util == 31.0 and reading.power_w == 210.5
    assert reading.process_mem_mib == 1500.0 and reading.co_resident_pids == (99,)
    assert reading.sm_active is None and reading.process_sm_util is None


# --- DCGM exporter / Prometheus imports ----------------------------------------------------------
LABELS = 'gpu="0",UUID="GPU-1",modelName="NVIDIA A100-SXM4-80GB",Hostname="node-1",pod="{pod}",namespace="ml"'


def _scrapes(values: list[tuple[str, str, float | str]]) -> str:
    return "\n".join(f"{metric}{{{LABELS.format(pod=pod)}}} {value}" for metric, pod, value in values)


def test_prometheus_text_scrapes_become_jobs_with_bad_values_counted() -> None:
    from horus_airflow.telemetry import dcgm

    text = "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization.\n" + _scrapes([
        ("DCGM_FI_DEV_GPU_UTIL", "train-a", 80), ("DCGM_FI_DEV_FB_USED", "train-a", 20000),
        ("DCGM_FI_DEV_FB_FREE", "train-a", 61920), ("DCGM_FI_PROF_SM_ACTIVE", "train-a", 0.7),
        ("DCGM_FI_DEV_GPU_UTIL", "train-a", "NaN"), ("DCGM_FI_DEV_FB_USED", "train-a", 21000),
        ("DCGM_FI_DEV_GPU_UTIL", "train-a", 90), ("DCGM_FI_DEV_GPU_UTIL", "", 0), ("DCGM_FI_DEV_XID_ERRORS", "train-a", 0),
    ])
    jobs, left_out = dcgm.group_jobs(dcgm.parse(text, "prometheus-text", interval_s=2.0))
    [job] = jobs
    assert job.key == "train-a" and job.model_name == "NVIDIA A100-SXM4-80GB" and job.memory_mib == 81920 + 1000
    assert [s.t_s for s in job.samples] == [0.0, 2.0, 4.0]
    assert [s.gpus[0].util for s in job.samples] == [80.0, None, 90.0]
    assert job.samples[0].gpus[0].sm_active == pytest.approx(70.0)
    assert job.problems == {"util NaN, infinite or negative": 1}
    assert left_out == {"series without label 'pod'": 1, "metric DCGM_FI_DEV_XID_ERRORS not read": 1}


def test_prometheus_api_answers_parse_and_bad_exports_say_what_is_expected() -> None:
    from horus_airflow.telemetry import dcgm

    answer = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "1", "pod": "p", "modelName": "Tesla V100-SXM2-32GB"},
         "values": [[1700000000, "55"], [1700000015, "65"]]},
    ]}}
    [job], _ = dcgm.group_jobs(dcgm.parse(json.dumps(answer), "prometheus-json"))
    assert job.gpu_indices == (1,) and [s.t_s for s in job.samples] == [0.0, 15.0]
    with pytest.raises(dcgm.TelemetryImportError, match="resultType 'scalar'"):
        dcgm.parse(json.dumps({"data": {"resultType": "scalar", "result": []}}), "prometheus-json")
    with pytest.raises(dcgm.TelemetryImportError, match="accepted: prometheus-json, prometheus-text"):
        dcgm.parse("x", "csv")


@pytest.mark.integration
def test_an_import_logs_each_job_once(horus_home: Path, tmp_path: Path) -> None:
    from horus_airflow.cli import main
    from horus_airflow.registry.retraining import all_profiling_runs
    from horus_airflow.settings import Settings

    export = tmp_path / "scrapes.txt"
    export.write_text(_scrapes([("DCGM_FI_DEV_GPU_UTIL", "train-a", 70), ("DCGM_FI_DEV_GPU_UTIL", "train-b", 30),
                                ("DCGM_FI_DEV_GPU_UTIL", "train-a", 90), ("DCGM_FI_DEV_GPU_UTIL", "train-b", 50)]))
    assert main(["telemetry", "import", str(export), "--job", "train-a=resnet18:32@cifar10"]) == 0
    assert main(["telemetry", "import", str(export), "--job", "train-a=resnet18:32@cifar10"]) == 0  # again: nothing new
    runs = {r.data.tags["horus.import.key"]: r for r in all_profiling_runs(Settings.from_env())}
    assert set(runs) == {"train-a", "train-b"}
    a, b = runs["train-a"], runs["train-b"]
    assert a.info.status == "FINISHED" and a.data.metrics["gpu_util_mean"] == 80.0 and a.data.tags["horus.gpu_type"] == "a100-80gb"
    assert a.data.params["job.model"] == "resnet18" and "feature.train_flops" in a.data.params
    assert "feature.train_flops" not in b.data.params  # kept without features; retraining sets it aside
    assert main(["telemetry", "import", str(export), "--job", "train-a=resnt18:32"]) == 2  # a typo is refused


@pytest.mark.integration
def test_horus_run_with_a_job_logs_a_profiling_run(horus_home: Path, tmp_path: Path) -> None:
    from horus_airflow.registry.retraining import all_profiling_runs
    from horus_airflow.settings import Settings

    done = subprocess.run([sys.executable, "-m", "horus_airflow.cli", "run", "--out", str(tmp_path / "out"), "--job", "mlp:8@mnist",
                           "--", sys.executable, "-c", "import time; time.sleep(1.5)"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"telemetry in {tmp_path / 'out'}" in done.stderr
    [logged] = all_profiling_runs(Settings.from_env())
    assert logged.data.params["job.model"] == "mlp" and logged.data.tags["horus.gpu_measured"] == "false"
    summary = RunSummary.read(tmp_path / "out")
    assert summary is not None and summary.started_at is not None
    # the run spans the job, not the moment it was logged; the start is the job's own
    assert 1500 <= logged.info.end_time - logged.info.start_time <= 1000 * summary.duration_s + 1
    assert logged.info.start_time == int(summary.started_at * 1000) and "started_at" not in logged.data.metrics
    again = subprocess.run([sys.executable, "-m", "horus_airflow.cli", "run", "--out", str(tmp_path / "out"), "--", "true"],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and "already holds a run's telemetry (samples.jsonl, summary.json)" in again.stderr
    refused = subprocess.run([sys.executable, "-m", "horus_airflow.cli", "run", "--job", "mlp", "--", "touch", str(tmp_path / "ran")],
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and not (tmp_path / "ran").exists()  # bad input: the command never ran


def test_a_wrapper_killed_mid_job_leaves_its_samples_and_a_failed_exit_code(horus_home: Path) -> None:
    from horus_airflow.backends import LocalBackend, acquire
    from horus_airflow.backends.local import LaunchedJob
    from horus_airflow.placement import load_profile
    from horus_airflow.predictor import Demand, GpuDemand
    from horus_airflow.settings import Settings

    backend = LocalBackend(Settings.from_env())
    got = acquire(backend, Demand("j", 1, {"a100-80gb": GpuDemand(10, 20, 100)}), load_profile("exclusive"), "o", 5)
    run_dir = horus_home / "runs" / "j"
    run_dir.mkdir(parents=True)
    (run_dir / "samples.jsonl").write_text(Sample(0.2, 5.0, 50.0, (GpuReading(0, 30.0, 500.0),)).to_json() + "\n")
    process = subprocess.Popen(["sh", "-c", "kill -9 $$"])  # stands in for the wrapper, killed before its summary
    summary = backend.wait(LaunchedJob(process, run_dir), got.reservation, poll_s=0.05)
    assert summary.exit_code == 137 and summary.samples == 1 and summary.gpu_util_mean == 30.0


def test_a_job_stops_when_the_process_holding_its_gpu_is_killed(tmp_path: Path) -> None:
    """A launcher killed with SIGKILL cannot stop its job; the wrapper sees it gone and stops the job,
    so no orphan keeps training on a GPU whose lease is about to run out."""
    pid_file = tmp_path / "job.pid"
    job = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    launcher = (
        "import os, subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-m', 'horus_airflow.cli', 'run', '--out', {str(tmp_path / 'run')!r},\n"
        f"                  '--launcher-pid', str(os.getpid()), '--', sys.executable, '-c', {job!r}])\n"
        "time.sleep(120)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", launcher])
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and holder.poll() is None
        time.sleep(0.1)
    job_pid = int(pid_file.read_text())
    holder.kill()
    holder.wait()
    deadline = time.monotonic() + 20
    while not (tmp_path / "run" / "summary.json").exists() or _alive(job_pid):
        assert time.monotonic() < deadline, "the job outlived its launcher"
        time.sleep(0.1)
    assert RunSummary.read(tmp_path / "run").exit_code == 128 + signal.SIGTERM


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return status != "Z"


@pytest.mark.integration
def test_a_profiling_run_whose_artifacts_are_refused_is_failed_with_its_reason(
    horus_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the artifact store acknowledged before it refused (params, metrics) stays; the run says why it
    is FAILED and the error says where the telemetry is kept."""
    from mlflow.tracking import MlflowClient

    from horus_airflow.errors import ProfilingLogError
    from horus_airflow.features.gpus import gpu_spec
    from horus_airflow.placement import GpuState
    from horus_airflow.run_schema import Tag
    from horus_airflow.registry.profiling import ProfilingRecord, log_profiling_run
    from horus_airflow.registry.retraining import all_profiling_runs
    from horus_airflow.settings import Settings

    def disk_full(*_args: object, **_kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(MlflowClient, "log_artifacts", disk_full)
    run_dir = tmp_path / "job"
    run_dir.mkdir()
    gpu = GpuState("n/0", "n", 0, "a100-80gb", gpu_spec("a100-80gb").memory_mib)
    record = ProfilingRecord(None, None, None, "prior", None, (gpu,), RunSummary(0, 10.0, 50, False, 90.0, 500.0), run_dir, {},
                             co_residents=())
    with pytest.raises(ProfilingLogError, match=f"No space left on device.*kept in {run_dir}"):
        log_profiling_run(Settings.from_env(), record)
    [logged] = all_profiling_runs(Settings.from_env())
    assert logged.info.status == "FAILED" and "No space left on device" in logged.data.tags[Tag.LOGGING_ERROR]
    assert logged.data.metrics["duration_s"] == 10.0 and logged.data.metrics["samples"] == 50  # what was acknowledged is kept


@pytest.mark.integration
def test_a_run_whose_server_fails_mid_write_is_still_closed_failed(
    horus_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tracking server's database goes away between the run's creation and its metrics, and the tag that
    says why cannot be written either: the run is closed FAILED all the same, not left RUNNING."""
    from mlflow.tracking import MlflowClient

    from horus_airflow.errors import ProfilingLogError
    from horus_airflow.features.gpus import gpu_spec
    from horus_airflow.placement import GpuState
    from horus_airflow.registry.profiling import ProfilingRecord, log_profiling_run
    from horus_airflow.registry.retraining import all_profiling_runs
    from horus_airflow.settings import Settings

    def database_gone(*_args: object, **_kwargs: object) -> None:
        raise ConnectionError("server closed the connection unexpectedly")

    monkeypatch.setattr(MlflowClient, "log_batch", database_gone)
    monkeypatch.setattr(MlflowClient, "set_tag", database_gone)
    run_dir = tmp_path / "job"
    run_dir.mkdir()
    gpu = GpuState("n/0", "n", 0, "a100-80gb", gpu_spec("a100-80gb").memory_mib)
    record = ProfilingRecord(None, None, None, "prior", None, (gpu,), RunSummary(0, 10.0, 50, False, 90.0, 500.0), run_dir, {},
                             co_residents=())
    with pytest.raises(ProfilingLogError, match="server closed the connection.*it is marked FAILED"):
        log_profiling_run(Settings.from_env(), record)
    [logged] = all_profiling_runs(Settings.from_env())
    assert logged.info.status == "FAILED"


@pytest.mark.integration
def test_a_retry_closes_its_killed_trys_run_before_logging_its_own(
    horus_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A try killed while logging left its run RUNNING. The next try of the same task instance closes it
    FAILED, with the reason, before it logs its own; while the tracking server cannot be searched it logs
    nothing at all (the task fails and is retried) rather than leave the half-written run behind."""
    from mlflow.tracking import MlflowClient

    from horus_airflow.errors import ProfilingLogError
    from horus_airflow.features.gpus import gpu_spec
    from horus_airflow.placement import GpuState
    from horus_airflow.registry.profiling import ProfilingRecord, log_profiling_run
    from horus_airflow.run_schema import Experiment, Tag
    from horus_airflow.registry.retraining import all_profiling_runs
    from horus_airflow.registry.store import client, experiment_id
    from horus_airflow.settings import Settings

    settings = Settings.from_env()
    mlflow = client(settings)
    owner = "dag/train/manual__1/-1"
    killed = mlflow.create_run(experiment_id(mlflow, settings, Experiment.PROFILING), tags={Tag.OWNER: owner}).info.run_id
    other = mlflow.create_run(experiment_id(mlflow, settings, Experiment.PROFILING),
                              tags={Tag.OWNER: "dag/train/manual__2/-1"}).info.run_id  # another task instance, still logging
    run_dir = tmp_path / "job"
    run_dir.mkdir()
    gpu = GpuState("n/0", "n", 0, "a100-80gb", gpu_spec("a100-80gb").memory_mib)
    record = ProfilingRecord(None, None, None, "prior", None, (gpu,), RunSummary(0, 10.0, 50, False, 90.0, 500.0), run_dir,
                             {Tag.OWNER: owner}, co_residents=())

    real_search = MlflowClient.search_runs

    def unreachable(*_args: object, **_kwargs: object) -> None:
        raise ConnectionError("tracking server unreachable")

    monkeypatch.setattr(MlflowClient, "search_runs", unreachable)
    with pytest.raises(ProfilingLogError, match=f"earlier try of {owner} left RUNNING could not be closed"):
        log_profiling_run(settings, record)
    monkeypatch.setattr(MlflowClient, "search_runs", real_search)
    assert len(all_profiling_runs(settings)) == 2  # nothing new was written

    logged = log_profiling_run(settings, record)
    runs = {r.info.run_id: r for r in all_profiling_runs(settings)}
    assert runs[killed].info.status == "FAILED" and "a later try of the same task closed it" in runs[killed].data.tags[Tag.LOGGING_ERROR]
    assert runs[logged].info.status == "FINISHED"
    assert runs[other].info.status == "RUNNING"  # not this owner's: left alone
