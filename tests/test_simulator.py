"""The trace-driven simulator on tiny traces whose outcome can be worked out by hand from Gavel's
measured numbers (data/interference_seed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from horus_airflow.errors import HorusError
from horus_airflow.interference.pairs import read_pairs
from horus_airflow.placement import load_profile
from horus_airflow.placement.profiles import parse_profile
from horus_airflow.simulator.engine import Cluster, NodeGroup, simulate
from horus_airflow.simulator.metrics import comparison_table, summarize
from horus_airflow.simulator.traces import TraceError, read_trace, read_trace_on
from horus_airflow.simulator.truth import split_models
from tests.conftest import env_with_home

DATA = Path(__file__).resolve().parent.parent / "data" / "interference_seed"
HORUS = str(Path(sys.executable).parent / "horus")
RESNET18, LM = "ResNet-18 (batch size 32)", "LM (batch size 20)"
RATES = {RESNET18: 29.947157, LM: 64.742451}  # measured steps/s alone on a V100 (gavel_isolated.csv)


@pytest.fixture(scope="module")
def isolated() -> pd.DataFrame:
    return pd.read_csv(DATA / "gavel_isolated.csv")


@pytest.fixture(scope="module")
def models():  # type: ignore[no-untyped-def]
    return split_models(read_pairs(DATA / "gavel_pairs.csv"), "v100")


def gavel_trace(path: Path, jobs: list[tuple[str, float, float, int]]) -> Path:
    """(job type, seconds alone on a V100, arrival, GPUs) -> a Gavel .trace file."""
    lines = [f"{job}\tcmd %s\t-n\t0\t{RATES.get(job, 1.0) * seconds:.6f}\t{arrival}\t{gpus}" for job, seconds, arrival, gpus in jobs]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.integration
def test_exclusive_queues_the_second_job(tmp_path: Path, isolated: pd.DataFrame, models) -> None:  # type: ignore[no-untyped-def]
    truth, policy = models
    trace = read_trace(gavel_trace(tmp_path / "t.trace", [(RESNET18, 1000, 0, 1), (LM, 1000, 0, 1)]), "gavel", "v100", isolated)
    run = simulate(trace, Cluster(1, 1, "v100"), load_profile("exclusive"), truth, policy)
    assert sorted(round(f.jct_s, 3) for f in run.finished) == [1000.0, 2000.0]
    metrics = summarize(run)
    assert metrics.makespan_s == pytest.approx(2000) and metrics.avg_wait_s == pytest.approx(500)
    assert metrics.gpu_util == pytest.approx(1.0) and metrics.oom_events == 0


def test_sharing_runs_each_job_at_its_measured_speed(tmp_path: Path, isolated: pd.DataFrame, models) -> None:  # type: ignore[no-untyped-def]
    truth, policy = models
    trace = read_trace(gavel_trace(tmp_path / "t.trace", [(RESNET18, 1000, 0, 1), (LM, 1000, 0, 1)]), "gavel", "v100", isolated)
    run = simulate(trace, Cluster(1, 1, "v100"), load_profile("horus-paper"), truth, policy)
    finish = {f.job_id: f.finish_s for f in run.finished}
    # Gavel measured ResNet-18 at 1.0 next to the LM and the LM at 0.7928 next to ResNet-18: ResNet-18 ends
    # at 1000 s; the LM has 1000 - 792.8 s of work left, alone, so it ends at 1207.2 s.
    assert finish["0"] == pytest.approx(1000.0)
    assert finish["1"] == pytest.approx(1000 + 1000 * (1 - 0.792804), rel=1e-4)
    assert all(f.colocated for f in run.finished) and run.measured_pairs > 0 and run.modelled_pairs == 0
    assert summarize(run).avg_slowdown > 1.0


@pytest.mark.integration
def test_a_pair_that_could_not_run_together_crashes_and_restarts(tmp_path: Path, isolated: pd.DataFrame, models) -> None:  # type: ignore[no-untyped-def]
    truth, policy = models
    jobs = [("Transformer (batch size 256)", 0, 0, 1), ("Transformer (batch size 32)", 0, 10, 1)]
    rates = isolated[isolated["gpu_type"] == "v100"].set_index(["job_type", "scale_factor"])["steps_per_s"]
    path = tmp_path / "oom.trace"
    path.write_text("".join(f"{job}\tcmd\t-n\t0\t{rates[(job, 1)] * 3600:.4f}\t{arrival}\t{gpus}\n" for job, _, arrival, gpus in jobs))
    run = simulate(read_trace(path, "gavel", "v100", isolated), Cluster(1, 1, "v100"), load_profile("gandiva-pack"), truth, policy)
    assert run.oom_events >= 1  # Gavel measured zero throughput for this pair on a V100
    assert len(run.finished) == 2 and max(f.restarts for f in run.finished) >= 1


def test_a_gang_runs_at_its_slowest_workers_pace(tmp_path: Path, isolated: pd.DataFrame, models) -> None:  # type: ignore[no-untyped-def]
    truth, policy = models
    rates = isolated[isolated["gpu_type"] == "v100"].set_index(["job_type", "scale_factor"])["steps_per_s"]
    path = tmp_path / "gang.trace"
    path.write_text(f"{RESNET18}\tcmd\t-n\t0\t{rates[(RESNET18, 2)] * 1000:.4f}\t0\t2\n"
                    f"{LM}\tcmd\t-n\t0\t{RATES[LM] * 100000:.4f}\t0\t1\n")
    run = simulate(read_trace(path, "gavel", "v100", isolated), Cluster(1, 2, "v100"), load_profile("horus-paper"), truth, policy)
    gang = next(f for f in run.finished if f.gpus == 2)
    assert gang.colocated and gang.finish_s == pytest.approx(1000.0)  # measured speed 1.0 next to the LM


def test_readers_count_what_they_skip_and_name_missing_columns(tmp_path: Path, isolated: pd.DataFrame) -> None:
    native = tmp_path / "jobs.csv"
    native.write_text("job_id,arrival_s,gpus,duration_s,model,batch_size,dataset\n"
                      "a,0,1,100,resnet18,32,cifar10\nb,5,1,-3,resnet18,32,cifar10\nc,5,0,10,resnet18,32,\n"
                      "d,7,1,10,resnet19,32,\ne,8,2,50,bert_base,8,squad\nf,9,1,10,resnet18,-4,cifar10\n")
    trace = read_trace(native, "native", "v100")
    assert [j.job_id for j in trace.jobs] == ["a", "e"]
    assert trace.skipped == {"non-positive duration": 1, "fewer than 1 GPU": 1, "unknown model": 1, "batch size below 1": 1}
    muri = tmp_path / "muri.csv"
    muri.write_text("job_id,num_gpu,submit_time,iterations,model_name,batch_size,duration,interval\n"
                    "0,1,2000,10,vgg16,16,3000000,0\n1,4,0,10,gpt2,4,60000,0\n")
    jobs = read_trace(muri, "muri", "v100").jobs
    assert [(j.job_id, j.arrival_s, j.duration_s, j.workload.model) for j in jobs] == [
        ("1", 0.0, 60.0, "gpt2_small"), ("0", 2.0, 3000.0, "vgg16")]
    with pytest.raises(TraceError, match="lacks columns: duration_s; expected: job_id, arrival_s"):
        pd.DataFrame({"job_id": [1], "arrival_s": [0], "gpus": [1], "model": ["mlp"], "batch_size": [1]}).to_csv(native, index=False)
        read_trace(native, "native", "v100")
    with pytest.raises(TraceError, match="unknown trace format 'philly'; accepted: muri, gavel, tiresias, native"):
        read_trace(native, "philly", "v100")
    with pytest.raises(TraceError, match=r"no job of .*g.trace' can be used as a gavel trace \(1 no measured throughput for 16 GPUs\)"):
        read_trace(gavel_trace(tmp_path / "g.trace", [(RESNET18, 10, 0, 16)]), "gavel", "v100", isolated)


def test_jobs_that_can_never_be_placed_are_counted_not_left_waiting(tmp_path: Path, isolated: pd.DataFrame, models) -> None:  # type: ignore[no-untyped-def]
    truth, policy = models
    trace = read_trace(gavel_trace(tmp_path / "t.trace", [(RESNET18, 100, 0, 1), ("LM (batch size 20)", 100, 0, 1)]),
                       "gavel", "v100", isolated)
    run = simulate(trace, Cluster(1, 1, "v100"), load_profile("exclusive"), truth, policy)
    assert len(run.finished) == 2 and run.unfinished == 0
    native = tmp_path / "wide.csv"
    native.write_text("job_id,arrival_s,gpus,duration_s,model,batch_size\nw,0,4,10,resnet18,32\n")
    run = simulate(read_trace(native, "native", "v100"), Cluster(1, 2, "v100"), load_profile("exclusive"), truth, policy)
    assert run.skipped == {"more GPUs than the cluster has": 1} and run.finished == []


def test_ground_truth_needs_a_measured_gpu_type() -> None:
    with pytest.raises(HorusError, match="GPU type 'a100-80gb' has none. Measured: k80, p100, v100"):
        split_models(read_pairs(DATA / "gavel_pairs.csv"), "a100-80gb")


@pytest.mark.integration
def test_simulate_cli_writes_the_json_contract_and_a_plot(tmp_path: Path) -> None:
    trace = gavel_trace(tmp_path / "t.trace", [(RESNET18, 1000, 0, 1), (LM, 1000, 0, 1), (RESNET18, 500, 100, 1)])
    out, png = tmp_path / "out.json", tmp_path / "out.png"
    env = env_with_home(tmp_path / "horus")
    done = subprocess.run(
        [HORUS, "simulate", "--trace", str(trace), "--trace-format", "gavel", "--nodes", "1", "--gpus-per-node", "2",
         "--gpu", "v100", "--profiles", "exclusive,horus-paper", "--json", str(out), "--plot", str(png),
         "--pairs", str(DATA / "gavel_pairs.csv"), "--isolated", str(DATA / "gavel_isolated.csv")],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result["profiles"]) == {"exclusive", "horus-paper"} and result["wall_s"] > 0
    keys = {"makespan_s", "avg_jct_s", "p95_jct_s", "avg_wait_s", "gpu_util", "avg_slowdown", "oom_events", "finished"}
    assert all(keys <= set(p) for p in result["profiles"].values())
    assert result["profiles"]["exclusive"]["finished"] == 3
    assert png.stat().st_size > 10_000 and "ratio to exclusive" in done.stdout
    assert "MLflow run" in done.stdout


def test_comparison_table_has_ratios_against_exclusive(tmp_path: Path, isolated: pd.DataFrame, models) -> None:  # type: ignore[no-untyped-def]
    truth, policy = models
    trace = read_trace(gavel_trace(tmp_path / "t.trace", [(RESNET18, 1000, 0, 1), (LM, 1000, 0, 1)]), "gavel", "v100", isolated)
    results = [summarize(simulate(trace, Cluster(1, 1, "v100"), load_profile(p), truth, policy)) for p in ("exclusive", "horus-paper")]
    table = comparison_table(results)
    assert "ratio to exclusive" in table
    ratio_line = [line for line in table.splitlines() if line.startswith("horus-paper")][-1]
    assert float(ratio_line.split()[1]) == pytest.approx(1207.2 / 2000, rel=1e-3)  # makespan ratio


@pytest.mark.integration
def test_a_crash_is_not_repeated_where_the_profile_keeps_crashed_pairs_apart(tmp_path: Path, isolated: pd.DataFrame, models) -> None:  # type: ignore[no-untyped-def]
    truth, policy = models
    jobs = [("Transformer (batch size 256)", 0), ("Transformer (batch size 32)", 10)]
    rates = isolated[isolated["gpu_type"] == "v100"].set_index(["job_type", "scale_factor"])["steps_per_s"]
    path = tmp_path / "oom.trace"
    path.write_text("".join(f"{job}\tcmd\t-n\t0\t{rates[(job, 1)] * 3600:.4f}\t{arrival}\t1\n" for job, arrival in jobs))
    trace = read_trace(path, "gavel", "v100", isolated)
    shipped = load_profile("gandiva-pack")
    blind = parse_profile({"name": "gandiva-forgetful", "filters": [{"name": f.name} for f in shipped.filters if f.name != "oom-anti-affinity"],
                           "scores": [{"name": "allocation", "args": {"mode": "binpack"}}]})
    loop = simulate(trace, Cluster(1, 1, "v100"), blind, truth, policy)
    learned = simulate(trace, Cluster(1, 1, "v100"), shipped, truth, policy)
    assert loop.oom_events > 10  # re-queued every 60 s for the hour the first Transformer runs
    assert learned.oom_events == 1 and len(learned.finished) == 2
    transformer = next(f for f in learned.finished if f.restarts)
    assert transformer.restarts == 1 and transformer.start_s == pytest.approx(3600.0)  # waited for the GPU to be free


def test_a_mixed_cluster_runs_each_job_at_the_measured_speed_of_the_type_it_got(tmp_path: Path, isolated: pd.DataFrame) -> None:
    """One V100 and one K80: two jobs at once, one on each, each finishing after its steps over the
    throughput Gavel measured alone on that type; a gang never spans the two types (their racks differ)."""
    truth, policy = split_models(read_pairs(DATA / "gavel_pairs.csv"), ("v100", "k80"))
    rates = isolated.set_index(["gpu_type", "job_type", "scale_factor"])["steps_per_s"]
    steps = RATES[RESNET18] * 1000  # 1,000 s alone on a V100
    path = gavel_trace(tmp_path / "mixed.trace", [(RESNET18, 1000, 0, 1), (RESNET18, 1000, 0, 1), (RESNET18, 1000, 0, 2)])
    trace = read_trace_on(path, "gavel", ("v100", "k80"), isolated)
    assert trace.jobs[0].durations_s == pytest.approx({"v100": steps / rates[("v100", RESNET18, 1)], "k80": steps / rates[("k80", RESNET18, 1)]})
    cluster = Cluster(1, 1, "v100", others=(NodeGroup(1, 1, "k80"),))
    assert cluster.gpu_types == ("v100", "k80") and cluster.total_gpus == 2
    run = simulate(trace, cluster, load_profile("exclusive"), truth, policy)
    assert run.skipped == {"cannot be placed even on the idle cluster by exclusive": 1}  # the 2-GPU gang
    assert sorted(f.duration_s for f in run.finished) == pytest.approx(sorted(trace.jobs[0].durations_s.values()))
    assert all(f.start_s == 0 and f.slowdown == pytest.approx(1.0) for f in run.finished)
    assert summarize(run).makespan_s == pytest.approx(steps / rates[("k80", RESNET18, 1)])  # the K80 is slower


def test_a_mixed_cluster_refuses_traces_with_one_runtime_and_leaves_the_policies_unseen_types(tmp_path: Path) -> None:
    native = tmp_path / "one.csv"
    native.write_text("job_id,arrival_s,gpus,duration_s,model,batch_size\nw,0,1,10,resnet18,32\n")
    with pytest.raises(TraceError, match="native traces give one runtime. Accepted for mixed clusters: gavel"):
        read_trace_on(native, "native", ("v100", "k80"))
    with pytest.raises(HorusError, match="a cluster of k80, p100, v100 leaves none"):
        split_models(read_pairs(DATA / "gavel_pairs.csv"), ("k80", "p100", "v100"))
