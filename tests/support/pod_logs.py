"""A fake of exactly one thing the test cluster cannot do: a container's
output.

kwok runs no containers, so no pod on the test cluster has a log; a rank's
stdout (its traceback, the preflight script's JSON line) exists only where a
real kubelet ran a real process. `PodLogs` stands in for the one call that
reads it, `CoreV1Api.read_namespaced_pod_log`, on one provider; every other
call goes to the real API server. A pod the test wrote no output for reads
as empty, as a container that printed nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kubernetes import client as k8s


@dataclass
class PodLogs:
    text: dict[tuple[str, str], str] = field(default_factory=dict)  # (namespace, pod)
    reads: list[dict] = field(default_factory=list)

    def install(self, provider) -> PodLogs:
        provider.core.read_namespaced_pod_log = self.read
        return self

    def read(self, name: str, namespace: str, **kwargs):
        self.reads.append({"pod": name, "namespace": namespace, **kwargs})
        raw = _Raw(self.text.get((namespace, name), "").encode())
        if kwargs.get("_preload_content") is False:
            # What the client hands back unparsed: the raw bytes of the body.
            return raw
        # What the client makes of the body otherwise: it tries it as JSON
        # first, so a log that is one JSON line comes back as a dict's repr.
        return k8s.ApiClient().deserialize(raw, "str")


@dataclass
class _Raw:
    data: bytes
