"""Co-location interference: each job's normalized speed when jobs share a GPU, and whether they fit.
Two models behind one interface: the paper's summed-utilization proxy and a learned pairwise model."""

from horus_airflow.interference.base import CoRunner, Interference, InterferenceModel, signature
from horus_airflow.interference.learned import LearnedInterference
from horus_airflow.interference.memo import Memoized
from horus_airflow.interference.proxy import SummedUtilization, TimeSharing

__all__ = ["CoRunner", "Interference", "InterferenceModel", "LearnedInterference", "Memoized", "SummedUtilization", "TimeSharing", "signature"]
