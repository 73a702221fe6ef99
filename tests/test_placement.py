"""The placer: the paper's cost by hand, filters, gang placement and explanations."""

from __future__ import annotations

import pytest

from horus_airflow.errors import HorusError
from horus_airflow.placement import ClusterState, GpuState, Resident, builtin_profiles, load_profile, place
from horus_airflow.placement.plugins import HorusCost, MemoryFit
from horus_airflow.predictor import Demand, GpuDemand

A100 = "a100-80gb"


def gpu(index: int, *residents: Resident, node: str = "n1", gpu_type: str = A100, memory: float = 80_000) -> GpuState:
    return GpuState(f"{node}/{index}", node, index, gpu_type, memory, tuple(residents))


def demand(util: float, mem: float, gpus: int = 1) -> Demand:
    return Demand("job", gpus, {A100: GpuDemand(util, util * 1.1, mem)})


def test_horus_cost_matches_a_hand_computation_with_the_intended_memory_term() -> None:
    resident = Resident("r", util=70, util_p90=75, mem_mib=20_000)
    cost = HorusCost().cost(GpuDemand(50, 55, 20_000), gpu(0, resident))
    # memory 1.3 * (20000 + 20000) / 80000 = 0.65; util (120 - 100) * 1.6 / 100 = 0.32; residents 1
    assert cost.parts == pytest.approx({"memory": 0.65, "util": 0.32, "residents": 1.0})
    assert cost.value == pytest.approx(1.97)


def test_under_subscription_costs_the_gap_unweighted() -> None:
    cost = HorusCost().cost(GpuDemand(30, 33, 0), gpu(0))
    assert cost.parts["util"] == pytest.approx(0.70)


def test_paper_profile_shares_the_gpu_whose_summed_util_lands_nearest_100() -> None:
    busy = gpu(0, Resident("a", 60, 66, 4000))
    busier = gpu(1, Resident("b", 90, 95, 4000))
    decision = place(demand(40, 2000), ClusterState((busy, busier)), load_profile("horus-paper"))
    assert decision.gpu_ids == ("n1/0",)
    assert "summed util 100%" in decision.reason


def test_memory_fit_rejects_with_a_reason_and_counts_residents_memory() -> None:
    full = gpu(0, Resident("a", 10, 11, 70_000))
    verdict = MemoryFit(driver_reserved_mib=300, margin_fraction=0.05).check(GpuDemand(10, 11, 6_000), full)
    assert not verdict.passed
    assert "76000 MiB" in verdict.reason


def test_exclusive_profile_never_shares() -> None:
    state = ClusterState((gpu(0, Resident("a", 10, 11, 1000)), gpu(1, Resident("b", 10, 11, 1000))))
    decision = place(demand(10, 1000), state, load_profile("exclusive"))
    assert not decision.placed
    assert "max-residents" in decision.reason


def test_gang_placement_is_all_or_nothing_on_one_node() -> None:
    state = ClusterState((gpu(0, node="n1"), gpu(0, node="n2"), gpu(1, node="n2")))
    decision = place(demand(50, 1000, gpus=2), state, load_profile("horus-paper"))
    assert decision.gpu_ids == ("n2/0", "n2/1")
    lonely = ClusterState((gpu(0, node="n1"), gpu(0, node="n2")))
    assert not place(demand(50, 1000, gpus=2), lonely, load_profile("horus-paper")).placed


def test_explanation_lists_every_candidate_with_verdicts_and_costs() -> None:
    state = ClusterState((gpu(0), gpu(1, Resident("a", 50, 55, 79_000))))
    decision = place(demand(50, 2000), state, load_profile("horus-paper"))
    assert [c.gpu_id for c in decision.candidates] == ["n1/0", "n1/1"]
    chosen, rejected = decision.candidates
    assert chosen.passed and chosen.cost is not None and "horus-cost.util" in chosen.cost_parts
    assert not rejected.passed and "memory-fit" in rejected.rejection


def test_gpu_type_without_prediction_is_filtered_not_crashed() -> None:
    decision = place(demand(10, 100), ClusterState((gpu(0, gpu_type="t4", memory=15_000),)), load_profile("horus-paper"))
    assert not decision.placed
    assert "no prediction" in decision.reason


def test_profiles_are_data_and_unknown_ones_are_named() -> None:
    assert {"horus-paper", "exclusive"} <= set(builtin_profiles())
    with pytest.raises(HorusError, match="built-in profiles: .*horus-paper"):
        load_profile("horus-papr")
