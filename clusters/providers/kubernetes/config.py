"""Per-cluster Kubernetes settings (Cluster.settings), checked once.

Every key is documented in docs/kubernetes.md. A bad value raises
PermanentError naming the key, so a typo stops reconcile with a message
instead of retrying forever.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from controlplane.lib.errors import PermanentError

PREFLIGHT_MODES = ("allreduce", "dcgm-labels")
GANG_SCHEDULERS = ("", "volcano", "kueue")
PROPAGATION = ("Foreground", "Background")
# EKS's node monitoring agent runs NVIDIA DCGM checks and reports them here.
DEFAULT_HEALTH_CONDITIONS = {"AcceleratedHardwareReady": "True"}


@dataclass(frozen=True)
class KubeSettings:
    namespace: str = "regatta-training"
    # How to reach the API server: in-cluster service account, a kubeconfig
    # (and context), or a plain URL without auth (kubectl proxy).
    in_cluster: bool = False
    kubeconfig: str = ""
    context: str = ""
    api_url: str = ""
    request_timeout_s: float = 30.0
    service_account: str = ""
    image_pull_secrets: tuple[str, ...] = ()
    nccl_env: dict = field(default_factory=dict)
    checkpoint_pvc: str = ""
    checkpoint_mount_path: str = "/checkpoints"
    shm_size: str = ""
    gang_scheduler: str = ""
    queue: str = ""
    priority_class: str = ""
    termination_grace_s: int = 120
    delete_propagation: str = "Foreground"
    preflight: str = "allreduce"
    preflight_image: str = "regatta/trainer:latest"
    health_conditions: dict = field(default_factory=lambda: dict(DEFAULT_HEALTH_CONDITIONS))
    # Node labels a health checker sets, with the value that means healthy.
    health_labels: dict = field(default_factory=dict)
    # Shared with the AWS adapter and checkpoint storage; handed to the ranks
    # when checkpoints go to S3.
    region: str = ""
    s3_endpoint_url: str = ""

    @classmethod
    def parse(cls, raw: dict[str, Any] | None) -> KubeSettings:
        raw = dict(raw or {})
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in raw.items():
            if key not in known:
                # Keys for other adapters (AWS region, S3 endpoint) share the dict.
                continue
            default = known[key].default
            if isinstance(default, bool):
                if not isinstance(value, bool):
                    raise PermanentError(f"cluster setting {key!r} must be true or false")
            elif isinstance(default, int | float) and not isinstance(default, bool):
                if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                    raise PermanentError(f"cluster setting {key!r} must be a number >= 0")
            elif key in ("nccl_env", "health_conditions", "health_labels"):
                value = _str_dict(key, value)
            elif key == "image_pull_secrets":
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise PermanentError(f"cluster setting {key!r} must be a list of names")
                value = tuple(value)
            elif not isinstance(value, str):
                raise PermanentError(f"cluster setting {key!r} must be a string")
            values[key] = value
        settings = cls(**values)
        settings._check_choices()
        return settings

    def _check_choices(self) -> None:
        for key, allowed in (("preflight", PREFLIGHT_MODES),
                             ("gang_scheduler", GANG_SCHEDULERS),
                             ("delete_propagation", PROPAGATION)):
            if getattr(self, key) not in allowed:
                raise PermanentError(
                    f"cluster setting {key!r} is {getattr(self, key)!r}; one of {allowed}"
                )
        if not self.namespace:
            raise PermanentError("cluster setting 'namespace' must not be empty")
        if self.gang_scheduler and not self.queue:
            raise PermanentError(f"cluster setting 'queue' is needed with {self.gang_scheduler}")


def _str_dict(key: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise PermanentError(f"cluster setting {key!r} must be an object of strings")
    return {k: str(v) for k, v in value.items()}
