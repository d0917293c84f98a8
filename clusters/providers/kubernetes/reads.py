"""Where the provider reads the cluster's objects from: the process's
informers (informers.py) when the provider was made for a cluster, or the
API server, one request per read, when it was made around a client alone
(a stand-in server, a one-off call).

Writes always go to the API server (client.py). A read the cache cannot
answer is asked of the server, once: an object created a moment ago and not
yet seen on the watch, or one really gone (a 404 then).
"""

from __future__ import annotations

import json

from .kinds import PYTORCHJOB, TRAINJOB, JobKind
from .manifests import KUEUE_JOB_UID_LABEL, PODGROUPS, WORKLOADS, WORKLOADS_PLURAL

JOBSETS = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
_INFORMER_OF = {PYTORCHJOB.name: "pytorchjobs", TRAINJOB.name: "trainjobs"}


def parse_selector(selector: str) -> dict[str, str]:
    """`a=b,c=d` as a dict; only equality selectors are used here."""
    pairs = (part.split("=", 1) for part in selector.split(",") if part.strip())
    return {k.strip(): v.strip() for k, v in pairs}


def matches(obj: dict, labels: dict[str, str]) -> bool:
    have = (obj.get("metadata") or {}).get("labels") or {}
    return all(have.get(k) == v for k, v in labels.items())


class LiveReads:
    """Every read a request to the API server."""

    def __init__(self, provider):
        self.p = provider

    def derived(self, what: str, obj: dict, make):
        """`make(obj)`, what a pass derives from an object it read (a
        NodeInfo, a node's health signals); `what` names it."""
        return make(obj)

    def nodes(self, selector: dict[str, str]) -> list[dict]:
        query = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        return self.p._json("list nodes", self.p.core.list_node,
                            label_selector=query or None).get("items", [])

    def node(self, name: str) -> dict | None:
        return self.p._json(f"read node {name}", self.p.core.read_node, name, ok=(404,))

    def wrote(self, kind: str, obj: dict | None) -> None:
        """What the server answered a write of `kind` with: nothing to keep
        without a cache."""

    def node_now(self, name: str) -> dict | None:
        """The node as the server has it now, for a write that depends on
        it (a cordon): a cache a moment behind would decide it wrong."""
        return LiveReads.node(self, name)

    def pods(self, selector: str, what: str, **query) -> list[dict]:
        return self.p._json(what, self.p.core.list_namespaced_pod, self.p.ns,
                            label_selector=selector, **query).get("items", [])

    def pod_tombstones(self, selector: str) -> list[dict]:
        return []  # only a watch sees a pod go

    def gone_nodes(self, names: set[str]) -> set[str]:
        """Which of `names` no longer exist. Without informers, unknown:
        asking for each node on every observe is what the cache is for, so
        here a lost node shows when the pod GC fails its pods."""
        return set()

    def job(self, kind: JobKind, name: str) -> dict | None:
        return self._get(kind.name, name, *kind.resource)

    def jobset(self, name: str) -> dict | None:
        return self._get("JobSet", name, *JOBSETS)

    def jobs(self, kind: JobKind, selector: str) -> list[dict]:
        found = self.p._call(f"list {kind.name}s", self.p.custom.list_namespaced_custom_object,
                             *kind.resource[:2], self.p.ns, kind.resource[2],
                             label_selector=selector)
        return (found or {}).get("items") or []

    def jobs_unseen(self, kind: JobKind, selector: str) -> list[dict]:
        """Jobs the last `jobs()` may have missed: none, it asked the server."""
        return []

    def workloads(self, job_uid: str, name: str) -> list[dict]:
        found = self.p._call(f"list Workloads of {name}",
                             self.p.custom.list_namespaced_custom_object, *WORKLOADS,
                             self.p.ns, WORKLOADS_PLURAL,
                             label_selector=f"{KUEUE_JOB_UID_LABEL}={job_uid}", ok=(404,))
        return (found or {}).get("items") or []

    def podgroup(self, name: str) -> dict | None:
        return self._get("PodGroup", name, *PODGROUPS, "podgroups")

    def events(self) -> list[dict]:
        found = self.p._call("list Warning events", self.p.core.list_namespaced_event,
                             self.p.ns, field_selector="type=Warning", _preload_content=False,
                             ok=(403, 404))
        if found is None:
            return []
        return json.loads(found.data).get("items") or []

    def _get(self, kind: str, name: str, group: str, version: str, plural: str):
        return self.p._call(f"get {kind} {name}", self.p.custom.get_namespaced_custom_object,
                            group, version, self.p.ns, plural, name, ok=(404,))


class CachedReads(LiveReads):
    """Reads from the informers; what they cannot answer, from the server."""

    def __init__(self, provider, cache):
        super().__init__(provider)
        self.cache = cache

    def derived(self, what: str, obj: dict, make):
        """Made once per version of the object and kept in the cache: a
        fleet of 5,000 nodes is 5,000 NodeInfos per pass otherwise, for
        objects that did not change (informers.ClusterCache.memo)."""
        meta = obj.get("metadata") or {}
        version = meta.get("resourceVersion")
        if not version:
            return make(obj)
        return self.cache.memo(what, meta.get("uid") or meta.get("name"), version,
                               lambda: make(obj))

    def nodes(self, selector: dict[str, str]) -> list[dict]:
        return [n for n in self.cache.informer("nodes").items() if matches(n, selector)]

    def wrote(self, kind: str, obj: dict | None) -> None:
        """Read your own writes: the object as the server answered the write
        goes into the informer's cache now (Informer.wrote)."""
        informer = self.cache.started().get(kind)
        if obj is not None and informer is not None:
            informer.wrote(obj)

    def node(self, name: str) -> dict | None:
        found = self.cache.informer("nodes").get("", name)
        # A node not in the cache is rare (just registered, or gone): the
        # server says which.
        return found if found is not None else super().node(name)

    def pods(self, selector: str, what: str, **query) -> list[dict]:
        labels = parse_selector(selector)
        pods = [p for p in self.cache.informer("pods").items() if matches(p, labels)]
        node = parse_selector(query.get("field_selector") or "").get("spec.nodeName")
        if node is not None:
            pods = [p for p in pods if (p.get("spec") or {}).get("nodeName") == node]
        return pods

    def gone_nodes(self, names: set[str]) -> set[str]:
        known = self.cache.informer("nodes")
        missing = {n for n in names if known.get("", n) is None}
        # Confirmed by the server: a node can be newer than the cache.
        return {n for n in missing if LiveReads.node(self, n) is None}

    def pod_tombstones(self, selector: str) -> list[dict]:
        labels = parse_selector(selector)
        return [p for p in self.cache.informer("pods").tombstones() if matches(p, labels)]

    def job(self, kind: JobKind, name: str) -> dict | None:
        found = self.cache.informer(_INFORMER_OF[kind.name]).get(self.p.ns, name)
        return found if found is not None else super().job(kind, name)

    def jobs(self, kind: JobKind, selector: str) -> list[dict]:
        labels = parse_selector(selector)
        return [j for j in self.cache.informer(_INFORMER_OF[kind.name]).items()
                if matches(j, labels)]

    def jobs_unseen(self, kind: JobKind, selector: str) -> list[dict]:
        """Asked of the server: one made a moment ago may not be on the
        watch yet."""
        return LiveReads.jobs(self, kind, selector)

    def jobset(self, name: str) -> dict | None:
        informer = self.cache.informer("jobsets")
        found = informer.get(self.p.ns, name)
        return found if found is not None or informer.missing else super().jobset(name)

    def workloads(self, job_uid: str, name: str) -> list[dict]:
        return [w for w in self.cache.informer("workloads").items()
                if matches(w, {KUEUE_JOB_UID_LABEL: job_uid})]

    def events(self) -> list[dict]:
        return self.cache.informer("events").items()
