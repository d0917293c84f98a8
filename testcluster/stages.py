"""kwok's configuration: which lifecycle stages the simulated kubelet plays.

kwok runs no containers; its stages write the pod and node statuses a
kubelet would. Most stages here are kwok's own, read from its module at the
pinned version; three are Regatta's, for what a test needs to choose:

- `pod-container-running-succeeded`: a Running pod labelled
  SUCCEED_LABEL=true exits 0 (kwok's own `pod-complete` only finishes pods
  that a batch Job owns).
- `pod-image-pull-failed`: a pod whose image is MISSING_IMAGE stays Pending
  with ErrImagePull, the way a kubelet reports an image that does not exist;
  kwok's `pod-ready` is narrowed to leave such pods alone.
- kwok's chaos stages, as they come: a Running pod labelled
  `pod-container-running-failed.stage.kwok.x-k8s.io=true` fails with the exit
  code in its `…/exit-code` annotation; a node labelled
  `node-not-ready.stage.kwok.x-k8s.io=true` turns NotReady.
testcluster/fleet.py wraps these in functions.
"""

from __future__ import annotations

import copy

import yaml

from . import build

MISSING_IMAGE = "registry.invalid/regatta/missing:1"
SUCCEED_LABEL = "pod-container-running-succeeded.stage.regatta.dev"
FAIL_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"
FAIL_ANNOTATION = "pod-container-running-failed.stage.kwok.x-k8s.io"
NOT_READY_LABEL = "node-not-ready.stage.kwok.x-k8s.io"
NOT_READY_ANNOTATION = "node-not-ready.stage.kwok.x-k8s.io"

KWOK_STAGES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "node/chaos/node-not-ready.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-delete.yaml",
    "pod/chaos/pod-container-running-failed.yaml",
)

_SUCCEEDED = {
    "apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage",
    "metadata": {"name": "pod-container-running-succeeded"},
    "spec": {
        "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
        "selector": {"matchExpressions": [
            {"key": f'.metadata.labels["{SUCCEED_LABEL}"]', "operator": "In",
             "values": ["true"]},
            {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
            {"key": ".status.phase", "operator": "In", "values": ["Running"]},
        ]},
        "weight": 10000,
        "next": {"statusTemplate": """
{{ $now := Now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Initialized
- lastTransitionTime: {{ $now | Quote }}
  status: "False"
  reason: PodCompleted
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  status: "False"
  reason: PodCompleted
  type: ContainersReady
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: false
  restartCount: 0
  started: false
  state:
    terminated:
      exitCode: 0
      finishedAt: {{ $now | Quote }}
      reason: Completed
      startedAt: {{ $now | Quote }}
{{ end }}
phase: Succeeded
"""},
    },
}

_IMAGE_PULL_FAILED = {
    "apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage",
    "metadata": {"name": "pod-image-pull-failed"},
    "spec": {
        "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
        "selector": {"matchExpressions": [
            {"key": ".spec.containers.[].image", "operator": "In", "values": [MISSING_IMAGE]},
            {"key": ".spec.nodeName", "operator": "Exists"},
            {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
            # Once: the kubelet's back-off would rewrite it; nothing here needs that.
            {"key": ".status.containerStatuses", "operator": "DoesNotExist"},
        ]},
        "next": {"statusTemplate": """
{{ $now := Now }}
{{ $pullFailed := "rpc error: code = NotFound desc = failed to pull and unpack image" }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Initialized
- lastTransitionTime: {{ $now | Quote }}
  status: "False"
  reason: ContainersNotReady
  type: Ready
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: false
  restartCount: 0
  started: false
  state:
    waiting:
      reason: ErrImagePull
      message: {{ printf "%s %q: not found" $pullFailed .image | Quote }}
{{ end }}
phase: Pending
startTime: {{ $now | Quote }}
"""},
    },
}


def kwok_stages() -> list[dict]:
    folder = build.module_dir(build.KUBE_MOD, "sigs.k8s.io/kwok") / "kustomize" / "stage"
    stages = []
    for rel in KWOK_STAGES:
        stage = yaml.safe_load((folder / rel).read_text())
        if stage["metadata"]["name"] == "pod-ready":
            stage = copy.deepcopy(stage)
            stage["spec"]["selector"]["matchExpressions"].append(
                {"key": ".spec.containers.[].image", "operator": "NotIn",
                 "values": [MISSING_IMAGE]})
        stages.append(stage)
    return stages + [_SUCCEEDED, _IMAGE_PULL_FAILED]


def kwok_config() -> str:
    return yaml.safe_dump_all(kwok_stages(), sort_keys=False)
