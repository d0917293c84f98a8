"""The one door through which the jobs app acts on nodes.

A job's pass decides that a node must leave service, that a spare takes a
vacancy, that a check's failure blames a node, that a draining node's
provider is asked to evict, or that a node returns to service; how each is
done (the pool's lock, the claim, the provider's half left to the cluster
pass) is the cluster reconcile's business. jobs imports these names from
here and nothing from clusters.reconcile (an import-linter contract).
"""

from clusters.reconcile.check_verdict import judge as judge_check
from clusters.reconcile.nodes import send_drain
from clusters.reconcile.promotion import fill_vacancies
from clusters.reconcile.replacement import cordon_with_evidence, take_out
from clusters.reconcile.returns import request_return

__all__ = ["cordon_with_evidence", "fill_vacancies", "judge_check", "request_return",
           "send_drain", "take_out"]
