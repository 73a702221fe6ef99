"""How a placement becomes a pod: binding modes.

The placer picks a node and GPU indices; a binding mode writes that choice into the pod so the kubelet
and the NVIDIA container toolkit honour it. Each mode needs something of the cluster (see
docs/KUBERNETES.md, "Binding modes"):

- ``visible-devices`` (default): every Horus pod is pinned to its node (required node affinity on
  ``kubernetes.io/hostname``) and to its GPU indices (``NVIDIA_VISIBLE_DEVICES``), and requests no
  ``nvidia.com/gpu``. The ledger is then the only bookkeeper of those GPUs, so its indices are the
  physical ones.
- ``hybrid``: a task placed alone requests ``nvidia.com/gpu`` from the device plugin; co-located tasks
  are pinned as above. The device plugin picks the physical GPU of an alone task, which need not be the
  index the ledger booked.
- ``device-plugin``: every task requests ``nvidia.com/gpu`` and nothing is shared; a decision that
  co-locates is refused. Pair it with the ``exclusive`` profile.

A new mode (KAI scheduler's ``gpu-fraction``, HAMi's ``gpumem``) is a class with ``name`` and ``apply``
registered in :data:`BINDINGS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kubernetes.client import models as k8s

from horus_airflow.errors import BindingError

GPU_RESOURCE = "nvidia.com/gpu"
HOSTNAME_LABEL = "kubernetes.io/hostname"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class GpuTarget:
    """Where the placer put a pod: one node, GPU indices on it, and whether any of them had residents."""

    node: str
    indices: tuple[int, ...]
    shared: bool


class Binding(Protocol):
    name: str

    def apply(self, pod: k8s.V1Pod, target: GpuTarget, container: str) -> None:
        """Write ``target`` into ``pod`` (in place); ``container`` is the training container's name."""


def _container(pod: k8s.V1Pod, name: str) -> k8s.V1Container:
    for container in pod.spec.containers:
        if container.name == name:
            return container
    raise BindingError(f"the pod has no container named {name!r} to bind GPUs to; it has {[c.name for c in pod.spec.containers]}")


def _pin_to_node(pod: k8s.V1Pod, node: str) -> None:
    """Add ``hostname In [node]`` to every required node-selector term, so the user's own affinity still holds."""
    expression = k8s.V1NodeSelectorRequirement(key=HOSTNAME_LABEL, operator="In", values=[node])
    spec = pod.spec
    spec.affinity = spec.affinity or k8s.V1Affinity()
    spec.affinity.node_affinity = spec.affinity.node_affinity or k8s.V1NodeAffinity()
    node_affinity = spec.affinity.node_affinity
    required = node_affinity.required_during_scheduling_ignored_during_execution
    if required is None or not required.node_selector_terms:
        node_affinity.required_during_scheduling_ignored_during_execution = k8s.V1NodeSelector(
            node_selector_terms=[k8s.V1NodeSelectorTerm(match_expressions=[expression])]
        )
        return
    for term in required.node_selector_terms:
        term.match_expressions = [*(term.match_expressions or []), expression]


def _set_gpu_request(container: k8s.V1Container, count: int) -> None:
    resources = container.resources or k8s.V1ResourceRequirements()
    limits = {k: v for k, v in (resources.limits or {}).items() if k != GPU_RESOURCE}
    requests = {k: v for k, v in (resources.requests or {}).items() if k != GPU_RESOURCE}
    if count:
        limits[GPU_RESOURCE] = str(count)
        requests[GPU_RESOURCE] = str(count)
    resources.limits, resources.requests = limits or None, requests or None
    container.resources = resources


def _set_visible_devices(container: k8s.V1Container, indices: tuple[int, ...] | None) -> None:
    env = [e for e in (container.env or []) if e.name != VISIBLE_DEVICES]
    if indices is not None:
        env.append(k8s.V1EnvVar(name=VISIBLE_DEVICES, value=",".join(str(i) for i in indices)))
    container.env = env


class VisibleDevicesBinding:
    name = "visible-devices"

    def apply(self, pod: k8s.V1Pod, target: GpuTarget, container: str) -> None:
        _pin_to_node(pod, target.node)
        main = _container(pod, container)
        _set_gpu_request(main, 0)
        _set_visible_devices(main, target.indices)


class DevicePluginBinding:
    name = "device-plugin"

    def apply(self, pod: k8s.V1Pod, target: GpuTarget, container: str) -> None:
        if target.shared:
            raise BindingError(
                "binding 'device-plugin' cannot co-locate tasks on a GPU, and this placement shares one; use the "
                "'exclusive' profile with it, or binding 'visible-devices' or 'hybrid'"
            )
        _pin_to_node(pod, target.node)
        main = _container(pod, container)
        _set_visible_devices(main, None)
        _set_gpu_request(main, len(target.indices))


class HybridBinding:
    name = "hybrid"

    def apply(self, pod: k8s.V1Pod, target: GpuTarget, container: str) -> None:
        chosen = VisibleDevicesBinding() if target.shared else DevicePluginBinding()
        chosen.apply(pod, target, container)


BINDINGS: dict[str, Binding] = {b.name: b for b in (VisibleDevicesBinding(), HybridBinding(), DevicePluginBinding())}


def binding(name: str) -> Binding:
    try:
        return BINDINGS[name]
    except KeyError:
        raise BindingError(f"unknown binding mode {name!r}; accepted: {', '.join(BINDINGS)}") from None
