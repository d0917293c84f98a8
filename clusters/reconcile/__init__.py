"""The cluster reconcile: the logic is in `clusters/reconcile/cluster_pass.py`;
the package's names are its door."""

from .cluster_pass import (  # noqa: F401
    CLUSTERS,
    ERROR_CONDITION,
    due_cluster_ids,
    reconcile_cluster_locked,
    reconcile_cluster_unlocked,
)
