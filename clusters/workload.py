"""What runs on the fleet, as the app that places work tells it.

Clusters never import jobs (jobs import clusters), yet the cluster reconcile
must know whether a node it is about to take out holds a gang: a spot notice
on an idle node retires it at once, on a busy one it is the job's to handle
(emergency checkpoint first). The placing app registers its answer at
start-up (jobs/apps.py); until one does, asking is an error rather than a
silent "nothing runs", which would take busy nodes out from under their jobs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

JobsOnNodes = Callable[[Iterable[int]], dict[int, list[int]]]

_jobs_on_nodes: JobsOnNodes | None = None


def register(jobs_on_nodes: JobsOnNodes) -> None:
    """`jobs_on_nodes(node_ids)` -> {node id: ids of the jobs with a live
    attempt on it}, nodes without work left out."""
    global _jobs_on_nodes
    _jobs_on_nodes = jobs_on_nodes


def jobs_on(node_ids: Iterable[int]) -> dict[int, list[int]]:
    if _jobs_on_nodes is None:
        raise RuntimeError("no app registered what runs on the fleet (clusters.workload)")
    return _jobs_on_nodes(list(node_ids))


def jobs_on_node(node_id: int) -> list[int]:
    return jobs_on([node_id]).get(node_id, [])
