"""What every rank must decide at the same step, agreed without a host sync.

Rank 0 holds the control plane's directives (stop, checkpoint now, a new
interval, profile the next N steps); any rank may have had SIGTERM, or still
be writing a checkpoint (the SAVE_NOT_READY slot: 0 only when every rank's
part of the pending save is down, so that it can be committed).
All ranks must act on these at the same step, so they are combined with an
all-reduce (MAX). Doing that with a blocking read every step made the host
wait for the GPU each step (the tensor lived on the GPU and `.tolist()`
synchronised), so the host could never queue the next step ahead of the
GPU.

Here the all-reduce runs on a gloo group of CPU tensors (no GPU involved at
all) and is pipelined: the flags a rank holds at step k are sent with
`async_op=True` at the end of step k and read at the end of step k+1, where
the next round is launched. Every rank reads round k at the same step, k+1,
so every rank still acts at the same step: one step later than a
blocking agreement would, which costs a stop or a requested checkpoint
one step of latency and nothing else. Periodic checkpoints need no
agreement at all (every rank computes `step % interval`), and the interval
only changes through a directive, applied at the same step everywhere, so
resumes stay bitwise identical.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from regatta.contract import MAX_PROFILE_STEPS

log = logging.getLogger("regatta")

STOP, CHECKPOINT_REQUEST, INTERVAL, SAVE_NOT_READY, PROFILE_REQUEST = range(5)
NOTHING = (0, 0, 0, 0, 0)


class Agreement:
    def __init__(self, d) -> None:
        # The group is read from `d` at each round, never kept: `Dist.leave`
        # frees it when the run ends.
        self.d = d
        self._inflight: tuple[torch.Tensor, object] | None = None

    def exchange(self, flags: list[int]) -> tuple[int, ...]:
        """Send this step's flags; return the agreed flags of the previous
        call (all zeros at the first). Collective: every rank calls it once
        per step boundary."""
        agreed = self._collect()
        tensor = torch.tensor(flags, dtype=torch.int64)
        work = dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.d.control_group,
                               async_op=True)
        self._inflight = (tensor, work)
        return agreed

    def drain(self) -> tuple[int, ...]:
        """Wait for the round in flight, if any (before a final decision)."""
        return self._collect()

    def _collect(self) -> tuple[int, ...]:
        if self._inflight is None:
            return NOTHING
        tensor, work = self._inflight
        self._inflight = None
        work.wait()
        return tuple(tensor.tolist())


@dataclass(frozen=True)
class Decision:
    """What every rank agreed at one step boundary."""

    step: int
    stop: bool = False
    request_id: str | None = None
    fallback: bool = False
    profile: tuple[str, int] | None = None  # (request id, steps) to profile from step+1


class Directives:
    """The control plane's directives and SIGTERM, turned into decisions
    that every rank takes at the same step boundary."""

    def __init__(self, d, reporter, checkpoint_every: int) -> None:
        self.d, self.reporter = d, reporter
        self.agreement = Agreement(d)
        self.checkpoint_every = checkpoint_every
        self.served_requests: set[str] = set()
        self.sigterm = False
        self.stopping = False
        self.decision = Decision(step=-1)
        self._flagged_request: str | None = None
        self._request_id: str | None = None
        self.served_profiles: set[str] = set()
        self._profile: tuple[str, int] | None = None

    def boundary(self, step: int, ckpt) -> Decision:
        """Collective: exchange flags, commit a pending save every rank has
        finished, apply what was agreed."""
        stop, request, interval, not_ready, profile = self.agreement.exchange(
            self._local_flags(ckpt))
        if ckpt.pending is not None and not not_ready:
            ckpt.commit_pending()
        if interval and interval != self.checkpoint_every:
            log.info("checkpoint interval %s -> %d steps (directive)",
                     self.checkpoint_every, interval)
            self.checkpoint_every = interval
        self.stopping = self.stopping or bool(stop)
        request_id = self._agreed_request_id() if request else None
        profile_request = self._agreed_profile() if profile else None
        self.decision = Decision(step, self.stopping, request_id, ckpt.fallback_due,
                                 profile_request)
        ckpt.fallback_due = False
        return self.decision

    def request_for(self, step: int) -> str | None:
        """The request id a save at `step` serves, if any."""
        return self.decision.request_id if self.decision.step == step else None

    def _local_flags(self, ckpt) -> list[int]:
        flags = [0] * len(NOTHING)
        flags[STOP] = int(self.sigterm)
        # 0 only once this rank has a pending save whose files are down; "no
        # pending save" counts as not ready, so a save started after these
        # flags were sent is never committed on their word.
        pending = ckpt.pending
        flags[SAVE_NOT_READY] = int(pending is None or not pending.local.done())
        if self.d.rank == 0:
            self._directive_flags(flags, self.reporter.directives())
        return flags

    def _directive_flags(self, flags: list[int], directives: dict[str, Any]) -> None:
        flags[STOP] |= int(bool(directives.get("stop")))
        request = directives.get("checkpoint_request")
        # Flag an id once: the answer comes a step later, while the id may
        # still be up, and it must not be served twice.
        if request and request not in self.served_requests \
                and request != self._flagged_request:
            flags[CHECKPOINT_REQUEST] = 1
            self._flagged_request = self._request_id = request
        interval = directives.get("checkpoint_interval_steps")
        if isinstance(interval, int) and not isinstance(interval, bool) and interval > 0:
            flags[INTERVAL] = interval
        profile = _profile_request(directives.get("profile"))
        # Like a checkpoint request: flagged once, served once.
        if profile and profile[0] not in self.served_profiles \
                and (self._profile is None or profile[0] != self._profile[0]):
            flags[PROFILE_REQUEST] = 1
            self._profile = profile

    def _agreed_request_id(self) -> str | None:
        """Rank 0's request id, learnt by every rank (it goes into every
        rank's state); None if it was served already."""
        box = [self._request_id]
        dist.broadcast_object_list(box, src=0, group=self.d.control_group)
        if box[0] is None or box[0] in self.served_requests:
            return None
        self.served_requests.add(box[0])
        return box[0]

    def _agreed_profile(self) -> tuple[str, int] | None:
        """Rank 0's profile request, learnt by every rank; None if served."""
        box = [self._profile]
        dist.broadcast_object_list(box, src=0, group=self.d.control_group)
        if box[0] is None or box[0][0] in self.served_profiles:
            return None
        self.served_profiles.add(box[0][0])
        return tuple(box[0])

    def state_dict(self) -> dict[str, Any]:
        # Saved with every checkpoint, so that a resumed run neither serves a
        # request twice nor loses an interval the control plane set.
        return {"served_requests": sorted(self.served_requests),
                "checkpoint_every": self.checkpoint_every}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.served_requests = set(state.get("served_requests", []))
        self.checkpoint_every = state.get("checkpoint_every", self.checkpoint_every)


def _profile_request(value: Any) -> tuple[str, int] | None:
    """The directive's `profile` as (request id, steps), or None when absent
    or malformed (a malformed directive is ignored, never fatal)."""
    if not isinstance(value, dict):
        return None
    request_id, steps = value.get("request_id"), value.get("steps")
    if not isinstance(request_id, str) or not request_id or len(request_id) > 64:
        return None
    if isinstance(steps, bool) or not isinstance(steps, int) \
            or not 1 <= steps <= MAX_PROFILE_STEPS:
        return None
    return request_id, steps
