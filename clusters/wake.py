"""Waking the jobs on a node that needs them, through the kernel's port
(clusters never import jobs). A fast path; beat's sweeps find the same work
anyway. Admission and the cluster's own reconcile are asked for directly:
`ADMIT_CLUSTER.soon(cluster_id)`, `RECONCILE_CLUSTER.soon(cluster_id)`."""

from controlplane.lib.tasks import RECONCILE_JOB

from .workload import jobs_on_node


def jobs(job_ids) -> None:
    for job_id in job_ids:
        RECONCILE_JOB.soon(job_id)


def jobs_on(node_id: int) -> list[int]:
    """Wake the jobs with a live attempt on the node; returns their ids."""
    job_ids = jobs_on_node(node_id)
    jobs(job_ids)
    return job_ids

