"""Watch, don't list: the objects a cluster's passes read, kept by informers
shared by every pass of one worker process.

A fleet of thousands of nodes cannot be listed on every pass: each LIST of
5,000 Nodes is megabytes the API server reads from etcd and serializes, per
pass, per pool. An informer lists once, then watches from the list's
resourceVersion (with bookmarks, so a quiet watch still moves its
resourceVersion on and its restart does not replay history); a watch the
server ends is resumed from the last resourceVersion seen, a 410 Gone
(that history compacted) relists, and a full relist every `RESYNC_S`
repairs whatever a lost event could have left wrong. Lists come from the
API server's watch cache in one response each. A pass reads the cache: its
cost no longer grows with the fleet, and Regatta's requests while nothing
changes are a watch renewal a minute and a list every `RESYNC_S` per kind,
however large the fleet.

Why not a library: the `kubernetes` client has watches but no informer, and
the Python operator frameworks (kopf) run their own event loop and
handlers; this is the part of client-go's reflector a control plane of
passes needs, on the client's own `watch` line reader.

Freshness: an informer whose list or watch goes unanswered reports the
server away (reachability.py), and reading it raises TemporaryError until
it answers again: a pass never acts on a cache it knows to be stale.
Deleted pods are remembered for a while (`tombstones`), so a rank's pod
that went with its node, or that its operator re-created elsewhere, is
still known by where it ran.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from controlplane.lib.errors import PermanentError, TemporaryError

from . import reachability
from .errors import classify, unanswered

log = logging.getLogger(__name__)

# The server ends each watch after this long; a watch that has said nothing
# (not even a bookmark) for this long plus WATCH_SLACK_S is a server that
# stopped answering.
WATCH_S = 60
WATCH_SLACK_S = 15
RESYNC_S = 600.0
# A whole list of a large fleet may take the server a while on a loaded
# machine; the list runs in the informer's thread, and holds no pass.
LIST_READ_S = 120.0
# A watch the server ends this soon having sent nothing (client-go's
# reflector calls it a "very short watch") is asked again after a back-off:
# looping on it at once would hammer a server that closes every watch.
SHORT_WATCH_S = 1.0
# An informer nobody read for this long stops (a cluster deleted, a test's
# stand-in server gone); the next read starts it again.
IDLE_STOP_S = 900.0
TOMBSTONES_KEPT = 2000
# What passes derived from cached objects, kept per object and version.
MEMO_KEPT = 100_000
TOMBSTONE_TTL_S = 3600.0


class Gone(Exception):
    """410: the resourceVersion is older than the server's history."""


@dataclass(frozen=True)
class Resource:
    """What one informer lists and watches: a function of the client's
    generated API taking `**query`, and a name for messages."""

    name: str
    list_fn: Callable[..., object]


def _key(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name')}"


def _older(obj: dict, than: dict | None) -> bool:
    """Whether `obj` is an older version than `than`. resourceVersions are
    opaque, but the API server's are etcd's revisions: numbers that grow."""
    if than is None:
        return False
    mine = (obj.get("metadata") or {}).get("resourceVersion") or ""
    theirs = (than.get("metadata") or {}).get("resourceVersion") or ""
    return mine.isdigit() and theirs.isdigit() and int(mine) < int(theirs)


def _slim(obj: dict) -> dict:
    # managedFields is often half of an object and nothing here reads it.
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


class Informer:
    """One kind of object, listed once and then watched, in a thread."""

    def __init__(self, resource: Resource, reach: reachability.Reachability,
                 timeout: tuple[float, float], clock=time.monotonic):
        self.resource = resource
        self.reach = reach
        self.timeout = timeout
        self._clock = clock
        self._mutex = threading.Lock()
        self._store: dict[str, dict] = {}
        self._tombstones: OrderedDict[str, tuple[float, dict]] = OrderedDict()
        self._rv: str | None = None
        self._synced = threading.Event()
        self._tried = threading.Event()  # the first list came back or failed
        self._stop = threading.Event()
        self._broken = ""  # why the last list or watch failed; "" while it answers
        # The last failure in its class (errors.classify): a PermanentError (a
        # 403: the account may not list or watch the kind) is raised as such.
        self._broken_as: BaseException | None = None
        self._last_read = clock()
        self._last_list = 0.0
        self.lists = 0  # how many full lists it made (the bench reads it)
        self.missing = False  # the server does not serve this kind (no such CRD)
        self._thread = threading.Thread(target=self._run, name=f"informer:{resource.name}",
                                        daemon=True)
        self._thread.start()

    # --- reading --------------------------------------------------------------
    def items(self) -> list[dict]:
        self._fresh()
        with self._mutex:
            return list(self._store.values())

    def get(self, namespace: str, name: str) -> dict | None:
        self._fresh()
        with self._mutex:
            return self._store.get(f"{namespace}/{name}")

    def tombstones(self) -> list[dict]:
        """Objects deleted within TOMBSTONE_TTL_S, oldest first, each as last seen."""
        self._fresh()
        cutoff = self._clock() - TOMBSTONE_TTL_S
        with self._mutex:
            return [obj for at, obj in self._tombstones.values() if at >= cutoff]

    def _fresh(self) -> None:
        self._last_read = self._clock()
        what = f"read {self.resource.name}"
        # Until its first list came back or failed: a refusal (403) is said at
        # once, not after a timeout.
        self._tried.wait(self.timeout[1])
        if isinstance(self._broken_as, PermanentError):
            raise PermanentError(f"{what}: {self._broken_as}")
        if not self._synced.is_set():
            raise TemporaryError(f"{what}: its first list has not come back "
                                 f"({self._broken or 'no answer yet'})", delay=2.0)
        if self._broken:
            raise TemporaryError(f"{what}: the watch is broken, the cache may be stale: "
                                 f"{self._broken}", delay=2.0)
        self.reach.check(what)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()

    # --- the loop ---------------------------------------------------------------
    def _run(self) -> None:
        failures = short = 0
        while not self._stop.is_set():
            if self._clock() - self._last_read > IDLE_STOP_S:
                log.info("informer %s stopped: not read for %.0f s", self.resource.name,
                         IDLE_STOP_S)
                return
            try:
                if self._rv is None or self._clock() - self._last_list > RESYNC_S:
                    self._relist()
                if self._watch():
                    failures = short = 0
                else:
                    # Not a failure (the cache is as fresh as the server says),
                    # but no reason to ask again at once either.
                    short += 1
                    self._stop.wait(min(30.0, 0.5 * 2 ** (short - 1)))
            except Gone:
                self._rv = None  # relist at once
            except ApiException as exc:
                if exc.status == 404 and not self._synced.is_set():
                    # No such resource here (Kueue or JobSet not installed):
                    # an empty cache that is never wrong.
                    self.missing = True
                    self._synced.set()
                    self._tried.set()
                    return
                failures = self._failed(exc, failures)
            except Exception as exc:  # noqa: BLE001 - kept going; reads see it broken
                failures = self._failed(exc, failures)

    def _failed(self, exc: Exception, failures: int) -> int:
        failures += 1
        self._broken = f"{type(exc).__name__}: {exc}"[:300]
        self._broken_as = classify(exc, f"list or watch {self.resource.name}")
        self._tried.set()
        if unanswered(exc):
            self.reach.failed(self._broken)
        else:
            self.reach.answered()
        delay = min(30.0, 0.5 * 2 ** (failures - 1))
        log.warning("informer %s: %s; again in %.1f s", self.resource.name, self._broken, delay)
        self._stop.wait(delay)
        return failures

    def _relist(self) -> None:
        # From the API server's watch cache (resourceVersion "0"), in one
        # response: a list whose request count grew with the fleet (pages of
        # 500) would make Regatta's requests per minute grow with it at each
        # resync, and the watch cache spares etcd the read. The watch that
        # follows starts from the list's resourceVersion, so nothing between
        # the two is missed.
        resp = self.resource.list_fn(resource_version="0", _preload_content=False,
                                     _request_timeout=(self.timeout[0],
                                                       max(self.timeout[1], LIST_READ_S)))
        doc = json.loads(resp.data)
        items = {_key(obj): _slim(obj) for obj in doc.get("items") or []}
        rv = (doc.get("metadata") or {}).get("resourceVersion")
        with self._mutex:
            for key in set(self._store) - set(items):
                self._bury(key, self._store[key])
            self._store = items
        self._rv = rv
        self._last_list = self._clock()
        self.lists += 1
        self._answered()
        self._synced.set()
        self._tried.set()

    def _watch(self) -> bool:
        """Follow the watch until the server ends it; False when it ended at
        once having sent nothing (SHORT_WATCH_S)."""
        started, lines = self._clock(), 0
        resp = self.resource.list_fn(
            watch=True, resource_version=self._rv, allow_watch_bookmarks=True,
            timeout_seconds=WATCH_S, _preload_content=False,
            _request_timeout=(self.timeout[0], WATCH_S + WATCH_SLACK_S))
        self._answered()
        try:
            for line in iter_resp_lines(resp):
                lines += 1
                if self._stop.is_set():
                    return True
                self._apply(json.loads(line))
                if self._clock() - self._last_list > RESYNC_S:
                    return True
        finally:
            resp.release_conn()
        return lines > 0 or self._clock() - started >= SHORT_WATCH_S

    def _answered(self) -> None:
        self._broken = ""
        self._broken_as = None
        self.reach.answered()

    def _apply(self, event: dict) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone(obj.get("message", ""))
            raise ApiException(status=obj.get("code") or 500,
                               reason=obj.get("message") or obj.get("reason") or "watch error")
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if kind in ("ADDED", "MODIFIED"):
            with self._mutex:
                key = _key(obj)
                if not _older(obj, self._store.get(key)):
                    self._store[key] = _slim(obj)
        elif kind == "DELETED":
            with self._mutex:
                key = _key(obj)
                self._store.pop(key, None)
                self._bury(key, _slim(obj))
        if rv:
            self._rv = rv

    def wrote(self, obj: dict) -> None:
        """The server's answer to a write of this process (a patched Node):
        read at once by the passes that follow, not a watch event later (a
        return to service must not see the cordon it just lifted)."""
        with self._mutex:
            key = _key(obj)
            if key in self._store and not _older(obj, self._store[key]):
                self._store[key] = _slim(obj)

    def _bury(self, key: str, obj: dict) -> None:
        uid = (obj.get("metadata") or {}).get("uid") or key
        self._tombstones[uid] = (self._clock(), obj)
        self._tombstones.move_to_end(uid)
        while len(self._tombstones) > TOMBSTONES_KEPT:
            self._tombstones.popitem(last=False)


# --- the kinds a cluster's passes read ------------------------------------------------
def resources(api: k8s.ApiClient, namespace: str, pod_selector: str) -> dict[str, Resource]:
    core, custom = k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)

    def custom_list(group, version, plural):
        def list_fn(**query):
            query = {k: v for k, v in query.items() if v is not None}
            return custom.list_namespaced_custom_object(group, version, namespace, plural,
                                                        **query)
        return list_fn

    def core_list(fn, *args, **fixed):
        def list_fn(**query):
            query = {k: v for k, v in query.items() if v is not None}
            return fn(*args, **fixed, **query)
        return list_fn

    return {
        "nodes": Resource("nodes", core_list(core.list_node)),
        "pods": Resource("pods", core_list(core.list_namespaced_pod, namespace,
                                           label_selector=pod_selector)),
        # Warning events only: why a controller could not make a pod, an
        # admission webhook's refusal (observe.event_issues).
        "events": Resource("events", core_list(core.list_namespaced_event, namespace,
                                               field_selector="type=Warning")),
        "pytorchjobs": Resource("pytorchjobs", custom_list("kubeflow.org", "v1", "pytorchjobs")),
        "trainjobs": Resource("trainjobs", custom_list("trainer.kubeflow.org", "v1alpha1",
                                                       "trainjobs")),
        "jobsets": Resource("jobsets", custom_list("jobset.x-k8s.io", "v1alpha2", "jobsets")),
        "workloads": Resource("workloads", custom_list("kueue.x-k8s.io", "v1beta1",
                                                       "workloads")),
    }


class ClusterCache:
    """The informers of one cluster (one API server, credentials and
    namespace), each started the first time a pass reads its kind."""

    def __init__(self, api: k8s.ApiClient, namespace: str, pod_selector: str,
                 timeout: tuple[float, float]):
        self.api = api
        self.reach = reachability.of(api.configuration.host)
        self.timeout = timeout
        self._resources = resources(api, namespace, pod_selector)
        self._informers: dict[str, Informer] = {}
        self._mutex = threading.Lock()
        self._memo: dict[tuple[str, str], tuple[str, object]] = {}

    def informer(self, kind: str) -> Informer:
        with self._mutex:
            found = self._informers.get(kind)
            if found is None or (not found.alive and not found.missing):
                found = self._informers[kind] = Informer(self._resources[kind], self.reach,
                                                         self.timeout)
            return found

    def memo(self, what: str, key: str, version: str, make: Callable[[], object]):
        """What `make()` gives for version `version` of object `key`, made
        once per version (an object's resourceVersion changes with it)."""
        found = self._memo.get((what, key))
        if found is not None and found[0] == version:
            return found[1]
        value = make()
        if len(self._memo) > MEMO_KEPT:
            self._memo.clear()  # objects gone long ago; the next pass remakes the rest
        self._memo[(what, key)] = (version, value)
        return value

    def started(self) -> dict[str, Informer]:
        with self._mutex:
            return dict(self._informers)

    def stop(self) -> None:
        for informer in self.started().values():
            informer.stop()


_caches: dict[tuple, ClusterCache] = {}
_caches_mutex = threading.Lock()


def shared(key: tuple, make: Callable[[], ClusterCache]) -> ClusterCache:
    """The process's cache for `key`, made by `make` the first time."""
    with _caches_mutex:
        found = _caches.get(key)
        if found is None:
            found = _caches[key] = make()
        return found


def stop_all() -> None:
    """Stop every informer of this process (a worker shutting down)."""
    with _caches_mutex:
        caches = list(_caches.values())
        _caches.clear()
    for cache in caches:
        cache.stop()
