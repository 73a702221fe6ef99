"""Placement engine: filter and score plugins composed into profiles, queue policies; pure, no clock
and no I/O."""

from horus_airflow.placement.placer import Candidate, Decision, Scheduled, demand_shape, place, schedule
from horus_airflow.placement.profiles import Profile, builtin_profiles, load_profile
from horus_airflow.placement.queue import Waiting
from horus_airflow.placement.state import ClusterState, GpuState, Resident

__all__ = [
    "Candidate",
    "ClusterState",
    "Decision",
    "GpuState",
    "Profile",
    "Resident",
    "Scheduled",
    "Waiting",
    "builtin_profiles",
    "demand_shape",
    "load_profile",
    "place",
    "schedule",
]
