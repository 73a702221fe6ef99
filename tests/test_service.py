"""The one place-and-book path (service.PlacementService) that both operators and `horus place` use."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from horus_airflow.backends import LocalBackend
from horus_airflow.backends.ledger import Booking, SqliteLedger
from horus_airflow.errors import NoPlacementError
from horus_airflow.jobs import JobSpec
from horus_airflow.service import PlacementService
from horus_airflow.settings import Settings


@pytest.fixture
def settings(horus_home: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("HORUS_LOCAL_GPUS", "2xa100-80gb")
    return Settings.from_env()


def test_decide_places_without_booking(settings: Settings) -> None:
    backend = LocalBackend(settings)
    service = PlacementService(settings, "horus-paper")
    planned = service.plan(JobSpec(model="mlp", batch_size=8), "j", [g.gpu_type for g in backend.gpus])
    decision = service.decide(planned.demand, backend.snapshot())
    assert decision.placed and planned.demand.predictor == "prior"
    assert backend.snapshot().version == 0 and all(not g.residents for g in backend.snapshot().gpus)
    with pytest.raises(TypeError, match="no backend to book on"):
        service.book(planned.demand, "d/t/r/-1", 5)


def test_book_releases_what_a_dead_try_of_the_same_owner_left_and_nothing_else(settings: Settings) -> None:
    ledger = SqliteLedger(settings.ledger_path)
    now = time.time()
    ledger.reserve(0, "dead-try", "d/t/r/-1", [Booking("local/0", 90, 95, 70_000)], now=now, lease_s=600)
    ledger.reserve(1, "neighbour", "d/other/r/-1", [Booking("local/1", 90, 95, 70_000)], now=now, lease_s=600)
    backend = LocalBackend(settings)
    service = PlacementService(settings, "exclusive", backend)
    demand = service.plan(JobSpec(model="mlp", batch_size=8), "retry", [g.gpu_type for g in backend.gpus]).demand
    acquired = service.book(demand, "d/t/r/-1", 5)
    assert acquired.decision.gpu_ids == ("local/0",)  # the dead try's GPU, free again; the neighbour kept its own
    owners = {r.job_id for g in backend.snapshot().gpus for r in g.residents}
    assert owners == {"retry", "neighbour"}


def test_a_demand_too_big_for_the_idle_cluster_fails_at_once(settings: Settings) -> None:
    backend = LocalBackend(settings)
    service = PlacementService(settings, "exclusive", backend)
    demand = service.plan(JobSpec(model="mlp", batch_size=8, gpus=3), "big", [g.gpu_type for g in backend.gpus]).demand
    started = time.monotonic()
    with pytest.raises(NoPlacementError, match="cannot fit even on idle GPUs"):
        service.book(demand, "d/t/r/-1", 60)
    assert time.monotonic() - started < 30 and backend.snapshot().version == 0
