from .auth import LoginView, LogoutView, home
from .compare import compare_jobs
from .fleet import fleet, fleet_live
from .job_actions import cancel, checkpoint, profile, restart
from .jobs import (
    job_attempts,
    job_checkpoints,
    job_detail,
    job_list,
    job_list_live,
    job_live,
)
from .node_actions import node_action, node_fault
from .nodes import node_detail, node_live
from .teams import team_detail, team_list, team_live

__all__ = [
    "LoginView", "LogoutView", "home", "compare_jobs", "fleet", "fleet_live", "cancel",
    "checkpoint", "profile", "restart",
    "job_attempts", "job_checkpoints", "job_detail", "job_list", "job_list_live", "job_live",
    "node_action", "node_fault", "node_detail", "node_live", "team_detail", "team_list",
    "team_live",
]
