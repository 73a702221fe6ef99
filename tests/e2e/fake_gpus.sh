#!/usr/bin/env bash
# Give the kind workers of deploy/kubernetes/kind-gpu-cluster.yaml allocatable nvidia.com/gpu matching
# their nvidia.com/gpu.count label, as the NVIDIA device plugin would. No GPU is used: pods that the
# e2e suite starts run busybox and print the GPUs they were pinned to.
set -euo pipefail
for node in $(kubectl get nodes -l nvidia.com/gpu.product -o name); do
  count=$(kubectl get "$node" -o jsonpath='{.metadata.labels.nvidia\.com/gpu\.count}')
  kubectl patch "$node" --subresource=status --type=json \
    -p "[{\"op\":\"add\",\"path\":\"/status/capacity/nvidia.com~1gpu\",\"value\":\"$count\"}]"
done
kubectl apply -f "$(dirname "$0")/../../deploy/kubernetes/namespace.yaml"
kubectl apply -f "$(dirname "$0")/../../deploy/kubernetes/serviceaccount.yaml"
kubectl apply -f "$(dirname "$0")/../../deploy/kubernetes/rbac.yaml"
