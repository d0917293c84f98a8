"""A launched attempt that has shown nothing yet: what its ranks are doing.

Between `Launched` and the first step a start-up can take minutes (imports,
a rendezvous, a checkpoint load, torch.compile's first step) or never end
(a rank that never comes), and the start-up deadlines (detect.py) are long
on purpose. So once an attempt has had no step reported for the cluster
setting `startup_report_after_s` after its launch, the job's pass asks the
provider what each rank is doing (`describe_startup(ref)`, the
DescribesStartup capability, read on the nodes: clusters/providers/local/startup.py) and writes a
`StartupReport` event: per rank its state (not started, importing,
rendezvous, setting up, loading checkpoint, compiling, first step, running
without reporting, exited, gone), for how long, and whether the control
plane heard from it. It asks again at most once per that interval, and
writes again only when the account changed. A provider that cannot say
gets no event: there would be nothing in it beyond `Launched`; nor does a
program of the job's own whose ranks left no start-up marker (it does not
use the SDK: its `NoHeartbeats` condition says what there is to say).
"""

from __future__ import annotations

from clusters.providers.base import RankActivity
from clusters.providers.capabilities import DescribesStartup
from jobs.context import Ctx

from ..models import JobAttempt, RankStatus

REPORT = "StartupReport"


def watch(ctx: Ctx, attempt: JobAttempt, status) -> None:
    after = ctx.config.startup_report_after_s
    provider = ctx.provider
    # No step reported by any rank (a program judged not to report has a
    # first step on record without one: jobs/reconcile/job_pass.py).
    if (not after or not isinstance(provider, DescribesStartup) or attempt.started_at is None
            or attempt.last_step > 0 or status.state != "running"):
        return
    waited = (ctx.now - attempt.started_at).total_seconds()
    if waited < after:
        return
    noted = ctx.condition(REPORT)
    mine = noted is not None and noted.get("attempt") == attempt.id
    if mine and ctx.now.timestamp() - noted["at"] < after:
        return
    ranks = provider.describe_startup(attempt.provider_ref)
    if ctx.job.entrypoint and ranks and all(r.state == "importing" and not r.marked
                                            for r in ranks):
        # A program without the SDK: that its processes live is all there is
        # to say, and its NoHeartbeats condition says it.
        return
    heard = set(RankStatus.objects.filter(attempt=attempt).values_list("rank", flat=True))
    summary = sorted((r.rank, r.state, r.rank in heard) for r in ranks)
    ctx.set_condition(REPORT, attempt=attempt.id, at=ctx.now.timestamp(),
                      summary=[list(s) for s in summary])
    if mine and noted.get("summary") == [list(s) for s in summary]:
        return
    ctx.job.record(REPORT, message(attempt, waited, ranks, heard), attempt=attempt,
                   now=ctx.now, evidence={
                       "attempt": attempt.number, "since_launch_s": round(waited, 1),
                       "heard_from": sorted(heard),
                       "ranks": [{"rank": r.rank, "node": r.node, "state": r.state,
                                  "since_s": r.since_s, "detail": r.detail,
                                  "heard_from": r.rank in heard} for r in ranks]})


def message(attempt: JobAttempt, waited: float, ranks: tuple[RankActivity, ...],
            heard: set[int]) -> str:
    """One line per state: which ranks are in it, the longest for how long."""
    groups: dict[str, list[RankActivity]] = {}
    for r in sorted(ranks, key=lambda r: r.rank):
        groups.setdefault(r.state, []).append(r)
    parts = []
    for state, members in groups.items():
        names = ", ".join(str(r.rank) for r in members)
        longest = max((r.since_s for r in members if r.since_s is not None), default=None)
        first = members[0]
        parts.append(f"rank{'s' if len(members) > 1 else ''} {names}: {state}"
                     + (f" for {longest:.0f} s" if longest is not None else "")
                     + (f" ({first.detail})" if first.detail else ""))
    silent = "no rank heard from" if not heard else f"heard from ranks {sorted(heard)}"
    return (f"attempt {attempt.number}: no first step {waited:.0f} s after its launch, "
            f"{silent}; " + "; ".join(parts))[:4000]
