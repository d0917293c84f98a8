"""Recovery: what a failure means, and who pays for it.

failure (jobs/recovery/detect.py) → attribution (evidence.py: which node,
if any, the evidence points at) → take-out (jobs/recovery/handle.py,
through clusters' node acts) → restart decision (crash_loop.py, then the
budgets) → resume (jobs/reconcile/launch.py).

The rules every provider follows (docs/fleet.md, "Blame needs evidence"):
- a node is taken out only on evidence about the node: the scheduler saying
  it is gone or not ready (its own heartbeats missed), a critical health
  event, or a health check run on it after the failure that fails; a rank's death
  alone, or "it failed again", makes the node a suspect, checked before it
  is used again, never retired on that alone;
- the node blamed is the one the rank ran on, as the provider observed it;
- a job's own failures retire a bounded number of nodes, never its whole
  gang, and a crash loop ends the job with the user's error line.
"""
