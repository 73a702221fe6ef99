"""The `horus run` wrapper: exit codes, signal forwarding, and no GPU metric without a GPU."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from horus_airflow.telemetry import RunSummary, run


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
