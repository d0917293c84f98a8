"""A stand-in Kubernetes API server, kept only for what the real test cluster
(tests/support/kube_cluster.py) cannot be made to produce yet:

- faults injected into one request: a 429 with the server's Retry-After on a
  Secret create (API Priority and Fairness admits a lone request even at
  zero concurrency), and an informer's watch ending in an ERROR event (410
  Gone, which the real server sends only once etcd compacted the history
  the watch resumes from, minutes on; 500), tests/clusters/providers/kubernetes/test_provider.py;
- Volcano's PodGroups (the Go module proxy refuses every version of
  volcano.sh/volcano, so it cannot be built here) and kubelet states kwok
  has no stage for
  (CreateContainerConfigError, a registry's 429, ContainerCreating),
  tests/clusters/providers/kubernetes/test_start_issues.py.

Everything else runs on the real cluster. This one speaks just
enough of the protocol over real HTTP (http.server on 127.0.0.1, port 0):
lists, gets, creates (409 AlreadyExists), merge patches, deletes (404
NotFound), the Eviction subresource, pod logs and watch streams (newline-
delimited JSON events). It records every request so tests can check what
the provider sent, and can be told to fail the next matching requests with
429 (and Retry-After), 5xx, 403 or 422.
"""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from kubernetes import client as k8s

from clusters.providers.kubernetes.informers import stop_all

_REASONS = {400: "BadRequest", 403: "Forbidden", 404: "NotFound", 409: "AlreadyExists",
            410: "Gone", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
            503: "ServiceUnavailable"}


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any = None


@dataclass
class _Fault:
    method: str
    path: str
    status: int
    headers: dict = field(default_factory=dict)
    times: int = 1


class K8sStandIn:
    def __init__(self):
        self.requests: list[Recorded] = []
        # collection path -> {name: object}
        self.store: dict[str, dict[str, dict]] = {}
        self.logs: dict[tuple[str, str], str] = {}  # (namespace, pod) -> text
        # collection path -> list of events a watch on it streams, then closes;
        # or a function called per watch request that returns that list.
        self.watch_events: dict[str, Any] = {}
        self.hooks: list = []  # fn(method, collection, obj), after each write
        # A watch without scripted events stays open this long, streaming
        # what changes, then the server ends it (a real one after its
        # timeoutSeconds): an informer on this server sees a change within
        # a poll, and is never answered by an empty watch that ends at once.
        self.watch_hold_s = 2.0
        self._faults: list[_Fault] = []
        self._lock = threading.Lock()
        self._counter = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        # The informers a provider made for this server (for_cluster) would
        # otherwise keep asking it for 15 minutes; the next pass of a cluster
        # elsewhere makes its own again.
        stop_all()
        self.server.shutdown()
        self.server.server_close()

    def api_client(self) -> k8s.ApiClient:
        cfg = k8s.Configuration()
        cfg.host = self.url
        return k8s.ApiClient(cfg)

    # --- test controls -------------------------------------------------------
    def put(self, collection: str, obj: dict) -> dict:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta["resourceVersion"] = self._next_version()
        self.store.setdefault(collection, {})[meta["name"]] = obj
        return obj

    def get(self, collection: str, name: str) -> dict | None:
        return self.store.get(collection, {}).get(name)

    def fail_next(self, method: str, path: str, status: int, headers: dict | None = None,
                  times: int = 1) -> None:
        """The next `times` requests of `method` whose path starts with `path` fail."""
        self._faults.append(_Fault(method, path, status, headers or {}, times))

    def calls(self, method: str | None = None, path: str | None = None) -> list[Recorded]:
        return [r for r in self.requests
                if (method is None or r.method == method)
                and (path is None or r.path.startswith(path))]

    # --- internals -----------------------------------------------------------
    def _next_version(self) -> str:
        with self._lock:
            self._counter += 1
            return str(self._counter)

    def _fault_for(self, method: str, path: str) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.method == method and path.startswith(fault.path) and fault.times > 0:
                    fault.times -= 1
                    return fault
        return None

    def _handler(self):
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output quiet
                pass

            def _serve(self):
                parsed = urlparse(self.path)
                query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                standin.requests.append(Recorded(self.command, parsed.path, query,
                                                 dict(self.headers), body))
                fault = standin._fault_for(self.command, parsed.path)
                if fault is not None:
                    return self._status(fault.status, "injected failure", fault.headers)
                try:
                    standin._route(self, self.command, parsed.path, query, body)
                except _Reply as reply:
                    self._send(reply.code, reply.body, reply.content_type)

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _serve

            def _status(self, code, message, headers=None):
                body = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                        "status": "Failure", "message": message,
                        "reason": _REASONS.get(code, "Unknown"), "code": code}
                self._send(code, body, headers=headers)

            def _send(self, code, body, content_type="application/json", headers=None):
                data = body if isinstance(body, bytes) else (
                    body.encode() if isinstance(body, str) else json.dumps(body).encode())
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, str(value))
                self.end_headers()
                self.wfile.write(data)

            def stream(self, events: list[dict]):
                self._open_stream()
                for event in events:
                    self._event(event)
                self.wfile.write(b"0\r\n\r\n")

            def _open_stream(self):
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

            def _event(self, event: dict):
                line = (json.dumps(event) + "\n").encode()
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.flush()

        return Handler

    def _route(self, h, method, path, query, body):
        collection, name, sub, namespace = _parse_path(path)
        items = self.store.setdefault(collection, {})
        if sub is not None:
            return self._subresource(h, method, collection, items, name, sub, namespace, body)
        if method == "GET" and name is None:
            return self._list(h, collection, items, query)
        handler = {"GET": self._get, "POST": self._create, "PATCH": self._patch,
                   "DELETE": self._delete}.get(method)
        if handler is None:
            return h._status(400, f"unsupported {method} {path}")
        return handler(h, collection, items, name, body)

    def _subresource(self, h, method, collection, items, name, sub, namespace, body):
        if sub == "log" and method == "GET":
            raise _Reply(200, self.logs.get((namespace, name), ""), "text/plain")
        if sub == "eviction" and method == "POST":
            if name not in items:
                return h._status(404, f'pods "{name}" not found')
            del items[name]
            self._fire("EVICT", collection, body)
            raise _Reply(201, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
        return h._status(400, f"unsupported {method} of {sub}")

    def _list(self, h, collection, items, query):
        matched = [o for o in items.values() if _matches(o, query)]
        if query.get("watch") in ("true", "1", "True"):
            events = self.watch_events.get(collection)
            if callable(events):
                events = events()
            if events is None:
                current = lambda: [o for o in list(items.values()) if _matches(o, query)]  # noqa: E731
                return _follow(h, current, self.watch_hold_s)
            return h.stream(events)
        raise _Reply(200, {"kind": "List", "apiVersion": "v1",
                           "metadata": {"resourceVersion": self._next_version()},
                           "items": matched})

    def _get(self, h, collection, items, name, body):
        if name not in items:
            return h._status(404, f'"{name}" not found')
        raise _Reply(200, items[name])

    def _create(self, h, collection, items, name, body):
        name = body["metadata"]["name"]
        if name in items:
            return h._status(409, f'"{name}" already exists')
        obj = self.put(collection, body)
        obj["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
        if "stringData" in obj:
            obj["data"] = {k: "***" for k in obj.pop("stringData")}
        self._fire("POST", collection, obj)
        raise _Reply(201, obj)

    def _patch(self, h, collection, items, name, body):
        if name not in items:
            return h._status(404, f'"{name}" not found')
        _merge(items[name], body)
        items[name]["metadata"]["resourceVersion"] = self._next_version()
        self._fire("PATCH", collection, items[name])
        raise _Reply(200, items[name])

    def _delete(self, h, collection, items, name, body):
        if name not in items:
            return h._status(404, f'"{name}" not found')
        obj = items.pop(name)
        self._fire("DELETE", collection, obj)
        raise _Reply(200, {"kind": "Status", "apiVersion": "v1", "status": "Success",
                           "details": {"name": name, "uid": obj["metadata"]["uid"]}})

    def _fire(self, method, collection, obj):
        for hook in list(self.hooks):
            hook(method, collection, obj)


def _follow(h, current, hold_s: float) -> None:
    """A watch as a server streams it: the objects `current()` lists now as
    ADDED, then, until `hold_s` passed, each change as it is seen (polled)."""
    h._open_stream()
    sent: dict[str, dict] = {}
    deadline = time.monotonic() + hold_s
    try:
        while True:
            now = {o["metadata"]["name"]: copy.deepcopy(o) for o in current()}
            for name, obj in now.items():
                before = sent.get(name)
                if before is None or (before["metadata"].get("resourceVersion")
                                      != obj["metadata"].get("resourceVersion")):
                    h._event({"type": "ADDED" if before is None else "MODIFIED", "object": obj})
            for name in set(sent) - set(now):
                h._event({"type": "DELETED", "object": sent[name]})
            sent = now
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        h.wfile.write(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass  # the client went


class _Reply(Exception):
    def __init__(self, code, body, content_type="application/json"):
        self.code, self.body, self.content_type = code, body, content_type


def _lookup(obj: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def _matches(obj: dict, query: dict) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in filter(None, (query.get("labelSelector") or "").split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    for term in filter(None, (query.get("fieldSelector") or "").split(",")):
        key, _, value = term.partition("=")
        if str(_lookup(obj, key)) != value:
            return False
    return True


def _merge(target: dict, patch: dict) -> None:
    """JSON merge patch (RFC 7386), enough for the patches under test."""
    for key, value in (patch or {}).items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    if "stringData" in target:
        target.setdefault("data", {}).update({k: "***" for k in target.pop("stringData")})


# --- shapes the API server returns -------------------------------------------

NODES = "/api/v1/nodes"


def namespaced(ns: str, resource: str) -> str:
    return f"/api/v1/namespaces/{ns}/{resource}"


def pytorchjobs(ns: str) -> str:
    return f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs"


def node(name: str, *, gpus: int = 8, allocatable: int | None = None, ready: bool = True,
         labels: dict | None = None, conditions: list[dict] | None = None,
         taints: list[dict] | None = None, instance: str = "i-0123456789abcdef0",
         unschedulable: bool = False) -> dict:
    """A Node as a GPU node on EKS reports itself."""
    conds = [{"type": "Ready", "status": "True" if ready else "False",
              "reason": "KubeletReady" if ready else "NodeStatusUnknown",
              "message": "kubelet is posting ready status" if ready
              else "Kubelet stopped posting node status.",
              "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    conds += conditions or []
    spec = {"providerID": f"aws:///us-east-1a/{instance}"}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": spec,
        "status": {
            "capacity": {"cpu": "192", "memory": "2047Gi", "nvidia.com/gpu": str(gpus)},
            "allocatable": {"cpu": "191", "memory": "2000Gi",
                            "nvidia.com/gpu": str(gpus if allocatable is None else allocatable)},
            "conditions": conds,
            "addresses": [{"type": "InternalIP", "address": f"10.0.0.{abs(hash(name)) % 250}"},
                          {"type": "Hostname", "address": name}],
        },
    }


def pod(job: str, replica_type: str, index: int, *, node_name: str, phase: str = "Running",
        exit_code: int | None = None, reason: str = "", message: str = "",
        restarts: int = 0, namespace: str = "regatta-training", status_reason: str = "") -> dict:
    """A pod the training operator made for a PyTorchJob replica."""
    state: dict = {"running": {"startedAt": "2026-01-01T00:00:05Z"}}
    if exit_code is not None:
        state = {"terminated": {"exitCode": exit_code, "reason": reason or "Error",
                                "message": message, "finishedAt": "2026-01-01T00:10:00Z"}}
    statuses = [] if phase == "Pending" else [
        {"name": "pytorch", "ready": phase == "Running", "restartCount": restarts,
         "state": state, "image": "img", "imageID": "", "containerID": ""}]
    status = {"phase": phase, "containerStatuses": statuses}
    if status_reason:
        status.update(reason=status_reason, message=message)
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": f"{job}-{replica_type.lower()}-{index}", "namespace": namespace,
            "labels": {"training.kubeflow.org/job-name": job,
                       "training.kubeflow.org/replica-type": replica_type.lower(),
                       "training.kubeflow.org/replica-index": str(index),
                       "app.kubernetes.io/managed-by": "regatta"},
        },
        "spec": {"nodeName": node_name, "containers": [{"name": "pytorch", "image": "img"}]},
        "status": status,
    }


def watch_error(code: int, message: str = "") -> dict:
    """The event a watch stream sends instead of an object when it fails, e.g.
    410 Gone once the resourceVersion it resumes from has been compacted."""
    return {"type": "ERROR", "object": {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message or f"watch failed with {code}",
        "reason": _REASONS.get(code, "Unknown"), "code": code}}


def job_condition(kind: str, status: str = "True", message: str = "") -> dict:
    return {"type": kind, "status": status, "reason": f"PyTorchJob{kind}",
            "message": message or f"PyTorchJob is {kind.lower()}.",
            "lastUpdateTime": "2026-01-01T00:00:10Z",
            "lastTransitionTime": "2026-01-01T00:00:10Z"}


def _parse_path(path: str):
    """(collection path, object name, subresource, namespace) of an API path:
    /api/v1/namespaces/ns/pods/name/log, /apis/group/v1/namespaces/ns/kind/name, ..."""
    parts = path.strip("/").split("/")
    prefix = 2 if parts[0] == "api" else 3
    rest = parts[prefix:]
    namespaced = bool(rest) and rest[0] == "namespaces" and len(rest) >= 3
    coll_len = prefix + (3 if namespaced else 1)
    tail = parts[coll_len:]
    name = tail[0] if tail else None
    sub = tail[1] if len(tail) > 1 else None
    namespace = parts[prefix + 1] if namespaced else None
    return "/" + "/".join(parts[:coll_len]), name, sub, namespace


# --- what holds a gang back before it starts ----------------------------------
# The shapes the kubelet, the scheduler and Volcano write, as
# `kubectl get -o json` shows them on a real cluster.

def waiting_pod(job: str, replica_type: str, index: int, *, node_name: str, reason: str,
                message: str, namespace: str = "regatta-training") -> dict:
    """A scheduled pod whose container the kubelet cannot create or start
    yet: ImagePullBackOff, ErrImagePull, CreateContainerConfigError, ..."""
    obj = pod(job, replica_type, index, node_name=node_name, phase="Pending",
              namespace=namespace)
    obj["status"].update(
        conditions=[
            {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-01-01T00:00:01Z"},
            {"type": "Ready", "status": "False", "reason": "ContainersNotReady",
             "message": "containers with unready status: [pytorch]",
             "lastTransitionTime": "2026-01-01T00:00:01Z"},
            {"type": "PodScheduled", "status": "True",
             "lastTransitionTime": "2026-01-01T00:00:01Z"}],
        containerStatuses=[{"name": "pytorch", "ready": False, "restartCount": 0,
                            "started": False, "image": "img", "imageID": "",
                            "state": {"waiting": {"reason": reason, "message": message}}}])
    return obj


def volcano_podgroups(ns: str) -> str:
    return f"/apis/scheduling.volcano.sh/v1beta1/namespaces/{ns}/podgroups"


def _owner(job: dict) -> dict:
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "name": job["metadata"]["name"], "uid": job["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}


def podgroup(job: dict, *, phase: str = "Pending", message: str = "") -> dict:
    """The PodGroup the training operator makes for a Volcano gang, named
    after the PyTorchJob."""
    meta = job["metadata"]
    spec = job["spec"]
    members = sum(r.get("replicas", 1) for r in spec["pytorchReplicaSpecs"].values())
    conditions = []
    if phase in ("Pending", "Inqueue") and message:
        conditions.append({"type": "Unschedulable", "status": "True",
                           "reason": "NotEnoughResources", "message": message,
                           "transitionID": "5e0f1a52-0d35-4b8b-9a0b-1c2f8e0e6a10",
                           "lastTransitionTime": "2026-01-01T00:00:03Z"})
    policy = (spec.get("runPolicy") or {}).get("schedulingPolicy") or {}
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                     "ownerReferences": [_owner(job)]},
        "spec": {"minMember": policy.get("minAvailable", members),
                 "queue": policy.get("queue", "default")},
        "status": {"phase": phase, "conditions": conditions},
    }
