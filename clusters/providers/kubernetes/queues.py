"""The queue part of the Kubernetes provider: the gang scheduler the
cluster's jobs wait in (cluster setting `gang_scheduler`), and what it says
of a gang that has not started. Each job API asks it only while its gang has
not started (or Kueue suspended it): reading the queue's object costs a
call per observe. The answer is the keyword arguments of the job API's
`attempt_status` (observe.py, trainjob.py): Kueue's Workload, Volcano's
PodGroup, or nothing.
"""

from __future__ import annotations

from .reads import LiveReads


class NoQueue:
    """No gang scheduler: the default scheduler binds pods one by one."""

    name = ""

    def holding(self, job: dict) -> dict:
        return {}


class Kueue:
    """Kueue's Workload of the job, found by the job-uid label Kueue puts on
    it (its name carries a hash of Kueue's choosing)."""

    name = "kueue"

    def __init__(self, reads: LiveReads):
        self.reads = reads

    def holding(self, job: dict) -> dict:
        meta = job["metadata"]
        items = self.reads.workloads(meta.get("uid", ""), meta["name"])
        return {"workload": items[0] if items else None}


class Volcano:
    """Volcano's PodGroup of the job, which carries the job's name."""

    name = "volcano"

    def __init__(self, reads: LiveReads):
        self.reads = reads

    def holding(self, job: dict) -> dict:
        return {"podgroup": self.reads.podgroup(job["metadata"]["name"])}


def queue_for(gang_scheduler: str, reads: LiveReads) -> NoQueue | Kueue | Volcano:
    if gang_scheduler == Kueue.name:
        return Kueue(reads)
    if gang_scheduler == Volcano.name:
        return Volcano(reads)
    return NoQueue()
