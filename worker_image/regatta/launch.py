"""The launch contract: what torchrun and the control plane put in a rank's
environment (docs/trainer-protocol.md). Standard library only."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


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
    resume_step: str = "latest"
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
        return cls(
            rank=int(env.get("RANK", "0")),
            world_size=int(env.get("WORLD_SIZE", "1")),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            url=env.get("REGATTA_URL", ""),
            token=env.get("REGATTA_TOKEN", ""),
            job_id=env.get("REGATTA_JOB_ID", ""),
            attempt_id=env.get("REGATTA_ATTEMPT_ID", "0") or "0",
            node=env.get("REGATTA_NODE", "") or os.uname().nodename,
            checkpoint_uri=env.get("REGATTA_CHECKPOINT_URI", "checkpoints") or "checkpoints",
            resume_step=(env.get("REGATTA_RESUME_STEP", "latest") or "latest").strip().lower(),
            resume_uri=env.get("REGATTA_RESUME_URI", ""),
            status_dir=env.get("REGATTA_STATUS_DIR", ""),
            checkpoint_every=int(env.get("REGATTA_CHECKPOINT_EVERY", "0") or 0),
        )

    def env(self) -> dict[str, str]:
        """The reporting part, in the shape `reporting.from_env` reads (the
        checkpoint URI is where undelivered reports are left at exit)."""
        return {"REGATTA_URL": self.url, "REGATTA_TOKEN": self.token,
                "REGATTA_JOB_ID": self.job_id, "REGATTA_ATTEMPT_ID": self.attempt_id,
                "REGATTA_NODE": self.node, "REGATTA_CHECKPOINT_URI": self.checkpoint_uri}
