"""Logs read once more, for the record: a failed rank's log that the
provider could not read when the failure was acted on (its node's agent
unreachable) is read again by a later cluster pass, whatever became of the
job since (relaunched, failed, cancelled), and goes on the job's timeline.

The provider keeps what it could not read and reads it when asked, once
(`late_logs()`, the KeepsLateLogs capability: Kubernetes keeps the pod,
clusters/providers/kubernetes/kept_logs.py). Clusters never import jobs: the app that places
the attempts registers where a late log goes (jobs/apps.py), as it tells
what runs on a node (workload.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from clusters.providers.capabilities import KeepsLateLogs
from controlplane.lib.errors import PermanentError, TemporaryError

log = logging.getLogger(__name__)

_record: Callable | None = None


def register(record: Callable) -> None:
    """`record(late_log, now)` writes a LateLog (clusters.providers.base) on
    its attempt's job's timeline."""
    global _record
    _record = record


def collect(cluster, provider, now) -> int:
    """Ask the provider for the logs it kept and hand each to the timeline;
    how many; none from a provider that keeps none."""
    if not isinstance(provider, KeepsLateLogs) or _record is None:
        return 0
    try:
        found = provider.late_logs(now.timestamp())
    except (PermanentError, TemporaryError) as exc:
        log.warning("cluster %s: kept logs not read: %s", cluster.name, exc)
        return 0
    for late in found:
        _record(late, now)
    return len(found)
