"""How a Horus error fails an Airflow task: bad input without retries (retrying cannot fix it), with
the message that says what is accepted; any other Horus error fails this try, to be retried."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from horus_airflow.errors import (
    BindingError,
    HorusError,
    InvalidJobError,
    InventoryError,
    KubernetesConfigError,
    ProfileError,
)

_BAD_INPUT = (InvalidJobError, InventoryError, BindingError, KubernetesConfigError, ProfileError)


@contextmanager
def as_airflow_errors() -> Iterator[None]:
    try:
        yield
    except _BAD_INPUT as exc:
        raise AirflowFailException(str(exc)) from exc
    except HorusError as exc:
        raise AirflowException(str(exc)) from exc
