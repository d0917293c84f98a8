"""Asking for a look now, by task name (clusters never import jobs): the
jobs on a node that needs them, admission when capacity changed, the
cluster's own reconcile when a replacement is owed. All fast paths; beat's
sweeps find the same work anyway."""

from controlplane.lib.tasks import (
    ADMIT_CLUSTER,
    RECONCILE_CLUSTER,
    RECONCILE_JOB,
    enqueue_on_commit,
)

from .workload import jobs_on_node


def jobs(job_ids) -> None:
    for job_id in job_ids:
        enqueue_on_commit(RECONCILE_JOB, job_id)


def jobs_on(node_id: int) -> list[int]:
    """Wake the jobs with a live attempt on the node; returns their ids."""
    job_ids = jobs_on_node(node_id)
    jobs(job_ids)
    return job_ids


def admission(cluster_id: int) -> None:
    enqueue_on_commit(ADMIT_CLUSTER, cluster_id)


def cluster(cluster_id: int) -> None:
    """The cluster's own reconcile, soon: a job's pass claimed a replacement
    whose provider half the cluster reconcile carries out."""
    enqueue_on_commit(RECONCILE_CLUSTER, cluster_id)
