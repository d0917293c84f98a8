"""The launch contract as a rank reads it: what torchrun and the control
plane put in its environment (regatta/contract.py names each variable,
docs/trainer-protocol.md tells it). Standard library only."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from regatta import contract as c


def _default(name: str) -> str:
    return c.LAUNCH_ENV[name].default


@dataclass(frozen=True)
class Launch:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    url: str = ""  # REGATTA_URL: empty means no control plane
    token: str = ""
    job_id: str = ""
    attempt_id: str = "0"
    node: str = ""
    checkpoint_uri: str = "checkpoints"
    # latest (the newest verified), none, or a step: the newest verified at or before it
    resume_step: str = c.RESUME_LATEST
    # The exact step-N folder the control plane chose; wins over resume_step.
    resume_uri: str = ""
    status_dir: str = ""
    # Every N steps (0: only when asked); the job's fixed policy, if it set one.
    checkpoint_every: int = 0

    @property
    def managed(self) -> bool:
        """Whether a control plane is listening (then it owns retention)."""
        return bool(self.url and self.token)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Launch:
        env = os.environ if env is None else env

        def get(name: str) -> str:
            # Set but empty reads as unset.
            return env.get(name) or _default(name)

        return cls(
            rank=int(get(c.RANK)),
            world_size=int(get(c.WORLD_SIZE)),
            local_rank=int(get(c.LOCAL_RANK)),
            url=get(c.URL),
            token=get(c.TOKEN),
            job_id=get(c.JOB_ID),
            attempt_id=get(c.ATTEMPT_ID),
            node=get(c.NODE) or os.uname().nodename,
            checkpoint_uri=get(c.CHECKPOINT_URI),
            resume_step=get(c.RESUME_STEP).strip().lower(),
            resume_uri=get(c.RESUME_URI),
            status_dir=get(c.STATUS_DIR),
            checkpoint_every=int(get(c.CHECKPOINT_EVERY)),
        )

    def env(self) -> dict[str, str]:
        """The reporting part, in the shape `reporting.from_env` reads (the
        checkpoint URI is where undelivered reports are left at exit)."""
        return {c.URL: self.url, c.TOKEN: self.token, c.JOB_ID: self.job_id,
                c.ATTEMPT_ID: self.attempt_id, c.NODE: self.node,
                c.CHECKPOINT_URI: self.checkpoint_uri}
