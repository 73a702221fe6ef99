"""Predicted GPU demand of a job: utilization (mean, p90) and peak memory, per GPU type, from the
analytic prior or a trained LightGBM model."""

from horus_airflow.predictor.demand import Demand, GpuDemand
from horus_airflow.predictor.prior import AnalyticPrior

__all__ = ["AnalyticPrior", "Demand", "GpuDemand"]
