"""Kubernetes provider: Kubeflow PyTorchJobs (docs/kubernetes.md)."""

from .client import KubernetesProvider, api_client_for
from .config import KubeSettings

__all__ = ["KubeSettings", "KubernetesProvider", "api_client_for"]
