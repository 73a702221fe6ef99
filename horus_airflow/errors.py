"""Errors a user can act on: each names the problem and what is accepted."""

from __future__ import annotations


class HorusError(Exception):
    """Base class of every error Horus raises on purpose."""


class InvalidJobError(HorusError, ValueError):
    """A job description that cannot be run as given."""


class InventoryError(HorusError, ValueError):
    """A GPU inventory declaration that does not parse."""


class NoPlacementError(HorusError):
    """No GPU can take the job now (every candidate was filtered out)."""


class LedgerConflictError(HorusError):
    """The ledger changed between snapshot and reservation; re-read and decide again."""


class InvalidDemandError(HorusError):
    """A predicted demand that cannot be placed: NaN, infinite or negative."""


class KubernetesApiError(HorusError):
    """The Kubernetes API server kept failing (429, 5xx, timeouts) after every retry, or refused a call."""


class KubernetesConfigError(HorusError):
    """A kubeconfig or in-cluster configuration that does not work."""


class BindingError(HorusError, ValueError):
    """A binding mode that cannot express the placement (or an unknown mode)."""


class ProfilingLogError(HorusError):
    """A profiling run could not be logged completely (MLflow unreachable, artifact store full); the
    job's telemetry is kept on local disk, and a retry logs it again."""


class RegistryError(HorusError):
    """A registered model or version asked for that does not exist in the MLflow registry."""


class ProfileError(HorusError, ValueError):
    """A placement profile that does not exist or does not parse: retrying cannot fix it."""
