"""A job's checkpoints as the job sees them: the logic is in
`jobs/checkpointing/job_checkpoints.py`; the package's names are its door."""

from .job_checkpoints import (  # noqa: F401
    abandon_branch,
    job_checkpoint_uri,
    newest_verified,
    on_abandoned_branch,
    open_job_storage,
    protected_steps,
    prune,
    s3_options,
    sweep_retention,
)
