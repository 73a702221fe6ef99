"""``@task.horus_kubernetes``: ``@task.kubernetes`` whose pod is placed by Horus.

The decorated function runs in the pod like ``@task.kubernetes`` runs it; the decorator's arguments
are those of :class:`~horus_airflow.operators.kubernetes.HorusKubernetesPodOperator` (``model``,
``batch_size``, ``profile``, ``binding``, ...) and of ``KubernetesPodOperator`` (``image``, ...).
"""

from __future__ import annotations

from typing import Any, Callable

from airflow.providers.cncf.kubernetes.decorators.kubernetes import (
    _KubernetesDecoratedOperator,
)
from airflow.sdk.bases.decorator import TaskDecorator, task_decorator_factory

from horus_airflow.operators.kubernetes import HorusKubernetesPodOperator


class _HorusKubernetesDecoratedOperator(_KubernetesDecoratedOperator, HorusKubernetesPodOperator):
    custom_operator_name = "@task.horus_kubernetes"
    template_fields = tuple(
        {*_KubernetesDecoratedOperator.template_fields, *HorusKubernetesPodOperator.template_fields} - {"cmds", "arguments"}
    )


def horus_kubernetes_task(
    python_callable: Callable[..., Any] | None = None, multiple_outputs: bool | None = None, **kwargs: Any
) -> TaskDecorator:
    """Run the function in a Kubernetes pod on the GPUs Horus chooses."""
    return task_decorator_factory(
        python_callable=python_callable,
        multiple_outputs=multiple_outputs,
        decorated_operator_class=_HorusKubernetesDecoratedOperator,
        **kwargs,
    )
