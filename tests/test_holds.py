"""Holds: a starving gang gets the GPUs that free up first; other jobs use the rest, and only a job
predicted to end before the held GPUs free up may backfill them."""

from __future__ import annotations

import json

from horus_airflow.placement import ClusterState, GpuState, Resident, Waiting, load_profile, schedule
from horus_airflow.placement.holds import hold_for
from horus_airflow.placement.profiles import parse_profile
from horus_airflow.placement.rounds import scheduling_round
from horus_airflow.predictor import Demand, GpuDemand

A100 = "A100-SXM4-80GB"


def cluster(n1_mem: float = 70_000, n2_mem: float = 70_000, n1_end: float | None = 100.0,
            n2_end: float | None = 500.0) -> ClusterState:
    """Two nodes of four GPUs, one resident on each GPU; n1's residents end first."""
    gpus = []
    for node, mem, end in (("n1", n1_mem, n1_end), ("n2", n2_mem, n2_end)):
        for i in range(4):
            gpus.append(GpuState(f"{node}/{i}", node, i, A100, 80_000, (Resident(f"{node}-r{i}", 40, 44, mem, (), end),)))
    return ClusterState(tuple(gpus))


def job(name: str, gpus: int, mem: float, arrival: float, now: float = 50.0, runtime: float | None = None,
        skips: int = 0) -> Waiting:
    demand = Demand(name, gpus, {A100: GpuDemand(30, 33, mem)})
    return Waiting(demand, arrival, waited_s=now - arrival, skips=skips, expected_runtime_s=runtime)


def profile(**queue: object):  # type: ignore[no-untyped-def]
    return parse_profile({"name": "test", "filters": [{"name": "memory-fit"}], "scores": [{"name": "horus-cost"}],
                          "queue": {"policy": "lookahead", "k": 5, "max_skips": 3, "backfill": True, **queue}})


GANG = job("gang", 4, 40_000, arrival=0.0, skips=3)  # past the bound: 3 skips


def test_the_hold_is_the_node_that_frees_first() -> None:
    hold = hold_for(GANG, cluster())
    assert hold is not None and hold.gpu_ids == ("n1/0", "n1/1", "n1/2", "n1/3")
    assert hold.free_at == 100.0 and hold.now == 50.0
    later = hold_for(GANG, cluster(n1_end=900.0))
    assert later is not None and later.gpu_ids[0].startswith("n2/") and later.free_at == 500.0


def test_a_long_job_goes_around_the_hold_and_a_short_one_backfills_it() -> None:
    state = cluster()
    long_job = job("long", 1, 5_000, arrival=10.0, runtime=1_000.0)
    done = schedule([GANG, long_job], state, profile())
    assert done.hold is not None and done.hold.job_id == "gang"
    assert done.job is long_job and done.decision is not None and done.decision.gpu_ids[0].startswith("n2/")
    # n2 full: the long job must not take a held GPU, a short one (ends at 80 <= 100) may
    full = cluster(n2_mem=78_000)
    assert schedule([GANG, long_job], full, profile()).job is None
    short_job = job("short", 1, 5_000, arrival=20.0, runtime=30.0)
    done = schedule([GANG, long_job, short_job], full, profile())
    assert done.job is short_job and done.decision is not None and done.decision.gpu_ids[0].startswith("n1/")


def test_why_a_job_waits_names_the_hold() -> None:
    long_job = job("long", 1, 5_000, arrival=10.0, runtime=1_000.0)
    result = scheduling_round([GANG, long_job], cluster(n2_mem=78_000), profile())
    reasons = {h.job.demand.job_id: h.reason for h in result.held}
    assert "n1/0,n1/1,n1/2,n1/3 held for gang, which waited past its bound (predicted free in 50 s)" in reasons["gang"]
    assert "held for gang" in reasons["long"]


def test_unknown_ends_allow_no_backfill() -> None:
    state = cluster(n2_mem=78_000, n1_end=None, n2_end=None)
    hold = hold_for(GANG, state)
    assert hold is not None and hold.free_at is None
    short_job = job("short", 1, 5_000, arrival=20.0, runtime=1.0)
    assert schedule([GANG, short_job], state, profile()).job is None


def test_without_backfill_a_starving_job_blocks_every_other() -> None:
    assert load_profile("horus-paper").queue.backfill is False  # the default: opt in with backfill: true
    long_job = job("long", 1, 5_000, arrival=10.0, runtime=1_000.0)
    done = schedule([GANG, long_job], cluster(), profile(backfill=False))
    assert done.job is None and done.hold is None and [d.job_id for d in done.tried] == ["gang"]


def test_a_job_under_its_bound_holds_nothing() -> None:
    young = job("gang", 4, 40_000, arrival=0.0, skips=2)
    long_job = job("long", 1, 5_000, arrival=10.0, runtime=1_000.0)
    done = schedule([young, long_job], cluster(n2_mem=78_000), profile())
    assert done.hold is None and done.job is long_job


def test_a_demand_no_gpu_could_ever_take_holds_nothing() -> None:
    huge = job("huge", 4, 90_000, arrival=0.0, skips=3)
    assert hold_for(huge, cluster()) is None
    other = job("other", 1, 5_000, arrival=10.0, runtime=1_000.0)
    assert schedule([huge, other], cluster(), profile()).job is other


def test_expected_ends_round_trip_in_the_state_json() -> None:
    state = cluster()
    assert ClusterState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
    assert state.arrays.free_at.tolist() == [100.0] * 4 + [500.0] * 4
